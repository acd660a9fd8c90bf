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

from hpcwatch.twin.scenarios import Scenario, register

__all__ = ["Straggler", "STRAGGLER_GPU", "STRAGGLER_FACTOR"]

#: The slow GPU's index on its node, and how much longer its backward takes (DESIGN.md section 6).
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
