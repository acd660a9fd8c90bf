"""What-if analysis: how much faster would the step be if no worker straggled?

The method of Lin et al., "Understanding Stragglers in Large Model Training Using
What-if Analysis" (OSDI'25, https://www.usenix.org/conference/osdi25/presentation/lin-jinkun,
artifact https://github.com/ByteDance-Seed/StragglerAnalysis). A step is a graph of
operations; an operation starts when the operations it depends on have ended, and a
collective ends a fixed transfer time after its *last* participant arrived:

    worker A  |== fwd ==|== bwd ==|.. wait ..|= allreduce =|= opt =|
    worker B  |== fwd ==|====== bwd (slow) ======|= allreduce =|= opt =|
                                            last arrival ^  transfer

We replay that graph twice: once with every operation at its measured duration
(T_replay), once with every operation at the typical duration of its type (the
mean for computation, the median for communication, over all workers and steps:
T_ideal). The slowdown is S = mean(T_replay) / mean(T_ideal). Putting back the
measured durations of one group of operations only (one operation type, one
data-parallel rank, one pipeline stage, one worker) says how much of S that group
causes. A worker is one (data-parallel rank, pipeline stage) pair; its
tensor-parallel ranks synchronise inside every operation and move as one: when the
trace has each of them (a ``tp_rank`` column), a worker's operation ends when its
last tensor-parallel rank's does, and the typical duration is averaged over ranks.

Dependencies modelled (Megatron-LM 1F1B, as the artifact does):

- compute on a stage runs in its recorded order; each pipeline send/recv stream too;
- a send follows its micro-batch's compute; a recv precedes it and follows the
  previous compute of its direction; the first backward recv follows the compute
  just before the first backward;
- a send and its peer's recv form one transfer; data-parallel collectives
  (parameter all-gather, gradient reduce-scatter) wait for every data-parallel rank;
- after the last compute: gc, layer-norm all-reduce, embedding all-reduce (first and
  last stage together), the gradient reduce-scatter (unless overlapped), the
  gradient-clipping all-reduce (every worker) and the optimizer.

Input is a columnar batch (``OP_COLUMNS``; ``sources.optrace.read_optrace`` gives
one), our own ``Span`` records, or a trace set's step anatomy (``whatif_anatomy``: the
aligned steps ``hpcwatch steps`` builds from reduced ranks, here or on Dask workers), the
last two replayed as a pure data-parallel job.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec
import numpy as np
import numpy.typing as npt

from hpcwatch.analysis.steps import Anatomy, step_times_s
from hpcwatch.errors import InputError
from hpcwatch.records import PHASES, Span

if TYPE_CHECKING:  # a table is one input shape; ``steps`` on Kineto traces never loads pyarrow
    import pyarrow as pa

__all__ = [
    "OP_COLUMNS",
    "TP_COLUMN",
    "COMM_OPTYPES",
    "WorkerSlowdown",
    "Share",
    "WhatIf",
    "whatif_ops",
    "whatif_spans",
    "whatif_anatomy",
    "anatomy_spans",
    "spans_to_ops",
    "SCENARIOS_PER_REPLAY",
    "FIT_TOLERANCE",
]

#: Columns ``whatif_ops`` reads: dp_rank, stage, rank, step (ints), optype (string),
#: seq_id (int, order among the worker's ops of that type in the step), mc (int, model
#: chunk, -1 if none), start_s and dur_s (float seconds).
OP_COLUMNS = ("dp_rank", "stage", "rank", "step", "optype", "seq_id", "mc", "start_s", "dur_s")
#: Optional column: the tensor-parallel rank inside the worker, when the trace has every one.
TP_COLUMN = "tp_rank"

FWD, BWD = "forward-compute", "backward-compute"
P2P = ("forward-send", "forward-recv", "backward-send", "backward-recv")
DP_COLLECTIVES = ("params-all-gather", "grads-reduce-scatter", "separate-grads-all-reduce")
LAYERNORM, EMBEDDING = "layernorm-grads-all-reduce", "embedding-grads-all-reduce"
CLIP, OPTIMIZER, GC = "optimizer-clip-main-grad", "optimizer", "gc"
#: Communication types take the median as their typical duration (a few slow transfers
#: are what we look for; computation takes the mean), as in the artifact.
COMM_OPTYPES = frozenset((*P2P, *DP_COLLECTIVES, LAYERNORM, EMBEDDING, CLIP, "allreduce"))
_MEGATRON_OPTYPES = frozenset((FWD, BWD, *P2P, *DP_COLLECTIVES, LAYERNORM, EMBEDDING, CLIP, OPTIMIZER, GC))
# Collectives among our Span phases / finer op names: synchronised over every rank.
_SPAN_COLLECTIVE_MARKS = ("allreduce", "all_reduce", "reduce_scatter", "all_gather")
# The paper's M_W looks at the slowest 3 % of workers (compute_mw.py, RATIO = 3).
TOP_WORKER_PERCENT = 3
#: Replays run this many scenarios at a time. Ours: a trace set of 1,024 ranks has ~2,050 scenarios
#: (one per rank, twice: as data-parallel rank and as worker), and all at once would be ~840 MB of
#: durations at 10 steps of 5 phases; 64 at a time is 26 MB, and the replay stays vectorised.
SCENARIOS_PER_REPLAY = 64
#: The model fits the trace when its replayed step (measured durations, the model's dependencies) is
#: within this fraction of the measured step, on average over the steps; outside it S is not given.
#: Ours: the replay misses whatever the model does not know (host gaps between phases, a GPU queue that
#: runs behind the host, phases laid end to end that overlapped): on the artifact's ST trial it is 2 %
#: off, on the real Kineto sets of tests/data 1-22 %, on HTA's GPU-lags-host trace 63 % (the GPU's
#: period is 2.7 times the phases' sum). 25 % keeps a model that explains most of the step.
FIT_TOLERANCE = 0.25


class WorkerSlowdown(msgspec.Struct, frozen=True, kw_only=True):
    """S when only this worker keeps its measured durations (everyone else typical)."""

    dp_rank: int
    stage: int
    rank: int
    slowdown: float


class Share(msgspec.Struct, frozen=True, kw_only=True):
    """How much of the slowdown a set of workers explains (the paper's M_S, M_W).

    ``removed`` = (T_replay − T_without) / (T_replay − T_ideal): the part that goes
    away when those workers run at typical speed; ``added`` = (T_with − T_ideal) /
    (T_replay − T_ideal): the part they cause alone.
    """

    workers: tuple[tuple[int, int], ...]
    """(dp_rank, stage) of the workers concerned."""
    removed: float
    added: float
    step_time_without_s: float
    step_time_with_s: float


class WhatIf(msgspec.Struct, frozen=True, kw_only=True):
    """The what-if slowdown of a job and where it comes from."""

    slowdown: float | None
    """S = mean replayed step time / mean step time with every op at its typical duration; ``None`` when
    the model does not fit the measured steps (``fits``): a ratio of two replays that miss the trace says
    nothing about the trace. S <= 1 means no slowdown to recover (typical durations replay no faster)."""
    model_slowdown: float
    """The same ratio whether or not the model fits (for looking into a model that misses)."""
    fits: bool
    """The replayed step is within ``FIT_TOLERANCE`` of the measured one (means over the steps)."""
    verdict: str
    """One line saying S, that there is no slowdown, or that the model does not fit (every view prints it)."""
    steps: tuple[int, ...]
    step_time_actual_s: tuple[float, ...]
    """The measured step times: first start to last end of the step's operations in the trace (an op
    table, Spans), or a trace set's own step times (``analysis.steps.step_times_s``, ``whatif_anatomy``)."""
    step_time_replay_s: tuple[float, ...]
    step_time_ideal_s: tuple[float, ...]
    step_slowdown: tuple[float, ...]
    replay_ratio: float
    """mean measured (``step_time_actual_s``) / mean replayed step time: how far the model misses
    the trace (gaps it does not know about, such as data loading); 1.0 is a perfect replay."""
    by_optype: Mapping[str, float]
    by_dp_rank: Mapping[int, float]
    by_stage: Mapping[int, float]
    by_worker: tuple[WorkerSlowdown, ...]
    """Worst first."""
    last_stage: Share | None
    """The paper's M_S (pipeline jobs only)."""
    top_workers: Share | None
    """The paper's M_W: the slowest 3 % of workers (at least one)."""
    dp_size: int
    pp_size: int
    ops_per_step: int
    """Operations replayed per step (all workers)."""


# ---------------------------------------------------------------------------------------------
# Lanes: the trace as arrays [op, step, dp_rank]


class _Ops(msgspec.Struct, frozen=True, kw_only=True):
    steps: np.ndarray
    dps: np.ndarray
    stage: np.ndarray  # [op]
    optype: tuple[str, ...]  # [op]
    seq: np.ndarray  # [op]
    mc: np.ndarray  # [op]
    start: np.ndarray  # [op, step, dp], seconds from the step's first start
    dur: np.ndarray  # [op, step, dp], the worker's: until its last tensor-parallel rank ends
    dur_ranks: np.ndarray  # [op, step, dp, tp], each tensor-parallel rank's own
    rank: np.ndarray  # [dp, stage], the worker's first global rank


def _columns(table: pa.Table | Mapping[str, npt.ArrayLike]) -> dict[str, np.ndarray]:
    names = list(table.column_names) if hasattr(table, "column_names") else list(table)  # a pyarrow Table
    missing = [c for c in OP_COLUMNS if c not in names]
    if missing:
        raise InputError(f"operation batch lacks column(s) {', '.join(missing)}")
    out = {}
    for c in OP_COLUMNS + ((TP_COLUMN,) if TP_COLUMN in names else ()):
        col = table[c]
        arr = col.to_numpy(zero_copy_only=False) if hasattr(col, "to_numpy") else np.asarray(col)
        out[c] = arr.astype(str) if c == "optype" else arr
    return out


def _lanes(table: pa.Table | Mapping[str, npt.ArrayLike]) -> _Ops:
    c = _columns(table)
    if len(c["step"]) == 0:
        raise InputError("no operations to analyse")
    steps, si = np.unique(c["step"], return_inverse=True)
    dps, di = np.unique(c["dp_rank"], return_inverse=True)
    tps, pi = np.unique(c.get(TP_COLUMN, np.zeros(len(si), np.int64)), return_inverse=True)
    types, ti = np.unique(c["optype"], return_inverse=True)
    stage = c["stage"].astype(np.int64)
    seq = c["seq_id"].astype(np.int64)
    key = (stage * len(types) + ti) * (int(seq.max()) + 1) + seq
    keys, first, oi = np.unique(key, return_index=True, return_inverse=True)
    shape = (len(keys), len(steps), len(dps), len(tps))
    count = np.zeros(shape, dtype=np.int64)
    np.add.at(count, (oi, si, di, pi), 1)
    if (count != 1).any():
        o, s, d, p = np.argwhere(count != 1)[0]
        what = f"operation {types[ti[first[o]]]} #{seq[first[o]]} of stage {stage[first[o]]}"
        raise InputError(
            f"{what} appears {count[o, s, d, p]} times in step {steps[s]} on dp_rank {dps[d]}, "
            f"tp_rank {tps[p]} (expected once: every step must run the same operations on every rank)"
        )
    start = np.empty(shape)
    dur = np.empty(shape)
    start[oi, si, di, pi] = c["start_s"]
    dur[oi, si, di, pi] = c["dur_s"]
    start -= start.min(axis=(0, 2, 3), keepdims=True)
    # Tensor-parallel ranks synchronise inside every op: the worker's op ends with its last rank.
    end = (start + dur).max(axis=3)
    start = start.max(axis=3)
    pp = int(stage.max()) + 1
    rank = np.full((len(dps), pp), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(rank, (di, stage), np.asarray(c["rank"], np.int64))
    return _Ops(
        steps=steps,
        dps=dps,
        stage=stage[first],
        optype=tuple(types[ti[first]]),
        seq=seq[first],
        mc=np.asarray(c["mc"])[first].astype(np.int64),
        start=start,
        dur=np.maximum(end - start, 0.0),
        dur_ranks=dur,
        rank=rank,
    )


# ---------------------------------------------------------------------------------------------
# The dependency graph of one step on one data-parallel replica


class _Graph(msgspec.Struct):
    deps: list[list[int]]
    groups: list[tuple[tuple[int, ...], bool]]  # (members, synchronised across dp ranks)

    def need(self, op: int, *on: int | None) -> None:
        self.deps[op].extend(u for u in on if u is not None and u not in self.deps[op])

    def chain(self, ops: Sequence[int]) -> None:
        for before, after in zip(ops, ops[1:]):
            self.need(after, before)


def _by_stage(ops: _Ops) -> dict[int, dict[str, list[int]]]:
    """Per stage, per type, the ops in the order the template lane ran them."""
    t0 = ops.start[:, 0, 0]
    out: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for o in sorted(range(len(ops.optype)), key=lambda o: (t0[o], ops.seq[o], ops.optype[o])):
        out[int(ops.stage[o])][ops.optype[o]].append(o)
    return out


def _megatron_graph(ops: _Ops) -> _Graph:
    graph = _Graph(deps=[[] for _ in ops.optype], groups=[])
    stages = _by_stage(ops)
    pp = max(stages) + 1
    t0, end0 = ops.start[:, 0, 0], ops.start[:, 0, 0] + ops.dur[:, 0, 0]
    for s, kinds in stages.items():
        compute = sorted(kinds.get(FWD, []) + kinds.get(BWD, []), key=lambda o: (t0[o], ops.seq[o]))
        if not compute:
            raise InputError(f"stage {s} has no forward/backward compute: not a training step")
        graph.chain(compute)
        _p2p_deps(graph, ops, s, kinds, compute)
        last = max(compute, key=lambda o: end0[o])
        _dp_and_tail_deps(graph, ops, s, kinds, last)
        unknown = set(kinds) - _MEGATRON_OPTYPES
        if unknown:
            raise InputError(
                f"operation type(s) {', '.join(sorted(unknown))} on stage {s} are not in the dependency model"
            )
    _pair_p2p(graph, ops, stages, pp)
    _collective_groups(graph, stages, pp)
    return graph


def _p2p_deps(graph: _Graph, ops: _Ops, s: int, kinds: Mapping[str, list[int]], compute: list[int]) -> None:
    for direction, comp_type in (("forward", FWD), ("backward", BWD)):
        comps = sorted(kinds.get(comp_type, []), key=lambda o: ops.seq[o])
        for verb in ("send", "recv"):
            stream = sorted(kinds.get(f"{direction}-{verb}", []), key=lambda o: ops.seq[o])
            if stream and len(stream) != len(comps):
                raise InputError(
                    f"stage {s} has {len(stream)} {direction}-{verb} for {len(comps)} "
                    f"{comp_type}: interleaved (virtual) pipeline schedules are not replayed"
                )
            graph.chain(stream)
            for k, op in enumerate(stream):
                if verb == "send":
                    graph.need(op, comps[k])
                else:
                    graph.need(comps[k], op)
                    graph.need(op, comps[k - 1] if k else None)
    first_bwd = next((i for i, o in enumerate(compute) if ops.optype[o] == BWD), 0)
    if first_bwd:
        # Megatron posts the first backward recv with the send of the last warm-up forward.
        for name in ("backward-recv", "backward-send"):
            stream = sorted(kinds.get(name, []), key=lambda o: ops.seq[o])
            if stream:
                graph.need(stream[0], compute[first_bwd - 1])


def _dp_and_tail_deps(graph: _Graph, ops: _Ops, s: int, kinds: Mapping[str, list[int]], last: int) -> None:
    t0 = ops.start[:, 0, 0]
    dp_comm = sorted((o for name in DP_COLLECTIVES for o in kinds.get(name, [])), key=lambda o: t0[o])
    graph.chain(dp_comm)
    forwards = kinds.get(FWD, [])
    for ag in kinds.get("params-all-gather", []):
        same_chunk = [o for o in forwards if ops.mc[o] == ops.mc[ag]] or forwards
        graph.need(min(same_chunk, key=lambda o: t0[o]), ag)
    overlapped = "separate-grads-all-reduce" in kinds
    reduce_scatter = kinds.get("grads-reduce-scatter", [])
    if overlapped:
        backwards = kinds.get(BWD, [])
        for rs in reduce_scatter:
            same_chunk = [o for o in backwards if ops.mc[o] == ops.mc[rs]] or backwards
            graph.need(rs, max(same_chunk, key=lambda o: t0[o] + ops.dur[o, 0, 0]))
    tail = [*kinds.get(LAYERNORM, []), *kinds.get(EMBEDDING, [])]
    tail += kinds.get("separate-grads-all-reduce", []) if overlapped else reduce_scatter
    tail += [*kinds.get(CLIP, []), *kinds.get(OPTIMIZER, [])]
    head = kinds.get(GC, [])
    for g in head:
        graph.need(g, last)
    if tail:
        graph.need(tail[0], *(head or [last]), *(reduce_scatter[-1:] if overlapped else []))
        graph.chain(tail)


def _pair_p2p(graph: _Graph, ops: _Ops, stages: Mapping[int, Mapping[str, list[int]]], pp: int) -> None:
    for s, kinds in stages.items():
        for direction, peer_stage in (("forward", s + 1), ("backward", s - 1)):
            sends = sorted(kinds.get(f"{direction}-send", []), key=lambda o: ops.seq[o])
            if not sends:
                continue
            if not 0 <= peer_stage < pp:
                raise InputError(f"stage {s} of {pp} has {direction}-send operations: no stage to receive them")
            recvs = sorted(stages.get(peer_stage, {}).get(f"{direction}-recv", []), key=lambda o: ops.seq[o])
            if len(recvs) != len(sends):
                raise InputError(
                    f"stage {s} sends {len(sends)} {direction} activations but stage {peer_stage} receives {len(recvs)}"
                )
            graph.groups += [((a, b), False) for a, b in zip(sends, recvs)]


def _collective_groups(graph: _Graph, stages: Mapping[int, Mapping[str, list[int]]], pp: int) -> None:
    for kinds in stages.values():
        graph.groups += [((o,), True) for name in DP_COLLECTIVES for o in kinds.get(name, [])]
    embedding = tuple(o for s in sorted({0, pp - 1}) for o in stages.get(s, {}).get(EMBEDDING, []))
    if embedding:
        graph.groups.append((embedding, False))
    clip = tuple(o for s in sorted(stages) for o in stages[s].get(CLIP, []))
    if clip:
        graph.groups.append((clip, True))


def _sequential_graph(ops: _Ops) -> _Graph:
    """A pure data-parallel step (our Spans): each rank runs its ops in order; collectives sync all."""
    graph = _Graph(deps=[[] for _ in ops.optype], groups=[])
    for kinds in _by_stage(ops).values():
        order = sorted((o for group in kinds.values() for o in group), key=lambda o: (ops.start[o, 0, 0], ops.seq[o]))
        graph.chain(order)
    graph.groups = [
        ((o,), True)
        for o, name in enumerate(ops.optype)
        if any(mark in name.lower() for mark in _SPAN_COLLECTIVE_MARKS)
    ]
    return graph


# ---------------------------------------------------------------------------------------------
# Replay


class _Plan(msgspec.Struct, frozen=True):
    nodes: tuple[tuple[tuple[int, ...], bool, bool], ...]  # (members, is_collective, across_dp), in order
    deps: tuple[tuple[int, ...], ...]


def _plan(graph: _Graph) -> _Plan:
    """Topological order of the graph with each synchronised group as one node."""
    node_of = list(range(len(graph.deps)))
    nodes: dict[int, tuple[tuple[int, ...], bool, bool]] = {o: ((o,), False, False) for o in node_of}
    for members, across in graph.groups:
        head = members[0]
        for m in members:
            if m != head:
                nodes.pop(m)
            node_of[m] = head
        nodes[head] = (members, True, across)
    after: dict[int, set[int]] = defaultdict(set)
    indegree = {n: 0 for n in nodes}
    for n, (members, _, _) in nodes.items():
        before = {node_of[d] for m in members for d in graph.deps[m]} - {n}
        indegree[n] = len(before)
        for b in before:
            after[b].add(n)
    ready = sorted(n for n, k in indegree.items() if k == 0)
    order = []
    while ready:
        n = ready.pop()
        order.append(nodes[n])
        for nxt in sorted(after[n]):
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    if len(order) != len(nodes):
        raise InputError(
            "the operations' dependencies form a cycle: the trace does not follow the schedule this model knows"
        )
    return _Plan(nodes=tuple(order), deps=tuple(tuple(d) for d in graph.deps))


def _replay(plan: _Plan, dur: np.ndarray) -> np.ndarray:
    """End time of every op; ``dur`` is [scenario, op, step, dp] (transfer time for collectives)."""
    end = np.zeros_like(dur)
    zero = np.zeros(dur.shape[:1] + dur.shape[2:])
    for members, collective, across_dp in plan.nodes:
        starts = [end[:, list(plan.deps[m])].max(axis=1) if plan.deps[m] else zero for m in members]
        if not collective:
            end[:, members[0]] = starts[0] + dur[:, members[0]]
            continue
        arrival = np.maximum.reduce(starts) if len(starts) > 1 else starts[0]
        if across_dp:
            arrival = arrival.max(axis=-1, keepdims=True)
        for m in members:
            end[:, m] = arrival + dur[:, m]
    return end


def _effective_durations(ops: _Ops, plan: _Plan) -> np.ndarray:
    """Measured durations, with a collective's time counted from its last participant's arrival."""
    eff = ops.dur.copy()
    end = ops.start + ops.dur
    for members, collective, across_dp in plan.nodes:
        if not collective:
            continue
        arrival = ops.start[list(members)].max(axis=0)
        if across_dp:
            arrival = arrival.max(axis=-1, keepdims=True)
        eff[list(members)] = np.clip(end[list(members)] - arrival, 0.0, None)
    return eff


def _typical(ops: _Ops, eff: np.ndarray) -> np.ndarray:
    """Every op at the mean (compute) or median (communication) of its type over workers and steps.

    Computation is averaged over every tensor-parallel rank, so a slow rank inside a
    worker counts as a straggler too; a collective's time already starts at its last arrival.
    """
    typ = np.empty_like(eff)
    names = np.asarray(ops.optype)
    for name in set(ops.optype):
        rows = names == name
        typ[rows] = np.median(eff[rows]) if name in COMM_OPTYPES else np.mean(ops.dur_ranks[rows])
    return typ


# ---------------------------------------------------------------------------------------------
# Public entry points


def whatif_ops(table: pa.Table | Mapping[str, npt.ArrayLike]) -> WhatIf:
    """What-if slowdown of a 3D-parallel job from a per-operation batch (``OP_COLUMNS``)."""
    ops = _lanes(table)
    return _analyse(ops, _megatron_graph(ops))


def whatif_spans(spans: Iterable[Span]) -> WhatIf:
    """What-if slowdown of a data-parallel job from our Spans (ranks = data-parallel ranks).

    ``barrier_wait`` spans are dropped: waiting is what the replay recomputes. Steps that
    not every rank finished (the last one of a live store) are left out.
    """
    return _analyse(_lanes(_complete_steps(spans_to_ops(spans))), graph=None)


def whatif_anatomy(anatomy: Anatomy) -> WhatIf:
    """What-if slowdown of a trace set from its step anatomy (``anatomy_spans``): the same for every path
    that builds the anatomy from the same reduced ranks (one process, Dask workers, a reduced Parquet).

    The phases laid end to end are the model's own timeline, so the replay is compared with the set's
    measured step times (the slowest rank's step, on the GPU's clock where the traces have one): that
    comparison is ``replay_ratio`` and ``fits``."""
    measured = dict(zip(anatomy.steps, step_times_s(anatomy).tolist()))
    return _analyse(_lanes(_complete_steps(spans_to_ops(anatomy_spans(anatomy)))), graph=None, measured_s=measured)


def anatomy_spans(anatomy: Anatomy) -> list[Span]:
    """Each rank-step's phases as Spans laid end to end from its start (on the median rank's clock).

    A phase lasts as long as the slower of its host range and, on kernel-level traces, the GPU time of its
    kernels (``RankStep.gpu_phases``): a launch-bound step waits for the host, a GPU-bound one for the
    kernels, and the host's range of an asynchronous launch says nothing of a slow GPU. Phases in
    ``records.PHASES`` order, every phase that some step has; the barrier wait is left out, as ``whatif_spans`` does, since waiting is what the replay recomputes.
    Phases that overlap on the host (a DDP all-reduce under the backward pass) are laid one after the
    other, so the replay can run longer than the trace: ``WhatIf.replay_ratio`` says by how much.
    """
    # Every rank-step gets the phases any step has (0 s where it had none): the replay keeps only steps
    # with every rank and as many operations as the fullest step.
    present = [
        p
        for p in PHASES
        if p != "barrier_wait"
        and any(max(rs.phases.get(p, 0.0), (rs.gpu_phases or {}).get(p, 0.0)) > 0 for rs in anatomy.rank_steps)
    ]
    out = []
    for rs in anatomy.rank_steps:
        t = rs.start_s - anatomy.clock_offset_s.get(rs.rank, 0.0)
        for phase in present:
            dur = max(float(rs.phases.get(phase, 0.0)), float((rs.gpu_phases or {}).get(phase, 0.0)))
            out.append(Span(job=anatomy.job or "", rank=rs.rank, step=rs.step, phase=phase, start=t, dur=dur))
            t += dur
    return out


def _complete_steps(ops: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Only the steps with every rank and as many ops as the fullest step."""
    steps, step_index, rows = np.unique(ops["step"], return_inverse=True, return_counts=True)
    pairs = np.unique(np.stack([step_index, ops["dp_rank"]]), axis=1)
    ranks_per_step = np.bincount(pairs[0], minlength=len(steps))
    full = (rows == rows.max()) & (ranks_per_step == len(np.unique(ops["dp_rank"])))
    keep = full[step_index]
    return {name: column[keep] for name, column in ops.items()}


def spans_to_ops(spans: Iterable[Span]) -> dict[str, np.ndarray]:
    """Spans as an ``OP_COLUMNS`` batch: one stage, dp_rank = rank, seq_id counted per phase."""
    rows = sorted((s for s in spans if s.phase != "barrier_wait"), key=lambda s: (s.step, s.rank, s.start))
    if not rows:
        raise InputError("no spans to analyse")
    seen: dict[tuple[int, int, str], int] = defaultdict(int)
    seq = []
    for s in rows:
        seq.append(seen[(s.step, s.rank, s.phase)])
        seen[(s.step, s.rank, s.phase)] += 1
    n = len(rows)
    return {
        "dp_rank": np.fromiter((s.rank for s in rows), np.int64, n),
        "stage": np.zeros(n, np.int64),
        "rank": np.fromiter((s.rank for s in rows), np.int64, n),
        "step": np.fromiter((s.step for s in rows), np.int64, n),
        "optype": np.array([s.phase for s in rows]),
        "seq_id": np.asarray(seq, np.int64),
        "mc": np.full(n, -1, np.int64),
        "start_s": np.fromiter((s.start for s in rows), float, n),
        "dur_s": np.fromiter((s.dur for s in rows), float, n),
    }


def _analyse(ops: _Ops, graph: _Graph | None, *, measured_s: Mapping[int, float] | None = None) -> WhatIf:
    plan = _plan(graph if graph is not None else _sequential_graph(ops))
    measured = _effective_durations(ops, plan)
    ideal = _typical(ops, measured)
    names, masks = _scenarios(ops)
    # Scenarios that keep the same operations measured replay once: with one pipeline stage, worker d
    # is data-parallel rank d (half the scenarios of a data-parallel trace set).
    index_of: dict[bytes, int] = {}  # a scenario's mask -> its distinct number
    scenario_of = np.array([index_of.setdefault(m.tobytes(), len(index_of)) for m in masks])
    distinct = masks[np.unique(scenario_of, return_index=True)[1]]
    step_t = np.concatenate(
        [  # [distinct scenario, step]
            _replay(plan, np.where(distinct[k : k + SCENARIOS_PER_REPLAY], measured[None], ideal[None])).max(
                axis=(1, 3)
            )
            for k in range(0, len(distinct), SCENARIOS_PER_REPLAY)
        ]
    )[scenario_of]
    mean_t = step_t.mean(axis=1)
    t_ideal = mean_t[1]  # scenario 0 is the replay as measured, 1 the ideal (_scenarios)
    ratio = dict(zip(names, (mean_t / t_ideal).tolist()))
    actual = (ops.start + ops.dur).max(axis=(0, 2))
    if measured_s is not None:
        actual = np.array([measured_s[int(s)] for s in ops.steps])
    return _result(ops, names, ratio, step_t, actual, plan, measured, ideal)


#: A replay's name: ("replay",), ("ideal",), ("optype", label), ("dp_rank", d), ("stage", s), ("worker", d, s).
_Scenario = tuple[str | int, ...]


def _scenarios(ops: _Ops) -> tuple[list[_Scenario], np.ndarray]:
    """Which (op, dp) keep their measured duration in each replay: [scenario, op, 1, dp]."""
    n_ops, n_dp = len(ops.optype), len(ops.dps)
    stages = sorted(set(ops.stage.tolist()))
    label = np.array([_optype_label(t) for t in ops.optype])
    names: list[_Scenario] = [("replay",), ("ideal",)]
    masks = [np.ones((n_ops, n_dp), bool), np.zeros((n_ops, n_dp), bool)]
    for t in sorted(set(label.tolist())):
        names.append(("optype", t))
        masks.append(np.repeat((label == t)[:, None], n_dp, axis=1))
    for d in range(n_dp):
        names.append(("dp_rank", int(ops.dps[d])))
        masks.append(np.repeat((np.arange(n_dp) == d)[None], n_ops, axis=0))
    for s in stages:
        names.append(("stage", s))
        masks.append(np.repeat((ops.stage == s)[:, None], n_dp, axis=1))
    for d in range(n_dp):
        for s in stages:
            names.append(("worker", int(ops.dps[d]), s))
            masks.append((ops.stage == s)[:, None] & (np.arange(n_dp) == d)[None])
    return names, np.stack(masks)[:, :, None, :]


def _optype_label(optype: str) -> str:
    # The artifact reports send and recv of one direction together.
    if optype in P2P:
        return optype.split("-")[0] + "-pp-comm"
    return optype


def _result(
    ops: _Ops,
    names: list[_Scenario],
    ratio: Mapping[_Scenario, float],
    step_t: np.ndarray,
    actual: np.ndarray,
    plan: _Plan,
    measured: np.ndarray,
    ideal: np.ndarray,
) -> WhatIf:
    workers = sorted(
        (
            WorkerSlowdown(
                dp_rank=int(k[1]), stage=int(k[2]), rank=int(ops.rank[list(ops.dps).index(k[1]), int(k[2])]), slowdown=v
            )
            for k, v in ratio.items()
            if k[0] == "worker"
        ),
        key=lambda w: (-w.slowdown, w.dp_rank, w.stage),
    )
    pp = int(ops.stage.max()) + 1
    last_stage = None
    if pp > 1:
        last_stage = _share(ops, plan, measured, ideal, [(int(d), pp - 1) for d in ops.dps], step_t)
    n_top = max(1, math.ceil(len(workers) * TOP_WORKER_PERCENT / 100))
    top = _share(ops, plan, measured, ideal, [(w.dp_rank, w.stage) for w in workers[:n_top]], step_t)
    ranked = sorted(ratio.items(), key=lambda kv: -kv[1])
    s, measured_s, replay_s = ratio[("replay",)], float(actual.mean()), float(step_t[0].mean())
    fits = _fits(replay_s, measured_s)
    return WhatIf(
        slowdown=s if fits else None,
        model_slowdown=s,
        fits=fits,
        verdict=_verdict(s, fits, replay_s=replay_s, measured_s=measured_s),
        steps=tuple(int(s) for s in ops.steps),
        step_time_actual_s=tuple(actual.tolist()),
        step_time_replay_s=tuple(step_t[0].tolist()),
        step_time_ideal_s=tuple(step_t[1].tolist()),
        step_slowdown=tuple((step_t[0] / step_t[1]).tolist()),
        replay_ratio=measured_s / replay_s if replay_s > 0 else float("inf"),
        by_optype={str(k[1]): v for k, v in ranked if k[0] == "optype"},
        by_dp_rank={int(k[1]): v for k, v in ranked if k[0] == "dp_rank"},
        by_stage={int(k[1]): v for k, v in ranked if k[0] == "stage"},
        by_worker=tuple(workers),
        last_stage=last_stage,
        top_workers=top,
        dp_size=len(ops.dps),
        pp_size=pp,
        ops_per_step=len(ops.optype) * len(ops.dps),
    )


def _fits(replay_s: float, measured_s: float) -> bool:
    """The replayed step within ``FIT_TOLERANCE`` of the measured one (a step of 0 s fits nothing)."""
    return measured_s > 0 and abs(replay_s - measured_s) <= FIT_TOLERANCE * measured_s


def _verdict(s: float, fits: bool, *, replay_s: float, measured_s: float) -> str:
    """What S says, in one line: no S from a model that misses the steps, no speed-up from S <= 1."""
    replay = f"replay {replay_s:.4g} s vs measured {measured_s:.4g} s per step"
    if not fits:
        return f"what-if: model does not fit: {replay} (outside ±{FIT_TOLERANCE:.0%}): no what-if slowdown S"
    if s <= 1.0:  # the measured durations replay no slower than the typical ones: nothing to speed up
        return f"what-if: no slowdown from stragglers, S = {s:.3f}, typical durations replay no faster ({replay})"
    return (
        f"what-if slowdown S = {s:.3f}: with no worker slower than typical a step would take {1 / s:.0%} "
        f"of its time ({replay})"
    )


def _share(
    ops: _Ops, plan: _Plan, measured: np.ndarray, ideal: np.ndarray, workers: list[tuple[int, int]], step_t: np.ndarray
) -> Share:
    mask = np.zeros((len(ops.optype), len(ops.dps)), bool)
    dps = list(ops.dps)
    for d, s in workers:
        mask[:, dps.index(d)] |= ops.stage == s
    mask = mask[:, None, :]
    dur = np.stack([np.where(mask, ideal, measured), np.where(mask, measured, ideal)])
    t_without, t_with = _replay(plan, dur).max(axis=(1, 3)).mean(axis=1)
    t_replay, t_ideal = step_t[0].mean(), step_t[1].mean()
    gap = t_replay - t_ideal
    removed = float((t_replay - t_without) / gap) if gap > 0 else 0.0
    added = float((t_with - t_ideal) / gap) if gap > 0 else 0.0
    return Share(
        workers=tuple(workers),
        removed=removed,
        added=added,
        step_time_without_s=float(t_without),
        step_time_with_s=float(t_with),
    )
