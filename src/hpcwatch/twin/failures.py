"""Twin scenarios that make one node sick, as the exporters would show it: XID 79, a flapping IB link,
a stalled collective. The goodput simulator they once shared a module with is
``analysis/goodputsim.py``.
"""

from __future__ import annotations

import math
from typing import Any

from hpcwatch.records import Event
from hpcwatch.twin.scenarios import Scenario, register
from hpcwatch import vocab
from hpcwatch.vocab import EventKind

__all__ = ["Xid79", "IbFlap", "StalledNccl", "SCENARIO_ONSET_S"]

# -- twin scenarios: one sick node, as the exporters would show it --------------------------------

SCENARIO_ONSET_S = 30.0
"""Scenarios start this long after the twin first asks them, so the demo shows a healthy cluster first."""


class _Onset:
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
    """A GPU falls off the PCIe bus: XID 79, zeros, then the GPU is gone from the scrape.

    dcgm-exporter keeps the last XID in ``DCGM_FI_DEV_XID_ERRORS``; a GPU NVML can
    no longer reach reads as zero utilisation, power and clocks for the scrapes
    before DCGM gives it up, then it stops being exported at all (``absent_gpus``),
    while the node's other GPUs still report: the health check's ``gpu_missing``.
    """

    name = "xid79"
    description = "node2 GPU 3 falls off the bus (XID 79): zeros, then gone from dcgm-exporter"
    target_node = "node2"
    target_gpu = 3
    GONE_AFTER_S = 20.0
    """How long after the XID the exporter still lists the GPU (two 10 s scrapes of zeros and XID 79)."""
    DEAD_FIELDS = (vocab.DCGM_FI_DEV_GPU_UTIL, vocab.DCGM_FI_DEV_POWER_USAGE, vocab.DCGM_FI_DEV_SM_CLOCK,
                   vocab.DCGM_FI_PROF_GR_ENGINE_ACTIVE, vocab.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, vocab.DCGM_FI_DEV_FB_USED)

    def __init__(self) -> None:
        self._onset = _Onset()

    def adjust_gpu(self, *, node: str, gpu: int, t: float, fields: dict[str, float]) -> None:
        if self._onset.elapsed_s(t) < 0 or node != self.target_node or gpu != self.target_gpu:
            return
        fields[vocab.DCGM_FI_DEV_XID_ERRORS] = 79.0
        for key in self.DEAD_FIELDS:
            if key in fields:
                fields[key] = 0.0

    def absent_gpus(self, *, t: float) -> list[tuple[str, int]]:
        """The twin's hook for GPUs dcgm-exporter no longer exports (see twin/core.py)."""
        if self._onset.started_at is None or self._onset.elapsed_s(t) < self.GONE_AFTER_S:
            return []
        return [(self.target_node, self.target_gpu)]

    def events(self, *, twin: Any, t0: float, t1: float) -> list[Event]:
        # The kernel log line an operator would grep for, once, when the GPU goes.
        onset = self._onset.started_at
        if onset is None or not t0 <= onset + SCENARIO_ONSET_S < t1:
            return []
        t = onset + SCENARIO_ONSET_S
        out = [Event(kind=EventKind.XID, t=t, source="kernel", attrs={
            "node": self.target_node, "gpu": self.target_gpu, "xid": 79,
            "message": "NVRM: Xid (PCI:0000:5d:00): 79, pid=0, GPU has fallen off the bus."})]
        # A synchronous job on that GPU dies with it: the goodput accounting sees the interruption.
        job = getattr(twin, "training_job", None)
        if job is not None and self.target_node in getattr(job, "gpus_by_node", {}):
            out.append(Event(kind=EventKind.FAILURE, t=t, source="twin.failures",
                             attrs={"job": job.id, "cause": "faulty_gpu", "node": self.target_node,
                                    "gpu": self.target_gpu, "xid": 79}))
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
        self._onset = _Onset()
        self._added: dict[str, int] = {}

    def adjust_ib(self, *, node: str, port: int, t: float, counters: dict[str, float]) -> None:
        elapsed = self._onset.elapsed_s(t)
        if node != self.target_node or port != self.target_port or elapsed < 0:
            return
        flaps = math.floor(elapsed / self.FLAP_PERIOD_S) + 1
        target = {"LinkDownedCounter": flaps, "LinkErrorRecoveryCounter": 2 * flaps,
                  "SymbolErrorCounter": math.floor(elapsed * self.SYMBOL_ERRORS_PER_S),
                  "PortRcvErrors": math.floor(elapsed / 10.0)}
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
        self._onset = _Onset()

    def adjust_gpu(self, *, node: str, gpu: int, t: float, fields: dict[str, float]) -> None:
        if self._onset.elapsed_s(t) < 0:
            return
        fields[vocab.DCGM_FI_DEV_GPU_UTIL] = 100.0
        fields[vocab.DCGM_FI_DEV_POWER_USAGE] = self.STALL_POWER_W
        for key in (vocab.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, vocab.DCGM_FI_PROF_DRAM_ACTIVE):
            if key in fields:
                fields[key] = 0.0
