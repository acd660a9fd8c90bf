"""HTA's own numbers for the real traces of tests/data/kineto, the ones tests/unit/test_kernels.py pins.

Run with HTA's interpreter (its own venv, see bench_steps_vs_hta.py), one trace folder per set:

    /tmp/hta/bin/python benchmarks/hta_reference.py tests/data/kineto/hta_sampled_2ranks ...

Prints one JSON document: per folder and rank, HTA 0.5.0's temporal breakdown, idle-time
breakdown per stream (host wait / kernel wait / other), comm–compute overlap, the
kernel-kind sums of get_gpu_kernel_breakdown and the launch statistics. With
``HTA_DISABLE_NS_ROUNDING=1`` HTA keeps the trace's sub-µs times (as we do).
"""

from __future__ import annotations

import json
import logging
import sys


def _one(folder: str) -> dict:
    from hta.trace_analysis import TraceAnalysis

    analysis = TraceAnalysis(trace_dir=folder)
    ranks = sorted(int(r) for r in analysis.t.traces)
    out: dict = {"ranks": {}}
    try:
        tb = analysis.get_temporal_breakdown(visualize=False)
        out["temporal"] = {
            int(r["rank"]): [
                float(r["idle_time(us)"]),
                float(r["compute_time(us)"]),
                float(r["non_compute_time(us)"]),
                float(r["kernel_time(us)"]),
            ]
            for _, r in tb.iterrows()
        }
    except AssertionError as err:
        out["temporal"] = f"HTA asserted: {err}"
    try:
        ov = analysis.get_comm_comp_overlap(visualize=False)
        out["overlap_pct"] = {int(r["rank"]): float(r["comp_comm_overlap_pctg"]) for _, r in ov.iterrows()}
    except Exception as err:  # HTA fails on traces without communication kernels
        out["overlap_pct"] = f"HTA failed: {type(err).__name__}"
    try:
        kinds, kernels = analysis.get_gpu_kernel_breakdown(visualize=False)
        out["kind_sum_us"] = {str(r["kernel_type"]): float(r["sum"]) for _, r in kinds.iterrows()}
        out["kernel_sum_us"] = {
            f"{int(r['rank'])}|{r['name']}": float(r["sum (us)"]) for _, r in kernels.head(40).iterrows()
        }
    except Exception as err:
        out["kind_sum_us"] = f"HTA failed: {type(err).__name__}: {err}"
    for rank in ranks:
        idle, _ = analysis.get_idle_time_breakdown(ranks=[rank], visualize=False)
        launches = analysis.get_cuda_kernel_launch_stats(ranks=[rank], visualize=False)[rank]
        out["ranks"][rank] = {
            "idle": {f"{int(r['stream'])}|{r['idle_category']}": float(r["idle_time"]) for _, r in idle.iterrows()},
            "launches": len(launches),
            "launch_delay_sum_us": float(launches["launch_delay"].sum()),
            "short_kernels": int(
                ((launches["cpu_duration"] <= 50) & (launches["gpu_duration"] < launches["cpu_duration"])).sum()
            ),
            "delay_outliers": int((launches["launch_delay"] > 100).sum()),
        }
    return out


if __name__ == "__main__":
    logging.disable(logging.WARNING)
    print(json.dumps({folder: _one(folder) for folder in sys.argv[1:]}, indent=1, default=str))
