"""Load + temporal breakdown: hpcwatch vs Holistic Trace Analysis on the same traces, same run.

HTA (``pip install HolisticTraceAnalysis``) pulls ~70 packages (jupyterlab, pandas, ipykernel…)
into an environment, so it lives in its own venv, not in hpcwatch's test extra:

    python3 -m venv /tmp/hta && /tmp/hta/bin/pip install HolisticTraceAnalysis -e .
    .venv/bin/python benchmarks/bench_steps_vs_hta.py [--hta-python /tmp/hta/bin/python] [--repeat 3]

Each measurement runs in a fresh child process, so its peak RSS (``ru_maxrss``) is its own;
we report the peak and the growth over the process's RSS after its imports. HTA rounds event
times to whole µs by default, so our numbers are compared with ``round_us=True`` (equal) and
without (the difference is HTA's rounding). HTA's ``get_temporal_breakdown`` stops on an
assertion on the H200 trace (its rounding makes non-compute time -2 µs); the benchmark then
times its parse and computes the breakdown with HTA's own building blocks. A last HTA run
with ``HTA_DISABLE_NS_ROUNDING=1`` gives its unrounded numbers, which ours equal.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = {
    "hta_a100_nccl_rank0": ROOT / "tests/data/kineto/hta_a100_nccl_rank0.json.gz",
    "h200_annotated_steps": ROOT / "tests/data/kineto/h200_annotated_steps.json.gz",
}


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _current_rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def child_ours(trace_dir: str) -> dict:
    import warnings

    from hpcwatch.analysis.steps import anatomy_from_traces, temporal_breakdown
    from hpcwatch.sources.kineto import read_kineto
    warnings.simplefilter("ignore")
    base = _current_rss_mib()
    t0, c0 = time.perf_counter(), time.process_time()
    traces = [read_kineto(p) for p in sorted(Path(trace_dir).iterdir())]
    t1 = time.perf_counter()
    rows = {t.rank: temporal_breakdown(t, round_us=True) for t in traces}
    t2, c2 = time.perf_counter(), time.process_time()
    exact = {t.rank: temporal_breakdown(t) for t in traces}
    t3 = time.perf_counter()
    anatomy_from_traces(traces)
    t4 = time.perf_counter()
    return {"load_s": t1 - t0, "breakdown_s": t2 - t1, "cpu_s": c2 - c0, "anatomy_s": t4 - t3,
            "peak_rss_mib": _rss_mib(),
            "base_rss_mib": base,
            "numbers": {r: [b.idle_us, b.compute_us, b.non_compute_us, b.kernel_us] for r, b in rows.items()},
            "exact": {r: [b.idle_us, b.compute_us, b.non_compute_us, b.kernel_us] for r, b in exact.items()}}


def child_hta(trace_dir: str) -> dict:
    import logging
    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis
    base = _current_rss_mib()
    t0, c0 = time.perf_counter(), time.process_time()
    analysis = TraceAnalysis(trace_dir=trace_dir)
    t1 = time.perf_counter()
    try:
        df = analysis.get_temporal_breakdown(visualize=False)
        numbers = {int(r["rank"]): [float(r["idle_time(us)"]), float(r["compute_time(us)"]),
                                    float(r["non_compute_time(us)"]), float(r["kernel_time(us)"])]
                   for _, r in df.iterrows()}
        note = ""
    except AssertionError:
        numbers, note = _hta_blocks(analysis), "get_temporal_breakdown asserted; HTA building blocks used"
    t2, c2 = time.perf_counter(), time.process_time()
    return {"load_s": t1 - t0, "breakdown_s": t2 - t1, "cpu_s": c2 - c0, "peak_rss_mib": _rss_mib(),
            "base_rss_mib": base,
            "numbers": numbers, "note": note}


def _hta_blocks(analysis) -> dict:
    from hta.analyzers.breakdown_analysis import BreakdownAnalysis
    from hta.utils.utils import get_kernel_type, merge_kernel_intervals
    sym = analysis.t.symbol_table.get_sym_table()
    out = {}
    for rank, df in analysis.t.traces.items():
        gpu = df[df["stream"].ne(-1)].copy()
        idle, kernel = BreakdownAnalysis._get_idle_time_for_kernels(gpu.copy())
        kinds = gpu["name"].apply(lambda x: get_kernel_type(sym[x]))
        comp = merge_kernel_intervals(gpu[kinds.eq("COMPUTATION")].copy())
        compute = comp.end.sum() - comp.ts.sum()
        out[int(rank)] = [float(idle), float(compute), float(kernel - compute - idle), float(kernel)]
    return out


def _run(python: str, role: str, trace_dir: Path, *, env: dict | None = None) -> dict:
    proc = subprocess.run([python, __file__, "--child", role, str(trace_dir)], capture_output=True, text=True,
                          timeout=600, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{role} child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _best(runs: list[dict]) -> dict:
    best = min(runs, key=lambda r: r["load_s"] + r["breakdown_s"])
    return {**best, "peak_rss_mib": min(r["peak_rss_mib"] for r in runs), "cpu_s": min(r["cpu_s"] for r in runs)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hta-python", default="/tmp/hta/bin/python")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for name, path in TRACES.items():
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(path, Path(tmp) / path.name)
            ours = _best([_run(args.python, "ours", Path(tmp)) for _ in range(args.repeat)])
            hta = _best([_run(args.hta_python, "hta", Path(tmp)) for _ in range(args.repeat)])
            hta_exact = _run(args.hta_python, "hta", Path(tmp), env=dict(os.environ, HTA_DISABLE_NS_ROUNDING="1"))
        _report(name, ours, hta)
        _report_exact(ours, hta_exact)


def _report(name: str, ours: dict, hta: dict) -> None:
    t_ours, t_hta = ours["load_s"] + ours["breakdown_s"], hta["load_s"] + hta["breakdown_s"]
    g_ours = ours["peak_rss_mib"] - ours["base_rss_mib"]
    g_hta = hta["peak_rss_mib"] - hta["base_rss_mib"]
    print(f"\n== {name}")
    print(f"time  load+breakdown: ours {t_ours:.3f} s (load {ours['load_s']:.3f}, breakdown {ours['breakdown_s']:.4f}, "
          f"+anatomy {ours['anatomy_s']:.3f}); HTA {t_hta:.3f} s (load {hta['load_s']:.3f}, "
          f"breakdown {hta['breakdown_s']:.3f})  -> {t_hta / t_ours:.1f}x faster")
    print(f"CPU time load+breakdown: ours {ours['cpu_s']:.3f} s; HTA {hta['cpu_s']:.3f} s  -> "
          f"{hta['cpu_s'] / ours['cpu_s']:.1f}x less CPU (steadier than wall time on a shared machine)")
    print(f"peak RSS: ours {ours['peak_rss_mib']:.0f} MiB (+{g_ours:.0f} over imports); HTA {hta['peak_rss_mib']:.0f} "
          f"MiB (+{g_hta:.0f})  -> {ours['peak_rss_mib'] / hta['peak_rss_mib']:.2f} of HTA's peak, "
          f"{g_ours / max(g_hta, 1e-9):.2f} of its growth")
    if hta.get("note"):
        print(f"HTA: {hta['note']}")
    for rank, theirs in hta["numbers"].items():
        mine, exact = ours["numbers"][str(rank)], ours["exact"][str(rank)]
        labels = ("idle", "compute", "non_compute", "kernel")
        print(f"rank {rank} µs   HTA " + " ".join(f"{k}={v:.0f}" for k, v in zip(labels, theirs)))
        print(f"rank {rank} µs  ours " + " ".join(f"{k}={v:.0f}" for k, v in zip(labels, mine)) + "  (HTA rounding)")
        diff = max(abs(a / exact[3] - b / theirs[3]) for a, b in zip(exact[:3], theirs[:3]))
        print(f"rank {rank} µs exact " + " ".join(f"{k}={v:.1f}" for k, v in zip(labels, exact))
              + f"  (no rounding: max share difference {100 * diff:.2f} points)")


def _report_exact(ours: dict, hta: dict) -> None:
    for rank, theirs in hta["numbers"].items():
        exact = ours["exact"][str(rank)]
        worst = max(abs(a - b) / max(abs(b), 1.0) for a, b in zip(exact, theirs))
        print(f"rank {rank} µs   HTA with HTA_DISABLE_NS_ROUNDING=1: "
              + " ".join(f"{v:.1f}" for v in theirs) + f"  -> ours differ by at most {100 * worst:.4f} %")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        role, trace_dir = sys.argv[2], sys.argv[3]
        print(json.dumps(child_ours(trace_dir) if role == "ours" else child_hta(trace_dir)))
    else:
        main()
