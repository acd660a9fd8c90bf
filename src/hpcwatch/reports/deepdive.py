"""One slow run looked into: the critical path of a rank's step (``hpcwatch steps TRACE --critical-path``) and
what changed between two runs or two step ranges (``hpcwatch steps A --compare B``), and the CUPTI
counters of each kernel where the trace has them (``hpcwatch steps TRACE --counters``).

Reads one Kineto trace, runs ``analysis.critical_path`` on the chosen window and returns the document the
command prints or emits as JSON: the path's length, its µs by what bounds it (HTA's ``bound_by``), the ops
and kernels with time on it (share of the path) and what would shorten the step. Times are µs on the
trace's clock, rounded as HTA rounds them.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcwatch.analysis.critical_path import BOUND_KINDS, CriticalPath, CriticalPathError, critical_path
from hpcwatch.errors import InputError
from hpcwatch.traces import KinetoTrace

if TYPE_CHECKING:  # each document imports its analysis when it runs: --critical-path loads no diff or counters
    from hpcwatch.analysis.trace_diff import OpChange, SideSteps

__all__ = [
    "critical_path_document",
    "counters_document",
    "diff_document",
    "read_trace",
    "DEFAULT_ANNOTATION",
    "EVENTS_LISTED",
]

#: The window of a step (HTA's usual choice: ``annotation="ProfilerStep"``).
DEFAULT_ANNOTATION = "ProfilerStep"
#: Ops and kernels the document lists (most time on the path first).
EVENTS_LISTED = 20
#: Ops and kernels named under each kind of time in ``shorten``.
SHORTEN_LISTED = 3
#: What to do about each kind of time on the path.
_ADVICE = {
    "cpu_bound": "host ops are on the path: the GPU waits on the CPU (fewer or fused ops, CUDA graphs, no host syncs)",
    "gpu_compute_bound": "GPU kernels are on the path: faster kernels shorten the step (fusion, lower precision)",
    "gpu_communication_bound": "collectives are on the path: overlap them with compute or shrink them",
    "gpu_kernel_kernel_overhead": "gaps between kernels of a stream are on the path: fewer, larger kernels",
    "gpu_kernel_launch_overhead": "launch delays are on the path: launch earlier or batch launches (CUDA graphs)",
}


def _by_name(cp: CriticalPath) -> list[dict[str, Any]]:
    """The path's op / kernel time summed by name (an op called 50 times on the path is one row), most first."""
    rows: dict[tuple[str, bool], list[int]] = {}
    for e in cp.events:
        row = rows.setdefault((e.name, e.on_gpu), [0, 0])
        row[0] += e.on_path_us
        row[1] += 1
    ranked = sorted(rows.items(), key=lambda kv: (-kv[1][0], kv[0][0]))[:EVENTS_LISTED]
    return [
        {
            "name": name,
            "on_gpu": on_gpu,
            "on_path_us": us,
            "share": us / cp.length_us if cp.length_us > 0 else None,
            "events": n,
        }
        for (name, on_gpu), (us, n) in ranked
    ]


def read_trace(path: str | os.PathLike[str]) -> tuple[KinetoTrace, tuple[str, ...]]:
    """One Kineto trace, with the warnings its reader gave.

    The registry's ``kineto`` format reads with this same function; asking the registry would load its table
    of every format first (~5 ms of a command whose 0.02 MB trace takes ~0.1 s in all).
    """
    from hpcwatch.sources.kineto import read_kineto

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = read_kineto(Path(path))
    return trace, tuple(str(w.message) for w in caught)


def critical_path_document(
    trace: KinetoTrace, *, annotation: str = DEFAULT_ANNOTATION, instances: tuple[int, int] = (0, 0)
) -> dict[str, Any]:
    """The critical path of ``trace``'s window as a JSON-ready document (InputError, one line, when there is none)."""
    try:
        cp = critical_path(trace, annotation=annotation, instances=instances)
    except CriticalPathError as err:
        raise InputError(f"{trace.path}: {err}") from err
    return _document(trace, cp)


def _document(trace: KinetoTrace, cp: CriticalPath) -> dict[str, Any]:
    length = cp.length_us
    shares = {k: (v / length if length > 0 else None) for k, v in cp.bound_by_us.items()}
    ranked = sorted((k for k in BOUND_KINDS if cp.bound_by_us[k] > 0), key=lambda k: -cp.bound_by_us[k])
    top = cp.events[:EVENTS_LISTED]
    shorten = [
        {
            "bound_by": k,
            "us": cp.bound_by_us[k],
            "share": shares[k],
            "what": _ADVICE[k],
            # the ops / kernels of that kind with most time on the path: making one faster shortens the step by
            # at most its time on the path (another chain may become the longest)
            "first": [
                {"name": e.name, "on_path_us": e.on_path_us, "saves_at_most_us": e.on_path_us}
                for e in cp.events
                if e.bound_by == k
            ][:SHORTEN_LISTED],
        }
        for k in ranked
    ]
    return {
        "path": trace.path,
        "rank": trace.rank,
        "clock": "trace µs (Kineto host clock; GPU activities are on it too), rounded as HTA rounds",
        "annotation": cp.annotation,
        "instances": list(cp.instances),
        "window_us": list(cp.window_us),
        "length_us": length,
        "bound_by_us": cp.bound_by_us,
        "bound_by_share": shares,
        "events": [
            {
                "row": e.event,
                "name": e.name,
                "on_gpu": e.on_gpu,
                "stream": e.stream,
                "bound_by": e.bound_by,
                "on_path_us": e.on_path_us,
                "share": e.share,
                "dur_us": e.dur_us,
            }
            for e in top
        ],
        "events_on_path": len(cp.events),
        "by_name": _by_name(cp),
        "shorten": shorten,
        "edges": [
            {
                "kind": e.kind,
                "duration_us": e.duration_us,
                "row": e.event,
                "bound_by": e.bound_by,
                "start_us": e.start_us,
                "end_us": e.end_us,
            }
            for e in cp.edges
        ],
        "graph": {"nodes": cp.nodes, "edges": cp.graph_edges},
        "has_syncs": cp.has_syncs,
        "warnings": []
        if cp.has_syncs
        else ["the trace has no CUDA sync events (cuda_sync): the path may miss GPU→CPU waits (as HTA warns)"],
    }


def diff_document(
    control: KinetoTrace,
    test: KinetoTrace,
    *,
    control_iterations: list[int] | None = None,
    test_iterations: list[int] | None = None,
    device: str = "all",
) -> dict[str, Any]:
    """What got slower or faster from ``control`` to ``test`` (HTA's TraceDiff), as a JSON-ready document."""
    from hpcwatch.analysis.trace_diff import TraceDiffError, trace_diff

    try:
        d = trace_diff(
            control, test, control_iterations=control_iterations, test_iterations=test_iterations, device=device
        )
    except TraceDiffError as err:
        raise InputError(str(err)) from err
    slower = [c for c in d.changes if c.diff_us > 0]
    faster = sorted((c for c in d.changes if c.diff_us < 0), key=lambda c: (c.diff_us, c.name))
    return {
        "control": {"path": control.path, "rank": control.rank, **_steps(d.control)},
        "test": {"path": test.path, "rank": test.rank, **_steps(d.test)},
        "device": d.device,
        "clock": "µs rounded as HTA rounds; host events on the host clock, GPU events' durations on the GPU clock",
        "slower": [_change(c) for c in slower],
        "faster": [_change(c) for c in faster],
        "new": list(d.new),
        "gone": list(d.gone),
        "unchanged": sum(1 for c in d.changes if c.diff_us == 0 and c.diff_counts == 0),
        "changes": [_change(c) for c in d.changes],
    }


def _steps(s: SideSteps) -> dict[str, Any]:
    return {"iterations": list(s.iterations), "host_step_us": s.host_step_us, "gpu_step_us": s.gpu_step_us}


def _change(c: OpChange) -> dict[str, Any]:
    return {
        "name": c.name,
        "on_gpu": c.on_gpu,
        "control_counts": c.control_counts,
        "test_counts": c.test_counts,
        "control_total_us": c.control_total_us,
        "test_total_us": c.test_total_us,
        "diff_counts": c.diff_counts,
        "diff_us": c.diff_us,
        "change": c.change,
        "share_of_step": c.share_of_step,
    }


def counters_document(trace: KinetoTrace) -> dict[str, Any]:
    """The CUPTI counters of each profiled kernel with the ops that launched it (HTA's counter analysis)."""
    from hpcwatch.analysis.counters import kernel_counters

    report = kernel_counters(trace)
    if report is None:
        raise InputError(
            f"{trace.path}: no CUPTI counters (cuda_profiler_range events): profile with Kineto's CUPTI range "
            "profiler (experimental_config profiler_metrics) to get them"
        )
    return {
        "path": trace.path,
        "rank": trace.rank,
        "clock": "trace µs; a range's duration is a profiled replay, not the kernel's normal time",
        "paired": report.paired,
        "launches": report.launches,
        "counter_names": list(report.counter_names),
        "kernels": [
            {
                "row": k.row,
                "name": k.name,
                "ts_us": k.ts_us,
                "dur_us": k.dur_us,
                "flops": k.flops,
                "top_level_op": k.top_level_op,
                "bottom_level_op": k.bottom_level_op,
                "op_stack": list(k.op_stack),
                "counters": k.counters,
            }
            for k in report.kernels
        ],
        "by_top_level_op": [
            {"op": o.op, "kernels": o.kernels, "flops": o.flops, "counters": o.counters} for o in report.by_top_level_op
        ],
        "warnings": []
        if report.paired
        else [
            f"{len(report.kernels)} profiled kernels but {report.launches} cudaLaunchKernel calls: "
            "kernels are not tied to ops (HTA refuses such a trace)"
        ],
    }
