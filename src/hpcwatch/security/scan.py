"""Run every detector over a store (or over files read into one): the seven vectors in one pass.

The store holds what the detectors read: samples (IB counters, DCGM fields, the
hook's gradient statistics), events (``pip_package``, ``pth_file``, ``falco``,
``tetragon``, ``shard_check``, ``opensm_partitions``, ``nvidia_params``,
``gpu_process``, ``xid``) and Slurm jobs. Two inputs are not records and travel
in ``ScanExtras``: an OSV database and shard manifests to verify on disk.

Files reach the detectors through the store like everything else (``hpcwatch.ingest``):
OSV advisories and shard manifests are stored as events (``sources.stored``) and
``scan_store`` reads them back when ``ScanExtras`` does not give them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc

from hpcwatch import vocab
from hpcwatch.model import Cluster
from hpcwatch.records import SEVERITIES, Event, Finding, Job, Sample, Vector
from hpcwatch.security import gradients, rdma, remanence
from hpcwatch.security.container_escape import ContainerEscapeConfig, detect_container_escape
from hpcwatch.security.context import with_requeued_attempts
from hpcwatch.security.data_poisoning import DataPoisoningConfig, detect_data_poisoning, verify_manifest
from hpcwatch.security.gradients import GradientConfig, detect_gradient_anomalies
from hpcwatch.security.rdma import CONSTRAINT_METRICS, DATA_METRICS, LUSTRE_METRICS, RdmaConfig
from hpcwatch.security.remanence import FB_USED, GPU_UTIL, RemanenceConfig
from hpcwatch.security.series import WindowSeries
from hpcwatch.security.supply_chain import SupplyChainConfig, detect_supply_chain
from hpcwatch.security.weights_access import WeightsAccess, WeightsConfig, detect_weights_access, weights_report
from hpcwatch.sources.manifest import ShardManifest
from hpcwatch.sources.osv import OsvDatabase
from hpcwatch.sources.stored import ADVISORY, MANIFEST, manifests_from_events, osv_from_events
from hpcwatch.store import queries
from hpcwatch.vocab import EventKind

__all__ = [
    "ScanConfig",
    "ScanExtras",
    "ScanInputs",
    "Detector",
    "DETECTORS",
    "scan_records",
    "scan_store",
    "sort_findings",
    "EVENT_KINDS",
    "sample_metrics",
    "weights_reads",
    "rescan",
    "stored_extras",
    "LiveScan",
    "LIVE_WINDOW_S",
    "FORGET_STEP",
    "RULES",
]

#: Event kinds the detectors read (``job_end``: the windows of requeued attempts, ``with_requeued_attempts``).
EVENT_KINDS = (
    EventKind.PIP_PACKAGE,
    EventKind.PTH_FILE,
    EventKind.FALCO,
    EventKind.TETRAGON,
    EventKind.SHARD_CHECK,
    EventKind.OPENSM_PARTITIONS,
    EventKind.NVIDIA_PARAMS,
    EventKind.GPU_PROCESS,
    EventKind.XID,
    EventKind.GPU_XID,
    EventKind.JOB_END,
)


@dataclass(frozen=True, slots=True)
class ScanInputs:
    """What every detector may read: the records of the scan, and the documents that are not records."""

    samples: list[Sample]
    events: list[Event]
    jobs: list[Job]
    extras: ScanExtras
    series: Mapping[Vector, WindowSeries] = field(default_factory=dict)
    """Per vector, the samples of a detector that reads them grouped (``Detector.series``)."""


@dataclass(frozen=True, slots=True)
class Detector:
    """One threat vector's detector: the vector, the module that holds its ``RULES``, and how to run it;
    ``reads``, where given, names the sample metrics it reads: it is then given only those samples, in their
    order (a live scan at 1,024 nodes holds 700,000 samples a detector would otherwise step over).

    ``series``, where given, makes the grouping the detector reads its samples through (``security.series``):
    ``run`` then finds them in ``inputs.series[vector]``, not in ``inputs.samples``, and a live scan keeps the
    grouping between scans, adding only the samples that arrived."""

    vector: Vector
    module: str
    run: Callable[[ScanInputs, ScanConfig], list[Finding]]
    reads: Callable[[str], bool] | None = None
    series: type[WindowSeries] | None = None


def _reads(detector: Detector, metric: str) -> bool:
    return detector.reads is None or detector.reads(metric)


def _no_samples(metric: str) -> bool:
    """``Detector.reads`` of a detector that reads events only."""
    return False


#: One detector a vector, in the order of ``records.VECTOR_TABLE`` (tests/unit/test_security_rules.py checks
#: both, and that each rule id starts with its vector's short name); a new one is a module and one line here.
DETECTORS: tuple[Detector, ...] = (
    Detector(
        "supply_chain",
        "supply_chain",
        lambda i, c: detect_supply_chain(i.events, osv=i.extras.osv, config=c.supply_chain),
        _no_samples,
    ),
    Detector(
        "data_poisoning",
        "data_poisoning",
        lambda i, c: detect_data_poisoning(i.events, i.jobs, c.data_poisoning),
        _no_samples,
    ),
    Detector(
        "rdma_blind_spot",
        "rdma",
        lambda i, c: rdma.detect_rdma_series(
            cast(rdma.RdmaSeries, i.series["rdma_blind_spot"]), i.jobs, i.events, c.rdma
        ),
        rdma.reads_metric,
        rdma.RdmaSeries,
    ),
    Detector(
        "gradient_injection",
        "gradients",
        lambda i, c: detect_gradient_anomalies(i.samples, i.events, c.gradients),
        gradients.reads_metric,
    ),
    Detector(
        "gpu_memory_remanence",
        "remanence",
        lambda i, c: remanence.detect_remanence_series(
            cast(remanence.GpuSeries, i.series["gpu_memory_remanence"]), i.jobs, i.events, c.remanence
        ),
        remanence.reads_metric,
        remanence.GpuSeries,
    ),
    Detector(
        "container_escape",
        "container_escape",
        lambda i, c: detect_container_escape(i.events, i.jobs, c.container_escape),
        _no_samples,
    ),
    Detector(
        "weights_access",
        "weights_access",
        lambda i, c: detect_weights_access(i.events, i.jobs, c.weights),
        _no_samples,
    ),
)


def _all_rules() -> tuple[str, ...]:
    return tuple(r for d in DETECTORS for r in importlib.import_module(f"hpcwatch.security.{d.module}").RULES)


#: Every rule id a detector can emit, module by module (the web page titles findings by rule id).
RULES: tuple[str, ...] = _all_rules()


def sample_metrics() -> list[str]:
    """Metric names the detectors read (plus ``*remote_access_errors*`` and ``train_grad_*``)."""
    return sorted(
        {m for ms in DATA_METRICS.values() for m in ms}
        | CONSTRAINT_METRICS
        | set(LUSTRE_METRICS)
        | {FB_USED, GPU_UTIL, vocab.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, vocab.DCGM_FI_DEV_XID_ERRORS}
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ScanConfig:
    supply_chain: SupplyChainConfig = SupplyChainConfig()
    data_poisoning: DataPoisoningConfig = DataPoisoningConfig()
    rdma: RdmaConfig = RdmaConfig()
    gradients: GradientConfig = GradientConfig()
    remanence: RemanenceConfig = RemanenceConfig()
    container_escape: ContainerEscapeConfig = ContainerEscapeConfig()
    weights: WeightsConfig = WeightsConfig()

    @classmethod
    def for_cluster(cls, cluster: Cluster, *, storage_hosts: Iterable[str] = (), **overrides) -> ScanConfig:
        """Defaults that follow the model: the weights path, and the storage servers' names."""
        return cls(
            rdma=RdmaConfig(storage_hosts=frozenset(storage_hosts), storage_prefixes=(f"{cluster.storage.name}-",)),
            weights=WeightsConfig(weights_path=cluster.weights.path),
            **overrides,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ScanExtras:
    osv: OsvDatabase | None = None
    manifests: tuple[ShardManifest, ...] = ()
    manifest_key: bytes | None = None
    """HMAC key the manifests are signed with; None skips the signature check."""


_SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (-_SEVERITY_RANK[f.severity], f.vector, f.t, f.target))


def scan_records(
    samples: Iterable[Sample],
    events: Iterable[Event],
    jobs: Iterable[Job],
    *,
    config: ScanConfig = ScanConfig(),
    extras: ScanExtras = ScanExtras(),
) -> list[Finding]:
    samples = list(samples)
    series = {d.vector: d.series.of(samples) for d in DETECTORS if d.series is not None}
    return _scan(samples, series, events, jobs, config=config, extras=extras)


def _scan(
    samples: list[Sample],
    series: Mapping[Vector, WindowSeries],
    events: Iterable[Event],
    jobs: Iterable[Job],
    *,
    config: ScanConfig,
    extras: ScanExtras,
) -> list[Finding]:
    """Every detector over ``samples`` (what the detectors without ``series`` read) and ``series`` (what the
    others read, grouped)."""
    events = list(events)
    jobs = with_requeued_attempts(list(jobs), events)
    for manifest in extras.manifests:
        events += verify_manifest(manifest, key=extras.manifest_key)
    inputs = ScanInputs(samples=samples, events=events, jobs=jobs, extras=extras, series=series)
    metrics = {s.metric for s in samples}
    return sort_findings(
        f for detector in DETECTORS for f in detector.run(_inputs_of(detector, inputs, metrics), config)
    )


def _inputs_of(detector: Detector, inputs: ScanInputs, metrics: set[str]) -> ScanInputs:
    """``inputs`` with only the samples ``detector`` reads, when it says which (the others it skips anyway)."""
    if detector.reads is None:
        return inputs
    if detector.series is not None:
        return replace(inputs, samples=[])  # it reads ``inputs.series``
    read = {m for m in metrics if detector.reads(m)}
    if read == metrics:
        return inputs
    if not read:
        return replace(inputs, samples=[])
    return replace(inputs, samples=[s for s in inputs.samples if s.metric in read])


#: Besides ``sample_metrics()``, the detectors read every metric named like these.
SAMPLE_PREFIXES, SAMPLE_SUBSTRINGS = ("train_grad_",), ("remote_access_errors",)


def _read_samples(store, since_version: int = 0) -> tuple[int, list[Sample]]:
    version, rows = _read_rows(store, since_version)
    return version, queries.samples_of_table(rows)


def _read_rows(store, since_version: int = 0) -> tuple[int, pa.Table]:
    """(store version read at, the rows of the metrics the detectors read committed since ``since_version``):
    ``queries.sample_rows_matching``'s columns."""
    return queries.sample_rows_matching(
        store, sample_metrics(), prefixes=SAMPLE_PREFIXES, substrings=SAMPLE_SUBSTRINGS, since_version=since_version
    )


def scan_store(store, *, config: ScanConfig = ScanConfig(), extras: ScanExtras = ScanExtras()) -> list[Finding]:
    """Findings over what ``store`` holds (``store`` is a ``hpcwatch.store.Store``)."""
    _, samples = _read_samples(store)
    _, events = queries.events_of_kinds(store, EVENT_KINDS)
    return scan_records(samples, events, store.jobs(), config=config, extras=stored_extras(store, extras))


def stored_extras(store, extras: ScanExtras = ScanExtras()) -> ScanExtras:
    """``extras`` completed with the advisories and manifests the store holds as events."""
    osv = extras.osv
    if osv is None:
        stored = osv_from_events(store.events(ADVISORY))
        osv = stored if len(stored) else None
    manifests = tuple(extras.manifests) + tuple(manifests_from_events(store.events(MANIFEST)))
    return ScanExtras(osv=osv, manifests=manifests, manifest_key=extras.manifest_key)


def rescan(store, *, config: ScanConfig = ScanConfig(), extras: ScanExtras = ScanExtras()) -> list[Finding]:
    """Scan the store and replace its stored findings with these (what a live view calls now and then)."""
    findings = scan_store(store, config=config, extras=extras)
    with store.transaction() as tx:  # readers never see the findings cleared but not yet replaced
        tx.clear_findings()
        tx.add(findings)
    return findings


#: The live scan's window: five minutes of a live store holds every signal a detector compares
#: (RDMA rates between consecutive scrapes, a few hundred training steps, the memory a GPU keeps
#: after its job); what happened before stays as a finding (see ``LiveScan``).
LIVE_WINDOW_S = 300.0
#: A live scan forgets what left its window once the window has moved on by this share of its length: each
#: forgetting walks every series of the window (15-17 % of a scan at 1,024 nodes when done every scan, py-spy),
#: and a window up to a tenth longer holds the same signals. Ours.
FORGET_STEP = 0.1


class LiveScan:
    """The detectors over the last ``window_s`` of a growing store, read incrementally: what the demo calls
    every few seconds. ``rescan`` reads the whole store each time, which grows with the demo's age.

    Each call reads only the sample and event rows committed since the previous call (``Store.query_since``
    from the store version the previous read was bound to), forgets samples older than ``window_s`` before
    the newest (once the window has moved on by ``FORGET_STEP`` of its length: it holds between ``window_s``
    and 1.1 x ``window_s``), and runs the detectors over the window, every event and every job (both small). The
    detectors that read their samples grouped by series (``Detector.series``) keep their grouping from one
    call to the next: each sample is grouped once, when it arrives. A finding stays once found: one found
    again (same rule and target) is replaced by the fresher one, one whose evidence left the window is kept
    as it was; the kept findings replace the stored ones in one commit. ``hpcwatch scan`` (``scan_store``)
    is unchanged.
    """

    def __init__(
        self, *, config: ScanConfig = ScanConfig(), extras: ScanExtras = ScanExtras(), window_s: float = LIVE_WINDOW_S
    ) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.config, self.extras, self.window_s = config, extras, window_s
        self._series = {d.vector: d.series() for d in DETECTORS if d.series is not None}
        self._samples: list[Sample] = []  # what the detectors without ``series`` read
        self._read_flat: dict[str, bool] = {}  # metric -> whether one of them reads it
        self._events: list[Event] = []
        self._marks = {"samples": 0, "events": 0}  # store versions read up to; 0: nothing yet
        self._found: dict[tuple[str, str], Finding] = {}
        self._newest = float("-inf")
        self._forgot_to = float("-inf")  # the window's start when it last forgot

    def __call__(self, store) -> list[Finding]:
        """Scan what arrived, replace the store's findings with the kept ones, return them."""
        self._read_new(store)
        fresh = _scan(self._samples, self._series, self._events, store.jobs(), config=self.config, extras=self.extras)
        self._found.update({(f.rule, f.target): f for f in fresh})
        findings = sort_findings(self._found.values())
        with store.transaction() as tx:  # readers never see the findings cleared but not yet replaced
            tx.clear_findings()
            tx.add(findings)
        return findings

    @property
    def held(self) -> int:
        """The samples the window holds, grouped or not."""
        return len(self._samples) + sum(len(series) for series in self._series.values())

    def _read_new(self, store) -> None:
        """What was committed since the last call; the version read at is the next mark, so a row the twin
        commits meanwhile is read next time rather than skipped."""
        self._marks["samples"], rows = _read_rows(store, self._marks["samples"])
        if rows.num_rows:
            metrics = pc.unique(rows["metric"]).to_pylist()
            for detector in DETECTORS:
                if detector.series is not None and (read := [m for m in metrics if _reads(detector, m)]):
                    self._series[detector.vector].add_table(rows.filter(pc.is_in(rows["metric"], pa.array(read))))
            flat = [m for m in metrics if self._reads_flat(m)]
            if flat:
                self._samples += queries.samples_of_table(rows.filter(pc.is_in(rows["metric"], pa.array(flat))))
            self._newest = max(self._newest, pc.max(rows["t"]).as_py())
            oldest = self._newest - self.window_s
            if oldest - self._forgot_to >= self.window_s * FORGET_STEP:
                self._samples = [s for s in self._samples if s.t >= oldest]
                for series in self._series.values():
                    series.forget_before(oldest)
                self._forgot_to = oldest
        self._marks["events"], events = queries.events_of_kinds(store, EVENT_KINDS, since_version=self._marks["events"])
        self._events += events

    def _reads_flat(self, metric: str) -> bool:
        read = self._read_flat.get(metric)
        if read is None:
            read = self._read_flat[metric] = any(
                d.series is None and (d.reads is None or d.reads(metric)) for d in DETECTORS
            )
        return read


def weights_reads(store, *, config: ScanConfig = ScanConfig()) -> list[WeightsAccess]:
    """Every access to the checkpoint folder the store's Tetragon events show, with user and job."""
    return weights_report(store.events(EventKind.TETRAGON), store.jobs(), config.weights)
