"""The cluster model (layers, nodes, GPUs, links, storage, scheduler, stack, weights) and the hardware catalog.

The names are loaded on first use (PEP 562): ``hpcwatch steps TRACE`` needs the catalog's GPU peaks
(``analysis.mfu``) but not the cluster model, whose module imports PyYAML (see benchmarks/RESULTS.md,
"CLI start-up"); ``from hpcwatch.model import reference_cluster`` still works.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpcwatch.model.catalog import GPUS, LINKS, GpuSpec, LinkSpec, gpu_spec, link_spec
    from hpcwatch.model.cluster import (
        Cluster,
        Fabric,
        Gpu,
        Node,
        Scheduler,
        Stack,
        Storage,
        Weights,
        load_cluster,
        parse_cluster,
        reference_cluster,
    )

_HOME = {
    **dict.fromkeys(("GPUS", "LINKS", "GpuSpec", "LinkSpec", "gpu_spec", "link_spec"), "catalog"),
    **dict.fromkeys(
        (
            "Cluster",
            "Fabric",
            "Gpu",
            "Node",
            "Scheduler",
            "Stack",
            "Storage",
            "Weights",
            "load_cluster",
            "parse_cluster",
            "reference_cluster",
        ),
        "cluster",
    ),
}

__all__ = [
    "GPUS",
    "LINKS",
    "GpuSpec",
    "LinkSpec",
    "gpu_spec",
    "link_spec",
    "Cluster",
    "Fabric",
    "Gpu",
    "Node",
    "Scheduler",
    "Stack",
    "Storage",
    "Weights",
    "load_cluster",
    "parse_cluster",
    "reference_cluster",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"hpcwatch.model.{home}"), name)
    globals()[name] = value
    return value
