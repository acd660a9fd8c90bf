"""The critical path of one rank's step: the longest chain of dependent CPU ops, launches, kernels and syncs.

HTA 0.5's ``critical_path_analysis`` (``hta/analyzers/critical_path_analysis.py``), rebuilt on the trace's
columns without pandas or networkx, so the answer is HTA's own (tests pin HTA 0.5.0's answers on HTA's
example traces, ``tests/data/kineto/hta_cp_expected.json``):

- Every CPU op (``cpu_op``), CUDA runtime / driver call and launched GPU activity of the window is two
  nodes, its start and its end; nodes are numbered in time order (numpy's quicksort, as pandas' sort does,
  so ties are broken the same way).
- **CPU threads**: the call stack of each thread links each op's start to its first child's start, a
  child's end to the next child's start, the last child's end to the op's end (weight = the time between
  them, attributed to the op that time is spent in), and each top-level op's end to the next one's start
  (a dependency, weight 0). The exit of a blocking call (``cudaStreamSynchronize``, ``cudaMemcpy``…)
  weighs 0: the waiting is the GPU's.
- **GPU streams**: each kernel's start→end weighs its duration. A kernel whose stream was empty when it
  was launched (queue length 1 at the launch, 0 at its start) and whose launch came after the stream's
  previous kernel ended hangs off its launch (``kernel launch delay``, weight = launch start → kernel
  start); else it follows the previous kernel of its stream (``kernel-kernel delay``, weight = the gap).
- **Syncs**: Stream Sync links the stream's last kernel to the end of the ``cudaStreamSynchronize``,
  Context Sync every stream's last kernel; Event Sync links the kernel launched last before the
  ``cudaEventRecord`` to the end of ``cudaEventSynchronize``; Stream Wait Event makes the next kernel
  launched after ``cudaStreamWaitEvent`` wait on that kernel (weight 0 each).
- The critical path is the longest path of that DAG (networkx's ``dag_longest_path``: its topological
  order and its first-maximum tie-breaking), and each of its edges is put down to an op or kernel and to
  what bounds it: ``cpu_bound``, ``gpu_compute_bound``, ``gpu_communication_bound`` (an ``nccl*Kernel``),
  ``gpu_kernel_kernel_overhead``, ``gpu_kernel_launch_overhead`` (HTA's ``bound_by``).

Times are µs on the trace's clock rounded as HTA rounds them (start up to the µs, end down); the window
is the chosen instances of an annotation (``ProfilerStep`` by default), from the first's start to the
last's end, as HTA takes it. Where HTA's rules are odd we keep them and say so (``docs/usage.md``,
"Critical path"); where HTA would fail (a sync edge on its own stream, a cycle) we raise ``CriticalPathError``
with one line instead. Pure function: a ``traces.KinetoTrace`` in, frozen structs out.
"""

from __future__ import annotations

import functools
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

import msgspec
import numpy as np

from hpcwatch.traces import CAT, KinetoTrace, gc_paused

__all__ = [
    "CriticalPathError",
    "PathEdge",
    "PathEvent",
    "CriticalPath",
    "critical_path",
    "HtaColumns",
    "hta_columns",
    "EDGE_OPERATOR",
    "EDGE_DEPENDENCY",
    "EDGE_LAUNCH_DELAY",
    "EDGE_KERNEL_KERNEL_DELAY",
    "EDGE_SYNC",
    "BOUND_KINDS",
]

EDGE_OPERATOR = "critical_path_operator"
EDGE_DEPENDENCY = "critical_path_dependency"
EDGE_LAUNCH_DELAY = "critical_path_kernel_launch_delay"
EDGE_KERNEL_KERNEL_DELAY = "critical_path_kernel_kernel_delay"
EDGE_SYNC = "critical_path_sync_dependency"
_EDGE_TYPES = (EDGE_OPERATOR, EDGE_DEPENDENCY, EDGE_LAUNCH_DELAY, EDGE_KERNEL_KERNEL_DELAY, EDGE_SYNC)
_OP, _DEP, _LAUNCH, _KK, _SYNC = range(5)

BOUND_KINDS: tuple[str, ...] = (
    "cpu_bound",
    "gpu_compute_bound",
    "gpu_communication_bound",
    "gpu_kernel_kernel_overhead",
    "gpu_kernel_launch_overhead",
)

#: HTA's ``CPGraph.BLOCKING_SYNC_CALLS``: their exit edge weighs 0.
_BLOCKING_CALLS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventQuery",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cudaMemcpyAsync",
    }
)
#: HTA's ``get_runtime_launch_events_query``: the calls that enqueue work on a stream.
_LAUNCH_CALLS = frozenset(
    {
        "cudaMemsetAsync",
        "cudaMemcpyAsync",
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cuLaunchKernel",
        "runFunction - job_prep_and_submit_for_execution",
        "hipLaunchKernel",
        "hipExtModuleLaunchKernel",
        "hipMemcpyAsync",
        "hipMemsetAsync",
        "hipMemcpyWithStream",
    }
)
_NCCL_KERNEL = re.compile(r"^nccl.*Kernel")
#: Most events a window may hold: its graph costs ~0.5 KB an event in Python objects.
MAX_WINDOW_EVENTS = 1_000_000


class CriticalPathError(ValueError):
    """The trace has no critical path to give (no such annotation, an inconsistent graph…); one line."""


class PathEdge(msgspec.Struct, frozen=True, kw_only=True):
    """One edge of the critical path, in path order."""

    kind: str
    """One of the ``EDGE_*`` types (HTA's ``CPEdgeType`` values)."""
    duration_us: int
    """Its weight as HTA reports it (µs; a sub-µs overlap left by rounding may read -1)."""
    event: int | None
    """Row (``KinetoTrace.events``) of the op or kernel it is put down to; None for launch / sync / dependency edges."""
    bound_by: str
    """HTA's ``bound_by``: one of ``BOUND_KINDS``, or "" for dependency and sync edges."""
    start_us: int
    end_us: int


class PathEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An op or kernel with time on the critical path."""

    event: int
    name: str
    on_gpu: bool
    stream: int
    bound_by: str
    on_path_us: int
    """Time of the path put down to it (µs)."""
    share: float
    """``on_path_us`` / the path's length."""
    dur_us: int
    """Its own duration (µs, rounded as HTA rounds)."""


class CriticalPath(msgspec.Struct, frozen=True, kw_only=True):
    """The critical path of one window of one rank."""

    annotation: str
    instances: tuple[int, int]
    window_us: tuple[float, float]
    """Start and end of the window (µs on the trace's clock)."""
    length_us: int
    """Sum of the path's edge weights (µs): how long the step takes if nothing off the path changes."""
    bound_by_us: dict[str, int]
    """µs of the path by ``BOUND_KINDS`` (HTA's ``summary()`` before it turns them into %)."""
    edges: tuple[PathEdge, ...]
    events: tuple[PathEvent, ...]
    """Ops and kernels on the path, most time first."""
    nodes: int
    """Nodes with an edge (networkx's count: an op's start or end that nothing links is not in the graph)."""
    graph_edges: int
    has_syncs: bool
    """The trace has CUDA sync events (``cuda_sync``); without them HTA warns the path may be wrong."""


# --- HTA's rounding and correlation ------------------------------------------------------------------------


class HtaColumns(msgspec.Struct, frozen=True):
    """The columns as HTA's dataframe has them: times rounded to whole µs, ``ic`` its ``index_correlation``."""

    ts: list[int]
    end: list[int]
    dur: list[int]
    cat: list[int]
    name: list[int]
    stream: list[int]
    pid: list[int]
    tid: list[int]
    corr: list[int]
    ic: list[int]
    wait_stream: list[int]
    wait_corr: list[int]
    alive: list[bool]
    """False for the rows HTA drops at load (``_without_last_step``)."""


def hta_columns(trace: KinetoTrace) -> HtaColumns:
    return _columns(trace)[0]


def _columns(trace: KinetoTrace) -> tuple[HtaColumns, _Arrays]:
    """``hta_columns`` as lists (for the per-event loops) and as the arrays they were made from."""
    ev = trace.events
    ts_f, dur_f = ev["ts_us"], ev["dur_us"]
    # HTA (round_down_time_stamps): start up to the µs, end down, duration between them.
    ts = np.ceil(ts_f).astype(np.int64)
    end = np.floor(ts_f + dur_f).astype(np.int64)
    n = len(ts)
    wait_stream = ev.get("wait_stream", np.full(n, -1, dtype=np.int32))
    wait_corr = ev.get("wait_corr", np.full(n, -1, dtype=np.int64))
    stream = ev["stream"].astype(np.int64)
    corr = ev["correlation"].astype(np.int64)
    name = ev["name_id"]
    names = trace.names
    sync_names = np.array([nm in ("Event Sync", "Context Sync") for nm in names] + [False], dtype=bool)
    gpu_side = ((stream >= 0) & (corr >= 0)) | sync_names[name]
    ic = _index_correlation(corr, gpu_side)
    a = _Arrays(
        ts=ts,
        end=end,
        cat=ev["cat"],
        name=name,
        stream=stream,
        ic=ic,
        alive=np.ones(n, dtype=bool),
        corr=corr,
        pid=ev["pid"],
        tid=ev["tid"],
        wait_stream=np.asarray(wait_stream),
        wait_corr=np.asarray(wait_corr),
    )
    c = HtaColumns(
        ts=ts.tolist(),
        end=end.tolist(),
        dur=a.dur.tolist(),
        cat=ev["cat"].tolist(),
        name=name.tolist(),
        stream=stream.tolist(),
        pid=ev["pid"].tolist(),
        tid=ev["tid"].tolist(),
        corr=corr.tolist(),
        ic=ic.tolist(),
        wait_stream=np.asarray(wait_stream).tolist(),
        wait_corr=np.asarray(wait_corr).tolist(),
        alive=[True] * n,
    )
    return c, a


def _index_correlation(corr: np.ndarray, gpu_side: np.ndarray) -> np.ndarray:
    """HTA's ``transform_correlation_to_index``: each CPU event with a correlation points at the GPU event with
    the same one and back; -1 without a correlation, 0 with one nobody else has (the last pairing wins)."""
    ic: np.ndarray = np.minimum(corr, 0).astype(np.int64)
    has = corr != -1
    cpu_rows = np.flatnonzero(has & ~gpu_side)
    gpu_rows = np.flatnonzero(has & gpu_side)
    # an inner join on correlation
    g_order = gpu_rows[np.argsort(corr[gpu_rows], kind="stable")]
    g_corr = corr[g_order]
    lo = np.searchsorted(g_corr, corr[cpu_rows], side="left")
    hi = np.searchsorted(g_corr, corr[cpu_rows], side="right")
    # pandas writes every (cpu, gpu) pair of the merge in order (the cpu rows in file order, each one's gpu rows
    # in file order), so what stays is a cpu row's last gpu row and a gpu row's last cpu row: taken directly,
    # never the pairs themselves (a correlation shared by n events on each side would make n² of them).
    matched = hi > lo
    cpu_m = cpu_rows[matched]
    ic[cpu_m] = g_order[hi[matched] - 1]
    order = np.argsort(corr[cpu_m], kind="stable")
    c_sorted = corr[cpu_m][order]
    last = np.r_[c_sorted[1:] != c_sorted[:-1], True] if len(c_sorted) else np.zeros(0, dtype=bool)
    last_cpu, last_corr = cpu_m[order][last], c_sorted[last]
    pos = np.searchsorted(last_corr, g_corr)
    found = pos < len(last_corr)
    found[found] = last_corr[pos[found]] == g_corr[found]
    ic[g_order[found]] = last_cpu[pos[found]]
    return np.asarray(ic, dtype=np.int64)


def _without_last_step(trace: KinetoTrace, c: HtaColumns, a: _Arrays) -> HtaColumns:
    """HTA's ``_filter_irrelevant_gpu_kernels``, which every HTA analysis runs at load: with two or more
    ``ProfilerStep`` names, host events from the last step's start on are dropped (the last step is taken as
    incomplete) and so are GPU events without a host event of their correlation. Dropped rows keep their
    place (``alive`` False) and take part in nothing."""
    steps = trace.name_mask(lambda n: "ProfilerStep" in n)
    if int(steps.sum()) < 2:
        return c
    ev = trace.events
    sync_names = np.array([nm in ("Event Sync", "Context Sync") for nm in trace.names] + [False], dtype=bool)
    stream, corr, name = ev["stream"], ev["correlation"], ev["name_id"]
    ts = a.ts
    gpu_side = ((stream >= 0) & (corr >= 0)) | sync_names[name]
    step_rows = ~gpu_side & steps[name]
    if not step_rows.any():
        return c
    kept_cpu = ~gpu_side & (ts < ts[step_rows].max())
    keep_arr = kept_cpu | (gpu_side & _isin(corr, corr[kept_cpu]))
    if keep_arr.all():
        return c
    a.alive = keep_arr
    return msgspec.structs.replace(c, alive=keep_arr.tolist())


def _isin(values: np.ndarray, among: np.ndarray) -> np.ndarray:
    """``np.isin`` by a sort and a search: ``np.isin`` goes through ``np.unique``, whose first call imports
    ``numpy.ma`` (tens of ms of the command's start, benchmarks/RESULTS.md)."""
    pool = np.sort(among)
    if not len(pool):
        return np.zeros(len(values), dtype=bool)
    pos = np.minimum(np.searchsorted(pool, values), len(pool) - 1)
    return np.asarray(pool[pos] == values, dtype=bool)


class _Arrays:
    """Columns of ``HtaColumns`` as numpy arrays, for the whole-column steps (the window, the nodes, the queues)."""

    def __init__(
        self,
        *,
        ts: np.ndarray,
        end: np.ndarray,
        cat: np.ndarray,
        name: np.ndarray,
        stream: np.ndarray,
        ic: np.ndarray,
        alive: np.ndarray,
        corr: np.ndarray,
        pid: np.ndarray,
        tid: np.ndarray,
        wait_stream: np.ndarray,
        wait_corr: np.ndarray,
    ) -> None:
        self.ts, self.end, self.dur = ts, end, end - ts
        self.cat, self.name, self.stream, self.ic, self.alive = cat, name, stream, ic, alive
        self.corr, self.pid, self.tid, self.wait_stream, self.wait_corr = corr, pid, tid, wait_stream, wait_corr


# --- the window -------------------------------------------------------------------------------------------


def _window(trace: KinetoTrace, c: HtaColumns, annotation: str, first: int, last: int) -> tuple[int, int]:
    matching = trace.name_mask(lambda n: annotation in n)
    found = np.flatnonzero(matching[trace.events["name_id"]]) if len(matching) else np.zeros(0, dtype=np.int64)
    rows = np.array([r for r in found.tolist() if c.alive[r]], dtype=np.int64)
    if not len(rows):
        raise CriticalPathError(f"no event named like {annotation!r} in the trace (the window of --critical-path)")
    chosen = rows[first : last + 1].tolist()
    if not chosen:
        raise CriticalPathError(f"the trace has {len(rows)} events named like {annotation!r}: no instance {first}")
    return min(c.ts[r] for r in chosen), max(c.end[r] for r in chosen)


def _clipped(a: _Arrays, names: Sequence[str], lo: int, hi: int) -> list[int]:
    """HTA's clipped frame: host events starting in the window (dur > 0) and the GPU events they launched."""
    cpu_in = a.alive & (a.stream == -1) & (lo <= a.ts) & (a.ts <= hi) & (a.dur > 0)
    wait_event = next((i for i, nm in enumerate(names) if nm == "Stream Wait Event"), -200)
    keep = cpu_in | (a.alive & (a.stream != -1) & (a.name == wait_event))
    g = a.ic[cpu_in]  # a host event points at the GPU event it launched
    g = g[g > 0]
    keep[g[a.alive[g] & (a.stream[g] != -1)]] = True
    return np.flatnonzero(keep).tolist()


# --- the graph --------------------------------------------------------------------------------------------


class _Graph:
    """A DAG as networkx keeps it: nodes 0..n-1, successors and predecessors in insertion order."""

    def __init__(self, ts: list[int]) -> None:
        self.ts = ts
        self.succ: list[dict[int, None]] = [{} for _ in ts]
        self.pred: list[dict[int, tuple[int, int]]] = [{} for _ in ts]  # v -> {u: (weight, type)}
        self.attributed: dict[tuple[int, int], int] = {}
        self.syncs: list[tuple[int, int]] = []
        """(u, v) of every sync edge added (one may have been overwritten since by another kind)."""

    def add_all(self, us: np.ndarray, vs: np.ndarray, weights: np.ndarray, kinds: np.ndarray) -> None:
        """``add`` of each (u, v) in order, with its weight (no sync edge among them)."""
        if np.any(us == vs):
            u = int(us[np.argmax(us == vs)])
            raise CriticalPathError(f"an edge from a node to itself (node {u}): the trace's times are inconsistent")
        succ, pred = self.succ, self.pred
        for u, v, w, kind in zip(us.tolist(), vs.tolist(), weights.tolist(), kinds.tolist(), strict=True):
            succ[u][v] = None
            pred[v][u] = (w, kind)

    def add(self, u: int, v: int, kind: int, zero: bool = False) -> tuple[int, int]:
        if u == v:
            raise CriticalPathError(f"an edge from a node to itself (node {u}): the trace's times are inconsistent")
        weight = 0 if kind in (_DEP, _SYNC) or zero else self.ts[v] - self.ts[u]
        self.succ[u][v] = None
        self.pred[v][u] = (weight, kind)
        if kind == _SYNC:
            self.syncs.append((u, v))
        return u, v


def _cmp_events(x: tuple[int, int, int, int], y: tuple[int, int, int, int]) -> int:
    """HTA's ``compare_events`` on (row, time, dur, type), type 1 start, -1 end."""
    if x[0] == y[0]:
        return -1 if x[3] == 1 else 1
    result = x[1] - y[1]
    if result == 0:
        if x[3] == y[3]:
            if x[3] == 1:
                result = (
                    ((-1 if x[0] < y[0] else 1) if x[0] != y[0] else 0) if x[2] == y[2] else (1 if x[2] < y[2] else -1)
                )
            else:
                result = (
                    ((1 if x[0] < y[0] else -1) if x[0] != y[0] else 0) if x[2] == y[2] else (-1 if x[2] < y[2] else 1)
                )
        elif x[2] > 0 and y[2] > 0:
            result = 1 if x[3] == 1 else -1
        elif x[2] == 0 and y[2] == 0:
            result = x[0] - y[0]
        else:
            result = -1 if x[3] == 1 else 1
    return result


_EVENT_KEY = functools.cmp_to_key(_cmp_events)


def _call_stack(rows: list[int], c: HtaColumns) -> tuple[dict[int, list[int]], dict[int, int]]:
    """Children (in order) and parent of each row of one thread, as HTA's ``CallStackGraph`` builds them."""
    return _tree(_stack_events(rows, c)[0])


def _tree(events: list[tuple[int, int]]) -> tuple[dict[int, list[int]], dict[int, int]]:
    children: dict[int, list[int]] = {-1: []}
    parent: dict[int, int] = {}
    on_stack: list[int] = []
    for r, kind in events:
        if kind == 1:
            if r in parent:
                continue  # HTA logs "node has already existed" and skips it
            p = on_stack[-1] if on_stack else -1
            children.setdefault(p, []).append(r)
            children[r] = []
            parent[r] = p
            on_stack.append(r)
        elif on_stack:
            on_stack.pop()
    return children, parent


class _Walk(NamedTuple):
    """One thread's walk, a column each: in the order HTA's DFS of its ``CallStackGraph`` visits them, each row
    entered then left."""

    row: np.ndarray
    entering: np.ndarray
    """True where the walk enters ``row``, False where it leaves it."""
    parent: np.ndarray
    """The row's parent in the call stack, -1 for a top-level one."""


def _walk(rows: list[int], c: HtaColumns, *, fast: bool = True) -> _Walk:
    """HTA's walk of one thread's call stack.

    HTA builds the tree with a stack over the start and end events in ``compare_events`` order (a start
    pushes the row under the top; an end pops the top, whichever row it is), then walks it depth first. When
    every duration is > 0 (a window's host events, ``_clipped``) each row is pushed once before it is popped and
    the stack is empty at the end, so the walk is that sweep itself: a push enters, a pop leaves (``_sweep_walk``);
    else we build the tree and walk it as HTA does (``fast=False``: always, as the tests compare).
    """
    order = _total_order(rows, c) if fast else None
    if order is not None:
        return _sweep_walk(*order)
    children, parent = _tree(_stack_events(rows, c, fast=False)[0])
    walk: list[tuple[int, bool, int]] = []
    todo: list[tuple[int, bool]] = [(-1, True)]  # iterative DFS: (row, entering?)
    while todo:
        r, entering = todo.pop()
        if entering:
            todo.append((r, False))
            todo.extend((ch, True) for ch in reversed(children.get(r, ())))
        if r != -1:
            walk.append((r, entering, parent.get(r, -1)))
    visited, entered, parents = zip(*walk) if walk else ((), (), ())
    return _Walk(np.array(visited, dtype=np.int64), np.array(entered, dtype=bool), np.array(parents, dtype=np.int64))


def _sweep_walk(row: np.ndarray, is_start: np.ndarray) -> _Walk:
    """The walk of a sweep in which each row is pushed before it is popped, without a stack: the row on top of a
    stack ``d`` deep is the one pushed by the last push that made it ``d`` deep (a pop below ``d`` since then
    would have been followed by a push back to ``d``), so each pop's row and each push's parent are a search
    among the pushes sorted by (depth, position)."""
    n = len(row)
    if not n:
        return _Walk(row, is_start, row)
    depth = np.cumsum(np.where(is_start, 1, -1))
    level = np.where(is_start, depth, depth + 1)  # the place in the stack each event pushes to or pops from
    pushes = np.flatnonzero(is_start)
    keys = level[pushes] * (n + 1) + pushes
    by_key = np.argsort(keys)
    keys, pushes = keys[by_key], pushes[by_key]

    def last_push(at_level: np.ndarray, before: np.ndarray) -> np.ndarray:
        found: np.ndarray = pushes[np.searchsorted(keys, at_level * (n + 1) + before) - 1]
        return found

    at = np.arange(n)
    top = np.where(is_start, at, last_push(level, at))  # the push of the row each event enters or leaves
    parent = np.where(level[top] > 1, row[last_push(level[top] - 1, top)], -1)
    return _Walk(row[top], is_start, parent)


def _total_order(rows: list[int], c: HtaColumns) -> tuple[np.ndarray, np.ndarray] | None:
    """(row, is start?) of one thread's starts and ends in HTA's ``compare_events`` order when every duration is
    > 0 (a window's host events always have one, ``_clipped``); None when one is not.

    With every duration > 0 that order is a total one: by time; at one time the ends first (shorter first, then
    the later row), then the starts (longer first, then the earlier row); a numpy sort on those keys gives it in
    one call. With a zero duration among them HTA's comparison is not transitive and the order is whatever
    Python's sort makes of it (``_stack_events``).
    """
    r = np.array(rows, dtype=np.int64)
    ts = np.array([c.ts[x] for x in rows], dtype=np.int64)
    dur = np.array([c.dur[x] for x in rows], dtype=np.int64)
    if len(r) and int(dur.min()) <= 0:
        return None
    is_start = np.concatenate([np.ones(len(r), dtype=bool), np.zeros(len(r), dtype=bool)])
    time = np.concatenate([ts, ts + dur])
    by_dur = np.concatenate([-dur, dur])
    by_row = np.concatenate([r, -r])
    order = np.lexsort((by_row, by_dur, is_start, time))  # the last key first
    return np.concatenate([r, r])[order], is_start[order]


def _stack_events(rows: list[int], c: HtaColumns, *, fast: bool = True) -> tuple[list[tuple[int, int]], bool]:
    """(row, 1 at its start / -1 at its end) of one thread in HTA's ``compare_events`` order: ``_total_order``
    when there is one, else sorted as HTA sorts (``fast=False``: always). The flag says whether the order was the
    total one."""
    order = _total_order(rows, c)
    if order is not None and fast:
        r, is_start = order
        return list(zip(r.tolist(), np.where(is_start, 1, -1).tolist(), strict=True)), True
    events: list[tuple[int, int, int, int]] = []
    for x in rows:
        d = max(c.dur[x], 0)
        events.append((x, c.ts[x], d, 1))
        events.append((x, c.ts[x] + d, d, -1))
    events.sort(key=_EVENT_KEY)
    return [(e[0], e[3]) for e in events], order is not None


class _Builder:
    def __init__(self, trace: KinetoTrace, c: HtaColumns, a: _Arrays, rows: list[int]) -> None:
        self.trace, self.c, self.a, self.rows = trace, c, a, rows
        names = trace.names
        self.sym = {nm: i for i, nm in enumerate(names)}
        host_cats = np.array([CAT["cpu_op"], CAT["cuda_runtime"], CAT["cuda_driver"]], dtype=np.int64)
        r = np.array(rows, dtype=np.int64)
        cat = a.cat[r]
        host = (cat == host_cats[0]) | (cat == host_cats[1]) | (cat == host_cats[2])
        node_rows = r[host | ((a.stream[r] != -1) & (a.ic[r] >= 0))]
        blocking = np.array(sorted(self.sym[b] for b in _BLOCKING_CALLS if b in self.sym), dtype=np.int64)
        ts = np.concatenate([a.ts[node_rows], a.end[node_rows]])
        order = np.argsort(ts, kind="quicksort")  # pandas' sort_values: the same ties
        m = len(node_rows)
        both = np.concatenate([node_rows, node_rows])
        place = np.empty(2 * m, dtype=np.int64)
        place[order] = np.arange(2 * m, dtype=np.int64)
        rows_list = node_rows.tolist()
        self.start: dict[int, int] = dict(zip(rows_list, place[:m].tolist(), strict=True))
        self.end: dict[int, int] = dict(zip(rows_list, place[m:].tolist(), strict=True))
        # the same as columns by row (-1: no node), for the call-stack walks
        self.start_at, self.end_at = np.full(len(a.ts), -1, dtype=np.int64), np.full(len(a.ts), -1, dtype=np.int64)
        self.start_at[node_rows], self.end_at[node_rows] = place[:m], place[m:]
        self.blocking_at = np.zeros(len(a.ts), dtype=bool)
        self.blocking_at[node_rows] = _isin(a.name[node_rows], blocking)
        self.node_row: list[int] = both[order].tolist()
        self.node_is_start: list[bool] = (order < m).tolist()
        self.launch_rows = self._launches()
        self.node_ts = ts[order]
        self.g = _Graph(self.node_ts.tolist())

    # CPU threads
    def cpu_threads(self) -> None:
        c = self.c
        threads: dict[tuple[int, int], list[int]] = defaultdict(list)
        for r in self.rows:
            threads[(c.pid[r], c.tid[r])].append(r)
        for rows in threads.values():
            if any(c.stream[r] > 0 for r in rows):
                continue  # a GPU stream, not a thread
            if not all(c.stream[r] < 0 for r in rows):
                continue  # HTA: device type unknown, not walked
            self._thread(rows)

    def _thread(self, rows: list[int]) -> None:
        """HTA's edges of one thread's call stack: each op or call its walk enters or leaves is linked to the one
        before (an op's start to its first child's, a child's end to the next child's start, the last child's end
        to the op's end), and a top-level op's end to the next one's start by a dependency of weight 0."""
        walk = _walk(rows, self.c)
        node = np.where(walk.entering, self.start_at[walk.row], self.end_at[walk.row])
        has = node >= 0  # an annotation has no node: the walk passes over it
        row, entering, parent, node = walk.row[has], walk.entering[has], walk.parent[has], node[has]
        if len(node) < 2:
            return
        open_after = np.cumsum(np.where(entering, 1, -1))
        dep = ~entering[:-1] & (open_after[:-1] == 0)  # the event before left a top-level op
        u, v = node[:-1], node[1:]
        zero = dep | (~entering[1:] & self.blocking_at[row[1:]])  # a blocking call's exit: the waiting is the GPU's
        weight = np.where(zero, 0, self.node_ts[v] - self.node_ts[u])
        self.g.add_all(u, v, weight, np.where(dep, _DEP, _OP))
        # an operator edge's time goes to the op it starts in, else to the one it ends in, else (an end to the
        # next start) to their parent
        event = np.where(entering[:-1], row[:-1], np.where(~entering[1:], row[1:], parent[:-1]))
        op = ~dep
        self.g.attributed.update(zip(zip(u[op].tolist(), v[op].tolist(), strict=True), event[op].tolist(), strict=True))

    def _attribute(self, uv: tuple[int, int], src_parent: int) -> None:
        u, v = uv
        kind = self.g.pred[v][u][1]
        if kind == _KK or self.node_is_start[u]:
            ev = self.node_row[u]
        elif not self.node_is_start[v]:
            ev = self.node_row[v]
        else:
            ev = src_parent
        self.g.attributed[uv] = ev

    # GPU streams and syncs
    def gpu(self) -> None:
        c, sym, g = self.c, self.sym, self.g
        n = len(c.ts)
        sync_cat = CAT["cuda_sync"]
        context_sync, stream_sync = sym.get("Context Sync", -1), sym.get("Stream Sync", -1)
        event_sync, wait_event = sym.get("Event Sync", -1), sym.get("Stream Wait Event", -1)
        q = self._queue_lengths()
        rows = [r for r in self.rows if (c.stream[r] != -1 or c.name[r] in (event_sync, context_sync)) and c.ic[r] >= 0]
        prev_launch = self._previous_launch_of_record()
        next_launch = self._next_launch_of_wait()
        sort_by = np.array([c.end[r] if c.cat[r] == sync_cat else c.ts[r] for r in rows], dtype=np.int64)
        rows = [rows[k] for k in np.argsort(sort_by, kind="quicksort").tolist()]
        last: dict[int, int] = {}
        kernel_sync: dict[int, int | None] = {}
        for r in rows:
            if c.cat[r] == sync_cat:
                name = c.name[r]
                if name in (wait_event, event_sync):
                    launch = prev_launch.get(c.wait_corr[r], -1) if c.wait_corr[r] != -1 else -1
                    if launch < 0:
                        continue
                    src_kernel = c.ic[launch]
                    if name == wait_event:
                        dest_launch = next_launch.get(c.ic[r], -1)
                        if dest_launch < 0:
                            continue
                        kernel_sync[c.ic[dest_launch]] = src_kernel
                    elif src_kernel in self.end:
                        self._sync_to_cpu(self.end[src_kernel], c.ic[r])
                    continue
                if name not in (stream_sync, context_sync):
                    continue
                nodes = (
                    list(last.values()) if name == context_sync else [last[c.stream[r]]] if c.stream[r] in last else []
                )
                for node in nodes:
                    self._sync_to_cpu(node, c.ic[r])
                continue
            s, e = self.start[r], self.end[r]
            self._attribute(g.add(s, e, _OP), -1)
            sync_src = kernel_sync.get(r)
            sync_end: int | None = None
            if sync_src is not None:
                sync_end = self.end.get(sync_src)
                if sync_end is None:
                    sync_src = None
                else:
                    g.add(sync_end, s, _SYNC)
                kernel_sync[r] = None
            runtime = c.ic[r]
            prev = last.get(c.stream[r])
            runtime_ts = c.ts[runtime] if 0 <= runtime < n else 0
            if (
                q.get(runtime) == 1
                and q.get(r) == 0
                and (prev is None or g.ts[prev] < runtime_ts)
                and (sync_end is None or g.ts[sync_end] < runtime_ts)
            ):
                if runtime not in self.start:
                    raise CriticalPathError(f"kernel row {r} was launched by row {runtime}, which is not in the window")
                g.add(self.start[runtime], s, _LAUNCH)
            elif prev is not None and (sync_end is None or g.ts[sync_end] < g.ts[prev]):
                self._attribute(g.add(prev, s, _KK), -1)
            last[c.stream[r]] = e

    def _sync_to_cpu(self, gpu_node: int, runtime: int) -> None:
        end = self.end.get(runtime)
        if end is None:
            return  # HTA would fail on it: the synchronizing call is outside the window
        self.g.add(gpu_node, end, _SYNC)

    def _launches(self) -> np.ndarray:
        """HTA's launch calls with a GPU event, in start order (numpy quicksort), with its kernel's stream."""
        a = self.a
        rows = np.flatnonzero(a.alive & _isin(a.name, self._ids(_LAUNCH_CALLS)) & (a.ic > 0))
        rows = rows[np.argsort(a.ts[rows], kind="quicksort")]
        on_a_stream: np.ndarray = rows[a.stream[a.ic[rows]] != -1]
        return on_a_stream

    def _ids(self, names: frozenset[str]) -> np.ndarray:
        return np.array(sorted(self.sym[nm] for nm in names if nm in self.sym), dtype=np.int64)

    def _queue_lengths(self) -> dict[int, int]:
        """HTA's queue length of each launch's and each kernel's stream just after it (+1 at a launch, -1 at a
        kernel's start), over the whole trace."""
        a = self.a
        launches = np.flatnonzero(a.alive & _isin(a.name, self._ids(_LAUNCH_CALLS)) & (a.ic > 0))
        gpu = np.flatnonzero(a.alive & (a.stream != -1))
        if not len(launches) or not len(gpu):
            return {}
        # a launch's stream: that of the last GPU event of its correlation (-1: none, the launch is passed over)
        by_corr = gpu[np.argsort(a.corr[gpu], kind="stable")]
        corrs = a.corr[by_corr]
        last = np.r_[corrs[1:] != corrs[:-1], True]
        corrs, last_gpu = corrs[last], by_corr[last]
        at = np.minimum(np.searchsorted(corrs, a.corr[launches]), len(corrs) - 1)
        launch_stream = np.where(corrs[at] == a.corr[launches], a.stream[last_gpu[at]], -1)
        kernels = gpu[_isin(a.corr[gpu], a.corr[launches])]
        merged = np.concatenate([launches, kernels])
        stream = np.concatenate([launch_stream, a.stream[kernels]])
        step = np.concatenate([np.ones(len(launches), dtype=np.int64), np.full(len(kernels), -1, dtype=np.int64)])
        order = np.argsort(a.ts[merged], kind="quicksort")
        order = order[stream[order] != -1]
        return dict(zip(merged[order].tolist(), _running_sums(stream[order], step[order]).tolist(), strict=True))

    def _previous_launch_of_record(self) -> dict[int, int]:
        """For each ``cudaEventRecord`` (by correlation) the last launch on its GPU and stream before it."""
        c, a, sym = self.c, self.a, self.sym
        record = sym.get("cudaEventRecord")
        if record is None:
            return {}
        stream_of: dict[int, tuple[int, int]] = {}
        for r in np.flatnonzero(a.alive & (a.wait_stream > -1)).tolist():
            stream_of.setdefault(c.wait_corr[r], (c.pid[r], c.wait_stream[r]))
        records = [r for r in np.flatnonzero(a.alive & (a.name == record)).tolist() if c.corr[r] in stream_of]
        found: dict[int, int] = {}
        launches_by: dict[tuple[int, int], list[int]] = defaultdict(list)
        for r in self.launch_rows.tolist():
            launches_by[(c.pid[c.ic[r]], c.stream[c.ic[r]])].append(r)
        records_by: dict[tuple[int, int], list[int]] = defaultdict(list)
        for r in records:
            records_by[stream_of[c.corr[r]]].append(r)
        for gpu_stream, rs in records_by.items():
            ls = launches_by.get(gpu_stream, [])
            merged = ls + rs
            order = np.argsort(np.array([c.ts[r] for r in merged], dtype=np.int64), kind="quicksort").tolist()
            previous = -1
            for k in order:
                if k < len(ls):
                    previous = merged[k]
                else:
                    found[c.corr[merged[k]]] = previous
        return found

    def _next_launch_of_wait(self) -> dict[int, int]:
        """For each ``cudaStreamWaitEvent`` row the next launch on its thread and stream."""
        c, a, sym = self.c, self.a, self.sym
        wait_call, wait_event = sym.get("cudaStreamWaitEvent"), sym.get("Stream Wait Event")
        if wait_call is None or wait_event is None:
            return {}
        waits = np.flatnonzero(a.alive & (a.name == wait_call) & (a.ic > 0))
        waits = waits[a.stream[a.ic[waits]] != -1].tolist()
        found: dict[int, int] = {}
        launches_by: dict[tuple[int, int, int], list[int]] = defaultdict(list)
        for r in self.launch_rows.tolist():
            launches_by[(c.pid[r], c.tid[r], c.stream[c.ic[r]])].append(r)
        waits_by: dict[tuple[int, int, int], list[int]] = defaultdict(list)
        for r in waits:
            waits_by[(c.pid[r], c.tid[r], c.stream[c.ic[r]])].append(r)
        for key, ws in waits_by.items():
            ls = launches_by.get(key, [])
            merged = ls + ws
            order = np.argsort(np.array([c.ts[r] for r in merged], dtype=np.int64), kind="quicksort").tolist()
            upcoming = -1
            for k in reversed(order):
                if k < len(ls):
                    upcoming = merged[k]
                else:
                    found[merged[k]] = upcoming
        return found


def _running_sums(key: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The running sum of ``step`` within each ``key``, in order: what a counter per key reads after each step."""
    by_key = np.argsort(key, kind="stable")
    sums = np.cumsum(step[by_key])
    k = key[by_key]
    first = np.r_[True, k[1:] != k[:-1]] if len(k) else np.zeros(0, dtype=bool)
    before = (sums - step[by_key])[first]  # the sum before each key's first step
    running: np.ndarray = np.empty_like(sums)
    running[by_key] = sums - before[np.cumsum(first) - 1]
    return running


def _longest_path(g: _Graph) -> list[int]:
    """networkx ``dag_longest_path``: distances in topological-generation order, first maximum wins.

    Kahn's sort with a first-in first-out queue visits the nodes generation by generation in networkx's order
    (``topological_generations``: the sources by number, then each one's newly free successors in the order
    their edges were added), so one pass over a growing list gives it.
    """
    n = len(g.ts)
    pred, succ = g.pred, g.succ
    indegree = [len(p) for p in pred]
    order = [v for v in range(n) if not indegree[v]]
    for u in order:  # the list grows as it is walked: a FIFO queue
        for v in succ[u]:
            indegree[v] -= 1
            if not indegree[v]:
                order.append(v)
    if len(order) != n:
        raise CriticalPathError("the dependency graph has a cycle (the trace's times or correlations are inconsistent)")
    if not n:
        return []
    dist = [0] * n
    back = list(range(n))
    for v in order:
        best, best_u = -1, v
        for u, (w, _) in pred[v].items():
            d = dist[u] + w if w > 0 else dist[u]  # HTA sets weights of -1 to 0 before the search
            if d > best:
                best, best_u = d, u
        if best >= 0:
            dist[v], back[v] = best, best_u
    top = max(dist)
    v = next(x for x in order if dist[x] == top)  # networkx walks its dist dict, filled in topological order
    path: list[int] = []
    prev: int | None = None
    while prev != v:
        path.append(v)
        prev, v = v, back[v]
    path.reverse()
    return path


def _bound_by(kind: int, event: int | None, c: HtaColumns, names: Sequence[str]) -> str:
    if kind == _KK:
        return "gpu_kernel_kernel_overhead"
    if kind == _LAUNCH:
        return "gpu_kernel_launch_overhead"
    if kind in (_DEP, _SYNC) or event is None or event < 0:
        return ""
    if c.stream[event] < 0:
        return "cpu_bound"
    if _NCCL_KERNEL.match(names[c.name[event]]):
        return "gpu_communication_bound"
    return "gpu_compute_bound"


def critical_path(
    trace: KinetoTrace, *, annotation: str = "ProfilerStep", instances: tuple[int, int] = (0, 0)
) -> CriticalPath:
    """The critical path of the window from instance ``instances[0]`` to ``instances[1]`` (inclusive, in file
    order) of the events whose name contains ``annotation`` (HTA's ``critical_path_analysis``; an empty
    annotation is the whole trace)."""
    with gc_paused():  # the graph is a few dicts and tuples a node, none in a cycle: nothing for the collector
        return _critical_path(trace, annotation, instances)


def _critical_path(trace: KinetoTrace, annotation: str, instances: tuple[int, int]) -> CriticalPath:
    c, arrays = _columns(trace)
    names = trace.names
    if not len(c.ts):
        raise CriticalPathError("the trace has no complete events")
    c = _without_last_step(trace, c, arrays)
    first, last = instances
    if annotation:
        lo, hi = _window(trace, c, annotation, first, last)
    else:
        # HTA: the whole (loaded) frame
        lo, hi = int(arrays.ts[arrays.alive].min()), int(arrays.end[arrays.alive].max())
    rows = _clipped(arrays, names, lo, hi)
    if len(rows) > MAX_WINDOW_EVENTS:
        raise CriticalPathError(f"{len(rows)} events in the window, over {MAX_WINDOW_EVENTS}: choose a shorter one")
    b = _Builder(trace, c, arrays, rows)
    b.cpu_threads()
    b.gpu()
    g = b.g
    _check_syncs(g, b, c)
    path = _longest_path(g)
    if len(path) < 2:
        raise CriticalPathError("the window has no dependent events: no critical path")
    edges: list[PathEdge] = []
    on_path: dict[int, int] = defaultdict(int)
    bound: dict[str, int] = dict.fromkeys(BOUND_KINDS, 0)
    for u, v in zip(path, path[1:]):
        w, kind = g.pred[v][u]
        event = g.attributed.get((u, v)) if kind in (_OP, _KK) else None
        by = _bound_by(kind, event, c, names)
        edges.append(
            PathEdge(
                kind=_EDGE_TYPES[kind],
                duration_us=w,
                event=event if event is not None and event >= 0 else None,
                bound_by=by,
                start_us=g.ts[u],
                end_us=g.ts[v],
            )
        )
        if by:
            bound[by] += w
        if event is not None and event >= 0 and kind == _OP:
            on_path[event] += w
    length = sum(e.duration_us for e in edges)
    events = sorted(
        (
            PathEvent(
                event=r,
                name=names[c.name[r]],
                on_gpu=c.stream[r] >= 0,
                stream=c.stream[r],
                bound_by=_bound_by(_OP, r, c, names),
                on_path_us=us,
                share=us / length if length > 0 else math.nan,
                dur_us=c.dur[r],
            )
            for r, us in on_path.items()
        ),
        key=lambda e: (-e.on_path_us, e.event),
    )
    return CriticalPath(
        annotation=annotation,
        instances=(first, last),
        window_us=(float(lo), float(hi)),
        length_us=length,
        bound_by_us=bound,
        edges=tuple(edges),
        events=tuple(events),
        nodes=sum(1 for p, s in zip(g.pred, g.succ, strict=True) if p or s),
        graph_edges=sum(map(len, g.pred)),
        has_syncs=bool(np.any(trace.events["cat"] == CAT["cuda_sync"])),
    )


def _check_syncs(g: _Graph, b: _Builder, c: HtaColumns) -> None:
    """HTA's ``_validate_graph``: a sync edge between two kernels of one stream makes the graph invalid."""

    def bad(u: int, v: int) -> bool:
        su = c.stream[b.node_row[u]]
        return g.pred[v][u][1] == _SYNC and su != -1 and su == c.stream[b.node_row[v]]

    if not any(bad(u, v) for u, v in g.syncs):
        return
    for v, preds in enumerate(g.pred):  # the first one in networkx's order, for its stream in the message
        for u, (_, kind) in preds.items():
            if kind != _SYNC:
                continue
            su, sv = c.stream[b.node_row[u]], c.stream[b.node_row[v]]
            if su != -1 and su == sv:
                raise CriticalPathError(
                    f"a CUDA sync between two kernels of stream {su}: the graph is invalid (as HTA says)"
                )
