"""The twin's own ground truth per job, computed from the very counters it writes.

Each tick the Twin adds what its jobs' GPUs did (energy, utilisation, new XID errors) and what
their InfiniBand ports moved, attributed by the same rules as analysis/attribution.py, so a round
trip through files and readers can be checked number for number (``Twin.truth()``).

``GroundTruth`` is a mixin of ``Twin``, not an object it holds: its accounting reads the tick's
GPU fields, the placement of jobs and the rail of each GPU, all the Twin's shared arrays. The
annotations at the top of the class name what it reads of the Twin.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcwatch import vocab
from hpcwatch.twin.devices import FIELD
from hpcwatch.twin.lustre import LustreState
from hpcwatch.twin.workload import Scheduler

__all__ = ["JobTruth", "GroundTruth"]


@dataclass(slots=True)
class JobTruth:
    """What the twin knows happened to one job since the twin started (its own ground truth)."""

    id: str
    energy_mj: int = 0
    ib_tx_bytes: int = 0
    ib_rx_bytes: int = 0
    xid_errors: int = 0
    util_sum: float = 0.0
    util_samples: int = 0
    lustre_read_bytes: int = 0
    lustre_write_bytes: int = 0

    @property
    def energy_kwh(self) -> float:
        return self.energy_mj / 3.6e9

    @property
    def mean_gpu_util(self) -> float | None:
        return self.util_sum / self.util_samples if self.util_samples else None


class GroundTruth:
    """Per-job accounting of the Twin's ticks, and the truth it adds up to."""

    # What it reads of the Twin (twin/core.py sets these up).
    now: float
    scheduler: Scheduler
    fields: np.ndarray
    _label_job: np.ndarray
    _port_of_gpu: np.ndarray
    _gpus_per_port: np.ndarray
    _lustre: LustreState
    # Per job index: energy_mj, util_sum, util_samples, xid_errors, ib_tx_bytes, ib_rx_bytes (the Twin grows it).
    _acc: np.ndarray
    # Per GPU: its XID field last tick (a new value is a new error).
    _prev_xid: np.ndarray

    def _account(self, energy_inc: np.ndarray, ib_delta_bytes: np.ndarray) -> None:
        """Ground truth, attributed by the same rules as analysis/attribution.py."""
        assign = self._label_job
        xid = self.fields[:, FIELD[vocab.DCGM_FI_DEV_XID_ERRORS]]
        new_xid = (xid != 0) & (xid != self._prev_xid)
        self._prev_xid = xid.copy()
        busy = assign >= 0
        if not busy.any():
            return
        idx = assign[busy]
        n = self._acc.shape[0]
        # A port's bytes go to the jobs on its rail GPUs, shared equally (floor) between those GPUs.
        ports = self._port_of_gpu[busy]
        share = ib_delta_bytes[ports] // self._gpus_per_port[ports][:, None]
        for col, weights in enumerate(
            (
                energy_inc[busy],
                self.fields[busy, FIELD[vocab.DCGM_FI_DEV_GPU_UTIL]],
                None,
                new_xid[busy].astype(float),
                share[:, 0],
                share[:, 1],
            )
        ):
            self._acc[:, col] += np.bincount(idx, weights=weights, minlength=n)

    def truth(self) -> dict[str, JobTruth]:
        """Per job, what the twin did since t0 (energy, IB bytes, XID errors...) plus cumulative Lustre bytes."""
        out = {}
        for j, job in enumerate(self.scheduler.jobs):
            if job.start is None:
                continue
            energy, util, n, xid, tx, rx = (self._acc[j] if j < self._acc.shape[0] else np.zeros(6)).tolist()
            lustre_read, lustre_write = self._lustre.bytes_of(j)
            out[job.id] = JobTruth(
                id=job.id,
                energy_mj=int(energy),
                ib_tx_bytes=int(tx),
                ib_rx_bytes=int(rx),
                xid_errors=int(xid),
                util_sum=util,
                util_samples=int(n),
                lustre_read_bytes=lustre_read,
                lustre_write_bytes=lustre_write,
            )
        return out

    def gpu_hours(self, job_id: str) -> float:
        """GPUs x (end or now - start), as Slurm accounts it (jobstats' GPU-hours)."""
        job = next(j for j in self.scheduler.jobs if j.id == job_id)
        if job.start is None:
            return 0.0
        return job.gpus * ((job.end if job.end is not None else self.now) - job.start) / 3600.0
