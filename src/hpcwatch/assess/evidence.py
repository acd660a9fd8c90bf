"""The evidence an assessment reads, gathered once from a store into plain values.

Every criterion rule is a pure function of one ``Evidence``; this module is the only
part of ``assess/`` that reads the store, and it reads it through ``store.queries``
(and ``Store``'s record accessors), never SQL of its own.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson

from hpcwatch import vocab
from hpcwatch.analysis.goodput import GOODPUT_EVENT_KINDS, account_job
from hpcwatch.errors import ConfigError
from hpcwatch.model import Cluster
from hpcwatch.records import Event, Finding, Job
from hpcwatch.store import Store, queries
from hpcwatch.vocab import EventKind

__all__ = [
    "AssessConfig",
    "ModelShape",
    "Evidence",
    "GpuCadence",
    "gather_evidence",
    "PASSIVE_FIELDS",
    "DEFAULT_ACTIVE_CHECK_DAYS",
    "IDLE_UTIL_PCT",
]

#: How recent an active check must be to count (ours: ClusterMAX asks for automated active checks but
#: publishes no period; a week is the longest a burn-in sweep can be apart and still catch a node that
#: degraded since its last job).
DEFAULT_ACTIVE_CHECK_DAYS = 7.0
#: A GPU counts as idle at a scrape where DCGM_FI_DEV_GPU_UTIL is under this (ours: 1 %, the attribution
#: module's idle threshold, analysis/attribution.py IDLE_UTIL_PCT).
IDLE_UTIL_PCT = 1.0

#: The passive health fields ClusterMAX's monitoring criterion names (ECC, row remapping, PCIe replay,
#: clock events), as dcgm-exporter fields; a GPU has the field when any one name of the group is sampled.
PASSIVE_FIELDS: dict[str, tuple[str, ...]] = {
    "ecc": (vocab.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL,),
    "row_remap": (
        vocab.DCGM_FI_DEV_ROW_REMAP_FAILURE,
        vocab.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS,
        vocab.DCGM_FI_DEV_ROW_REMAP_PENDING,
    ),
    "pcie_replay": (vocab.DCGM_FI_DEV_PCIE_REPLAY_COUNTER,),
    "clock_events": (vocab.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, vocab.DCGM_FI_DEV_CLOCKS_EVENT_REASONS),
}
_CLOCK = vocab.DCGM_FI_DEV_GPU_UTIL


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """The trained model, for MFU (the store holds step times, not the model): the formula of docs/reference.md, "MFU"."""

    params: float
    layers: int
    d_model: int
    seq: int
    tokens_per_step: float

    def __post_init__(self) -> None:
        for name in ("params", "layers", "d_model", "seq", "tokens_per_step"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class AssessConfig:
    cluster: Cluster
    """The cluster model: its fabric's catalog rate, its GPU type."""
    active_check_days: float = DEFAULT_ACTIVE_CHECK_DAYS
    """Active checks older than this (before the newest record) do not count."""
    model: ModelShape | None = None
    """The model the training job trains, for MFU; None: MFU is unknown."""

    def __post_init__(self) -> None:
        if self.active_check_days <= 0:
            raise ConfigError(f"active_check_days must be > 0, got {self.active_check_days}")


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuCadence:
    host: str
    gpu: str
    samples: int
    first_t: float
    last_t: float
    longest_gap_s: float | None
    median_gap_s: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    """What the store holds that the criteria read; empty fields mean the store holds none of it."""

    t0: float | None
    t1: float | None
    cluster: Cluster
    config: AssessConfig
    cadence: tuple[GpuCadence, ...] = ()
    jobs: tuple[Job, ...] = ()
    job_gpu_seconds: dict[tuple[str, str, str], tuple[int, float, float]] = field(default_factory=dict)
    """(job, host, gpu) -> (samples, first t, last t) of GPU samples labelled with the job."""
    sample_jobs: tuple[str, ...] = ()
    presence: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    slurm_config: Event | None = None
    active_events: tuple[Event, ...] = ()
    failures: tuple[Event, ...] = ()
    goodput: Any = None
    """analysis.goodput.GoodputReport of the training job with the most steps, or None."""
    step_walls_s: tuple[float, ...] = ()
    nccl_tests: tuple[Event, ...] = ()
    port_rates: tuple[tuple[str | None, dict[str, Any], float], ...] = ()
    """(host, labels, Gb/s) of every ibstat port."""
    nccl_env: tuple[tuple[str, dict[str, str]], ...] | None = None
    """(source, NCCL_* variables) per NCCL log event; None when the store holds no NCCL log."""
    partitions: tuple[Event, ...] = ()
    constraint_increase: tuple[tuple[str, str | None, float], ...] = ()
    nvidia_params: tuple[Event, ...] = ()
    drivers: tuple[tuple[str | None, str], ...] = ()
    """(host, driver version) from the DCGM_FI_DRIVER_VERSION label of any metric (dcgm-exporter, nvidia-smi)."""
    container_toolkit: tuple[tuple[str | None, str], ...] = ()
    findings: tuple[Finding, ...] | None = None
    """Findings of the six detectors over the store; None when they were not run."""
    idle: tuple[tuple[str, str, str, float, int], ...] = ()
    gpu_models: tuple[str, ...] = ()


def _cadence(store: Store) -> tuple[GpuCadence, ...]:
    return tuple(
        GpuCadence(host=h, gpu=g, samples=n, first_t=a, last_t=b, longest_gap_s=gap, median_gap_s=med)
        for h, g, n, a, b, gap, med in queries.gpu_sample_cadence(store, _CLOCK)
    )


def _presence(store: Store) -> dict[tuple[str, str], frozenset[str]]:
    wanted = [vocab.DCGM_FI_DEV_XID_ERRORS, *(m for group in PASSIVE_FIELDS.values() for m in group)]
    found: dict[tuple[str, str], set[str]] = defaultdict(set)
    for host, gpu, metric in queries.gpu_metric_presence(store, wanted):
        found[(host, gpu)].add(metric)
    return {k: frozenset(v) for k, v in found.items()}


def _goodput(store: Store, jobs: list[Job]):
    """The goodput of the job with spans that ran longest (the training run the cluster is judged on)."""
    best = None
    events = [e for kind in GOODPUT_EVENT_KINDS for e in store.events(kind)]
    by_id = {j.id: j for j in jobs}
    for job_id in queries.span_jobs(store):
        report = account_job(by_id.get(job_id), store.spans(job_id), events)
        if best is None or report.total_s > best.total_s:
            best = report
    return best


def _step_walls(store: Store) -> tuple[float, ...]:
    jobs = queries.span_jobs(store)
    if not jobs:
        return ()
    longest = max(jobs, key=lambda j: len(queries.step_walls(store, j)))
    return tuple(end - start for _, start, end in queries.step_walls(store, longest))


def _nccl_env(store: Store) -> tuple[tuple[str, dict[str, str]], ...] | None:
    """NCCL_* variables each rank of an NCCL_DEBUG=INFO log set (``nccl_rank`` events of sources/nccl_log.py,
    attrs ``env``); None when the store holds no NCCL log at all."""
    events = store.events(EventKind.NCCL_RANK)
    if not events:
        return None
    return tuple((e.source, {str(k): str(v) for k, v in (e.attrs.get("env") or {}).items()}) for e in events)


def _labels(text: str) -> dict[str, Any]:
    value = orjson.loads(text) if text else {}
    return value if isinstance(value, dict) else {}


def gather_evidence(store: Store, config: AssessConfig, *, findings: list[Finding] | None = None) -> Evidence:
    """Read everything the criteria need, once."""
    t0, t1 = store.time_range()
    jobs = store.jobs()
    constraint = [
        vocab.NODE_INFINIBAND_PORT_CONSTRAINT_ERRORS_RECEIVED_TOTAL,
        vocab.NODE_INFINIBAND_PORT_CONSTRAINT_ERRORS_TRANSMITTED_TOTAL,
        "ib_PortRcvConstraintErrors",
        "ib_PortXmitConstraintErrors",
    ]
    configs = store.events(EventKind.SLURM_CONFIG)
    return Evidence(
        t0=t0,
        t1=t1,
        cluster=config.cluster,
        config=config,
        cadence=_cadence(store),
        jobs=tuple(jobs),
        job_gpu_seconds={(j, h, g): (n, a, b) for j, h, g, n, a, b in queries.job_gpu_coverage(store, _CLOCK)},
        sample_jobs=tuple(queries.sample_job_ids(store, [_CLOCK])),
        presence=_presence(store),
        slurm_config=configs[-1] if configs else None,
        active_events=tuple(
            e for k in (EventKind.DCGM_DIAG, EventKind.NCCL_TEST, EventKind.IB_WRITE_BW) for e in store.events(k)
        ),
        failures=tuple(store.events(EventKind.FAILURE)),
        goodput=_goodput(store, jobs),
        step_walls_s=_step_walls(store),
        nccl_tests=tuple(store.events(EventKind.NCCL_TEST)),
        port_rates=tuple(
            (h, _labels(lab), v) for h, lab, v, _ in queries.newest_by_labels(store, vocab.IB_PORT_RATE_GBPS)
        ),
        nccl_env=_nccl_env(store),
        partitions=tuple(store.events(EventKind.OPENSM_PARTITIONS)),
        constraint_increase=tuple((m, h, inc) for m, h, _, inc in queries.counter_increase(store, constraint)),
        nvidia_params=tuple(store.events(EventKind.NVIDIA_PARAMS)),
        # every metric: MIG instances export no GPU_UTIL, nvidia-smi and dcgm-exporter put the driver on all samples
        drivers=tuple(queries.label_values_any_metric(store, vocab.DCGM_FI_DRIVER_VERSION)),
        container_toolkit=(),
        findings=None if findings is None else tuple(findings),
        idle=tuple(
            queries.idle_gpu_maxima(
                store,
                util_metric=_CLOCK,
                metrics=[vocab.DCGM_FI_DEV_POWER_USAGE, vocab.DCGM_FI_DEV_GPU_TEMP],
                idle_below_pct=IDLE_UTIL_PCT,
            )
        ),
        gpu_models=tuple(v for _, v in queries.label_values_by_host(store, _CLOCK, "modelName")),
    )
