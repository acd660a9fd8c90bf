"""The cluster model: five layers plus the weights, loaded from YAML and checked.

A file describes node groups (``prefix``, ``count``, GPU type...); the loader
expands them into named nodes and GPUs, so 2 nodes and 128 nodes are the same
code. A wrong key gets one line naming the file, the line and the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from hpcwatch.errors import ConfigError
from hpcwatch.model.catalog import (
    COOLING,
    GPUS,
    LINKS,
    CoolingSpec,
    GpuSpec,
    LinkSpec,
    cooling_spec,
    gpu_spec,
    link_spec,
)

__all__ = [
    "Gpu",
    "Node",
    "Fabric",
    "Storage",
    "Scheduler",
    "Stack",
    "Weights",
    "Cooling",
    "Cluster",
    "load_cluster",
    "parse_cluster",
    "reference_cluster",
    "REFERENCE_PATH",
]

REFERENCE_PATH = "reference.yaml"


@dataclass(frozen=True, slots=True, kw_only=True)
class Gpu:
    node: str
    index: int
    spec: GpuSpec

    @property
    def id(self) -> str:
        """``node1/2``: how the schematic and the reports name a GPU."""
        return f"{self.node}/{self.index}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    name: str
    gpus: tuple[Gpu, ...]
    hcas: int
    cpu_cores: int
    memory_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Fabric:
    kind: str
    link: LinkSpec
    topology: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Storage:
    kind: str
    name: str
    mount: str
    osts: int
    mdts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Scheduler:
    kind: str
    version: str
    partitions: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Stack:
    framework: str
    communication: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Weights:
    path: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Cooling:
    """How the GPUs are cooled (``air`` or ``liquid``) and the inlet temperature, °C (the kind's typical one
    unless the file says)."""

    kind: str
    inlet_c: float
    spec: CoolingSpec


def _cooling(kind: str, inlet_c: float | None = None) -> Cooling:
    spec = COOLING[kind]
    return Cooling(kind=kind, inlet_c=spec.inlet_c if inlet_c is None else float(inlet_c), spec=spec)


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    name: str
    nodes: tuple[Node, ...]
    fabric: Fabric
    storage: Storage
    scheduler: Scheduler
    stack: Stack
    weights: Weights
    cooling: Cooling = field(default_factory=lambda: _cooling("liquid"))
    _by_name: dict[str, Node] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_name.update({node.name: node for node in self.nodes})

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        return tuple(gpu for node in self.nodes for gpu in node.gpus)

    def node(self, name: str) -> Node | None:
        return self._by_name.get(name)


def reference_cluster() -> Cluster:
    """The seed's cluster: 2 nodes x 8 H100 SXM, NDR, Lustre, Slurm, PyTorch/NCCL."""
    text = resources.files("hpcwatch.model").joinpath(REFERENCE_PATH).read_text()
    return parse_cluster(text, path=REFERENCE_PATH)


def load_cluster(path: str | Path) -> Cluster:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from err
    return parse_cluster(text, path=str(path))


def parse_cluster(text: str, *, path: str = "<cluster>") -> Cluster:
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as err:
        mark = err.problem_mark if isinstance(err, yaml.MarkedYAMLError) else None  # a ReaderError has none
        line = mark.line + 1 if mark else 0
        raise ConfigError(f"{path}:{line}: not YAML: {getattr(err, 'problem', err)}") from err
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"{path}:1: a cluster model is a mapping of layers")
    return _Reader(path).cluster(root)


class _Reader:
    """Turns the YAML node tree into the model, naming file:line:key on every error."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, node: yaml.Node, key: str, what: str) -> ConfigError:
        return ConfigError(f"{self.path}:{node.start_mark.line + 1}: {key}: {what}")

    def mapping(self, node: yaml.Node, key: str, allowed: set[str]) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, key, "expected a mapping")
        out = {}
        for k, v in node.value:
            name = k.value
            if name not in allowed:
                raise self.fail(
                    k, f"{key}.{name}" if key else name, f"unknown key (allowed: {', '.join(sorted(allowed))})"
                )
            out[name] = v
        return out

    def scalar(self, fields: dict[str, yaml.Node], name: str, key: str, kind: type, default: Any = ...) -> Any:
        node = fields.get(name)
        if node is None:
            if default is ...:
                raise ConfigError(f"{self.path}: {key}.{name}: missing")
            return default
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, f"{key}.{name}", f"expected a {kind.__name__}")
        value = yaml.safe_load(node.value) if kind is not str else node.value
        if kind is int and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise self.fail(node, f"{key}.{name}", f"expected a non-negative integer, got {node.value!r}")
        return value

    def node_groups(self, node: yaml.Node) -> tuple[Node, ...]:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise self.fail(node, "nodes", "expected a non-empty list of node groups")
        nodes: list[Node] = []
        for i, group in enumerate(node.value):
            nodes.extend(self.node_group(group, f"nodes[{i}]"))
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise self.fail(node, "nodes", "two groups produce the same node name")
        return tuple(nodes)

    def node_group(self, node: yaml.Node, key: str) -> list[Node]:
        allowed = {"prefix", "count", "start", "gpu", "gpus_per_node", "hcas_per_node", "cpu_cores", "memory_gib"}
        f = self.mapping(node, key, allowed)
        prefix = self.scalar(f, "prefix", key, str, "node")
        count = self.scalar(f, "count", key, int)
        start = self.scalar(f, "start", key, int, 1)
        gpu_key = self.scalar(f, "gpu", key, str)
        spec = gpu_spec(gpu_key)
        if spec is None:
            raise self.fail(f["gpu"], f"{key}.gpu", f"unknown GPU {gpu_key!r} (known: {', '.join(GPUS)})")
        per_node = self.scalar(f, "gpus_per_node", key, int, 8)
        hcas = self.scalar(f, "hcas_per_node", key, int, per_node)
        cores = self.scalar(f, "cpu_cores", key, int, 0)
        memory = self.scalar(f, "memory_gib", key, int, 0)
        out = []
        for n in range(start, start + count):
            name = f"{prefix}{n}"
            gpus = tuple(Gpu(node=name, index=i, spec=spec) for i in range(per_node))
            out.append(Node(name=name, gpus=gpus, hcas=hcas, cpu_cores=cores, memory_bytes=memory * 1024**3))
        return out

    def cluster(self, root: yaml.MappingNode) -> Cluster:
        layers = {"name", "nodes", "fabric", "storage", "scheduler", "stack", "weights", "cooling"}
        f = self.mapping(root, "", layers)
        if "nodes" not in f:
            raise ConfigError(f"{self.path}: nodes: missing")
        fabric = self.mapping(f["fabric"], "fabric", {"kind", "rate", "topology"}) if "fabric" in f else {}
        rate = self.scalar(fabric, "rate", "fabric", str, "ndr")
        link = link_spec(rate)
        if link is None:
            raise self.fail(fabric["rate"], "fabric.rate", f"unknown rate {rate!r} (known: {', '.join(LINKS)})")
        st = self.mapping(f["storage"], "storage", {"kind", "name", "mount", "osts", "mdts"}) if "storage" in f else {}
        sc = self.mapping(f["scheduler"], "scheduler", {"kind", "version", "partitions"}) if "scheduler" in f else {}
        sk = self.mapping(f["stack"], "stack", {"framework", "communication"}) if "stack" in f else {}
        w = self.mapping(f["weights"], "weights", {"path"}) if "weights" in f else {}
        partitions = sc.get("partitions")
        parts = tuple(p.value for p in partitions.value) if isinstance(partitions, yaml.SequenceNode) else ("gpu",)
        return Cluster(
            name=self.scalar(f, "name", "", str, "cluster"),
            nodes=self.node_groups(f["nodes"]),
            fabric=Fabric(
                kind=self.scalar(fabric, "kind", "fabric", str, "infiniband"),
                link=link,
                topology=self.scalar(fabric, "topology", "fabric", str, "fat-tree"),
            ),
            storage=Storage(
                kind=self.scalar(st, "kind", "storage", str, "lustre"),
                name=self.scalar(st, "name", "storage", str, "lustre"),
                mount=self.scalar(st, "mount", "storage", str, "/lustre"),
                osts=self.scalar(st, "osts", "storage", int, 4),
                mdts=self.scalar(st, "mdts", "storage", int, 1),
            ),
            scheduler=Scheduler(
                kind=self.scalar(sc, "kind", "scheduler", str, "slurm"),
                version=str(self.scalar(sc, "version", "scheduler", str, "22.05")),
                partitions=parts,
            ),
            stack=Stack(
                framework=self.scalar(sk, "framework", "stack", str, "pytorch"),
                communication=self.scalar(sk, "communication", "stack", str, "nccl"),
            ),
            weights=Weights(path=self.scalar(w, "path", "weights", str, "/lustre/checkpoints")),
            cooling=self.cooling(f["cooling"]) if "cooling" in f else _cooling("liquid"),
        )

    def cooling(self, node: yaml.Node) -> Cooling:
        f = self.mapping(node, "cooling", {"kind", "inlet_c"})
        kind = self.scalar(f, "kind", "cooling", str, "liquid")
        if cooling_spec(kind) is None:
            raise self.fail(f["kind"], "cooling.kind", f"unknown cooling {kind!r} (known: {', '.join(COOLING)})")
        inlet = self.scalar(f, "inlet_c", "cooling", float, None)
        if inlet is not None and (isinstance(inlet, bool) or not isinstance(inlet, (int, float)) or not 0 < inlet < 60):
            raise self.fail(f["inlet_c"], "cooling.inlet_c", f"expected degrees C between 0 and 60, got {inlet!r}")
        return _cooling(kind, inlet)
