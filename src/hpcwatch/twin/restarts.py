"""The twin's checkpoints, failures and restarts: what a job saved, how a failure kills it, how it comes back.

A job saves a checkpoint every ``checkpoint_interval_s`` (its kind); the save stops training only
while the shards are staged to host memory (``CHECKPOINT_STAGING_BYTES_S``). A scenario kills a job
through ``fail_job`` (its ranks stop stepping) and has Slurm requeue it with ``requeue_job``
(optionally draining a node for its reboot); once the job runs again it starts up
(``RESTART_STARTUP_S``), reads its last checkpoint back (``RESTORE_BYTES_S_PER_GPU``, bytes Lustre
sees) and resumes from the step after it: the steps since then are done again. ``failures.Xid79``
is the scenario that uses all of it.

``Restarts`` is a mixin of ``Twin``, not an object it holds: a failure and a restart act on the
Twin's scheduler, its placement of jobs on GPUs and the step counts of twin/training.py, so a
separate object would only pass the Twin around. The annotations at the top of the class name what
it reads and writes of the Twin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from hpcwatch.errors import ConfigError
from hpcwatch.model import Cluster
from hpcwatch.records import Event
from hpcwatch.twin.training import SEED_PHASES_S
from hpcwatch.twin.workload import PlannedJob, Scheduler
from hpcwatch.vocab import EventKind

__all__ = ["Restarts", "CHECKPOINT_STAGING_BYTES_S", "RESTART_STARTUP_S", "RESTORE_BYTES_S_PER_GPU"]

#: The twin's jobs save asynchronously (torch.distributed.checkpoint.async_save,
#: https://pytorch.org/docs/stable/distributed.checkpoint.html): training stops only while each GPU's
#: shard is copied to host memory over PCIe 5.0 x16 (32 GT/s a lane, ~63 GB/s a direction,
#: https://en.wikipedia.org/wiki/PCI_Express#Comparison_table; ~50 GB/s achieved). That stop is a
#: checkpoint event's ``duration_s``.
CHECKPOINT_STAGING_BYTES_S = 50e9
#: A restarted job's start-up before it reads its checkpoint (torchrun rendezvous, NCCL init, model build).
#: Ours: tens of seconds on a small job; the goodput simulator's first start-up is 5 min (analysis/goodputsim).
RESTART_STARTUP_S = 30.0
#: Checkpoint read-back per GPU from Lustre. Ours: a Lustre client streams a few GB/s per NDR port
#: (one port per GPU rail, 50 GB/s line rate); 2.5 GB/s per GPU is a loaded file system's share.
RESTORE_BYTES_S_PER_GPU = 2.5e9


class Restarts:
    """Checkpoints of the Twin's jobs, their failures, Slurm's requeue and the restart from the last save."""

    # What it reads of the Twin (twin/core.py and twin/training.py set these up).
    cluster: Cluster
    now: float
    t0: float
    scheduler: Scheduler
    _gpu_flat: dict[tuple[str, int], int]
    _job_of_gpu: np.ndarray
    # What it moves of the training steps (twin/training.py).
    _steps_done: dict[str, float]
    _last_step: tuple[int, float] | None

    if TYPE_CHECKING:

        @property
        def training_job(self) -> PlannedJob: ...

        def steps_done(self, job_id: str) -> int: ...

    def _init_restarts(self) -> None:
        self._halted: set[str] = set()
        """Jobs a failure killed that Slurm has not requeued yet."""
        self._resume_at: dict[str, float] = {}
        """Restarted jobs: when they step again (start-up and checkpoint read done)."""
        self._saved: dict[str, tuple[int, str]] = {}
        """Per job: the step and path of its last checkpoint (what a restart reads back)."""

    def planned(self, job_id: str) -> PlannedJob:
        """The scheduler's job ``job_id`` (``ConfigError`` when the twin has none)."""
        for job in self.scheduler.jobs:
            if job.id == job_id:
                return job
        raise ConfigError(f"the twin has no job {job_id!r}")

    # -- checkpoints -------------------------------------------------------------------------------------

    def _checkpoint_event(self, job: PlannedJob, t: float, step: int) -> Event:
        """A job saved step ``step`` at ``t``: the write seen on Lustre, with how long training stopped."""
        per_gpu = job.kind.checkpoint_bytes_per_gpu
        path = f"{self.cluster.weights.path}/{job.id}/step_{step}.pt"
        self._saved[job.id] = (step, path)
        return Event(
            kind=EventKind.CHECKPOINT,
            t=t,
            source="twin",
            attrs={
                "job": job.id,
                "bytes": int(per_gpu * job.gpus),
                "step": step,
                "duration_s": round(per_gpu / CHECKPOINT_STAGING_BYTES_S, 6),
                "path": path,
            },
        )

    def _checkpoints_before_t0(self) -> list[Event]:
        """The training job's last checkpoint before t0 (``LustreState.backfill`` wrote its bytes), so that a
        failure early in the run loses only the steps since then; its step is counted as the first tick
        counts the steps done before t0."""
        job = self.training_job
        every = job.kind.checkpoint_interval_s
        if job.state != "RUNNING" or job.start is None or not every or not job.kind.distributed:
            return []
        saves = int((self.t0 - job.start) // every)
        if saves < 1:
            return []
        t = job.start + saves * every
        return [self._checkpoint_event(job, t, int((t - job.start) / sum(SEED_PHASES_S.values())))]

    def _restore_read(self, job: PlannedJob, t0: float, t1: float) -> float:
        """Bytes per GPU a restarted job read back from its checkpoint in (t0, t1]."""
        resume = self._resume_at.get(job.id)
        if resume is None:
            return 0.0
        restore_s = job.kind.checkpoint_bytes_per_gpu / RESTORE_BYTES_S_PER_GPU
        overlap = max(0.0, min(t1, resume) - max(t0, resume - restore_s))
        return job.kind.checkpoint_bytes_per_gpu * overlap / restore_s if restore_s > 0 else 0.0

    # -- failures and restarts -----------------------------------------------------------------------

    def fail_job(self, job_id: str, *, cause: str, node: str, **attrs: Any) -> Event:
        """A failure kills ``job_id``'s ranks now: it stops stepping (a synchronous job cannot go on
        without one rank). Returns the ``failure`` event, with the step it had reached."""
        job = self.planned(job_id)
        self._halted.add(job.id)
        return Event(
            kind=EventKind.FAILURE,
            t=self.now,
            source="twin.failures",
            attrs={"job": job.id, "cause": cause, "node": node, "step": self.steps_done(job.id), **attrs},
        )

    def requeue_job(
        self, job_id: str, *, drain: str | None = None, down_s: float = 0.0, reason: str = ""
    ) -> list[Event]:
        """Slurm requeues the failed job (``Scheduler.requeue``) and, when ``drain`` is given, the health
        check drains that node for ``down_s`` (its reboot). The job restarts from its last checkpoint
        once its nodes are back (``_restarted``). Returns the ``job_end`` event of the lost attempt, whose
        state is the one ``sacct -D`` gives it: ``REQUEUED``."""
        job = self.planned(job_id)
        attempt_start, attempt_nodes = job.start, list(job.nodes)
        self._job_of_gpu[[self._gpu_flat[(node, g)] for node, gpus in job.gpus_by_node.items() for g in gpus]] = -1
        self.scheduler.requeue(job, self.now)
        if drain is not None:
            self.scheduler.drain(drain, until=self.now + down_s, reason=reason)
        self._halted.discard(job.id)
        if job is self.training_job:  # its ranks are gone: no step of it finished in this tick
            self._last_step = None
        return [
            Event(
                kind=EventKind.JOB_END,
                t=self.now,
                source="slurm",
                attrs={
                    "job": job.id,
                    "user": job.user,
                    "state": "REQUEUED",
                    "restart_cnt": job.restart_cnt,
                    "start": attempt_start,
                    "end": self.now,
                    "nodes": attempt_nodes,
                },
            )
        ]

    def _restarted(self, job: PlannedJob) -> list[Event]:
        """A requeued job runs again: start-up, then it reads its last checkpoint back and resumes from the
        step after it (the steps since then are done again)."""
        saved = self._saved.get(job.id)
        step = saved[0] if saved is not None else 0
        self._steps_done[job.id] = float(step)
        restore_s = job.kind.checkpoint_bytes_per_gpu / RESTORE_BYTES_S_PER_GPU
        t_restore = self.now + RESTART_STARTUP_S
        self._resume_at[job.id] = t_restore + restore_s
        return [
            Event(
                kind=EventKind.CHECKPOINT_RESTORE,
                t=t_restore,
                source="twin",
                attrs={
                    "job": job.id,
                    "step": step,
                    "duration_s": round(restore_s, 6),
                    "restart_cnt": job.restart_cnt,
                    "bytes": int(job.kind.checkpoint_bytes_per_gpu * job.gpus),
                    "path": saved[1] if saved is not None else "",
                },
            )
        ]
