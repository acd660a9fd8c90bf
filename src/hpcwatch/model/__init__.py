"""The cluster model (layers, nodes, GPUs, links, storage, scheduler, stack, weights) and the hardware catalog."""

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
