"""The twin's Lustre: per job and OST, the cumulative counters of the OSS's ``obdfilter.*.job_stats``.

A ``LustreState`` is held by the Twin (composition, not a mixin): it owns its two arrays and needs
nothing else of the Twin; each tick the Twin hands it the jobs that held GPUs, the steps they made
and the checkpoint bytes they read back, and it says which jobs saved a checkpoint (the Twin
writes those events). What a job reads and writes follows its kind (twin/workload.py): its
dataset shards for ``LOAD_PHASE_S`` after it starts, then a batch per step, and a checkpoint every
``checkpoint_interval_s``. Bytes are striped over every OST, in RPCs of at most 4 MiB, and a job
nothing happened to for ``job_cleanup_interval`` leaves the listing, as on a real OSS.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from hpcwatch.twin.training import SEED_STEP_S
from hpcwatch.twin.workload import PlannedJob

__all__ = ["LustreState", "LUSTRE_RPC_BYTES", "LUSTRE_CLEANUP_S", "LOAD_PHASE_S", "COLUMNS"]

#: Lustre: largest bulk RPC (4 MiB) and the default ``job_cleanup_interval`` (600 s) after which idle entries go.
LUSTRE_RPC_BYTES, LUSTRE_CLEANUP_S = 4 * 1024**2, 600.0
#: How long a job reads its dataset shards / last checkpoint after it starts.
LOAD_PHASE_S = 300.0
#: The counters kept per job and OST, in the order of the last axis.
COLUMNS = ("read_sum", "read_rpcs", "write_sum", "write_rpcs", "syncs")


class LustreState:
    """Cumulative job_stats of jobs by index (into the scheduler's jobs) x OST x ``COLUMNS``."""

    def __init__(self, osts: int) -> None:
        self._counters = np.zeros((0, max(1, osts), len(COLUMNS)))
        # Per job index: when the OSS last saw it do something (NaN: never).
        self._seen = np.zeros(0)

    def backfill(self, jobs: Sequence[PlannedJob], now: float) -> None:
        """Jobs running before t0 have already loaded their data and written their checkpoints."""
        for j, job in enumerate(jobs):
            if job.state != "RUNNING":
                continue
            elapsed = now - job.started_at
            kind = job.kind
            read = job.gpus * (kind.load_bytes_per_gpu + kind.read_bytes_s_per_gpu * max(0.0, elapsed - LOAD_PHASE_S))
            writes = int(elapsed // kind.checkpoint_interval_s) if kind.checkpoint_interval_s else 0
            self.add(
                np.array([j]),
                np.array([read]),
                np.array([writes * kind.checkpoint_bytes_per_gpu * job.gpus]),
                np.array([writes]),
                now=now,
            )

    def tick(
        self,
        jobs: Sequence[PlannedJob],
        idx: np.ndarray,
        *,
        now: float,
        dt: float,
        steps: Mapping[int, float],
        restored: np.ndarray,
    ) -> np.ndarray:
        """Add what ``jobs`` (indices ``idx``) read and wrote in ``(now - dt, now]``; returns, per job,
        whether it saved a checkpoint then.

        ``steps``: steps each timed job made in the tick (a timed job's loader reads a batch per step,
        so its reads follow its step rate and stop with it; the others read at their kind's steady
        rate); ``restored``: bytes per GPU each job read back from its checkpoint."""
        t0, t1 = now - dt, now
        start = np.array([j.start for j in jobs])
        gpus = np.array([j.gpus for j in jobs], dtype=float)
        rate = np.array([j.kind.read_bytes_s_per_gpu for j in jobs])
        load = np.array([j.kind.load_bytes_per_gpu for j in jobs])
        every = np.array([j.kind.checkpoint_interval_s or np.inf for j in jobs])
        ckpt = np.array([j.kind.checkpoint_bytes_per_gpu for j in jobs])
        loading = np.clip(np.minimum(t1, start + LOAD_PHASE_S) - np.maximum(t0, start), 0.0, None)
        steady_s = np.array([steps[j] * SEED_STEP_S if j in steps else dt for j in idx.tolist()])
        read = gpus * (rate * np.maximum(steady_s - loading, 0.0) + load * loading / LOAD_PHASE_S)
        read += gpus * restored
        stepping = np.array([j not in steps or steps[j] > 0 for j in idx.tolist()])
        due = (np.floor((t1 - start) / every) > np.floor((t0 - start) / every)) & stepping
        write = np.where(due, ckpt * gpus, 0.0)
        self.add(idx, read, write, due.astype(float), now=now)
        return due

    def add(self, idx: np.ndarray, read: np.ndarray, write: np.ndarray, syncs: np.ndarray, *, now: float) -> None:
        """Add bytes of jobs idx, striped over every OST (the first total mod osts OSTs get a byte more)."""
        c = self._rows(int(idx.max()) + 1 if len(idx) else 0)
        osts = c.shape[1]
        first = np.arange(osts)[None, :]
        for col, total in ((0, np.floor(read)), (2, np.floor(write))):
            q, r = np.divmod(total, osts)
            c[idx, :, col] += q[:, None] + (first < r[:, None])
            c[idx, :, col + 1] += np.ceil((q + (r > 0)) / LUSTRE_RPC_BYTES)[:, None]
        c[idx, :, 4] += syncs[:, None]
        active = (read > 0) | (write > 0) | (syncs > 0)
        self._seen[idx[active]] = now

    def listed(self, jobs: Sequence[PlannedJob], now: float) -> dict[str, np.ndarray]:
        """Counters (OSTs x ``COLUMNS``) of the jobs the OSS still lists at ``now``, by job id."""
        return {jobs[j].id: self._counters[j] for j in self.listed_indexes(now).tolist()}

    def listed_indexes(self, now: float) -> np.ndarray:
        """Indexes of the jobs the OSS still lists at ``now``, in index order."""
        seen = self._seen
        return np.flatnonzero(~np.isnan(seen) & (now - np.nan_to_num(seen) <= LUSTRE_CLEANUP_S))

    def counters_of(self, indexes: np.ndarray) -> np.ndarray:
        """Counters of the jobs at ``indexes`` (jobs x OSTs x ``COLUMNS``), a copy."""
        return self._counters[indexes]

    def bytes_of(self, j: int) -> tuple[int, int]:
        """(read, written) bytes of job index j, all OSTs, since before t0."""
        counters = self._counters[j] if j < self._counters.shape[0] else np.zeros((1, len(COLUMNS)))
        return int(counters[:, 0].sum()), int(counters[:, 2].sum())

    def _rows(self, n: int) -> np.ndarray:
        """The counters, grown to hold job index n - 1."""
        c = self._counters
        if c.shape[0] < n:
            grown = np.zeros((max(n, 2 * c.shape[0]), c.shape[1], c.shape[2]))
            grown[: c.shape[0]] = c
            self._counters = c = grown
            seen = np.full(grown.shape[0], np.nan)
            seen[: self._seen.shape[0]] = self._seen
            self._seen = seen
        return c
