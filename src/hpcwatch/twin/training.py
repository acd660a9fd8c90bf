"""The twin's training steps: how long each rank's phases take, how many steps a tick holds, their spans.

The first job is the training job whose steps are timed (``step_phases``): a seed step of ~42 ms
(load, forward, backward, the ring AllReduce from the link model, optimizer) with 1 % jitter per
rank; the collective waits for the slowest rank, so a straggler shows up as everyone else's
``barrier_wait``. Like a profiler schedule, one finished step per tick becomes spans
(``finished_spans``). Every other distributed job is timed the same way for its InfiniBand bytes
(its ring AllReduce) and its data loader's reads (twin/lustre.py).

``TrainingSteps`` is a mixin of ``Twin``, not an object it holds: every step reads the Twin's
shared state (which GPU holds which job, the scenarios, the clock) and the failures and restarts
(twin/restarts.py) move its step counts, so a separate object would only pass the Twin around.
The annotations at the top of the class name what it reads of the Twin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import orjson
import pyarrow as pa

from hpcwatch.records import Span
from hpcwatch.twin.scenarios import Scenario
from hpcwatch.twin.workload import PlannedJob, Scheduler

__all__ = ["TrainingSteps", "SEED_PHASES_S", "SEED_STEP_S", "RING_ALPHA_S", "SPAN_ORDER", "PHASE_JITTER"]

#: The seed's training step (seconds per phase, before the AllReduce which comes from the ring model): ~42 ms.
SEED_PHASES_S = {"load": 0.002, "forward": 0.011, "backward": 0.020, "optimizer": 0.002}
#: The seed step without its AllReduce: a job's kind reads ``read_bytes_s_per_gpu`` x this per step.
SEED_STEP_S = sum(SEED_PHASES_S.values())
#: NCCL per-hop latency alpha of the ring model T = 2(p-1)alpha + 2(p-1)/p n/B (docs/reference.md, "Ring all-reduce and busbw").
RING_ALPHA_S = 5e-6
#: The order the phases of a step run in (columns of ``step_phases`` are in ``records.PHASES`` order).
SPAN_ORDER = ("load", "forward", "backward", "barrier_wait", "allreduce", "optimizer")
_SPAN_COLUMNS = [("load", "forward", "backward", "allreduce", "optimizer", "barrier_wait").index(p) for p in SPAN_ORDER]
#: Relative per-phase jitter of one rank's compute (1 %).
PHASE_JITTER = 0.01


class TrainingSteps:
    """Step timing of the Twin's distributed jobs, and the spans of the training job's steps."""

    # What it reads of the Twin (twin/core.py sets these up).
    n_gpus: int
    seed: int
    now: float
    scheduler: Scheduler
    scenarios: tuple[Scenario, ...]
    link_bytes_s: float
    _nvlink_bytes_s: float
    _gpu_flat: dict[tuple[str, int], int]
    _label_job: np.ndarray
    # What the failures and restarts set (twin/restarts.py).
    _halted: set[str]
    _resume_at: dict[str, float]

    if TYPE_CHECKING:

        def _hooked(self, hook: str) -> list[Scenario]: ...

    def _init_steps(self) -> None:
        self._last_step: tuple[int, float] | None = None
        """(step, end) of the training job's step that finished in the last tick."""
        self._steps_done: dict[str, float] = {}
        self._tick_steps: dict[int, float] = {}
        """Steps each timed job (by index) made in the last tick: what its data loader read."""

    @property
    def training_job(self) -> PlannedJob:
        """The big training job whose steps the twin times (the first job)."""
        return self.scheduler.jobs[0]

    def steps_done(self, job_id: str) -> int:
        """Training steps a distributed job has finished (since it started), as the twin counts them."""
        return int(self._steps_done.get(job_id, 0.0))

    def _ring_allreduce_s(self, job: PlannedJob) -> float:
        p = job.gpus
        if p < 2:
            return 0.0
        # Across nodes the ring is limited by one NDR port per rail; inside a node by NVLink (one direction).
        bw = self.link_bytes_s if job.n_nodes > 1 else self._nvlink_bytes_s / 2
        return 2 * (p - 1) * RING_ALPHA_S + 2 * (p - 1) / p * job.kind.gradient_bytes / bw

    def ranks(self, job: PlannedJob) -> list[tuple[int, str, int]]:
        """(rank, node, gpu) in Slurm's order: node by node, GPU index order."""
        out: list[tuple[int, str, int]] = []
        for node, gpus in job.gpus_by_node.items():
            out.extend((len(out) + i, node, g) for i, g in enumerate(gpus))
        return [(i, node, g) for i, (_, node, g) in enumerate(out)]

    def step_phases(self, job: PlannedJob, step: int) -> tuple[list[tuple[int, str, int]], np.ndarray]:
        """Per-rank phase durations (seconds) of one step, columns in ``records.PHASES`` order.

        Each rank's compute jitters by 1 %; scenarios' ``adjust_step`` bend it. The AllReduce is a
        collective: it moves data only once the last rank arrives, so every other rank waits in it
        (as NCCL and the step anatomy of analysis/steps.py see it) for the slowest one::

            rank 0  |load|fwd|--bwd--|....barrier_wait....|allreduce|opt|
            rank 2  |load|fwd|------bwd x2-----------------|allreduce|opt|   <- the straggler sets the pace

        ``SPAN_ORDER`` is the order the phases run in.
        """
        ranks = self.ranks(job)
        rng = np.random.default_rng([self.seed, int(job.id), int(step)])
        jitter = 1.0 + PHASE_JITTER * rng.standard_normal((len(ranks), 4))
        base = np.array([SEED_PHASES_S[p] for p in ("load", "forward", "backward", "optimizer")])
        compute = base * jitter
        table = np.zeros((len(ranks), 6))
        table[:, [0, 1, 2, 4]] = compute
        table[:, 3] = self._ring_allreduce_s(job)
        hooked = self._hooked("adjust_step")
        for r, node, g in ranks if hooked else ():
            phases = {
                "load": table[r, 0],
                "forward": table[r, 1],
                "backward": table[r, 2],
                "allreduce": table[r, 3],
                "optimizer": table[r, 4],
            }
            for scenario in hooked:
                scenario.adjust_step(rank=r, node=node, gpu=g, step=step, phases=phases)
            table[r, :5] = [phases[p] for p in ("load", "forward", "backward", "allreduce", "optimizer")]
        before_collective = table[:, :3].sum(axis=1)
        table[:, 5] = before_collective.max() - before_collective
        return ranks, table

    def _train_steps(self, dt: float) -> tuple[np.ndarray, np.ndarray]:
        """Per GPU: share of the step spent in compute (scales tensor activity) and IB bytes this tick."""
        share = np.ones(self.n_gpus)
        gpu_bytes = np.zeros(self.n_gpus)
        jobs = self.scheduler.jobs
        self._tick_steps = {}
        step_hooks = bool(self._hooked("adjust_step"))
        for j in np.unique(self._label_job[self._label_job >= 0]).tolist():
            job = jobs[j]
            # Single-node jobs are timed only when a scenario may bend their steps (they move no IB bytes).
            if not job.kind.distributed or job.gpus < 2 or (job.n_nodes < 2 and not step_hooks and j != 0):
                continue
            done = self._steps_done.setdefault(
                job.id, max(0.0, self.now - dt - job.start) / sum(SEED_PHASES_S.values())
            )
            step = int(done)
            ranks, table = self.step_phases(job, step)
            step_s = float(table.sum(axis=1).max())
            nominal = sum(SEED_PHASES_S[p] for p in ("forward", "backward")) / (
                sum(SEED_PHASES_S.values()) + table[:, 3].mean()
            )
            flat = [self._gpu_flat[(node, g)] for _, node, g in ranks]
            share[flat] = (table[:, 1] + table[:, 2]) / step_s / nominal
            active_s = self._stepping_s(job, dt)
            if active_s < dt:  # its ranks are dead, waiting in the queue, or restoring: no compute
                share[flat] = share[flat] * active_s / dt if dt > 0 else 0.0
            self._tick_steps[j] = 0.0
            if active_s <= 0:
                continue
            steps = active_s / step_s
            self._steps_done[job.id] = done + steps
            self._tick_steps[j] = steps
            if job.n_nodes > 1:
                p = job.gpus
                gpu_bytes[flat] = steps * 2 * (p - 1) / p * job.kind.gradient_bytes
            if j == 0 and int(done + steps) > int(done):
                self._last_step = (int(done + steps) - 1, self.now)
        return share, gpu_bytes

    def _stepping_s(self, job: PlannedJob, dt: float) -> float:
        """Seconds of the last tick in which ``job`` trained: none once a failure killed its ranks, none
        before a restarted job has started up and read back its checkpoint."""
        if job.id in self._halted:
            return 0.0
        resume = self._resume_at.get(job.id)
        if resume is None:
            return dt
        return float(np.clip(self.now - resume, 0.0, dt))

    # -- spans -----------------------------------------------------------------------------------------

    def _span_table(self, job: PlannedJob, step: int, end: float | None):
        ranks, table = self.step_phases(job, step)
        step_s = float(table.sum(axis=1).max())
        start = (end if end is not None else job.started_at + (step + 1) * sum(SEED_PHASES_S.values())) - step_s
        return job.id, step, ranks, table, start

    def finished_span_table(self):
        """(job id, step, ranks, phase table, step start) of the step that finished in the last tick, or None;
        the columnar form of ``finished_spans()`` (columns of the table in ``records.PHASES`` order)."""
        if self._last_step is None:
            return None
        step, end = self._last_step
        return self._span_table(self.training_job, step, end)

    def _spans_of(self, job: PlannedJob, step: int, *, end: float | None = None) -> list[Span]:
        job_id, step, ranks, table, start = self._span_table(job, step, end)
        starts = _phase_starts(table, start)
        spans = []
        for r, node, g in ranks:
            for k, phase in enumerate(SPAN_ORDER):
                spans.append(
                    Span(
                        job=job_id,
                        rank=r,
                        step=step,
                        phase=phase,
                        start=round(float(starts[r, k]), 6),
                        dur=float(table[r, _SPAN_COLUMNS[k]]),
                        attrs={"node": node, "gpu": g},
                    )
                )
        return spans

    def finished_span_columns(self) -> pa.Table | None:
        """``finished_spans()`` as the store's span columns (job, rank, step, phase, start, dur, attrs as JSON
        text; ``Transaction.add_span_table``), built from the phase table in numpy: a 1,536-rank job's step is
        9,216 spans a tick, and making each a ``Span`` and then a row was a fifth of the 1,024-node twin's tick.
        None when no step finished in the last tick."""
        found = self.finished_span_table()
        if found is None:
            return None
        job_id, step, ranks, table, start = found
        phases = len(SPAN_ORDER)
        starts = _phase_starts(table, start)
        # The store writes a span's attrs as orjson's compact text of {"node": ..., "gpu": ...}: one per rank.
        attrs = [orjson.dumps({"node": node, "gpu": g}).decode() for _, node, g in ranks]
        rows = len(ranks) * phases
        return pa.table(
            {
                "job": pa.array([job_id] * rows, pa.string()),
                "rank": pa.array(np.repeat([r for r, _, _ in ranks], phases), pa.int32()),
                "step": pa.array(np.full(rows, step), pa.int32()),
                "phase": pa.array(list(SPAN_ORDER) * len(ranks), pa.string()),
                "start": pa.array([round(x, 6) for x in starts.reshape(-1).tolist()], pa.float64()),  # as Span's
                "dur": pa.array(table[:, _SPAN_COLUMNS].reshape(-1), pa.float64()),
                "attrs": pa.array(np.repeat(attrs, phases).tolist(), pa.string()),
            }
        )

    def finished_spans(self) -> list[Span]:
        """Spans of the training job's step that finished in the last tick (one step per tick, like a
        profiler's schedule), or nothing."""
        if self._last_step is None:
            return []
        step, end = self._last_step
        return self._spans_of(self.training_job, step, end=end)

    def spans(self, step: int | None = None) -> list[Span]:
        """Spans (every rank, every phase) of one step of the training job; default: the last one finished."""
        job = self.training_job
        if step is None:
            if self._last_step is not None:
                return self.finished_spans()
            step = max(0, int(self._steps_done.get(job.id, 1.0)) - 1)
        return self._spans_of(job, step)


def _phase_starts(table: np.ndarray, start: float) -> np.ndarray:
    """Each rank's phase start times (UTC s, columns in ``SPAN_ORDER``): the phases run back to back from the
    step's ``start``."""
    ordered = table[:, _SPAN_COLUMNS]
    starts: np.ndarray = start + np.cumsum(ordered, axis=1) - ordered
    return starts
