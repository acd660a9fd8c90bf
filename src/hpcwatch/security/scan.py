"""Run every detector over a store (or over files read into one): the seven vectors in one pass.

The store holds what the detectors read: samples (IB counters, DCGM fields, the
hook's gradient statistics), events (``pip_package``, ``pth_file``, ``falco``,
``tetragon``, ``shard_check``, ``opensm_partitions``, ``nvidia_params``,
``gpu_process``, ``xid``) and Slurm jobs. Two inputs are not records and travel
in ``ScanExtras``: an OSV database and shard manifests to verify on disk.

``load_paths`` reads files into records by their content (until sources/detect.py
knows every format, the security formats are recognised here).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from hpcwatch.errors import ParseError
from hpcwatch.model import Cluster
from hpcwatch.records import SEVERITIES, Event, Finding, Job, Sample
from hpcwatch.security.container_escape import ContainerEscapeConfig, detect_container_escape
from hpcwatch.security.data_poisoning import DataPoisoningConfig, detect_data_poisoning, verify_manifest
from hpcwatch.security.gradients import GradientConfig, detect_gradient_anomalies
from hpcwatch.security.rdma import CONSTRAINT_METRICS, DATA_METRICS, LUSTRE_METRICS, RdmaConfig, detect_rdma
from hpcwatch.security.remanence import FB_USED, GPU_UTIL, RemanenceConfig, detect_remanence
from hpcwatch.security.supply_chain import SupplyChainConfig, detect_supply_chain
from hpcwatch.security.weights_access import WeightsAccess, WeightsConfig, detect_weights_access, weights_report
from hpcwatch.sources.lines import read_text
from hpcwatch.sources.manifest import ShardManifest
from hpcwatch.sources.osv import OsvDatabase

__all__ = ["ScanConfig", "ScanExtras", "scan_records", "scan_store", "load_paths", "sort_findings",
           "EVENT_KINDS", "sample_metrics", "weights_reads", "rescan", "Loaded", "LiveScan", "LIVE_WINDOW_S", "RULES"]

#: Event kinds the detectors read.
EVENT_KINDS = ("pip_package", "pth_file", "falco", "tetragon", "shard_check", "opensm_partitions",
               "nvidia_params", "gpu_process", "xid", "gpu_xid")


def _all_rules() -> tuple[str, ...]:
    from hpcwatch.security import (container_escape, data_poisoning, gradients, rdma, remanence, supply_chain,
                                   weights_access)
    return tuple(r for m in (supply_chain, data_poisoning, rdma, gradients, remanence, container_escape,
                             weights_access) for r in m.RULES)


#: Every rule id a detector can emit, module by module (the web page titles findings by rule id).
RULES: tuple[str, ...] = _all_rules()


def sample_metrics() -> list[str]:
    """Metric names the detectors read (plus ``*remote_access_errors*`` and ``train_grad_*``)."""
    return sorted({m for ms in DATA_METRICS.values() for m in ms} | CONSTRAINT_METRICS
                  | set(LUSTRE_METRICS) | {FB_USED, GPU_UTIL, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_XID_ERRORS"})


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
    def for_cluster(cls, cluster: Cluster, *, storage_hosts: Iterable[str] = (), **overrides) -> "ScanConfig":
        """Defaults that follow the model: the weights path, and the storage servers' names."""
        return cls(rdma=RdmaConfig(storage_hosts=frozenset(storage_hosts),
                                   storage_prefixes=(f"{cluster.storage.name}-",)),
                   weights=WeightsConfig(weights_path=cluster.weights.path), **overrides)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScanExtras:
    osv: OsvDatabase | None = None
    manifests: tuple[ShardManifest, ...] = ()
    manifest_key: bytes | None = None
    """HMAC key the manifests are signed with; None skips the signature check."""


_SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (-_SEVERITY_RANK[f.severity], f.vector, f.t, f.target))


def scan_records(samples: Iterable[Sample], events: Iterable[Event], jobs: Iterable[Job], *,
                 config: ScanConfig = ScanConfig(), extras: ScanExtras = ScanExtras()) -> list[Finding]:
    samples, events, jobs = list(samples), list(events), list(jobs)
    for manifest in extras.manifests:
        events += verify_manifest(manifest, key=extras.manifest_key)
    findings = detect_supply_chain(events, osv=extras.osv, config=config.supply_chain)
    findings += detect_data_poisoning(events, jobs, config.data_poisoning)
    findings += detect_rdma(samples, jobs, events, config.rdma)
    findings += detect_gradient_anomalies(samples, events, config.gradients)
    findings += detect_remanence(samples, jobs, events, config.remanence)
    findings += detect_container_escape(events, jobs, config.container_escape)
    findings += detect_weights_access(events, jobs, config.weights)
    return sort_findings(findings)


def _sample_filter() -> tuple[str, list[str]]:
    """SQL condition and parameters selecting the samples the detectors read."""
    metrics = sample_metrics()
    marks = ", ".join("?" * len(metrics))
    return (f"(metric IN ({marks}) OR metric LIKE 'train_grad_%' OR metric LIKE '%remote_access_errors%')",
            metrics)


def scan_store(store, *, config: ScanConfig = ScanConfig(), extras: ScanExtras = ScanExtras()) -> list[Finding]:
    """Findings over what ``store`` holds (``store`` is a ``hpcwatch.store.Store``)."""
    where, metrics = _sample_filter()
    rows = store.query(f"SELECT metric, labels, t, value FROM samples WHERE {where} ORDER BY t", metrics)
    samples = [Sample(metric=m, labels=orjson.loads(lab), t=t, value=v) for m, lab, t, v in rows]
    events = [e for kind in EVENT_KINDS for e in store.events(kind)]
    return scan_records(samples, events, store.jobs(), config=config, extras=extras)


def rescan(store, *, config: ScanConfig = ScanConfig(), extras: ScanExtras = ScanExtras()) -> list[Finding]:
    """Scan the store and replace its stored findings with these (what a live view calls now and then)."""
    findings = scan_store(store, config=config, extras=extras)
    store.clear_findings()
    store.add(findings)
    return findings


#: The live scan's window: five minutes of a live store holds every signal a detector compares
#: (RDMA rates between consecutive scrapes, a few hundred training steps, the memory a GPU keeps
#: after its job); what happened before stays as a finding (see ``LiveScan``).
LIVE_WINDOW_S = 300.0


class LiveScan:
    """The detectors over the last ``window_s`` of a growing store, read incrementally: what the demo calls
    every few seconds. ``rescan`` reads the whole store each time, which grows with the demo's age.

    Each call reads only the sample and event rows committed since the previous call (``Store.query_since``
    from the store version the previous read was bound to), forgets samples older than ``window_s`` before
    the newest, and runs the detectors over the window, every event and every job (both small). A finding
    stays once found: one found again (same rule and target) is replaced by the fresher one, one whose
    evidence left the window is kept as it was; the kept findings replace the stored ones in one commit.
    ``hpcwatch scan`` (``scan_store``) is unchanged.
    """

    def __init__(self, *, config: ScanConfig = ScanConfig(), extras: ScanExtras = ScanExtras(),
                 window_s: float = LIVE_WINDOW_S) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.config, self.extras, self.window_s = config, extras, window_s
        self._samples: list[Sample] = []
        self._events: list[Event] = []
        self._marks = {"samples": 0, "events": 0}  # store versions read up to; 0: nothing yet
        self._found: dict[tuple[str, str], Finding] = {}
        self._newest = float("-inf")

    def __call__(self, store) -> list[Finding]:
        """Scan what arrived, replace the store's findings with the kept ones, return them."""
        self._read_new(store)
        fresh = scan_records(self._samples, self._events, store.jobs(), config=self.config, extras=self.extras)
        self._found.update({(f.rule, f.target): f for f in fresh})
        findings = sort_findings(self._found.values())
        with store.transaction() as tx:  # readers never see the findings cleared but not yet replaced
            tx.clear_findings()
            tx.add(findings)
        return findings

    def _read_new(self, store) -> None:
        where, metrics = _sample_filter()
        rows = self._new_rows(store, "samples", "metric, labels, t, value", where, metrics)
        self._samples += [Sample(metric=m, labels=orjson.loads(lab), t=t, value=v) for m, lab, t, v in rows]
        if rows:
            self._newest = max(self._newest, max(r[2] for r in rows))
            self._samples = [s for s in self._samples if s.t >= self._newest - self.window_s]
        kinds = f"kind IN ({', '.join('?' * len(EVENT_KINDS))})"
        rows = self._new_rows(store, "events", "kind, t, source, attrs", kinds, list(EVENT_KINDS))
        self._events += [Event(kind=k, t=t, source=src, attrs=orjson.loads(a)) for k, t, src, a in rows]

    def _new_rows(self, store, table: str, columns: str, where: str, params: list) -> list[tuple]:
        """Rows committed to ``table`` since the last call; the version they were read at is the next mark,
        so a row the twin commits meanwhile is read next time rather than skipped."""
        self._marks[table], rows = store.query_since(
            self._marks[table], f"SELECT {columns} FROM {table} WHERE {where} ORDER BY t", params)
        return rows


def weights_reads(store, *, config: ScanConfig = ScanConfig()) -> list[WeightsAccess]:
    """Every access to the checkpoint folder the store's Tetragon events show, with user and job."""
    return weights_report(store.events("tetragon"), store.jobs(), config.weights)


# -- reading files by content ---------------------------------------------------------------------------

@dataclass(slots=True)
class Loaded:
    records: list = field(default_factory=list)
    osv: OsvDatabase = field(default_factory=OsvDatabase)
    manifests: list[ShardManifest] = field(default_factory=list)
    formats: dict[str, str] = field(default_factory=dict)
    """path -> the format it was read as."""


def load_paths(paths: Iterable[str | Path], *, hosts: Iterable[str] = ()) -> Loaded:
    """Read files and folders of the formats the scan knows; ``hosts`` names nodes a file name may carry."""
    loaded = Loaded()
    hosts = tuple(sorted(hosts, key=len, reverse=True))
    for path in paths:
        _load(Path(path), loaded, hosts)
    return loaded


def _load(path: Path, loaded: Loaded, hosts: tuple[str, ...]) -> None:
    from hpcwatch.sources import osv, pip
    if not path.exists():
        raise ParseError("no such file or folder", path=path)
    if path.is_dir():
        if any(path.glob("*.pth")) or path.name in ("site-packages", "dist-packages"):
            _take(loaded, path, "site-packages", pip.read_site_packages(path))
        elif _looks_osv_dir(path):
            loaded.osv.add(e for entries in osv.read_osv(path).by_package.values() for e in entries)
            loaded.formats[str(path)] = "osv"
        else:
            children = sorted(p for p in path.iterdir() if not p.name.startswith("."))
            # A manifest's shards are data, not input: load manifests first, then skip what they list.
            children.sort(key=lambda p: p.name != "manifest.json")
            for child in children:
                if any(m.resolve(s) == child for m in loaded.manifests for s in m.shards):
                    continue
                _load(child, loaded, hosts)
        return
    if path.suffix == ".zip":
        loaded.osv.add(e for entries in osv.read_osv(path).by_package.values() for e in entries)
        loaded.formats[str(path)] = "osv"
        return
    fmt, reader = _sniff(path, hosts)
    if fmt == "manifest":
        loaded.manifests.append(reader())
        loaded.formats[str(path)] = fmt
    elif fmt == "osv":
        loaded.osv.add(reader())
        loaded.formats[str(path)] = fmt
    else:
        _take(loaded, path, fmt, reader())


def _take(loaded: Loaded, path: Path, fmt: str, records: Iterable) -> None:
    loaded.records.extend(records)
    loaded.formats[str(path)] = fmt


def _looks_osv_dir(path: Path) -> bool:
    first = next(iter(sorted(path.rglob("*.json"))), None)
    return first is not None and b'"affected"' in first.read_bytes()[:20000]


_FREEZE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[^\]]*\])?\s*(===?|@)\s*\S+", re.M)
_PARTITION = re.compile(r"^\s*[A-Za-z0-9_]+\s*(=\s*0x[0-9a-fA-F]+)?\s*(,[^:\n]*)?:[^;]*;", re.M)


def _sniff(path: Path, hosts: tuple[str, ...]):
    """(format, zero-argument reader) of one file, by its content."""
    from hpcwatch.sources import falco, manifest, opensm, osv, pip, procparams, tetragon
    text = read_text(path)
    head = text.lstrip()[:4096]
    first = head.split("\n", 1)[0]
    host = next((h for h in hosts if re.search(rf"(^|[^A-Za-z0-9]){re.escape(h)}([^A-Za-z0-9]|$)", path.name)), None)
    if head.startswith("{") and first.rstrip().endswith("}"):
        doc = _json_or_none(first)
        if isinstance(doc, dict):
            if "rule" in doc and "output" in doc:
                return "falco", lambda: falco.parse_falco_json(text.splitlines(), path=path)
            if any(k in doc for k in ("process_exec", "process_kprobe", "process_exit", "node_name")):
                return "tetragon", lambda: tetragon.parse_tetragon_json(text.splitlines(), path=path)
            if doc.get("kind") in ("sample", "span"):
                from hpcwatch.instrument.torch import read_hook_jsonl
                return "hook-jsonl", lambda: read_hook_jsonl(path)
    if head.startswith("{"):
        doc = _json_or_none(text)
        if isinstance(doc, dict):
            if "shards" in doc:
                return "manifest", lambda: manifest.parse_manifest(text, path=path)
            if "affected" in doc and "id" in doc:
                return "osv", lambda: osv.parse_osv_entry(text, path=str(path))
            if "jobs" in doc:
                return _slurm(doc, text, path)
            if "rule" in doc and "output" in doc:
                return "falco", lambda: falco.parse_falco_json([text.replace("\n", " ")], path=path)
    if head.startswith("[") and '"name"' in head and '"version"' in head:
        return "pip-list", lambda: pip.read_pip_list(path)
    if path.name == "partitions.conf" or (_PARTITION.search(head) and ("=full" in head or "=limited" in head)):
        return "opensm-partitions", lambda: opensm.read_partitions_conf(path)
    if path.name == "params" or re.search(r"^(ResmanDebugLevel|RegistryDwords|RMDisableScrubOnFree):", head, re.M):
        return "nvidia-params", lambda: procparams.read_nvidia_params(path, host=host)
    if _FREEZE.search(head) and not head.startswith("#"):
        return "pip-freeze", lambda: pip.read_pip_list(path)
    if "PortXmitData:" in head:
        return _perfquery(text, path, host)
    if head.startswith("<?xml") or head.startswith("<nvidia_smi_log") or head.startswith("timestamp, name"):
        return _nvidia_smi(text, path, host)
    from hpcwatch.sources.prometheus_text import is_prometheus_text, read_prometheus_text
    if is_prometheus_text(head):
        return "prometheus-text", lambda: _with_host(read_prometheus_text(path), host)
    return _fallback(path)


def _json_or_none(text: str):
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def _with_host(samples: Iterable[Sample], host: str | None) -> Iterator[Sample]:
    """Samples of a scrape that names no node (node-exporter) get the node its file name carries."""
    from hpcwatch.security.context import host_of
    for s in samples:
        if host and host_of(s.labels) is None:
            s = Sample(metric=s.metric, labels={**s.labels, "node": host}, t=s.t, value=s.value)
        yield s


def _slurm(doc: dict, text: str, path: Path):
    from hpcwatch.sources import slurm
    jobs = doc.get("jobs") or [{}]
    if isinstance(jobs[0].get("state"), dict):  # sacct: state {current, reason}
        return "sacct-json", lambda: slurm.parse_sacct_json(text, path=path)
    return "squeue-json", lambda: slurm.parse_squeue_json(text, path=path)


def _perfquery(text: str, path: Path, host: str | None):
    from hpcwatch.sources import infiniband
    return "perfquery", lambda: infiniband.parse_perfquery(text, path=path, node=host)


def _nvidia_smi(text: str, path: Path, host: str | None):
    from hpcwatch.sources import nvidia_smi
    if text.lstrip().startswith("<"):
        return "nvidia-smi-xml", lambda: nvidia_smi.parse_nvidia_smi_xml(text, path=path)
    return "nvidia-smi-csv", lambda: nvidia_smi.parse_nvidia_smi_csv(text, path=path)


def _fallback(path: Path):
    try:
        from hpcwatch.sources.detect import read_any
    except ImportError:
        raise ParseError("format not recognised by the scan", path=path) from None
    return "auto", lambda: read_any(path)
