"""RDMA blind spot: InfiniBand traffic nobody accounts for, seen only through port counters.

RDMA moves memory between nodes without the kernel's network stack: no socket,
no netfilter, no ``conntrack``, no Falco syscall. What remains visible is the HCA's
and switch's port counters (``perfquery``, node-exporter's ``node_infiniband_*``)
and the subnet manager's partitioning. From those alone:

    rule                          fires on
    rdma.traffic_no_job           a compute node moving more than ``idle_max_bytes_per_s`` with no job on it
    rdma.traffic_disproportion    a node of a job moving ``ratio`` x more than the job's other nodes over
                                  the same moment (or than the job's expected ring AllReduce rate, when given)
    rdma.traffic_unexplained      a node whose jobs are all single-node (their collectives stay on NVLink)
                                  moving ``ratio`` x more than those jobs' Lustre I/O (job_stats) explains
    rdma.pkey_violation           PortRcvConstraintErrors / PortXmitConstraintErrors went up: packets dropped
                                  by partition (P_Key) enforcement
    rdma.remote_access_error      a ``*remote_access_errors`` counter went up (mlx5 hw_counters: an RDMA
                                  READ/WRITE to memory the peer did not register for us)
    rdma.partitions_open          partitions.conf gives ``ALL`` (or ``ALL_CAS``) full membership: every
                                  HCA can reach every other, the shipped ``Default=0x7fff, ipoib : ALL=full;``

Storage servers (``storage_hosts``; Lustre OSS/MDS over o2ib) move data without a
Slurm job of their own: expected traffic, never a finding. Counters are
cumulative; a counter that goes down (reset, wrap) starts a new series. A sample
that names no node (a perfquery file read without ``node=``) cannot be tied to a
job and is skipped.

Nodes are scraped at their own instants: Prometheus gives each target an offset in the scrape interval from
a hash of its labels and URL (``Target.offset`` in prometheus/scrape/target.go), and a collector goes from
node to node. A node's rate over (t - dt, t] is compared with each peer's rate over its interval that holds t.

Ring AllReduce moves 2(p-1)/p x n bytes out of each rank per call
(https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md), which is what
``expected_bytes_per_s`` should be built from when the step rate is known.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from hpcwatch import vocab
from hpcwatch.records import Event, Finding, Job, Sample
from hpcwatch.security.context import JobIndex, host_of, once_per_labels
from hpcwatch.security.series import SeriesGroups
from hpcwatch.vocab import EventKind

__all__ = [
    "RdmaConfig",
    "detect_rdma",
    "detect_rdma_series",
    "RdmaSeries",
    "reads_metric",
    "ring_allreduce_bytes",
    "DATA_METRICS",
    "CONSTRAINT_METRICS",
    "LUSTRE_METRICS",
    "DEFAULT_IDLE_MAX_BYTES_PER_S",
    "RULES",
]

#: Rule ids this detector emits (the web catalogues have a title per rule: web/en.yaml ``finding``).
RULES: tuple[str, ...] = (
    "rdma.traffic_no_job",
    "rdma.traffic_disproportion",
    "rdma.traffic_unexplained",
    "rdma.pkey_violation",
    "rdma.remote_access_error",
    "rdma.partitions_open",
)

#: Data counters in bytes: perfquery (via sources.infiniband, already x4) and node-exporter.
DATA_METRICS = {
    "perfquery": (vocab.IB_PORTXMITDATA_BYTES, vocab.IB_PORTRCVDATA_BYTES),
    "node_exporter": (
        vocab.NODE_INFINIBAND_PORT_DATA_TRANSMITTED_BYTES_TOTAL,
        vocab.NODE_INFINIBAND_PORT_DATA_RECEIVED_BYTES_TOTAL,
    ),
}
CONSTRAINT_METRICS = frozenset(
    {
        "ib_PortRcvConstraintErrors",
        "ib_PortXmitConstraintErrors",
        vocab.NODE_INFINIBAND_PORT_CONSTRAINT_ERRORS_RECEIVED_TOTAL,
        vocab.NODE_INFINIBAND_PORT_CONSTRAINT_ERRORS_TRANSMITTED_TOTAL,
    }
)

#: An idle HCA only carries subnet management (MADs): kilobytes per second. 1 MiB/s is far above that
#: and far below any useful exfiltration rate over NDR's 50 GB/s.
DEFAULT_IDLE_MAX_BYTES_PER_S = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaConfig:
    storage_hosts: frozenset[str] = frozenset()
    """Lustre / storage servers: their IB traffic is expected."""
    storage_prefixes: tuple[str, ...] = ()
    """Host name prefixes of storage servers (``lustre-`` for a storage layer named ``lustre``)."""
    idle_max_bytes_per_s: float = DEFAULT_IDLE_MAX_BYTES_PER_S
    """Above this, a node without a job is moving data."""
    ratio: float = 3.0
    """A job's node moving this many times its peers' median (or the expected rate) fires."""
    min_job_bytes_per_s: float = 64 << 20
    """Below this a job node's excess is noise (64 MiB/s)."""
    job_grace_s: float = 30.0
    """A job's window is widened by this much at both ends (NCCL teardown, prolog)."""
    expected_bytes_per_s: Mapping[str, float] = field(default_factory=dict)
    """Per job id: the rate its collectives should move per node, when known."""

    def is_storage(self, host: str) -> bool:
        return host in self.storage_hosts or host.startswith(self.storage_prefixes)

    def __post_init__(self) -> None:
        if self.ratio <= 1:
            raise ValueError(f"ratio must be > 1, got {self.ratio}")


def ring_allreduce_bytes(n_bytes: float, ranks: int) -> float:
    """Bytes one rank sends in a ring AllReduce of n bytes over p ranks: 2(p-1)/p x n."""
    return 2 * (ranks - 1) / ranks * n_bytes if ranks > 1 else 0.0


def detect_rdma(
    samples: Iterable[Sample], jobs: Iterable[Job] = (), events: Iterable[Event] = (), config: RdmaConfig = RdmaConfig()
) -> list[Finding]:
    return detect_rdma_series(RdmaSeries.of(samples), jobs, events, config)


def detect_rdma_series(
    series: SeriesGroups, jobs: Iterable[Job] = (), events: Iterable[Event] = (), config: RdmaConfig = RdmaConfig()
) -> list[Finding]:
    """``detect_rdma`` over an ``RdmaSeries`` already filled (a live scan keeps one between scans)."""
    index = JobIndex.of(jobs)
    data, errors, lustre = series.groups["data"], series.groups["errors"], series.groups["lustre"]
    rates = _host_rates(data)
    findings = _no_job(rates, index, config) + _disproportion(rates, index, config) + _counter_rises(errors)
    findings += _unexplained(rates, index, _lustre_rates(lustre), config)
    findings += [f for e in events if e.kind == EventKind.OPENSM_PARTITIONS for f in _open_partitions(e)]
    return findings


# -- counters -> rates --------------------------------------------------------------------------------

Series = dict[tuple, list[tuple[float, float]]]


#: Each data metric's collector family.
_DATA_NAMES = {m: fam for fam, ms in DATA_METRICS.items() for m in ms}


class RdmaSeries(SeriesGroups):
    """The samples ``detect_rdma`` reads, by series: the IB data counters by (family, host, metric, labels)
    (``data``), the error and constraint counters by (host, metric, labels) (``errors``), the Lustre byte
    counters by (jobid, metric, target) (``lustre``); each point (t, value)."""

    def __init__(self) -> None:
        super().__init__("data", "errors", "lustre")
        self._kinds: dict[str, str | None] = {}

    def add(self, samples: Iterable[Sample]) -> None:
        """One pass over the samples (millions in a 1,024-node window)."""
        data, errors, lustre = self.groups["data"], self.groups["errors"], self.groups["lustre"]
        kinds, append = self._kinds, self.append
        keys = once_per_labels(lambda labels: (host_of(labels), tuple(sorted(labels.items()))))
        for s in samples:
            kind = kinds.get(s.metric, "?")
            if kind == "?":
                kind = kinds[s.metric] = _kind_of(s.metric)
            if kind is None:
                continue  # before host_of: most samples of a store are other metrics
            if kind == "lustre":
                if s.labels.get("jobid"):
                    append(lustre[(s.labels["jobid"], s.metric, s.labels.get("target"))], (s.t, s.value))
                continue
            host, labels = keys(s.labels)
            if host is None:
                continue
            key = (host, s.metric, labels)
            if kind == "data":
                append(data[(_DATA_NAMES[s.metric],) + key], (s.t, s.value))
            else:
                append(errors[key], (s.t, s.value))


def _kind_of(metric: str) -> str | None:
    """Which of ``RdmaSeries``' groups a metric's samples go to (None: none)."""
    if metric in _DATA_NAMES:
        return "data"
    if metric in CONSTRAINT_METRICS or metric.endswith(("remote_access_errors", "remote_access_errors_total")):
        return "errors"
    return "lustre" if metric in LUSTRE_METRICS else None


def _host_rates(data: Series) -> dict[str, dict[float, tuple[float, float]]]:
    """host -> scrape time t1 -> (bytes/s summed over ports and directions, seconds since previous scrape)."""
    families = defaultdict(set)
    for fam, host, *_ in data:
        families[host].add(fam)
    out: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for (fam, host, *_), points in data.items():
        if "node_exporter" in families[host] and fam != "node_exporter":
            continue  # both collectors on one node: count the port once
        points.sort()
        for (t0, v0), (t1, v1) in zip(points, points[1:]):
            if t1 > t0 and v1 >= v0:
                cell = out[host][t1]
                cell[0] += (v1 - v0) / (t1 - t0)
                cell[1] = t1 - t0
    return {h: {t: (r, dt) for t, (r, dt) in by_t.items()} for h, by_t in out.items()}


# -- rules ---------------------------------------------------------------------------------------------


def _no_job(rates: dict, index: JobIndex, config: RdmaConfig) -> list[Finding]:
    findings = []
    for host, by_t in sorted(rates.items()):
        if config.is_storage(host):
            continue
        hot = [
            (t, r, dt)
            for t, (r, dt) in sorted(by_t.items())
            if r > config.idle_max_bytes_per_s
            and not index.on(host, t, grace_s=config.job_grace_s)
            and not index.on(host, t - dt, grace_s=config.job_grace_s)
        ]
        if hot:
            peak = max(r for _, r, _ in hot)
            findings.append(
                Finding(
                    vector="rdma_blind_spot",
                    severity="high",
                    target=host,
                    title=f"{host} moved {peak / 1e6:.1f} MB/s over InfiniBand with no job on it",
                    evidence={
                        "host": host,
                        "peak_bytes_per_s": peak,
                        "bytes": sum(r * dt for _, r, dt in hot),
                        "first_t": hot[0][0],
                        "last_t": hot[-1][0],
                        "intervals": len(hot),
                        "idle_max_bytes_per_s": config.idle_max_bytes_per_s,
                    },
                    t=hot[0][0],
                    rule="rdma.traffic_no_job",
                )
            )
    return findings


def _disproportion(rates: dict, index: JobIndex, config: RdmaConfig) -> list[Finding]:
    hits: dict[tuple[str, str], list[tuple[float, float, float]]] = defaultdict(list)
    # id of a job -> the job, and its nodes' (host, t, rate) to compare with its other nodes
    to_compare: dict[int, tuple[Job, list[tuple[str, float, float]]]] = {}
    for host, by_t in rates.items():
        if config.is_storage(host):
            continue
        for t, (rate, _) in by_t.items():
            for job in index.on(host, t):
                expected = config.expected_bytes_per_s.get(job.id)
                if expected is None:
                    to_compare.setdefault(id(job), (job, []))[1].append((host, t, rate))
                elif _beyond(rate, expected, config):
                    hits[(host, job.id)].append((t, rate, expected))
    timelines = _Timelines(rates)
    for job, cells in to_compare.values():
        for (host, t, rate), reference in zip(cells, _peer_medians(job, cells, timelines).tolist()):
            if not math.isnan(reference) and _beyond(rate, reference, config):
                hits[(host, job.id)].append((t, rate, reference))
    return [_disproportion_finding(host, job_id, sorted(rows), config) for (host, job_id), rows in sorted(hits.items())]


def _beyond(rate: float, reference: float, config: RdmaConfig) -> bool:
    return rate > config.min_job_bytes_per_s and rate > config.ratio * max(reference, 1.0)


def _disproportion_finding(
    host: str, job_id: str, rows: list[tuple[float, float, float]], config: RdmaConfig
) -> Finding:
    """``rows``: (t, rate, reference) in time order."""
    peak = max(rows, key=lambda r: r[1])
    return Finding(
        vector="rdma_blind_spot",
        severity="medium",
        target=host,
        title=f"{host} moved {peak[1] / max(peak[2], 1.0):.1f}x the InfiniBand traffic of job {job_id}'s other nodes",
        evidence={
            "host": host,
            "job": job_id,
            "peak_bytes_per_s": peak[1],
            "reference_bytes_per_s": peak[2],
            "intervals": len(rows),
            "first_t": rows[0][0],
            "ratio_threshold": config.ratio,
            "reference": "expected" if job_id in config.expected_bytes_per_s else "peer median",
        },
        t=rows[0][0],
        rule="rdma.traffic_disproportion",
    )


class _Timelines:
    """Each host's rates as arrays in time order, made when first asked: interval ends, starts and rates."""

    def __init__(self, rates: dict[str, dict[float, tuple[float, float]]]) -> None:
        self._rates = rates
        self._made: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def __contains__(self, host: str) -> bool:
        return host in self._rates

    def covering(self, host: str, times: np.ndarray) -> np.ndarray:
        """The rate of ``host``'s interval (t - dt, t] that holds each of ``times``; NaN where none does."""
        if host not in self._made:
            by_t = sorted(self._rates[host].items())
            ends = np.array([t for t, _ in by_t])
            self._made[host] = (ends, ends - np.array([dt for _, (_, dt) in by_t]), np.array([r for _, (r, _) in by_t]))
        ends, starts, values = self._made[host]
        at = np.minimum(np.searchsorted(ends, times, side="left"), len(ends) - 1)  # the first end at or after
        return np.where((ends[at] >= times) & (starts[at] < times), values[at], np.nan)


#: Cells compared at once (a job's nodes x this many floats: 1,024 nodes, 16 MB).
_CELLS_AT_ONCE = 2048


def _peer_medians(job: Job, cells: list[tuple[str, float, float]], timelines: _Timelines) -> np.ndarray:
    """For each of ``job``'s cells (host, t, rate): the median rate of the job's other nodes over the interval that
    holds ``t``, NaN where none has one. Not at ``t`` itself: nodes are scraped at their own instants (Prometheus
    spreads its targets over the scrape interval, a collector goes from node to node), and a node compared only
    with peers scraped at the same instant was compared with none."""
    nodes = [n for n in dict.fromkeys(job.nodes) if n in timelines]  # a node listed twice is one peer
    out = np.full(len(cells), np.nan)
    if len(nodes) < 2:  # a single-node job (most of a cluster's): no peer
        return out
    row_of = {n: i for i, n in enumerate(nodes)}
    times = np.array([t for _, t, _ in cells], dtype=np.float64)
    own = np.array([row_of.get(host, -1) for host, _, _ in cells])
    for lo in range(0, len(cells), _CELLS_AT_ONCE):
        part = slice(lo, lo + _CELLS_AT_ONCE)
        peers = np.vstack([timelines.covering(n, times[part]) for n in nodes])  # nodes x cells
        mine = own[part] >= 0
        peers[own[part][mine], np.flatnonzero(mine)] = np.nan  # a node is not its own peer
        some = ~np.isnan(peers).all(axis=0)
        out[lo + np.flatnonzero(some)] = np.nanmedian(peers[:, some], axis=0)
    return out


#: Lustre job_stats byte counters (sources/lustre.py), labelled by ``jobid``.
LUSTRE_METRICS = (vocab.LUSTRE_JOB_READ_BYTES_TOTAL, vocab.LUSTRE_JOB_WRITE_BYTES_TOTAL)


def reads_metric(metric: str) -> bool:
    """Whether ``detect_rdma`` reads samples of ``metric`` (the scan gives it only those, in their order)."""
    return (
        metric in _DATA_NAMES
        or metric in CONSTRAINT_METRICS
        or metric.endswith(("remote_access_errors", "remote_access_errors_total"))
        or metric in LUSTRE_METRICS
    )


def _lustre_rates(series: Series) -> dict[str, float]:
    """job id -> mean Lustre bytes/s (read + write, all targets) over the window the samples cover; ``series``:
    ``RdmaSeries``' Lustre counters."""
    out: dict[str, float] = defaultdict(float)
    for (job, *_), points in series.items():
        points.sort()
        (t0, v0), (t1, v1) = points[0], points[-1]
        if t1 > t0 and v1 >= v0:
            out[job] += (v1 - v0) / (t1 - t0)
    return out


def _unexplained(rates: dict, index: JobIndex, lustre: dict[str, float], config: RdmaConfig) -> list[Finding]:
    findings = []
    for host, by_t in sorted(rates.items()):
        if config.is_storage(host):
            continue
        hot = []
        for t, (rate, _) in sorted(by_t.items()):
            jobs = index.on(host, t)
            if not jobs or any(len(j.nodes) > 1 for j in jobs):
                continue  # no job (another rule), or inter-node collectives expected
            storage = sum(lustre.get(j.id, 0.0) for j in jobs)
            if rate > config.min_job_bytes_per_s and rate > config.ratio * storage:
                hot.append((t, rate, storage, [j.id for j in jobs]))
        if hot:
            peak = max(hot, key=lambda h: h[1])
            findings.append(
                Finding(
                    vector="rdma_blind_spot",
                    severity="high",
                    target=host,
                    title=f"{host} moved {peak[1] / 1e9:.1f} GB/s over InfiniBand; its single-node jobs' Lustre I/O "
                    f"explains {peak[2] / 1e9:.2f} GB/s",
                    evidence={
                        "host": host,
                        "jobs": peak[3],
                        "peak_bytes_per_s": peak[1],
                        "lustre_bytes_per_s": peak[2],
                        "intervals": len(hot),
                        "first_t": hot[0][0],
                        "ratio_threshold": config.ratio,
                    },
                    t=hot[0][0],
                    rule="rdma.traffic_unexplained",
                )
            )
    return findings


def _counter_rises(errors: Series) -> list[Finding]:
    findings = []
    for (host, metric, labels), points in sorted(errors.items()):
        points.sort()
        rises = [(t1, v1 - v0) for (_, v0), (t1, v1) in zip(points, points[1:]) if v1 > v0]
        if not rises:
            continue
        pkey = metric in CONSTRAINT_METRICS
        port = dict(labels).get("port", "?")
        findings.append(
            Finding(
                vector="rdma_blind_spot",
                severity="high" if pkey else "medium",
                target=f"{host}:{port}",
                title=(
                    f"{host} port {port}: {sum(d for _, d in rises):.0f} packets dropped by P_Key enforcement"
                    if pkey
                    else f"{host} port {port}: {sum(d for _, d in rises):.0f} RDMA remote access errors"
                ),
                evidence={
                    "host": host,
                    "metric": metric,
                    "labels": dict(labels),
                    "increase": sum(d for _, d in rises),
                    "first_t": rises[0][0],
                },
                t=rises[0][0],
                rule="rdma.pkey_violation" if pkey else "rdma.remote_access_error",
            )
        )
    return findings


def _open_partitions(event: Event) -> list[Finding]:
    open_parts = [
        p
        for p in event.attrs.get("partitions", [])
        if any(who in ("ALL", "ALL_CAS") and m in ("full", "both") for who, m in p["members"])
    ]
    if not open_parts:
        return []
    names = ", ".join(f"{p['name']}={p.get('pkey') or '?'}" for p in open_parts)
    return [
        Finding(
            vector="rdma_blind_spot",
            severity="medium",
            target=event.source,
            title=f"OpenSM partitions isolate nothing: {names} gives every port full membership",
            evidence={"file": event.source, "partitions": open_parts},
            t=event.t,
            rule="rdma.partitions_open",
        )
    ]
