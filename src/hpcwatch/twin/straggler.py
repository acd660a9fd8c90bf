"""The ``straggler`` scenario: one GPU takes twice as long for its backward pass.

The seed's story: GPU 2 of the first node (node1 on the reference cluster) is
slow (a throttled clock, a bad HBM stack, a noisy neighbour). Because every
step ends in a collective, the whole job waits for it: each other rank's
``barrier_wait`` grows by exactly the straggler's extra backward time. The twin
derives the barrier itself (twin/core.py ``step_phases``); this scenario only
doubles one backward.
"""

from __future__ import annotations

from typing import Any

from hpcwatch.twin.exposition import GpuTraceConfig
from hpcwatch.twin.scenarios import Scenario, register

__all__ = ["Straggler", "GpuStraggler", "STRAGGLER_GPU", "STRAGGLER_FACTOR", "GPU_STRAGGLER_BACKWARD_FACTOR"]

#: The slow GPU's index on its node, and how much longer its backward takes (the seed scenario: twice as long).
STRAGGLER_GPU = 2
STRAGGLER_FACTOR = 2.0


@register
class Straggler(Scenario):
    name = "straggler"
    description = "GPU 2 of the first node is twice as slow in backward; every other rank waits at the barrier."

    def __init__(self, node: str = "node1", gpu: int = STRAGGLER_GPU, factor: float = STRAGGLER_FACTOR) -> None:
        self.node = node
        self.gpu = gpu
        self.factor = factor

    def bind(self, twin: Any) -> None:
        """Aim at the first node of whatever cluster the twin simulates."""
        self.node = twin.node_names[0]

    def adjust_step(self, *, rank: int, node: str, gpu: int, step: int, phases: dict[str, float]) -> None:
        if node == self.node and gpu == self.gpu:
            phases["backward"] *= self.factor


#: The GPU-only straggler's extra backward GPU time: ≈ 8 % of the step with GpuTraceConfig's defaults (issue 11).
GPU_STRAGGLER_BACKWARD_FACTOR = 1.15


@register
class GpuStraggler(Scenario):
    """One GPU is slower (extra GPU work in its backward) while its host runs like every other.

    Kernel launches are asynchronous, so the host-side spans of every rank look alike
    (each host blocks on its own GPU, and every GPU waits at the all-reduce for the slow
    one): only the GPU's own timeline, in the kernel-level Kineto traces the twin writes
    (``twin.exposition.gpu_kineto_traces``), names the rank.
    """

    name = "gpu_straggler"
    description = (
        "GPU 2 of the first node does ~8 % more GPU work per step; host timelines alike, only GPU time shows it."
    )

    def __init__(self, gpu: int = STRAGGLER_GPU, factor: float = GPU_STRAGGLER_BACKWARD_FACTOR) -> None:
        self.gpu = gpu
        self.factor = factor

    def gpu_trace_config(self, *, ranks: list[tuple[int, str, int]], first_node: str) -> GpuTraceConfig:
        """The kernel-level traces' settings: the rank on GPU ``gpu`` of ``first_node`` is the slow one."""
        slow = next((r for r, node, g in ranks if node == first_node and g == self.gpu), None)
        return GpuTraceConfig(slow_rank=slow, slow_backward_factor=self.factor)
