"""Twin scenarios that make one node sick, as the exporters would show it: XID 79, a flapping IB link,
a stalled collective. The goodput simulator they once shared a module with is
``analysis/goodputsim.py``.
"""

from __future__ import annotations

import math
from typing import Any

from hpcwatch import vocab
from hpcwatch.records import Event
from hpcwatch.twin.scenarios import Scenario, register
from hpcwatch.vocab import EventKind

__all__ = ["Xid79", "IbFlap", "StalledNccl", "SCENARIO_ONSET_S", "Onset"]

# -- twin scenarios: one sick node, as the exporters would show it --------------------------------

SCENARIO_ONSET_S = 30.0
"""Scenarios start this long after the twin first asks them, so the demo shows a healthy cluster first."""


class Onset:
    """Remembers the first time a hook ran, so a scenario's story is a function of elapsed time."""

    def __init__(self) -> None:
        self._t0: float | None = None

    @property
    def started_at(self) -> float | None:
        return self._t0

    def elapsed_s(self, t: float) -> float:
        if self._t0 is None:
            self._t0 = t
        return t - self._t0 - SCENARIO_ONSET_S


@register
class Xid79(Scenario):
    """A GPU falls off the PCIe bus (XID 79); the training job on it fails, is requeued and restarts.

    What each collector shows, in order (times after the onset)::

        0 s     XID 79 in the kernel log; the GPU reads zeros, DCGM_FI_DEV_XID_ERRORS = 79; the rank's CUDA
                calls fail, so the synchronous job stops stepping (``failure`` event, at its step)
        10 s    torchrun's agents have torn the job down: Slurm requeues it (squeue: PENDING,
                ``restart_cnt`` 1, reason ``ReqNodeNotAvail, UnavailableNodes:node2``) and the node health
                check drains node2 (``Reason=Xid 79 ...``) for its reboot
        20 s    the GPU is gone from dcgm-exporter (``absent_gpus``): the health check's ``gpu_missing``
        +REBOOT_S   node2 is back with all eight GPUs; 4101 starts again on the same nodes, starts up,
                reads its last checkpoint (``checkpoint_restore``) and re-does the steps since that save

    Where it restarts, and why: on the same nodes after the reboot. XID 79 ("GPU has fallen off the bus",
    https://docs.nvidia.com/deploy/xid-errors/) leaves the GPU unreachable until it is reset, which on an
    HGX baseboard operators do by rebooting the node (ours: the usual practice, not a vendor rule), and
    the job's ranks cannot move to the node's other GPUs: the two-node reference cluster has no spare node
    and node2's free GPUs are held by other users. So ``goodput`` counts the steps since the last
    checkpoint as lost progress and the reboot, start-up and restore as recovery.
    """

    name = "xid79"
    description = "node2 GPU 3 falls off the bus (XID 79): its job fails, is requeued and restarts from its checkpoint"
    target_node = "node2"
    target_gpu = 3
    GONE_AFTER_S = 20.0
    """How long after the XID the exporter still lists the GPU (two 10 s scrapes of zeros and XID 79)."""
    TEARDOWN_S = 10.0
    """From the XID to Slurm requeueing the job: the failing rank raises at its next CUDA call, torchrun's
    elastic agents stop every worker and the batch script exits (ours: seconds, as torchrun tears down)."""
    REBOOT_S = 180.0
    """The node's drain and reboot, until it is back in service. Ours: an HGX server's firmware and OS boot
    takes minutes; kept short so the demo shows the restart."""
    DEAD_FIELDS = (
        vocab.DCGM_FI_DEV_GPU_UTIL,
        vocab.DCGM_FI_DEV_POWER_USAGE,
        vocab.DCGM_FI_DEV_SM_CLOCK,
        vocab.DCGM_FI_PROF_GR_ENGINE_ACTIVE,
        vocab.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,
        vocab.DCGM_FI_DEV_FB_USED,
    )

    def __init__(self) -> None:
        self._onset = Onset()
        self._failed_job: str | None = None
        self._requeued = False

    def _down(self, t: float) -> bool:
        """Whether the GPU is lost at t: from the XID until the node is back from its reboot."""
        elapsed = self._onset.elapsed_s(t)
        return 0 <= elapsed < self.TEARDOWN_S + self.REBOOT_S

    def adjust_gpu(self, *, node: str, gpu: int, t: float, fields: dict[str, float]) -> None:
        if node != self.target_node or gpu != self.target_gpu or not self._down(t):
            return
        fields[vocab.DCGM_FI_DEV_XID_ERRORS] = 79.0
        for key in self.DEAD_FIELDS:
            if key in fields:
                fields[key] = 0.0

    def diag_failures(self, *, node: str, t: float) -> dict[int, tuple[str, dict[str, Any]]]:
        """From the XID until the node is back from its reboot, a diagnostic cannot reach the GPU over PCIe."""
        if node != self.target_node or self._onset.started_at is None or not self._down(t):
            return {}
        warning = f"GPU {self.target_gpu} is not reachable over PCIe: it has fallen off the bus (XID 79)"
        return {self.target_gpu: ("pcie", {"warning": warning})}

    def absent_gpus(self, *, t: float) -> list[tuple[str, int]]:
        """The twin's hook for GPUs dcgm-exporter no longer exports (see twin/core.py)."""
        if self._onset.started_at is None or self._onset.elapsed_s(t) < self.GONE_AFTER_S or not self._down(t):
            return []
        return [(self.target_node, self.target_gpu)]

    def events(self, *, twin: Any, t0: float, t1: float) -> list[Event]:
        onset = self._onset.started_at
        if onset is None:
            return []
        t_xid = onset + SCENARIO_ONSET_S
        out: list[Event] = []
        if t0 < t_xid <= t1:  # the tick that ends at (or just after) the XID: no step of it ran past it
            out += self._xid(twin, t_xid)
        if self._failed_job is not None and not self._requeued and t0 >= t_xid + self.TEARDOWN_S:
            self._requeued = True
            out += twin.requeue_job(
                self._failed_job, drain=self.target_node, down_s=self.REBOOT_S, reason=f"Xid 79 GPU {self.target_gpu}"
            )
        return out

    def _xid(self, twin: Any, t: float) -> list[Event]:
        """The kernel log line an operator would grep for, and the failure of the job holding the GPU."""
        out = [
            Event(
                kind=EventKind.XID,
                t=t,
                source="kernel",
                attrs={
                    "node": self.target_node,
                    "gpu": self.target_gpu,
                    "xid": 79,
                    "message": "NVRM: Xid (PCI:0000:5d:00): 79, pid=0, GPU has fallen off the bus.",
                },
            )
        ]
        job = twin.job_of(self.target_node, self.target_gpu) if twin is not None else None
        if job is not None:
            self._failed_job = job
            out.append(twin.fail_job(job, cause="faulty_gpu", node=self.target_node, gpu=self.target_gpu, xid=79))
        return out


@register
class IbFlap(Scenario):
    """One InfiniBand port flaps: LinkDownedCounter steps up every ``FLAP_PERIOD_S``, symbol errors pile up."""

    name = "ib_flap"
    description = "node1 IB port 1 flaps every 2 min; SymbolErrorCounter grows"
    target_node = "node1"
    target_port = 1
    FLAP_PERIOD_S = 120.0
    SYMBOL_ERRORS_PER_S = 25.0

    def __init__(self) -> None:
        self._onset = Onset()
        self._added: dict[str, int] = {}

    def adjust_ib(self, *, node: str, port: int, t: float, counters: dict[str, float]) -> None:
        elapsed = self._onset.elapsed_s(t)
        if node != self.target_node or port != self.target_port or elapsed < 0:
            return
        flaps = math.floor(elapsed / self.FLAP_PERIOD_S) + 1
        target = {
            "LinkDownedCounter": flaps,
            "LinkErrorRecoveryCounter": 2 * flaps,
            "SymbolErrorCounter": math.floor(elapsed * self.SYMBOL_ERRORS_PER_S),
            "PortRcvErrors": math.floor(elapsed / 10.0),
        }
        # The twin keeps the counters we return, so add only what is new since the last call.
        for name, total in target.items():
            counters[name] = counters.get(name, 0.0) + total - self._added.get(name, 0)
            self._added[name] = total


@register
class StalledNccl(Scenario):
    """A collective hangs: every GPU shows 100 % utilisation (the NCCL kernel spins) at near-idle power."""

    name = "stalled_nccl"
    description = "an NCCL all-reduce hangs: util 100 %, power near idle on every GPU"
    #: ~1.1 × the H100 SXM idle power of the catalog (70 W): a polling kernel draws little.
    STALL_POWER_W = 77.0

    def __init__(self) -> None:
        self._onset = Onset()

    def adjust_gpu(self, *, node: str, gpu: int, t: float, fields: dict[str, float]) -> None:
        if self._onset.elapsed_s(t) < 0:
            return
        fields[vocab.DCGM_FI_DEV_GPU_UTIL] = 100.0
        fields[vocab.DCGM_FI_DEV_POWER_USAGE] = self.STALL_POWER_W
        for key in (vocab.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, vocab.DCGM_FI_PROF_DRAM_ACTIVE):
            if key in fields:
                fields[key] = 0.0
