"""The vocabulary: five kinds of record every reader yields and every analysis reads.

Times are UTC seconds (float); durations are seconds; sizes are bytes.
These are plain frozen dataclasses: no logic lives here, but a ``Finding`` refuses a vector or a severity
outside the vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

__all__ = [
    "Sample",
    "Event",
    "Span",
    "Job",
    "MAX_JOB_ID_CHARS",
    "Finding",
    "Phase",
    "PHASES",
    "Vector",
    "VectorInfo",
    "VECTOR_TABLE",
    "VECTORS",
    "Severity",
    "SEVERITIES",
]

Phase = Literal["load", "forward", "backward", "allreduce", "optimizer", "barrier_wait"]
#: The phases of a training step, in the order they run.
PHASES: tuple[Phase, ...] = ("load", "forward", "backward", "allreduce", "optimizer", "barrier_wait")

Vector = Literal[
    "supply_chain",
    "data_poisoning",
    "rdma_blind_spot",
    "gradient_injection",
    "gpu_memory_remanence",
    "container_escape",
    "weights_access",
]


@dataclass(frozen=True, slots=True)
class VectorInfo:
    """One threat vector and the names it goes by; everything else that names a vector derives from its row."""

    id: Vector
    """``Finding.vector``, the page's ``data-vector``, the key of its card (model/cards.yaml) and of its title."""
    number: int | None
    """Its number on the schematic; None for the audit of who read the weights, which is not drawn as a vector
    (the weights are where every vector leads)."""
    short: str
    """The prefix of its detector's rule ids (``rdma.exfiltration``) and of the twin's scenarios that plant it
    (``threat_rdma``, ``benign_rdma``)."""
    target: str
    """The schematic element it attacks."""


#: The six threat vectors, then the audit of who read the weights: the one table of vectors.
VECTOR_TABLE: tuple[VectorInfo, ...] = (
    VectorInfo("supply_chain", 1, "supply_chain", "stack"),
    VectorInfo("data_poisoning", 2, "data_poisoning", "storage"),
    VectorInfo("rdma_blind_spot", 3, "rdma", "fabric"),
    VectorInfo("gradient_injection", 4, "gradient", "gpu"),
    VectorInfo("gpu_memory_remanence", 5, "remanence", "gpu"),
    VectorInfo("container_escape", 6, "container_escape", "node"),
    VectorInfo("weights_access", None, "weights", "weights"),
)
VECTORS: tuple[Vector, ...] = tuple(v.id for v in VECTOR_TABLE)
if set(VECTORS) != set(get_args(Vector)):  # the type and the table must name the same vectors
    raise RuntimeError(f"records.Vector and VECTOR_TABLE differ: {sorted(set(VECTORS) ^ set(get_args(Vector)))}")

Severity = Literal["info", "low", "medium", "high", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "low", "medium", "high", "critical")


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    """One point of a time series: a DCGM field, an IB counter, a Lustre job stat."""

    metric: str
    labels: Mapping[str, str]
    t: float
    value: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Something that happened: a Falco alert, an XID error, a job start, a checkpoint."""

    kind: str
    t: float
    source: str
    attrs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """A timed piece of a training step on one rank.

    ``phase`` is one of ``PHASES`` or the name of a finer operation.
    """

    job: str
    rank: int
    step: int
    phase: str
    start: float
    dur: float
    attrs: Mapping[str, Any] = field(default_factory=dict)


#: Longest workload id looked up (``reports.jobs.check_job_id``, ``hpcwatch job``). Slurm's are short: a
#: 32-bit job id (10 digits), ``_TASK`` for an array task (MaxArraySize is at most 4,000,001: 7 digits),
#: ``+OFFSET`` for a heterogeneous job component, so "4294967295_4000000" (18) is about the longest. The
#: longest of another kind is a pod's ``namespace/name``: a namespace is a DNS label (63) and a pod name a
#: DNS subdomain (253), 317 together. 512 leaves room for an ``hpc_job`` label of a site's own; anything
#: longer is no id of a workload and is refused before the store is asked (a 20,000-character id took
#: seconds of queries and came back whole in the error).
MAX_JOB_ID_CHARS = 512


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A scheduler job and what it was given.

    ``gpus`` is the total GPU count; ``gpus_by_node`` maps a node name to the GPU
    indices the job holds there, when the scheduler told us (squeue's
    ``gres_detail``, ``scontrol -d``); it is empty when only a count is known.
    ``end`` is ``None`` while the job runs; ``start`` is ``None`` while it waits.
    """

    id: str
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    nodes: tuple[str, ...] = ()
    gpus: int = 0
    gpus_by_node: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    start: float | None = None
    end: float | None = None
    state: str | None = None
    name: str | None = None
    mail_user: str | None = None
    """Slurm's ``--mail-user`` (``squeue``/``sacct --json``'s ``mail_user``, ``scontrol``'s ``MailUser``):
    as Slurm gives it, an address or (Slurm's default) the user's name; ``notify`` checks it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """A detection: which threat vector, on what, how bad, and the evidence for it."""

    vector: Vector
    severity: Severity
    target: str
    title: str
    evidence: Mapping[str, Any]
    t: float
    rule: str

    def __post_init__(self) -> None:
        # A vector missing from VECTOR_TABLE would be stored yet absent from every summary the page reads.
        if self.vector not in VECTORS:
            raise ValueError(f"finding {self.rule!r}: unknown vector {self.vector!r} (known: {', '.join(VECTORS)})")
        if self.severity not in SEVERITIES:
            raise ValueError(f"finding {self.rule!r}: unknown severity {self.severity!r}")
