"""Pin HTA 0.5's critical path on HTA's own example traces (run by hand, with HTA in its own venv).

    python3 -m venv /work/hta-venv && /work/hta-venv/bin/pip install HolisticTraceAnalysis==0.5.0 pandas==2.2.3
    /work/hta-venv/bin/python benchmarks/hta_critical_path_expected.py > tests/data/kineto/hta_cp_expected.json

(pandas 3 breaks HTA 0.5: ``drop(axis=1, columns=...)`` raises.) For each trace it writes HTA's path length,
its ``summary()`` in µs by ``bound_by`` and every edge of the path: type, weight, and the event it is put down
to as the row of the trace's complete events in file order (``KinetoTrace.events``; HTA numbers every
``traceEvents`` entry, so its index is mapped). HTA is never a dependency of hpcwatch.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "kineto"
#: (file under tests/data/kineto, annotation, instance) as HTA's own tests call critical_path_analysis.
CASES = (
    ("hta_cp_simple_add.json.gz", "[param|pytorch.model.alex_net|0|0|0|measure|forward]", 1),
    ("hta_alexnet_stream_sync.json.gz", "[param|pytorch.model.alex_net|0|0|0|measure|forward]", 1),
    ("hta_cp_event_sync.json.gz", "ProfilerStep", 0),
    ("hta_cp_event_sync_multi_stream.json.gz", "", 0),
    ("hta_mi250_rocm.json.gz", "ProfilerStep", 1),
    ("hta_a100_nccl_rank0.json.gz", "ProfilerStep", 0),
    ("hta_gpu_lags_host_rank0.json.gz", "ProfilerStep", 1),
    ("hta_gpu_lags_host_rank0.json.gz", "", 0),  # the whole trace, less HTA's dropped last step
)


def _x_rows(path: Path) -> dict[int, int]:
    """HTA's index of each complete event (its position in traceEvents) -> its row among complete events."""
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    rows: dict[int, int] = {}
    for i, ev in enumerate(events):
        if isinstance(ev, dict) and ev.get("ph") == "X":
            rows[i] = len(rows)
    return rows


def main() -> None:
    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis  # the HTA venv only

    out = {}
    for name, annotation, instance in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(DATA / name, Path(tmp) / name)
            t = TraceAnalysis(trace_dir=tmp)
            graph, ok = t.critical_path_analysis(rank=0, annotation=annotation, instance_id=instance)
        rows = _x_rows(DATA / name)
        edges = []
        it = iter(graph.critical_path_nodes)
        u = next(it)
        for v in it:
            e = graph.edges[u, v]["object"]
            ev = graph.get_event_attribution_for_edge(e)
            edges.append([e.type.value, int(e.weight), rows[ev] if ev is not None and ev >= 0 else None])
            u = v
        df = graph.get_critical_path_breakdown()
        summary = df.groupby("bound_by").duration.sum()
        key = f"{name} {annotation or '(whole trace)'} #{instance}"
        out[key] = {
            "file": name,
            "annotation": annotation,
            "instance": instance,
            "ok": bool(ok),
            "length_us": int(sum(w for _, w, _ in edges)),
            "bound_by_us": {k: int(v) for k, v in summary.items() if k},
            "nodes": graph.number_of_nodes(),
            "graph_edges": graph.number_of_edges(),
            "edges": edges,
        }
    doc = {
        "hta": "0.5.0",
        "env": {
            "CRITICAL_PATH_ADD_ZERO_WEIGHT_LAUNCH_EDGE": os.environ.get(
                "CRITICAL_PATH_ADD_ZERO_WEIGHT_LAUNCH_EDGE", "unset"
            )
        },
        "cases": out,
    }
    json.dump(doc, sys.stdout, separators=(",", ":"))  # compact: the paths have thousands of edges
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
