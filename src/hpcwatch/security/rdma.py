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
from hpcwatch.security.series import Points, Run, SeriesGroups
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
    series: RdmaSeries, jobs: Iterable[Job] = (), events: Iterable[Event] = (), config: RdmaConfig = RdmaConfig()
) -> list[Finding]:
    """``detect_rdma`` over an ``RdmaSeries`` already filled (a live scan keeps one between scans)."""
    index = JobIndex.of(jobs)
    rates = _Timelines(series.host_rates())
    findings = _no_job(rates, index, config) + _disproportion(rates, index, config) + _counter_rises(series)
    findings += _unexplained(rates, index, _lustre_rates(series.groups["lustre"]), config)
    findings += [f for e in events if e.kind == EventKind.OPENSM_PARTITIONS for f in _open_partitions(e)]
    return findings


# -- counters -> rates --------------------------------------------------------------------------------

Series = dict[tuple, list[tuple[float, float]]]
#: (family, host) -> scrape time t1 -> series key -> (bytes/s since the series' previous scrape, seconds since).
Cells = dict[tuple[str, str], dict[float, dict[tuple, tuple[float, float]]]]


#: Each data metric's collector family.
_DATA_NAMES = {m: fam for fam, ms in DATA_METRICS.items() for m in ms}


class RdmaSeries(SeriesGroups):
    """The samples ``detect_rdma`` reads, by series: the IB data counters by (family, host, metric, labels)
    (``data``), the error and constraint counters by (host, metric, labels) (``errors``), the Lustre byte
    counters by (jobid, metric, target) (``lustre``); each point (t, value).

    While the series come in time order it keeps, pair by pair of consecutive points, the data counters' rates
    (``host_rates`` sums them) and how many error counters' pairs rise (``rising``): a live scan then works out
    only the pairs that arrived, not the millions of its window."""

    def __init__(self) -> None:
        super().__init__("data", "errors", "lustre")
        self._kinds: dict[str, str | None] = {}
        self._cells: Cells = defaultdict(dict)
        self._sums: dict[tuple[str, str], dict[float, tuple[float, float]]] = defaultdict(dict)
        """``_cells`` summed (``_cell_rate``), kept while a cell is unchanged."""
        self._rises: dict[tuple, int] = {}
        """An error series' key -> its pairs of consecutive points that rise (those with none are absent)."""

    def add_runs(self, runs: Iterable[Run]) -> None:
        kinds = self._kinds
        keys = once_per_labels(lambda labels: (host_of(labels), tuple(sorted(labels.items()))))
        for run in runs:
            kind = kinds.get(run.metric, "?")
            if kind == "?":
                kind = kinds[run.metric] = _kind_of(run.metric)
            if kind is None:
                continue  # before host_of: most samples of a store are other metrics
            points = zip(run.t, run.values)
            if kind == "lustre":
                if run.labels.get("jobid"):
                    self.extend("lustre", (run.labels["jobid"], run.metric, run.labels.get("target")), points)
                continue
            host, labels = keys(run.labels)
            if host is None:
                continue
            if kind == "data":
                self.extend("data", (_DATA_NAMES[run.metric], host, run.metric, labels), points)
            else:
                self.extend("errors", (host, run.metric, labels), points)

    def pairs_added(self, name: str, key: tuple, points: Points, first: int) -> None:
        if name == "data":
            sums = self._sums[key[:2]]
            for t1 in _add_rates(self._cells, key, points, first):
                sums.pop(t1, None)
        elif name == "errors" and (rises := _rises_in(points, first - 1, len(points))):
            self._rises[key] = self._rises.get(key, 0) + rises

    def pairs_dropped(self, name: str, key: tuple, points: Points, count: int) -> None:
        if name == "data":
            cells, sums = self._cells[key[:2]], self._sums[key[:2]]
            for t1 in [t for t, _ in points[1 : count + 1]]:
                cell = cells.get(t1)
                if cell is not None and cell.pop(key, None) is not None:
                    sums.pop(t1, None)
                    if not cell:
                        del cells[t1]
        elif name == "errors" and key in self._rises:
            left = self._rises[key] - _rises_in(points, 0, min(count + 1, len(points)))
            if left:
                self._rises[key] = left
            else:
                del self._rises[key]

    def host_rates(self) -> dict[str, dict[float, tuple[float, float]]]:
        """host -> scrape time t1 -> (bytes/s summed over ports and directions, seconds since the previous
        scrape: the longest of its ports'). A node scraped by both collectors counts its ports once, from
        node-exporter."""
        data = self.groups["data"]
        cells, sums = self._cells, self._sums
        if not self.in_time_order:  # the kept pairs may be wrong: make them again from the points, sorted
            self._cells.clear()
            self._sums.clear()
            cells, sums = defaultdict(dict), defaultdict(dict)
            for key, points in data.items():
                points.sort()
                _add_rates(cells, key, points, 1)
        exported = {host for fam, host, *_ in data if fam == "node_exporter"}
        rates = {}
        for (fam, host), by_t in cells.items():
            if by_t and (fam == "node_exporter" or host not in exported):
                summed = sums[(fam, host)]
                if len(summed) != len(by_t):
                    summed.update((t1, _cell_rate(by_t[t1])) for t1 in by_t.keys() - summed.keys())
                rates[host] = dict(summed)
        return rates

    def rising(self) -> list[tuple]:
        """The error series that rise somewhere in the window (every one, to be looked at, when the series
        are out of time order)."""
        errors = self.groups["errors"]
        if self.in_time_order:
            return [key for key in errors if key in self._rises]
        self._rises.clear()
        return list(errors)


def _add_rates(cells: Cells, key: tuple, points: Points, first: int) -> list[float]:
    """The rates of the data series ``key``'s pairs from ``(points[first - 1], points[first])`` on, into
    ``cells``: a counter that went down (reset, wrap) gives none. Returns the scrape times given a rate."""
    by_t, added = cells[key[:2]], []
    for (t0, v0), (t1, v1) in zip(points[first - 1 :], points[first:]):
        if t1 > t0 and v1 >= v0:
            by_t.setdefault(t1, {})[key] = ((v1 - v0) / (t1 - t0), t1 - t0)
            added.append(t1)
    return added


def _cell_rate(cell: dict[tuple, tuple[float, float]]) -> tuple[float, float]:
    """A node's rate at one scrape, summed over its series (in any order: ``fsum`` rounds once), and the
    longest of their intervals."""
    return math.fsum(r for r, _ in cell.values()), max(dt for _, dt in cell.values())


def _rises_in(points: Points, lo: int, hi: int) -> int:
    """How many pairs of consecutive points in ``points[lo:hi]`` rise."""
    if hi - lo == 2:  # one pair: what a live scan adds to most series
        return int(points[lo + 1][1] > points[lo][1])
    return sum(1 for (_, v0), (_, v1) in zip(points[lo:hi], points[lo + 1 : hi]) if v1 > v0)


def _kind_of(metric: str) -> str | None:
    """Which of ``RdmaSeries``' groups a metric's samples go to (None: none)."""
    if metric in _DATA_NAMES:
        return "data"
    if metric in CONSTRAINT_METRICS or metric.endswith(("remote_access_errors", "remote_access_errors_total")):
        return "errors"
    return "lustre" if metric in LUSTRE_METRICS else None


# -- rules ---------------------------------------------------------------------------------------------
#
# Each rule looks, node by node, only at the intervals whose rate could fire it (above the idle limit, or above
# the least a job's excess counts), and asks which jobs held the node then of the node's jobs all at once.


def _no_job(rates: _Timelines, index: JobIndex, config: RdmaConfig) -> list[Finding]:
    findings = []
    for host in sorted(rates.hosts):
        if config.is_storage(host):
            continue
        ends, dts, values = rates.arrays(host)
        hot = np.flatnonzero(values > config.idle_max_bytes_per_s)
        if hot.size:  # idle at both ends of the interval
            held = index.holding(host)
            idle = ~held.covering(ends[hot], grace_s=config.job_grace_s).any(axis=0)
            idle &= ~held.covering(ends[hot] - dts[hot], grace_s=config.job_grace_s).any(axis=0)
            hot = hot[idle]
        if hot.size:
            peak = float(values[hot].max())
            findings.append(
                Finding(
                    vector="rdma_blind_spot",
                    severity="high",
                    target=host,
                    title=f"{host} moved {peak / 1e6:.1f} MB/s over InfiniBand with no job on it",
                    evidence={
                        "host": host,
                        "peak_bytes_per_s": peak,
                        "bytes": sum((values[hot] * dts[hot]).tolist()),
                        "first_t": float(ends[hot[0]]),
                        "last_t": float(ends[hot[-1]]),
                        "intervals": int(hot.size),
                        "idle_max_bytes_per_s": config.idle_max_bytes_per_s,
                    },
                    t=float(ends[hot[0]]),
                    rule="rdma.traffic_no_job",
                )
            )
    return findings


def _busy_cells(rates: _Timelines, index: JobIndex, config: RdmaConfig):
    """Per node (not storage) with an interval whose rate may count in a job (``min_job_bytes_per_s``): the
    node, those intervals' ends and rates, its jobs and which held it at each of those ends (jobs x ends)."""
    for host in sorted(rates.hosts):
        if config.is_storage(host):
            continue
        ends, _, values = rates.arrays(host)
        busy = values > config.min_job_bytes_per_s
        if busy.any():
            held = index.holding(host)
            yield host, ends[busy], values[busy], held.jobs, held.covering(ends[busy])


def _disproportion(rates: _Timelines, index: JobIndex, config: RdmaConfig) -> list[Finding]:
    hits: dict[tuple[str, str], list[tuple[float, float, float]]] = defaultdict(list)
    # id of a job -> the job, and its nodes' (host, t, rate) to compare with its other nodes
    to_compare: dict[int, tuple[Job, list[tuple[str, float, float]]]] = {}
    for host, ends, values, jobs, on in _busy_cells(rates, index, config):
        for job, held in zip(jobs, on):
            if not held.any():
                continue
            mine = zip(ends[held].tolist(), values[held].tolist())
            expected = config.expected_bytes_per_s.get(job.id)
            if expected is not None:
                hits[(host, job.id)] += [(t, rate, expected) for t, rate in mine if _beyond(rate, expected, config)]
            elif len(set(job.nodes)) > 1:  # a single-node job has no peer to compare with
                to_compare.setdefault(id(job), (job, []))[1].extend((host, t, rate) for t, rate in mine)
    for job, cells in to_compare.values():
        for (host, t, rate), reference in zip(cells, _peer_medians(job, cells, rates).tolist()):
            if not math.isnan(reference) and _beyond(rate, reference, config):
                hits[(host, job.id)].append((t, rate, reference))
    return [
        _disproportion_finding(host, job_id, sorted(rows), config)
        for (host, job_id), rows in sorted(hits.items())
        if rows
    ]


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
    """Each host's rates as arrays in time order, made when first asked: interval ends, lengths and rates."""

    def __init__(self, rates: dict[str, dict[float, tuple[float, float]]]) -> None:
        self._rates = rates
        self._made: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def __contains__(self, host: str) -> bool:
        return host in self._rates

    @property
    def hosts(self) -> Iterable[str]:
        return self._rates.keys()

    def arrays(self, host: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``host``'s intervals in time order: their ends, their lengths (seconds since the previous scrape),
        their rates."""
        if host not in self._made:
            by_t = sorted(self._rates[host].items())
            self._made[host] = (
                np.array([t for t, _ in by_t], dtype=np.float64),
                np.array([dt for _, (_, dt) in by_t], dtype=np.float64),
                np.array([r for _, (r, _) in by_t], dtype=np.float64),
            )
        return self._made[host]

    def covering(self, host: str, times: np.ndarray) -> np.ndarray:
        """The rate of ``host``'s interval (t - dt, t] that holds each of ``times``; NaN where none does."""
        ends, dts, values = self.arrays(host)
        starts = ends - dts
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
        out[lo + np.flatnonzero(some)] = column_nanmedians(peers[:, some])
    return out


def column_nanmedians(table: np.ndarray) -> np.ndarray:
    """Each column's median of its values that are not NaN (each column holds one at least): ``np.nanmedian(table,
    axis=0)``, whose columns of a few hundred rows go through masked arrays, 10x slower (a tenth of the scan at
    1,024 nodes). A sort puts NaN last, so a column's n values are its first n rows."""
    ordered = np.sort(table, axis=0)
    counts = np.count_nonzero(~np.isnan(table), axis=0)
    columns = np.arange(table.shape[1])
    return (ordered[(counts - 1) // 2, columns] + ordered[counts // 2, columns]) / 2


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


def _unexplained(rates: _Timelines, index: JobIndex, lustre: dict[str, float], config: RdmaConfig) -> list[Finding]:
    findings = []
    for host, ends, values, jobs, on in _busy_cells(rates, index, config):
        several = np.array([len(j.nodes) > 1 for j in jobs], dtype=bool)
        alone = on.any(axis=0) & ~on[several].any(axis=0)  # no job: another rule; inter-node collectives expected
        hot = []
        for i in np.flatnonzero(alone).tolist():
            held = [j for j, holds in zip(jobs, on[:, i].tolist()) if holds]
            storage = sum(lustre.get(j.id, 0.0) for j in held)
            if values[i] > config.ratio * storage:
                hot.append((float(ends[i]), float(values[i]), storage, [j.id for j in held]))
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


def _counter_rises(series: RdmaSeries) -> list[Finding]:
    findings = []
    errors = series.groups["errors"]
    for host, metric, labels in sorted(series.rising()):
        points = errors[(host, metric, labels)]
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
