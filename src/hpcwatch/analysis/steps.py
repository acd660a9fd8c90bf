"""Step anatomy: where each rank's time goes in each training step, and who waits for whom.

Per rank and step the anatomy splits the step into the phases of ``records.PHASES``:

- ``load``, ``forward``, ``backward``, ``optimizer``: the rank's own work, from the
  user annotations (``record_function`` names ``data_load``/``forward``/``backward``/
  ``optimizer``, HTA's ``## forward ##``, DDP's ``DistributedDataParallel.forward``,
  ``Optimizer.step#…``, Lightning's ``[Strategy]…training_step``…), else inferred
  from the operators (autograd ``evaluate_function`` ops are the backward).
- ``allreduce`` and ``barrier_wait``: the collectives. The same collective (the k-th
  of the step) is aligned across ranks; a rank that enters it early waits for the
  last one to arrive, and only then does data move::

      rank 0  ──compute──┤wait·········│xfer│
      rank 2  ──compute─────────────────┤xfer│      (the straggler: no wait)
                         ^ r0 start     ^ latest start

  ``barrier_wait`` of rank r = (latest start among ranks) − (r's start), clipped to the
  collective's duration; ``allreduce`` = the rest of the collective (the transfer).
  Collectives are the NCCL kernels on the GPU when there are some, else the host-side
  ``nccl:*``/``gloo:*`` annotations (gloo runs them on its own threads). Ranks on
  different hosts have different clocks: each rank's offset is estimated from the ends
  of its collectives (they end together) and removed first (``Anatomy.clock_offset_s``).

On GPU traces it also gives, per step, the GPU busy and idle time and the comm–compute
overlap, and per trace the temporal breakdown of Holistic Trace Analysis
(``temporal_breakdown``: idle / compute / non-compute, same rules as HTA's
``get_temporal_breakdown``, so the numbers agree).

Everything here is pure: traces (``traces.KinetoTrace``) or ``Span`` records in,
frozen structs (msgspec.Struct) out; times in seconds.
"""

from __future__ import annotations

import functools
import re
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, overload

import msgspec
import numpy as np
import orjson

from hpcwatch.errors import InputError
from hpcwatch.records import PHASES, Span
from hpcwatch.traces import CAT, IS_GPU_CATEGORY, KinetoTrace

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "merge_intervals",
    "RankStep",
    "Anatomy",
    "TemporalBreakdown",
    "anatomy_from_traces",
    "anatomy_from_timelines",
    "rank_timeline",
    "RankTimeline",
    "StepCell",
    "GpuStep",
    "anatomy_from_spans",
    "anatomy_from_span_table",
    "anatomy_of_pieces",
    "step_pieces",
    "StepPiece",
    "temporal_breakdown",
    "phase_of_annotation",
    "WORK_PHASES",
    "union_length",
    "union_lengths",
    "step_times_s",
    "median_step_time_s",
]

#: The phases that are a rank's own work (not waiting for others, not moving gradients).
WORK_PHASES: tuple[str, ...] = ("load", "forward", "backward", "optimizer")

# Annotation names → phase. Order matters: the first match wins.
# Lightning's profiler names: https://lightning.ai/docs/pytorch/stable/tuning/profiler_basic.html
# DDP: https://github.com/pytorch/pytorch/blob/main/torch/nn/parallel/distributed.py (record_function)
_PHASE_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("load", re.compile(r"data_?load|dataloader|DataLoader|get_batch", re.IGNORECASE)),
    ("optimizer", re.compile(r"optimizer|Optimizer\.(step|zero_grad)", re.IGNORECASE)),
    ("backward", re.compile(r"backward", re.IGNORECASE)),
    ("forward", re.compile(r"forward|training_step", re.IGNORECASE)),
    ("allreduce", re.compile(r"^(all_?reduce|reduce_grads|grad_sync)$", re.IGNORECASE)),
)
_BACKWARD_OP_PREFIX = "autograd::engine::evaluate_function"
_STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
# HTA's rule for "not a compute kernel" (hta/utils/utils.py NCCL_COMPUTE_KERNEL_RE, used with re.match).
_HTA_NON_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


def phase_of_annotation(name: str) -> str | None:
    """The phase a user annotation names, or ``None``."""
    if name.startswith(("ProfilerStep", "nccl:", "gloo:")):
        return None
    return next((phase for phase, rule in _PHASE_RULES if rule.search(name)), None)


class RankStep(msgspec.Struct, frozen=True, kw_only=True):
    """One rank's step: its phases (seconds) and, on GPU traces, the step on the GPU's own clock."""

    rank: int
    step: int
    start_s: float
    """Start, UTC seconds (trace seconds when the trace has no time origin)."""
    dur_s: float
    """The step's time: on GPU traces the GPU's step period (``gpu_period_s``), else the host's."""
    phases: Mapping[str, float]
    """Seconds per phase of ``records.PHASES`` (0 when absent), on the host's clock; the
    collectives' ``barrier_wait``/``allreduce`` come from the NCCL kernels when there are some."""
    host_dur_s: float | None = None
    """The host's step (its ``ProfilerStep#N`` range), labelled as such."""
    gpu_busy_s: float | None = None
    gpu_idle_s: float | None = None
    """Gaps between the step's first and last GPU activity."""
    overlap_s: float | None = None
    """Time when communication and compute kernels run at once."""
    gpu_period_s: float | None = None
    """The step on the GPU's clock: from the end of the previous step's GPU work to the end of
    this step's (the first step: to the next step's first GPU activity, or its own span)."""
    gpu_compute_s: float | None = None
    """Union of the step's compute kernels (HTA's kinds: not NCCL, not memcpy/memset/sync)."""
    gpu_comm_s: float | None = None
    """Union of the step's communication (NCCL) kernels."""
    gpu_phases: Mapping[str, float] | None = None
    """GPU seconds per work phase: the union of the kernels launched from the phase's host range
    (correlation ids), else its ``gpu_user_annotation`` ranges (see ``_gpu_phases``)."""
    gpu_lag_s: float | None = None
    """End of the step's GPU work − end of its host step: > 0 when the GPU runs behind the host."""
    late_s: float | None = None
    """Sum over the step's collectives of this rank's arrival (k-th NCCL kernel start) after
    the median rank's: how late the others found it."""
    last_arrivals: int = 0
    """Collectives of the step this rank arrived at last."""
    collectives: int = 0
    """Collectives of the step aligned across ranks."""

    @property
    def work_s(self) -> float:
        """The rank's own work: load + forward + backward + optimizer."""
        return sum(self.phases.get(p, 0.0) for p in WORK_PHASES)


class Anatomy(msgspec.Struct, frozen=True, kw_only=True):
    """Step anatomy of a job: one ``RankStep`` per (rank, step)."""

    world_size: int
    ranks: tuple[int, ...]
    steps: tuple[int, ...]
    rank_steps: Sequence[RankStep]
    """Step by step, rank by rank: a tuple, or a ``RankStepGrid`` (spans read as columns), equal to it."""
    placement: Mapping[int, tuple[str | None, int | None]] = msgspec.field(default_factory=dict)
    """rank → (node, GPU index), when the traces or spans said."""
    source: str = "kineto"
    job: str | None = None
    clock_offset_s: Mapping[int, float] = msgspec.field(default_factory=dict)
    """rank → its clock's offset from the median rank's, estimated from collective ends and
    removed before the waits are computed (traces only)."""
    gpu_collectives: bool = False
    """The collectives (waits, arrivals) are NCCL kernels on the GPU, not host-side calls."""

    @property
    def has_gpu(self) -> bool:
        """Whether the steps carry GPU time (kernel-level traces)."""
        if isinstance(self.rank_steps, RankStepGrid):
            return False  # spans carry phases on the host's clock only
        return any(rs.gpu_compute_s is not None for rs in self.rank_steps)

    def matrix(self, phase: str) -> np.ndarray:
        """Seconds of ``phase`` (or ``"work"``, ``"step"``, a GPU field of ``RankStep`` such as
        ``"gpu_compute_s"``, or ``"gpu:backward"``) as a ranks × steps array (NaN where missing)."""
        if isinstance(self.rank_steps, RankStepGrid):
            return self.rank_steps.matrix(phase)
        out = np.full((len(self.ranks), len(self.steps)), np.nan)
        rows, cols = _grid(self)
        if phase in PHASES:  # the common case, without a call per cell
            values = [rs.phases.get(phase, 0.0) for rs in self.rank_steps]
        else:
            values = [_cell(rs, phase) for rs in self.rank_steps]
        out[rows, cols] = np.asarray(values, dtype=float)
        return out


#: Recent anatomies' (row, column) of each rank step in ``Anatomy.matrix``, keyed by their ``rank_steps``
#: tuple (held, so its id is not reused): a straggler report asks for twenty matrices of the same anatomy,
#: and at 1,536 ranks finding each cell's place by dictionary was most of its time.
_GRIDS: dict[int, tuple[Sequence[RankStep], tuple[int, ...], tuple[int, ...], np.ndarray, np.ndarray]] = {}
_GRIDS_KEPT = 2  # a report works on one anatomy at a time; each holds its rank steps alive
_GRIDS_LOCK = threading.Lock()


def _grid(anatomy: Anatomy) -> tuple[np.ndarray, np.ndarray]:
    key = id(anatomy.rank_steps)
    with _GRIDS_LOCK:
        found = _GRIDS.get(key)
    if found is not None and found[0] is anatomy.rank_steps and found[1:3] == (anatomy.ranks, anatomy.steps):
        return found[3], found[4]
    r_index = {r: i for i, r in enumerate(anatomy.ranks)}
    s_index = {s: j for j, s in enumerate(anatomy.steps)}
    n = len(anatomy.rank_steps)
    rows = np.fromiter((r_index[rs.rank] for rs in anatomy.rank_steps), dtype=np.int64, count=n)
    cols = np.fromiter((s_index[rs.step] for rs in anatomy.rank_steps), dtype=np.int64, count=n)
    with _GRIDS_LOCK:
        while len(_GRIDS) >= _GRIDS_KEPT:
            del _GRIDS[next(iter(_GRIDS))]
        _GRIDS[key] = (anatomy.rank_steps, anatomy.ranks, anatomy.steps, rows, cols)
    return rows, cols


def _cell(rs: RankStep, what: str) -> float:
    if what == "work":
        return rs.work_s
    if what == "step":
        return rs.dur_s
    if what in _GPU_CELLS:
        value = getattr(rs, what)
        return np.nan if value is None else float(value)
    if what.startswith("gpu:"):
        return np.nan if rs.gpu_phases is None else float(rs.gpu_phases.get(what[4:], 0.0))
    return rs.phases.get(what, 0.0)


#: RankStep fields ``Anatomy.matrix`` gives by name (besides phases, ``work``, ``step`` and ``gpu:PHASE``).
_GPU_CELLS = frozenset(
    {
        "host_dur_s",
        "gpu_busy_s",
        "gpu_idle_s",
        "overlap_s",
        "gpu_period_s",
        "gpu_compute_s",
        "gpu_comm_s",
        "gpu_lag_s",
        "late_s",
        "last_arrivals",
        "collectives",
    }
)


class RankStepGrid(Sequence[RankStep]):
    """An anatomy's rank steps kept as matrices, each ``RankStep`` made only when one is read: what
    ``anatomy_from_span_table`` returns. A 1,536-rank job's 50 recent steps are 76,800 of them, and the
    reports on spans (stragglers, the job page) read only ``Anatomy.matrix``. The order is the tuple's
    (step by step, rank by rank), the values its values to the last bit, and it equals that tuple.
    Host phases only, as spans have: every GPU field is None, ``last_arrivals`` and ``collectives`` 0."""

    def __init__(
        self, ranks: np.ndarray, steps: np.ndarray, phase_s: np.ndarray, start_s: np.ndarray, end_s: np.ndarray
    ) -> None:
        """``phase_s``: steps × ranks × ``PHASES``; ``start_s``, ``end_s``: steps × ranks (first and last
        activity of the rank's step)."""
        self._ranks, self._steps = ranks.tolist(), steps.tolist()
        self._phase_s, self._start_s, self._end_s = phase_s, start_s, end_s
        self._made: tuple[RankStep, ...] | None = None

    def __len__(self) -> int:
        return len(self._ranks) * len(self._steps)

    @overload
    def __getitem__(self, index: int) -> RankStep: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[RankStep, ...]: ...
    def __getitem__(self, index: int | slice) -> RankStep | tuple[RankStep, ...]:
        return self._all()[index]

    def __iter__(self) -> Iterator[RankStep]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return self._all() == tuple(other)

    def __hash__(self) -> int:
        return hash(self._all())

    def __repr__(self) -> str:
        return f"RankStepGrid({len(self._ranks)} ranks × {len(self._steps)} steps)"

    def matrix(self, what: str) -> np.ndarray:
        """``Anatomy.matrix`` (ranks × steps) from the matrices, without a ``RankStep``."""
        if what in PHASES:
            return self._phase_s[:, :, PHASES.index(what)].T.copy()
        if what == "work":  # RankStep.work_s's sum, term by term in the same order: the same bits
            total = np.zeros(self._start_s.shape)
            for p in WORK_PHASES:
                total = total + self._phase_s[:, :, PHASES.index(p)]
            return total.T.copy()
        if what == "step":
            step: np.ndarray = (self._end_s - self._start_s).T.copy()  # numpy's stubs say Any
            return step
        if what in ("last_arrivals", "collectives"):
            return np.zeros((len(self._ranks), len(self._steps)))
        if what in _GPU_CELLS or what.startswith("gpu:"):
            return np.full((len(self._ranks), len(self._steps)), np.nan)
        return np.zeros((len(self._ranks), len(self._steps)))  # a phase no span has: 0, as ``_cell`` says

    def _all(self) -> tuple[RankStep, ...]:
        if self._made is None:
            made = []
            for k, step in enumerate(self._steps):
                rows = zip(self._ranks, self._phase_s[k].tolist(), self._start_s[k].tolist(), self._end_s[k].tolist())
                made += [
                    RankStep(rank=rank, step=step, start_s=lo, dur_s=hi - lo, phases=dict(zip(PHASES, row)))
                    for rank, row, lo, hi in rows
                ]
            self._made = tuple(made)
        return self._made


class TemporalBreakdown(msgspec.Struct, frozen=True, kw_only=True):
    """HTA's temporal breakdown of one rank's GPU time (µs, as HTA reports it)."""

    rank: int
    idle_us: float
    compute_us: float
    non_compute_us: float
    kernel_us: float
    """From the start of the first GPU activity to the end of the last."""

    def pct(self) -> dict[str, float]:
        total = self.kernel_us or 1.0
        return {
            "idle": 100 * self.idle_us / total,
            "compute": 100 * self.compute_us / total,
            "non_compute": 100 * self.non_compute_us / total,
        }


def step_times_s(anatomy: Anatomy) -> np.ndarray:
    """Each step's time, in the order of ``anatomy.steps``: the slowest rank's.

    This is hpcwatch's one definition of a step time, used by every report (CLI,
    web, exporter): a synchronous step ends when its last rank ends, so the step
    lasts as long as its slowest rank's step (``RankStep.dur_s``, first to last
    activity of that rank)::

        rank 0  |==work==|wait····|xfer|
        rank 2  |==work=============|xfer|   <- step time = this rank's duration
    """
    if not anatomy.steps:
        return np.zeros(0)
    slowest: np.ndarray = np.nanmax(anatomy.matrix("step"), axis=0)  # numpy's stubs say Any
    return slowest


def median_step_time_s(anatomy: Anatomy) -> float | None:
    """The median of ``step_times_s`` (``None`` without steps): the job's typical step."""
    times = step_times_s(anatomy)
    return float(np.median(times)) if len(times) else None


# --- intervals -----------------------------------------------------------------------------------------


def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint, sorted intervals covering the given ones (touching ones stay apart, as HTA's
    ``merge_kernel_intervals``)."""
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    firsts = np.flatnonzero(new)
    return s[firsts], np.maximum.reduceat(e, firsts)


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length covered by the intervals [start, end) (overlaps counted once)."""
    s, e = merge_intervals(starts, ends)
    return float((e - s).sum())


def _clip_union(starts: np.ndarray, ends: np.ndarray, lo: float, hi: float) -> float:
    s, e = np.clip(starts, lo, hi), np.clip(ends, lo, hi)
    keep = e > s
    return union_length(s[keep], e[keep])


def union_lengths(starts: np.ndarray, ends: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """``union_length`` of each group's intervals (``groups``: the group, 0..n_groups-1, of each interval)
    in a few numpy calls instead of a dozen per group, and equal to it to the last bit: the same merge,
    and each group's lengths summed by numpy's own ``sum`` of its slice (``np.add.reduceat`` adds in
    another order, so its totals differ in the last bits).

    The running furthest end restarts at each group: ends are replaced by their rank among all ends,
    offset by group × (number of distinct ends), so a group's keys all exceed the previous group's.
    """
    out = np.zeros(n_groups)
    if len(starts) == 0:
        return out
    order = np.lexsort((starts, groups))  # stable: ties keep their order, as merge_intervals' argsort
    s, e, g = starts[order], ends[order], groups[order].astype(np.int64)
    values, rank = np.unique(e, return_inverse=True)
    offset = g * len(values)
    reach = values[np.maximum.accumulate(offset + rank.reshape(-1)) - offset]
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = (g[1:] != g[:-1]) | (s[1:] > reach[:-1])
    firsts = np.flatnonzero(new)
    length, owner = np.maximum.reduceat(e, firsts) - s[firsts], g[firsts]
    cuts = np.flatnonzero(np.diff(owner)) + 1
    for group, part in zip(owner[np.r_[0, cuts]].tolist(), np.split(length, cuts)):
        out[group] = part.sum()
    return out


# --- HTA temporal breakdown ------------------------------------------------------------------------------


def _step_windows(trace: KinetoTrace) -> list[tuple[int, float, float]]:
    """(step number, start µs, end µs) of the ``ProfilerStep#N`` annotations (each name's first host
    event), by start."""
    ev = trace.events
    numbers = {i: int(found.group(1)) for i, name in enumerate(trace.names) if (found := _STEP_RE.match(name))}
    if not numbers:
        return []
    is_step = np.zeros(len(trace.names), dtype=bool)
    is_step[list(numbers)] = True
    rows = np.flatnonzero(is_step[ev["name_id"]] & (ev["stream"] < 0) & (ev["cat"] != CAT["gpu_user_annotation"]))
    ids, first = np.unique(ev["name_id"][rows], return_index=True)  # by name id, as the names are numbered
    rows = rows[first]
    steps = [
        (numbers[i], float(ts), float(ts + dur))
        for i, ts, dur in zip(ids.tolist(), ev["ts_us"][rows].tolist(), ev["dur_us"][rows].tolist())
    ]
    return sorted(steps, key=lambda s: s[1])


def _launch_ts(trace: KinetoTrace, gpu_rows: np.ndarray) -> np.ndarray:
    """Host launch time (µs) of each GPU activity, through the correlation id; NaN when unknown."""
    ev = trace.events
    host = np.flatnonzero((ev["stream"] < 0) & (ev["correlation"] >= 0))
    corr, ts = ev["correlation"][host], ev["ts_us"][host]
    order = np.argsort(corr, kind="stable")
    corr, ts = corr[order], ts[order]
    wanted = ev["correlation"][gpu_rows]
    pos = np.clip(np.searchsorted(corr, wanted), 0, max(len(corr) - 1, 0))
    found = (len(corr) > 0) & (corr[pos] == wanted) if len(corr) else np.zeros(len(wanted), dtype=bool)
    return np.where(found, ts[pos] if len(corr) else np.nan, np.nan)


def _compute_names(trace: KinetoTrace) -> np.ndarray:
    """Whether each name is a compute kernel's by HTA's rule (by name id)."""
    return trace.name_mask(lambda n: _HTA_NON_COMPUTE_RE.match(n) is None)


def _gpu_rows(trace: KinetoTrace) -> np.ndarray:
    return np.flatnonzero(IS_GPU_CATEGORY[trace.events["cat"]])


def temporal_breakdown(
    trace: KinetoTrace, *, include_last_step: bool = False, round_us: bool = False
) -> TemporalBreakdown:
    """Idle / compute / non-compute GPU time of one rank, by HTA's rules.

    Like HTA, only GPU activities launched before the last ``ProfilerStep`` starts count
    (the last step is often cut short), unless ``include_last_step``; with fewer than
    two steps every activity counts. Compute kernels are those HTA calls compute (not
    NCCL, not memcpy/memset, not a sync); idle time is the gaps between activities.
    ``round_us`` rounds each activity inward to whole µs (start up, end down) as HTA does
    by default (https://github.com/pytorch/pytorch/pull/122425); it turns sub-µs gaps
    into idle time, so leave it off unless you compare with HTA's own numbers.
    """
    ev = trace.events
    rows = _gpu_rows(trace)
    steps = _step_windows(trace)
    if len(steps) >= 2:
        limit = max(s[2] for s in steps) if include_last_step else max(s[1] for s in steps)
        launch = _launch_ts(trace, rows)
        rows = rows[(launch < limit) if not include_last_step else (launch <= limit)]
    if len(rows) == 0:
        raise InputError(f"{trace.path}: no GPU activity to break down (a CPU-only trace?)")
    starts, ends = ev["ts_us"][rows], ev["ts_us"][rows] + ev["dur_us"][rows]
    if round_us:
        starts, ends = np.ceil(starts), np.floor(ends)
    kernel_us = float(ends.max() - starts.min())
    busy_us = union_length(starts, ends)
    compute = _compute_names(trace)[ev["name_id"][rows]]
    compute_us = union_length(starts[compute], ends[compute])
    idle_us = kernel_us - busy_us
    return TemporalBreakdown(
        rank=trace.rank,
        idle_us=idle_us,
        compute_us=compute_us,
        non_compute_us=kernel_us - compute_us - idle_us,
        kernel_us=kernel_us,
    )


# --- anatomy from traces ------------------------------------------------------------------------------


class _Window(msgspec.Struct, frozen=True):
    step: int
    lo: float
    hi: float
    """µs; ``hi`` is the step's end (the next step's start bounds collectives)."""
    next_lo: float


def _windows(trace: KinetoTrace) -> list[_Window]:
    steps = _step_windows(trace)
    if not steps:
        ev = trace.events
        lo, hi = float(ev["ts_us"].min()), float((ev["ts_us"] + ev["dur_us"]).max())
        return [_Window(0, lo, hi, hi)]
    nexts = [s[1] for s in steps[1:]] + [steps[-1][2]]
    return [_Window(n, lo, hi, max(hi, nxt)) for (n, lo, hi), nxt in zip(steps, nexts)]


class _HostRows(msgspec.Struct, frozen=True):
    """What the per-step phase intervals read, found once per trace (not once per step)."""

    ts: np.ndarray
    end: np.ndarray
    """``ts + dur`` of every event (µs)."""
    notes: np.ndarray
    """Rows of the host user annotations that name a phase, in file order ..."""
    note_phase: tuple[str, ...]
    """... and the phase of each."""
    ops: np.ndarray
    """Rows of the host operators (``cpu_op``), for phases inferred when nothing is annotated ..."""
    op_backward: np.ndarray
    """... whether each is an autograd ``evaluate_function``."""
    optimizer: np.ndarray
    """Rows of the events named ``Optimizer.*``."""


def _host_rows(trace: KinetoTrace) -> _HostRows:
    ev = trace.events
    notes = np.flatnonzero(ev["cat"] == CAT["user_annotation"])
    phase = [_phase_of_name(trace, n) for n in ev["name_id"][notes].tolist()]
    named = np.array([p is not None for p in phase], dtype=bool)
    ops = np.flatnonzero(ev["cat"] == CAT["cpu_op"])
    backward = trace.name_mask(lambda n: n.startswith(_BACKWARD_OP_PREFIX))
    optimizer = trace.name_mask(lambda n: n.startswith("Optimizer."))
    return _HostRows(
        ts=ev["ts_us"],
        end=ev["ts_us"] + ev["dur_us"],
        notes=notes[named],
        note_phase=tuple(p for p in phase if p is not None),
        ops=ops,
        op_backward=backward[ev["name_id"][ops]],
        optimizer=np.flatnonzero(optimizer[ev["name_id"]]),
    )


def _annotation_intervals(rows: _HostRows, w: _Window) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per phase, the host user annotations inside the step, clipped to it (µs)."""
    inside = np.flatnonzero((rows.ts[rows.notes] < w.hi) & (rows.end[rows.notes] > w.lo))
    by_phase: dict[str, list[int]] = defaultdict(list)
    for k in inside.tolist():
        by_phase[rows.note_phase[k]].append(rows.notes[k])
    out = {}
    for phase, idx in by_phase.items():
        idx_a = np.asarray(idx)
        out[phase] = (_clip(rows.ts[idx_a], w.lo, w.hi), _clip(rows.end[idx_a], w.lo, w.hi))
    return out


def _clip(values: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """``np.clip`` (the same values) in two ufunc calls: np.clip's dispatch costs ~2 µs a call, ~8k calls a set."""
    clipped: np.ndarray = np.minimum(np.maximum(values, lo), hi)  # numpy's stubs say Any
    return clipped


def _phase_of_name(trace: KinetoTrace, name_id: int) -> str | None:
    return _phase_of_annotation_cached(trace.names[name_id])


@functools.lru_cache(maxsize=4096)
def _phase_of_annotation_cached(name: str) -> str | None:
    return phase_of_annotation(name)


def _inferred_intervals(rows: _HostRows, w: _Window) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Forward/backward/optimizer from the operators when there are no annotations.

    Backward = from the first to the last autograd ``evaluate_function`` op; forward =
    the host time before it; optimizer = ``Optimizer.*`` ops after it.
    """
    op_ts = rows.ts[rows.ops]
    bwd = rows.ops[rows.op_backward & (op_ts >= w.lo) & (op_ts < w.hi)]
    if len(bwd) == 0:
        return {}
    b0, b1 = float(rows.ts[bwd].min()), float(rows.end[bwd].max())
    opt_ts = rows.ts[rows.optimizer]
    opt = rows.optimizer[(opt_ts >= b1) & (opt_ts < w.hi)]
    return {
        "forward": (np.array([w.lo]), np.array([b0])),
        "backward": (np.array([b0]), np.array([b1])),
        "optimizer": (_clip(rows.ts[opt], w.lo, w.hi), _clip(rows.end[opt], w.lo, w.hi)),
    }


def _phase_intervals(rows: _HostRows, w: _Window) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    found = _annotation_intervals(rows, w)
    if not any(p in found for p in ("forward", "backward")):
        found.update(_inferred_intervals(rows, w))
    return found


def _host_phases(
    windows: Sequence[_Window], intervals: Sequence[Mapping[str, tuple[np.ndarray, np.ndarray]]]
) -> list[dict[str, float]]:
    """Each step's host seconds per phase of ``records.PHASES``: the union of its intervals clipped to the step
    (all steps' intervals clipped in one call, each to its own step's bounds)."""
    starts, ends, groups = [], [], []
    for k, found in enumerate(intervals):
        for p, (s, e) in found.items():
            if p in _PHASE_INDEX:
                starts.append(s)
                ends.append(e)
                groups.append(np.full(len(s), k * len(PHASES) + _PHASE_INDEX[p]))
    s, e, g = _joined(starts, ends, groups)
    lo, hi = np.array([w.lo for w in windows])[g // len(PHASES)], np.array([w.hi for w in windows])[g // len(PHASES)]
    s, e = np.minimum(np.maximum(s, lo), hi), np.minimum(np.maximum(e, lo), hi)  # np.clip, a tenth of the calls' cost
    keep = e > s
    total = union_lengths(s[keep], e[keep], g[keep], len(windows) * len(PHASES)).reshape(len(windows), len(PHASES))
    out = []
    for k, found in enumerate(intervals):
        phases: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        phases.update({p: float(total[k, _PHASE_INDEX[p]]) / 1e6 for p in found if p in _PHASE_INDEX})
        out.append(phases)
    return out


_PHASE_INDEX: Mapping[str, int] = {p: i for i, p in enumerate(PHASES)}


def _joined(
    starts: list[np.ndarray], ends: list[np.ndarray], groups: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each list of arrays as one array (an empty float, or for ``groups`` int, array for an empty list)."""

    def joined(parts: list[np.ndarray], dtype: type[np.generic]) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    return joined(starts, np.float64), joined(ends, np.float64), joined(groups, np.int64)


class _Coll(msgspec.Struct, frozen=True):
    """A rank's collectives in one step: start and end, µs, in order."""

    starts: np.ndarray
    ends: np.ndarray


def _collectives(trace: KinetoTrace, windows: list[_Window]) -> tuple[dict[int, _Coll], bool]:
    """Per step, the collectives of this rank: NCCL kernels when there are some, else host annotations;
    and whether they are GPU kernels."""
    ev = trace.events
    gpu = np.flatnonzero(ev["comm"] & IS_GPU_CATEGORY[ev["cat"]])
    if len(gpu):
        when = _launch_ts(trace, gpu)
        when = np.where(np.isnan(when), ev["ts_us"][gpu], when)
        rows = gpu
    else:
        rows = np.flatnonzero(ev["comm"] & (ev["cat"] == CAT["user_annotation"]))
        when = ev["ts_us"][rows]
    out = {}
    for w in windows:
        sel = rows[(when >= w.lo) & (when < w.next_lo)]
        sel = sel[np.argsort(ev["ts_us"][sel], kind="stable")]
        out[w.step] = _Coll(ev["ts_us"][sel], ev["ts_us"][sel] + ev["dur_us"][sel])
    return out, bool(len(gpu))


def _waits(colls: Mapping[int, _Coll]) -> dict[int, tuple[float, float]]:
    """rank → (barrier wait s, transfer s) for one step, the k-th collective aligned across ranks."""
    n = min((len(c.starts) for c in colls.values()), default=0)
    aligned = n > 0 and len(colls) >= 2
    # The latest arrival at each collective, once for all ranks (per rank it made the step O(ranks²)).
    latest = np.max([c.starts[:n] for c in colls.values()], axis=0) if aligned else None
    out = {}
    for rank, c in colls.items():
        if latest is None:
            out[rank] = (0.0, union_length(c.starts, c.ends) / 1e6)
            continue
        dur = c.ends[:n] - c.starts[:n]
        wait = np.clip(latest - c.starts[:n], 0.0, dur)
        busy = union_length(c.starts, c.ends)
        out[rank] = (float(wait.sum()) / 1e6, max(busy - float(wait.sum()), 0.0) / 1e6)
    return out


def _arrivals(colls: Mapping[int, _Coll]) -> dict[int, tuple[float, int, int]]:
    """rank → (lateness s, collectives it arrived at last, collectives aligned) for one step.

    The arrival at the k-th collective is its start (the NCCL kernel's on the GPU); the
    rank that arrives last is the one the others wait for (HTA's "potential stragglers")::

        rank 0  ─compute─┤nccl (waits)·····│xfer│
        rank 2  ─compute──────────────────┤xfer│   ← arrives last: late by (its start − median start)
    """
    n = min((len(c.starts) for c in colls.values()), default=0)
    if n == 0 or len(colls) < 2:
        return {r: (0.0, 0, 0) for r in colls}
    ranks = list(colls)
    starts = np.array([colls[r].starts[:n] for r in ranks])  # ranks × collectives
    late = np.clip(starts - np.median(starts, axis=0), 0.0, None).sum(axis=1) / 1e6
    last = np.bincount(np.argmax(starts, axis=0), minlength=len(ranks))
    return {r: (float(late[i]), int(last[i]), n) for i, r in enumerate(ranks)}


class GpuStep(msgspec.Struct, frozen=True):
    """One step's GPU activities (those launched from its host range), µs and seconds."""

    first_us: float
    last_us: float
    busy_s: float
    idle_s: float
    overlap_s: float
    compute_s: float
    comm_s: float
    phases: Mapping[str, float]
    """GPU seconds per work phase (``_gpu_phases``: only the phases the step has)."""
    period_lo_us: float = 0.0
    """The step's period on the GPU clock (``_gpu_periods_us``) runs from here ..."""
    period_hi_us: float = 0.0
    """... to here; ``period_busy_s`` is the GPU's busy time inside it, whichever step launched the work."""
    period_busy_s: float = 0.0


def _kinds(trace: KinetoTrace, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(communication, compute) masks of GPU rows, by HTA's kinds."""
    ev = trace.events
    return ev["comm"][rows], _compute_names(trace)[ev["name_id"][rows]]


def _gpu_steps(
    trace: KinetoTrace,
    windows: Sequence[_Window],
    intervals: Sequence[Mapping[str, tuple[np.ndarray, np.ndarray]]],
    gpu_notes: Mapping[str, tuple[np.ndarray, np.ndarray]],
) -> list[GpuStep | None]:
    """Each step's GPU activities: those launched from its host range (``lo`` to the next step's start),
    all steps at once (``union_lengths``); ``None`` for a step that launched none."""
    ev = trace.events
    rows = _gpu_rows(trace)
    launch, (comm, compute) = _launch_ts(trace, rows), _kinds(trace, rows)
    pos, grp = _launched_in(launch, windows)
    n = len(windows)
    s = ev["ts_us"][rows][pos]
    e = s + ev["dur_us"][rows][pos]
    comm, compute, launch = comm[pos], compute[pos], launch[pos]
    busy = union_lengths(s, e, grp, n)
    comm_us = union_lengths(s[comm], e[comm], grp[comm], n)
    other_us = union_lengths(s[~comm], e[~comm], grp[~comm], n)
    compute_us = union_lengths(s[compute], e[compute], grp[compute], n)
    present = np.flatnonzero(np.bincount(grp, minlength=n)).tolist()
    heads = np.searchsorted(grp, present)
    firsts = np.minimum.reduceat(s, heads).tolist() if present else []
    lasts = np.maximum.reduceat(e, heads).tolist() if present else []
    span = dict(zip(present, zip(firsts, lasts)))
    phases = _gpu_phases(launch[compute], s[compute], e[compute], grp[compute], intervals, gpu_notes, span)
    out: list[GpuStep | None] = [None] * n
    for k, (first, last) in span.items():
        b, overlap = float(busy[k]), float(comm_us[k]) + float(other_us[k]) - float(busy[k])
        out[k] = GpuStep(
            first_us=first,
            last_us=last,
            busy_s=b / 1e6,
            idle_s=(last - first - b) / 1e6,
            overlap_s=max(overlap, 0.0) / 1e6,
            compute_s=float(compute_us[k]) / 1e6,
            comm_s=float(comm_us[k]) / 1e6,
            phases=phases[k],
        )
    return out


def _launched_in(launch: np.ndarray, windows: Sequence[_Window]) -> tuple[np.ndarray, np.ndarray]:
    """(activity, step) pairs: each activity of each step whose range (``lo`` ≤ launch < ``next_lo``) holds its
    launch, by step, then in file order; an activity is in two steps when their ranges overlap."""
    order = np.argsort(launch, kind="stable")  # NaN (launch unknown) last: in no range
    lo = np.array([w.lo for w in windows])
    nxt = np.array([w.next_lo for w in windows])
    a, b = np.searchsorted(launch[order], lo, "left"), np.searchsorted(launch[order], nxt, "left")
    pos = np.concatenate([np.sort(order[i:j]) for i, j in zip(a.tolist(), b.tolist())] or [np.zeros(0, np.int64)])
    grp = np.repeat(np.arange(len(windows)), np.maximum(b - a, 0))
    keep = (launch[pos] >= lo[grp]) & (launch[pos] < nxt[grp])  # the range test itself (NaN bounds hold nothing)
    return pos[keep], grp[keep]


def _gpu_phases(
    launch: np.ndarray,
    s: np.ndarray,
    e: np.ndarray,
    grp: np.ndarray,
    intervals: Sequence[Mapping[str, tuple[np.ndarray, np.ndarray]]],
    gpu_notes: Mapping[str, tuple[np.ndarray, np.ndarray]],
    span: Mapping[int, tuple[float, float]],
) -> dict[int, dict[str, float]]:
    """Per step with GPU work, its GPU seconds per work phase: the union of the compute kernels launched from
    the phase's host range (launch time through the correlation id, whatever thread launched them), else,
    for a phase without a host range, its ``gpu_user_annotation`` ranges inside the step's GPU span.

    Kernel mapping comes first because Kineto's ``gpu_user_annotation`` only covers kernels
    launched from the annotating thread: on a real H200 trace (tests/data/kineto/
    h200_annotated_steps) "backward" is 1 µs on the GPU while 47 ms of backward kernels,
    launched from autograd's thread, run inside the host range.
    """
    n, per = len(intervals), len(WORK_PHASES)
    starts, ends, groups = [], [], []
    for i, phase in enumerate(WORK_PHASES):
        lo, hi = _ranges_by_step(intervals, phase, n)
        inside = np.zeros(len(launch), dtype=bool)
        for row_lo, row_hi in zip(lo, hi):  # a step's k-th range of the phase (NaN where it has fewer: holds nothing)
            inside |= (launch >= row_lo[grp]) & (launch < row_hi[grp])
        starts.append(s[inside])
        ends.append(e[inside])
        groups.append(grp[inside] * per + i)
        if phase in gpu_notes:  # steps without a host range of the phase: its GPU annotations in the step's span
            for k, (first, last) in span.items():
                if phase not in intervals[k]:
                    ps, pe = _clip(gpu_notes[phase][0], first, last), _clip(gpu_notes[phase][1], first, last)
                    starts.append(ps[pe > ps])
                    ends.append(pe[pe > ps])
                    groups.append(np.full(int((pe > ps).sum()), k * per + i))
    total = union_lengths(*_joined(starts, ends, groups), n * per)
    return {
        k: {
            phase: float(total[k * per + i]) / 1e6
            for i, phase in enumerate(WORK_PHASES)
            if phase in intervals[k] or phase in gpu_notes
        }
        for k in span
    }


def _ranges_by_step(
    intervals: Sequence[Mapping[str, tuple[np.ndarray, np.ndarray]]], phase: str, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi): row j, column k = step k's j-th host range of ``phase`` (NaN where it has fewer)."""
    ranged = [(k, found[phase]) for k, found in enumerate(intervals) if phase in found]
    depth = max((len(r[0]) for _, r in ranged), default=0)
    lo, hi = np.full((depth, n), np.nan), np.full((depth, n), np.nan)
    for k, (a, b) in ranged:
        lo[: len(a), k], hi[: len(b), k] = a, b
    return lo, hi


def _gpu_annotations(trace: KinetoTrace) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per work phase, the ``gpu_user_annotation`` ranges of the trace (µs)."""
    ev = trace.events
    rows = np.flatnonzero(ev["cat"] == CAT["gpu_user_annotation"])
    by_phase: dict[str, list[int]] = defaultdict(list)
    for row in rows.tolist():
        phase = _phase_of_name(trace, int(ev["name_id"][row]))
        if phase in WORK_PHASES:
            by_phase[phase].append(row)
    return {
        p: (ev["ts_us"][np.asarray(r)], ev["ts_us"][np.asarray(r)] + ev["dur_us"][np.asarray(r)])
        for p, r in by_phase.items()
    }


def _gpu_periods_us(cells: Sequence[StepCell]) -> dict[int, tuple[float, float]]:
    """Each step's period window ``(lo, hi)`` on the GPU's clock (µs): end of the previous step's GPU work to the
    end of its own. The GPU of a launch-ahead host runs steps back to back, so a step's own GPU
    span (first to last activity) overlaps the next one's and overstates the period::

        host   |step 1|step 2|step 3|
        GPU        |==== 1 ====|==== 2 ====|        step 2 = end(2) − end(1), not its span

    The first step has no previous end: its own first activity to the next step's first (or its own
    last, whichever is sooner).
    """
    out: dict[int, tuple[float, float]] = {}
    done = [(c.step, c.gpu) for c in cells if c.gpu is not None]
    for k, (step, g) in enumerate(done):
        if k > 0:
            out[step] = (max(done[k - 1][1].last_us, 0.0), g.last_us)
        elif len(done) > 1:
            out[step] = (g.first_us, g.first_us + min(done[1][1].first_us - g.first_us, g.last_us - g.first_us))
        else:
            out[step] = (g.first_us, g.last_us)
    return out


def _with_periods(cells: tuple[StepCell, ...], trace: KinetoTrace) -> tuple[StepCell, ...]:
    """The cells with each GPU step's period window and the GPU's busy time inside it.

    Busy is the union of *all* the rank's GPU activity in the window, so busy + idle is the period
    exactly; the launched-by-this-step span (``busy_s``/``idle_s``) overlaps the next step on a GPU
    that lags its host (HTA's negative_queue_length trace: span 0.37 s, period 0.216 s).
    """
    periods = _gpu_periods_us(cells)
    if not periods:
        return cells
    rows = _gpu_rows(trace)
    starts, ends = merge_intervals(
        trace.events["ts_us"][rows], trace.events["ts_us"][rows] + trace.events["dur_us"][rows]
    )
    out = []
    for c in cells:
        if c.gpu is None or c.step not in periods:
            out.append(c)
            continue
        lo, hi = periods[c.step]
        busy_us = _clip_union(starts, ends, lo, hi) if hi > lo else 0.0
        gpu = msgspec.structs.replace(c.gpu, period_lo_us=lo, period_hi_us=hi, period_busy_s=busy_us / 1e6)
        out.append(msgspec.structs.replace(c, gpu=gpu))
    return tuple(out)


class StepCell(msgspec.Struct, frozen=True, kw_only=True):
    """One rank's step as its own trace sees it, before the ranks are aligned (µs on the rank's clock).

    Everything here depends on this rank's trace alone; ``anatomy_from_timelines`` adds what needs
    the other ranks (clock offset, barrier wait, lateness at the collectives, the GPU period of the
    steps every rank has).
    """

    step: int
    lo_us: float
    hi_us: float
    next_lo_us: float
    """The next step's start (bounds this step's collectives and GPU launches)."""
    start_s: float
    """UTC seconds of ``lo_us`` (trace seconds when the trace has no time origin)."""
    phases: Mapping[str, float]
    """Host seconds per phase of ``records.PHASES`` from the annotations (0 when absent); ``allreduce`` is the
    host-side collective time, used when the step has no aligned collective."""
    gpu: GpuStep | None
    coll_starts_us: np.ndarray
    """The step's collectives (NCCL kernels, else host-side calls), in start order."""
    coll_ends_us: np.ndarray


class RankTimeline(msgspec.Struct, frozen=True, kw_only=True):
    """What one rank's trace contributes to a job's step anatomy: the per-rank half of ``anatomy_from_traces``."""

    rank: int
    world_size: int | None
    path: str
    node: str | None
    gpu: int | None
    gpu_collectives: bool
    """The collectives are NCCL kernels on the GPU (else host-side calls)."""
    cells: tuple[StepCell, ...]


def rank_timeline(trace: KinetoTrace) -> RankTimeline:
    """The per-rank reduction of one trace for the step anatomy (see ``RankTimeline``)."""
    windows = _windows(trace)
    colls, on_gpu = _collectives(trace, windows)
    host = _host_rows(trace)
    intervals = [_phase_intervals(host, w) for w in windows]
    gpus = _gpu_steps(trace, windows, intervals, _gpu_annotations(trace))
    cells = tuple(
        StepCell(
            step=w.step,
            lo_us=w.lo,
            hi_us=w.hi,
            next_lo_us=w.next_lo,
            start_s=float(trace.to_utc_s(w.lo)),
            phases=phases,
            gpu=gpu,
            coll_starts_us=colls[w.step].starts,
            coll_ends_us=colls[w.step].ends,
        )
        for w, phases, gpu in zip(windows, _host_phases(windows, intervals), gpus)
    )
    cells = _with_periods(cells, trace)
    node, gpu = _placement(trace)
    return RankTimeline(
        rank=trace.rank,
        world_size=trace.world_size,
        path=trace.path,
        node=node,
        gpu=gpu,
        gpu_collectives=on_gpu,
        cells=cells,
    )


def _rank_steps(
    timeline: RankTimeline,
    steps: set[int],
    waits: Mapping[int, tuple[float, float]],
    arrivals: Mapping[int, tuple[float, int, int]],
) -> list[RankStep]:
    cells = [c for c in timeline.cells if c.step in steps]
    out = []
    for c in cells:
        phases = dict(c.phases)
        wait_s, xfer_s = waits.get(c.step, (0.0, 0.0))
        if wait_s == 0.0 and xfer_s == 0.0:
            xfer_s = c.phases["allreduce"]
        phases["barrier_wait"], phases["allreduce"] = wait_s, xfer_s
        host_s = (c.hi_us - c.lo_us) / 1e6
        g, late = c.gpu, arrivals.get(c.step, (0.0, 0, 0))
        period = (g.period_hi_us - g.period_lo_us) / 1e6 if g is not None else None
        out.append(
            RankStep(
                rank=timeline.rank,
                step=c.step,
                start_s=c.start_s,
                dur_s=period if period is not None else host_s,
                phases=phases,
                host_dur_s=host_s,
                gpu_busy_s=g.period_busy_s if g else None,
                gpu_idle_s=period - g.period_busy_s if g and period is not None else None,
                overlap_s=g.overlap_s if g else None,
                gpu_period_s=period,
                gpu_compute_s=g.compute_s if g else None,
                gpu_comm_s=g.comm_s if g else None,
                gpu_phases=g.phases if g else None,
                gpu_lag_s=(g.last_us - c.hi_us) / 1e6 if g else None,
                late_s=late[0],
                last_arrivals=late[1],
                collectives=late[2],
            )
        )
    return out


def _placement(trace: KinetoTrace) -> tuple[str | None, int | None]:
    node = trace.hostname or trace.metadata.get("host_name")
    gpus = np.unique(trace.events["pid"][IS_GPU_CATEGORY[trace.events["cat"]]])
    return (str(node) if node else None), (int(gpus[0]) if len(gpus) == 1 else None)


def anatomy_from_traces(traces: Sequence[KinetoTrace]) -> Anatomy:
    """Step anatomy of a job from its per-rank traces (one trace per rank)."""
    return anatomy_from_timelines([rank_timeline(t) for t in traces])


def anatomy_from_timelines(timelines: Sequence[RankTimeline]) -> Anatomy:
    """Step anatomy of a job from each rank's reduced trace (``rank_timeline``): the cross-rank half.

    Steps are those every rank profiled; clocks are aligned on the collectives' ends, then each
    step's k-th collective gives the barrier waits and the arrival order.
    """
    if not timelines:
        raise InputError("no traces given")
    by_rank = {t.rank: t for t in timelines}
    if len(by_rank) != len(timelines):
        dup = sorted(t.path for t in timelines if sum(u.rank == t.rank for u in timelines) > 1)
        raise InputError(f"two traces claim the same rank: {', '.join(dup)}")
    colls = {r: {c.step: _Coll(c.coll_starts_us, c.coll_ends_us) for c in t.cells} for r, t in by_rank.items()}
    steps = sorted(set.intersection(*(set(c) for c in colls.values())))
    if not steps:
        raise InputError(
            "the traces share no profiled step (ProfilerStep#N): "
            + ", ".join(f"rank {r}: {sorted(c)}" for r, c in sorted(colls.items()))
        )
    offsets = _clock_offsets_us(colls, steps)
    waits: dict[int, dict[int, tuple[float, float]]] = defaultdict(dict)
    arrivals: dict[int, dict[int, tuple[float, int, int]]] = defaultdict(dict)
    for step in steps:
        shifted = {r: _Coll(colls[r][step].starts - offsets[r], colls[r][step].ends - offsets[r]) for r in by_rank}
        for rank, wx in _waits(shifted).items():
            waits[rank][step] = wx
        for rank, late in _arrivals(shifted).items():
            arrivals[rank][step] = late
    common = set(steps)
    rank_steps = [rs for r, t in sorted(by_rank.items()) for rs in _rank_steps(t, common, waits[r], arrivals[r])]
    world = max([t.world_size or 0 for t in timelines] + [len(timelines)])
    return Anatomy(
        world_size=world,
        ranks=tuple(sorted(by_rank)),
        steps=tuple(steps),
        rank_steps=tuple(rank_steps),
        placement={r: (t.node, t.gpu) for r, t in by_rank.items()},
        clock_offset_s={r: o / 1e6 for r, o in offsets.items()},
        gpu_collectives=all(t.gpu_collectives for t in timelines),
    )


def _clock_offsets_us(colls: Mapping[int, Mapping[int, _Coll]], steps: Sequence[int]) -> dict[int, float]:
    """Each rank's clock offset (µs), from the ends of its collectives.

    A blocking collective ends on every rank at about the same time (the last data
    arrives), so the median difference between a rank's collective ends and the median
    rank's is its clock's offset: the skew between hosts (NTP keeps it to ~ms, the
    size of the waits we measure). On one host it comes out ~0.
    """
    diffs: dict[int, list[np.ndarray]] = defaultdict(list)
    for step in steps:
        n = min(len(c[step].ends) for c in colls.values())
        if n == 0 or len(colls) < 2:
            continue
        ends = {r: c[step].ends[:n] for r, c in colls.items()}
        ref = np.median(np.array(list(ends.values())), axis=0)
        for r, e in ends.items():
            diffs[r].append(e - ref)
    return {r: float(np.median(np.concatenate(diffs[r]))) if diffs[r] else 0.0 for r in colls}


# --- anatomy from spans ----------------------------------------------------------------------------


def anatomy_from_spans(spans: Iterable[Span]) -> Anatomy:
    """Step anatomy from ``Span`` records (the PyTorch hook's, or the twin's).

    Spans whose phase is not in ``records.PHASES`` are ignored. When the spans carry no
    ``barrier_wait`` (the hook measures the all-reduce as a whole), it is computed as
    for traces, by aligning each step's ``allreduce`` spans across ranks.
    """
    cells: dict[tuple[int, int], dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    placement: dict[int, tuple[str | None, int | None]] = {}
    jobs = set()
    for s in spans:
        if s.phase in PHASES:
            cells[(s.rank, s.step)][s.phase].append((s.start, s.dur))
            jobs.add(s.job)
            if s.rank not in placement and ("node" in s.attrs or "gpu" in s.attrs):
                gpu = s.attrs.get("gpu")
                placement[s.rank] = (s.attrs.get("node"), int(gpu) if gpu is not None else None)
    if not cells:
        raise InputError("no spans with a training phase")
    ranks = tuple(sorted({r for r, _ in cells}))
    steps = tuple(sorted(step for step in {s for _, s in cells} if all((r, step) in cells for r in ranks)))
    has_wait = any("barrier_wait" in c for c in cells.values())
    rank_steps = []
    for step in steps:
        waits = {} if has_wait else _span_waits({r: cells[(r, step)].get("allreduce", []) for r in ranks})
        rank_steps += [_span_rank_step(r, step, cells[(r, step)], waits.get(r)) for r in ranks]
    return Anatomy(
        world_size=len(ranks),
        ranks=ranks,
        steps=steps,
        rank_steps=tuple(rank_steps),
        placement=placement,
        source="spans",
        job=next(iter(jobs)) if len(jobs) == 1 else None,
    )


def anatomy_from_span_table(table: pa.Table) -> Anatomy:
    """``anatomy_from_spans`` of spans given as the store's span columns (``job``, ``rank``, ``step``,
    ``phase``, ``start``, ``dur``, ``attrs`` JSON text; ``store.queries.job_span_table``), in the store's
    order (step, rank, start): the same ``Anatomy``, to the last bit, without a ``Span`` object per row (a
    1,536-rank job's 50 recent steps are 460,000 spans). Per (rank, step) cell the phases are summed by
    ``np.bincount``, which adds a cell's rows in their order, as ``sum`` did."""
    return anatomy_of_pieces(step_pieces(table))


class StepPiece(msgspec.Struct, frozen=True, kw_only=True):
    """What one step's spans give its anatomy, whatever the other steps (``step_pieces``): a server keeps the
    pieces of a job's recent steps between pages and takes apart only the steps with new spans
    (``reports.steps.recent_step_report``). Arrays are the piece's own: never written after it is made."""

    step: int
    ranks: np.ndarray
    """The ranks with a span of a training phase in the step, ascending."""
    phase_s: np.ndarray
    """``ranks`` × ``PHASES``: each cell's durations summed in the table's row order."""
    start_s: np.ndarray
    """Per rank, its first span's start."""
    end_s: np.ndarray
    """Per rank, its last span's end."""
    measured_wait: bool
    """A span of the step is a barrier wait."""
    waits: Mapping[int, tuple[float, float]]
    """Without a measured wait: each rank's (barrier wait, allreduce) from the step's collectives
    (``_span_waits``); used when no step of the anatomy measured one."""
    placed: np.ndarray
    """The ranks with a span in the step that names their node or GPU, in the order of the first such span."""
    nodes: np.ndarray
    """Per ``placed`` rank, the node its first such span names (objects: text or None)."""
    gpus: np.ndarray
    """Per ``placed`` rank, the GPU index its first such span names (objects: int or None)."""
    jobs: tuple[str, ...]
    first_start: float


def step_pieces(table: pa.Table) -> list[StepPiece]:
    """The pieces of each step of a span table (``anatomy_from_span_table``'s columns and order), by step. The
    cells are computed for the whole table at once, then cut step by step."""
    import pyarrow.compute as pc  # the report on traces given as files never loads pyarrow

    table = table.filter(pc.is_in(table.column("phase"), value_set=_phase_array()))
    if not table.num_rows:
        return []
    rank = table.column("rank").to_numpy().astype(np.int64)
    step = table.column("step").to_numpy().astype(np.int64)
    phase = pc.index_in(table.column("phase"), value_set=_phase_array()).to_numpy().astype(np.int64)
    start, dur = table.column("start").to_numpy(), table.column("dur").to_numpy()
    ranks, r = np.unique(rank, return_inverse=True)
    all_steps, s = np.unique(step, return_inverse=True)
    nr, np_ = len(ranks), len(PHASES)
    cell = s * nr + r
    cells = len(all_steps) * nr
    seen = np.zeros(cells, dtype=bool)
    seen[cell] = True
    present = seen.reshape(-1, nr)
    sums = np.bincount(cell * np_ + phase, weights=dur, minlength=cells * np_).reshape(-1, nr, np_)
    lowest, highest = np.full(cells, np.inf), np.full(cells, -np.inf)
    np.minimum.at(lowest, cell, start)
    np.maximum.at(highest, cell, start + dur)
    first, last = lowest.reshape(-1, nr), highest.reshape(-1, nr)
    measured = np.zeros(len(all_steps), dtype=bool)
    measured[s[phase == PHASES.index("barrier_wait")]] = True
    reduce_rows = np.flatnonzero(phase == PHASES.index("allreduce"))
    reduces = _rows_by_step(s[reduce_rows], len(all_steps))
    placed, nodes, gpus = _step_placements(s, rank, table.column("attrs"), len(all_steps))
    job_codes = pc.dictionary_encode(table.column("job")).combine_chunks()
    job_names = [*job_codes.dictionary.to_pylist(), None]  # the last: a span without a job
    job_of = pc.fill_null(job_codes.indices, len(job_names) - 1).to_numpy().astype(np.int64)
    step_jobs = np.unique(s * len(job_names) + job_of)
    jobs_of = _rows_by_step(step_jobs // len(job_names), len(all_steps))
    pieces = []
    for k, number in enumerate(all_steps.tolist()):
        mine = present[k]
        rows = reduce_rows[reduces[k]]
        waits = {} if measured[k] else _step_waits(rank[rows], start[rows], dur[rows], ranks[mine])
        starts = first[k][mine]
        pieces.append(
            StepPiece(
                step=number,
                ranks=ranks[mine],
                phase_s=sums[k][mine],
                start_s=starts,
                end_s=last[k][mine],
                measured_wait=bool(measured[k]),
                waits=waits,
                placed=placed[k],
                nodes=nodes[k],
                gpus=gpus[k],
                jobs=tuple(job_names[j] for j in (step_jobs[jobs_of[k]] % len(job_names)).tolist()),
                first_start=float(starts.min()),
            )
        )
    return pieces


def anatomy_of_pieces(pieces: Sequence[StepPiece]) -> Anatomy:
    """The anatomy of the steps whose ``pieces`` are given (ascending steps, each step once): the ranks are all
    those of the pieces, a step without a span of one of them is left out, and when no step measured its
    barrier waits, each step's are those of its collectives. ``InputError`` without a piece."""
    if not pieces:
        raise InputError("no spans with a training phase")
    ranks = np.unique(np.concatenate([p.ranks for p in pieces]))
    complete = [p for p in pieces if len(p.ranks) == len(ranks)]  # a piece's ranks are among ``ranks``
    nr, np_ = len(ranks), len(PHASES)
    sums = np.stack([p.phase_s for p in complete]) if complete else np.zeros((0, nr, np_))
    if not any(p.measured_wait for p in pieces):
        for k, p in enumerate(complete):  # no measured wait: the collectives' spans are split as ``_span_waits`` does
            _put_waits(sums[k], p.waits, ranks)
    first = np.stack([p.start_s for p in complete]) if complete else np.zeros((0, nr))
    last = np.stack([p.end_s for p in complete]) if complete else np.zeros((0, nr))
    steps = np.array([p.step for p in complete], dtype=np.int64)
    jobs = list(dict.fromkeys(j for p in pieces for j in p.jobs))
    return Anatomy(
        world_size=nr,
        ranks=tuple(ranks.tolist()),
        steps=tuple(steps.tolist()),
        rank_steps=RankStepGrid(ranks, steps, sums, first, last),
        placement=_pieces_placement(pieces),
        source="spans",
        job=jobs[0] if len(jobs) == 1 else None,
    )


def _rows_by_step(s: np.ndarray, steps: int) -> list[np.ndarray]:
    """The indices of ``s`` (each row's step index) step by step, each in row order."""
    order = np.argsort(s, kind="stable")
    return np.split(order, np.searchsorted(s[order], np.arange(1, steps)))


@functools.cache
def _phase_array() -> pa.Array:
    """``records.PHASES`` as an Arrow array, built on first use (the reports on trace files never load pyarrow)."""
    import pyarrow

    return pyarrow.array(PHASES, type=pyarrow.string())


def _put_waits(sums: np.ndarray, waits: Mapping[int, tuple[float, float]], ranks: np.ndarray) -> None:
    """Each rank's (barrier wait, allreduce) of one step into its row of ``sums`` (ranks × phases)."""
    wait_col, reduce_col = PHASES.index("barrier_wait"), PHASES.index("allreduce")
    for i, rank in enumerate(ranks.tolist()):
        wait = waits.get(rank)
        if wait is not None:
            sums[i, wait_col], sums[i, reduce_col] = wait


def _step_waits(
    rank: np.ndarray, start: np.ndarray, dur: np.ndarray, ranks: np.ndarray
) -> dict[int, tuple[float, float]]:
    """``_span_waits`` of one step's ``allreduce`` rows (their ranks, starts and durations, in row order), each
    of ``ranks`` (a rank without one: empty)."""
    order = np.argsort(rank, kind="stable")
    rank, start, dur = rank[order], start[order], dur[order]
    lo, hi = np.searchsorted(rank, ranks, side="left"), np.searchsorted(rank, ranks, side="right")
    colls = {}
    for a, b, who in zip(lo.tolist(), hi.tolist(), ranks.tolist()):
        st = start[a:b]
        order = np.argsort(st * 1e6, kind="stable")
        colls[who] = _Coll((st * 1e6)[order], ((st + dur[a:b]) * 1e6)[order])
    return _waits(colls)


def _step_placements(
    s: np.ndarray, rank: np.ndarray, attrs: pa.ChunkedArray, steps: int
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Per step (``s``: each row's step index), ``StepPiece``'s ``placed``, ``nodes`` and ``gpus``: each rank's
    first row in the step whose attrs name its node or GPU. Only the distinct attrs texts are parsed (one per
    rank, as the twin and the hook write them)."""
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(attrs).combine_chunks()
    parsed = [orjson.loads(a) if a else {} for a in encoded.dictionary.to_pylist()]
    placing = np.array([("node" in a or "gpu" in a) for a in parsed] + [False], dtype=bool)
    node_of = np.array([a.get("node") for a in parsed] + [None], dtype=object)
    gpu_of = np.array([None if a.get("gpu") is None else int(a["gpu"]) for a in parsed] + [None], dtype=object)
    codes = pc.fill_null(encoded.indices, len(parsed)).to_numpy().astype(np.int64)
    rows = np.flatnonzero(placing[codes])
    low = int(rank.min())
    _, first = np.unique(s[rows] * (int(rank.max()) - low + 1) + (rank[rows] - low), return_index=True)
    rows = rows[np.sort(first)]  # each (step, rank)'s first placing row, in row order
    by_step = _rows_by_step(s[rows], steps)
    return (
        [rank[rows[i]] for i in by_step],
        [node_of[codes[rows[i]]] for i in by_step],
        [gpu_of[codes[rows[i]]] for i in by_step],
    )


def _pieces_placement(pieces: Sequence[StepPiece]) -> dict[int, tuple[str | None, int | None]]:
    """Each rank's (node, gpu) from its first placing span, step by step (``_step_placements``), ranks in the
    order they are first placed: ``anatomy_from_spans``' placement."""
    placed = np.concatenate([p.placed for p in pieces])
    nodes = np.concatenate([p.nodes for p in pieces])
    gpus = np.concatenate([p.gpus for p in pieces])
    _, first = np.unique(placed, return_index=True)
    first = np.sort(first)
    return dict(zip(placed[first].tolist(), zip(nodes[first].tolist(), gpus[first].tolist())))


def _span_waits(allreduce: Mapping[int, list[tuple[float, float]]]) -> dict[int, tuple[float, float]]:
    colls = {
        r: _Coll(np.array([s for s, _ in v]) * 1e6, np.array([s + d for s, d in v]) * 1e6) for r, v in allreduce.items()
    }
    for c in colls.values():
        order = np.argsort(c.starts, kind="stable")
        c.starts[:], c.ends[:] = c.starts[order], c.ends[order]
    return _waits(colls)


def _span_rank_step(
    rank: int, step: int, cell: Mapping[str, list[tuple[float, float]]], wait: tuple[float, float] | None
) -> RankStep:
    phases: dict[str, float] = {p: float(sum(d for _, d in cell.get(p, []))) for p in PHASES}
    if wait is not None:
        phases["barrier_wait"], phases["allreduce"] = wait
    starts = [s for v in cell.values() for s, _ in v]
    ends = [s + d for v in cell.values() for s, d in v]
    return RankStep(rank=rank, step=step, start_s=min(starts), dur_s=max(ends) - min(starts), phases=phases)
