"""Which ops and kernels got slower or faster between two traces (or two step ranges of one): HTA's TraceDiff.

HTA 0.5's ``TraceDiff.compare_traces`` (``hta/trace_diff.py``) on the trace's columns: in each trace, the
events of the chosen iterations (``ProfilerStep#N``) are grouped by name, with their count and total
duration; the two sides are joined on the name (missing = 0) and the difference is test − control, with
``+`` / ``-`` / ``=`` for more, fewer or as many calls. Tests pin HTA 0.5.0's answer on HTA's own example
traces (``tests/data/kineto/hta_diff_expected.json``): the same names, counts and µs, exactly.

HTA's rules kept: times are µs rounded as HTA rounds them (start up to the µs, end down); a host event
(stream -1) belongs to the last ``ProfilerStep#N`` event (file order) whose span holds its start, a GPU
event (stream > 0) to the iteration of the launch it is correlated with; a GPU event on stream 0 belongs to
no iteration (HTA leaves it out too). What we add: each change as a share of the control's step, on the
host clock for host events and on the GPU clock for GPU events (the step's GPU span: first GPU activity
of the step to its last), and the lists of what is new and what is gone.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec
import numpy as np

from hpcwatch.analysis.critical_path import hta_columns
from hpcwatch.traces import KinetoTrace

__all__ = [
    "DEVICES",
    "TraceDiffError",
    "OpChange",
    "SideSteps",
    "TraceDiff",
    "iterations",
    "trace_diff",
]

#: Which events are compared: HTA's ``DeviceType`` (cpu: stream -1; gpu: any other stream; all: both).
DEVICES: tuple[str, ...] = ("all", "cpu", "gpu")
_STEP = re.compile(r"ProfilerStep\s*#\s*(\d+)")
#: Most ``ProfilerStep#N`` events a trace may have (each is a pass over the trace's host events).
MAX_STEP_EVENTS = 100_000


class TraceDiffError(ValueError):
    """The two traces cannot be compared as asked (no such iteration…); one line."""


class OpChange(msgspec.Struct, frozen=True, kw_only=True):
    """One op or kernel name across the two sides (HTA's row of ``compare_traces``)."""

    name: str
    on_gpu: bool
    """Its events run on the GPU (a stream); a name seen on both sides of the host/GPU line counts as GPU."""
    control_counts: int
    test_counts: int
    control_total_us: int
    test_total_us: int
    diff_counts: int
    diff_us: int
    change: str
    """HTA's ``counts_change_categories``: ``+`` more calls in test, ``-`` fewer, ``=`` as many."""
    share_of_step: float | None
    """``diff_us`` / the control's step (host step for host events, GPU step for GPU events); None without one."""


class SideSteps(msgspec.Struct, frozen=True, kw_only=True):
    """The chosen iterations of one side and how long they took."""

    iterations: tuple[int, ...]
    host_step_us: int
    """Sum of the ``ProfilerStep#N`` annotations' durations (µs, host clock)."""
    gpu_step_us: int | None
    """Sum over the iterations of (last GPU end − first GPU start) of their GPU events (µs, GPU clock); None without."""


class TraceDiff(msgspec.Struct, frozen=True, kw_only=True):
    device: str
    control: SideSteps
    test: SideSteps
    changes: tuple[OpChange, ...]
    """Every name of either side, most time gained first (largest ``diff_us``), then by name."""
    new: tuple[str, ...]
    """Names only the test side has."""
    gone: tuple[str, ...]
    """Names only the control side has."""


def iterations(trace: KinetoTrace) -> list[int]:
    """The trace's iteration numbers (``ProfilerStep#N`` names), sorted."""
    found = {int(m.group(1)) for n in trace.names if n.startswith("ProfilerStep") and (m := _STEP.match(n))}
    return sorted(found)


def _side(
    trace: KinetoTrace, chosen: Sequence[int] | None, device: str
) -> tuple[dict[str, tuple[int, int, bool]], SideSteps]:
    known = iterations(trace)
    if not known:
        raise TraceDiffError(f"{trace.path}: no ProfilerStep#N annotation: no iteration to compare")
    picked = tuple(chosen) if chosen else tuple(known[:1])
    missing = [i for i in picked if i not in known]
    if missing:
        raise TraceDiffError(
            f"{trace.path}: no iteration {missing[0]} (the trace has {known[0]}..{known[-1]}, {len(known)} of them)"
        )
    c = hta_columns(trace)
    names = trace.names
    step_of_name = {
        i: int(m.group(1)) for i, n in enumerate(names) if n.startswith("ProfilerStep") and (m := _STEP.match(n))
    }
    ts = np.array(c.ts, dtype=np.int64)
    dur = np.array(c.dur, dtype=np.int64)
    stream = np.array(c.stream, dtype=np.int64)
    name_id = trace.events["name_id"]
    iteration = np.full(len(ts), -1, dtype=np.int64)
    host = stream < 0
    host_steps = 0
    seen_host_step: set[int] = set()
    # lookups, not np.isin: its np.unique imports numpy.ma, tens of ms of the command (benchmarks/RESULTS.md)
    is_step = np.zeros(len(names) + 1, dtype=bool)
    is_step[list(step_of_name)] = True
    step_rows = np.flatnonzero(is_step[name_id]).tolist()
    if len(step_rows) > MAX_STEP_EVENTS:
        raise TraceDiffError(f"{trace.path}: {len(step_rows)} ProfilerStep events, over {MAX_STEP_EVENTS}")
    host_rows = np.flatnonzero(host)
    host_rows = host_rows[np.argsort(ts[host_rows], kind="stable")]
    host_ts = ts[host_rows]
    for r in step_rows:  # file order: the last one wins
        it = step_of_name[int(name_id[r])]
        lo, hi = np.searchsorted(host_ts, [ts[r], ts[r] + dur[r]], side="left")
        iteration[host_rows[lo:hi]] = it
        if it in picked and host[r] and it not in seen_host_step:
            seen_host_step.add(it)
            host_steps += int(dur[r])
    ic = np.array(c.ic, dtype=np.int64)
    gpu = stream > 0
    linked = gpu & (ic > 0)
    iteration[gpu] = -1
    iteration[linked] = iteration[ic[linked]]
    in_steps = np.zeros(len(ts), dtype=bool)
    for it in set(picked):
        in_steps |= iteration == it
    if device == "cpu":
        in_steps &= stream == -1
    elif device == "gpu":
        in_steps &= stream != -1
    summary: dict[str, tuple[int, int, bool]] = {}
    rows = np.flatnonzero(in_steps)
    ids = name_id[rows].astype(np.int64)
    counts = np.bincount(ids, minlength=len(names))
    totals = np.zeros(len(counts), dtype=np.int64)
    np.add.at(totals, ids, dur[rows])  # exact int64 sums (bincount's weights are float64)
    gpu_ids = np.bincount(ids[stream[rows] != -1], minlength=len(counts))
    for nid in np.flatnonzero(counts).tolist():  # by name: two ids of one name would be one row
        name = names[nid]
        count, total, on_gpu = summary.get(name, (0, 0, False))
        summary[name] = (count + int(counts[nid]), total + int(totals[nid]), on_gpu or bool(gpu_ids[nid]))
    gpu_span = 0
    any_gpu = False
    for it in picked:
        sel = (iteration == it) & (stream != -1)
        if sel.any():
            any_gpu = True
            gpu_span += int((ts[sel] + dur[sel]).max() - ts[sel].min())
    return summary, SideSteps(iterations=picked, host_step_us=host_steps, gpu_step_us=gpu_span if any_gpu else None)


def trace_diff(
    control: KinetoTrace,
    test: KinetoTrace,
    *,
    control_iterations: Sequence[int] | None = None,
    test_iterations: Sequence[int] | None = None,
    device: str = "all",
) -> TraceDiff:
    """HTA's ``compare_traces(control, test, control_iteration, test_iteration, device_type)``: each side's first
    iteration unless told, both sides' first rank (one trace each here)."""
    if device not in DEVICES:
        raise TraceDiffError(f"device {device!r}: one of {', '.join(DEVICES)}")
    a, a_steps = _side(control, control_iterations, device)
    b, b_steps = _side(test, test_iterations, device)
    changes = []
    for name in a.keys() | b.keys():
        ca, ta, ga = a.get(name, (0, 0, False))
        cb, tb, gb = b.get(name, (0, 0, False))
        on_gpu = ga or gb
        step = a_steps.gpu_step_us if on_gpu else a_steps.host_step_us
        diff = tb - ta
        changes.append(
            OpChange(
                name=name,
                on_gpu=on_gpu,
                control_counts=ca,
                test_counts=cb,
                control_total_us=ta,
                test_total_us=tb,
                diff_counts=cb - ca,
                diff_us=diff,
                change="+" if cb > ca else "-" if cb < ca else "=",
                share_of_step=diff / step if step else None,
            )
        )
    changes.sort(key=lambda ch: (-ch.diff_us, ch.name))
    return TraceDiff(
        device=device,
        control=a_steps,
        test=b_steps,
        changes=tuple(changes),
        new=tuple(sorted(n for n in b if n not in a)),
        gone=tuple(sorted(n for n in a if n not in b)),
    )
