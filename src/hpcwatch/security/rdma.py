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
import pyarrow as pa

from hpcwatch import vocab
from hpcwatch.records import Event, Finding, Job, Sample
from hpcwatch.security.context import JobIndex, host_of
from hpcwatch.security.series import PairIds, PointColumns, WindowSeries, numbering_of_held
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
    rates = _Timelines(series.node_rates())
    findings = _no_job(rates, index, config) + _disproportion(rates, index, config) + _counter_rises(series)
    findings += _unexplained(rates, index, _lustre_rates(series), config)
    findings += [f for e in events if e.kind == EventKind.OPENSM_PARTITIONS for f in _open_partitions(e)]
    return findings


# -- counters -> rates --------------------------------------------------------------------------------

#: Each data metric's collector family.
_DATA_NAMES = {m: fam for fam, ms in DATA_METRICS.items() for m in ms}
_GROUPS = ("data", "errors", "lustre")
#: A live scan's (metric, labels text) pairs remembered (``RdmaSeries.add_table``): one a series; past this many
#: (a long run's Lustre job ids), forgotten and learnt again.
_KEPT_PAIRS = 500_000


class RdmaSeries(WindowSeries):
    """The samples ``detect_rdma`` reads, as columns (``PointColumns``: each point's series, time and value) in
    three groups: the IB data counters (``data``, a series per (family, host, metric, labels)), the error and
    constraint counters (``errors``, per (host, metric, labels)), the Lustre byte counters (``lustre``, per
    (jobid, metric, target)). ``keys[group][i]`` is series ``i``'s key.

    While the data series come in time order (``in_time_order``: each point at or after its series' previous one,
    as tuples (t, value)), each pair of consecutive points' rate is worked out when its second point comes and
    kept (``_rates``) until its first point leaves the window: a live scan at 1,024 nodes holds 1.4 million data
    points, of which a scan adds 40,000. Once a point came out of order, the rates are made again from the
    points, sorted, at each ask. Every step is a numpy call over the points of a read or of the window: in
    Python, a step per series (92,000 at 1,024 nodes) was most of a scan."""

    def __init__(self) -> None:
        self.points = {group: PointColumns("series", "value") for group in _GROUPS}
        self.keys: dict[str, list[tuple]] = {group: [] for group in _GROUPS}
        self.in_time_order = True
        self._ids: dict[str, dict[tuple, int]] = {group: {} for group in _GROUPS}
        self._pair_ids = PairIds(2, self._ids_of, _KEPT_PAIRS)
        """(metric, labels JSON text) -> (index of its group in ``_GROUPS`` or -1: not read; series id)."""
        self._cells: list[tuple[str, str]] = []
        """(family, host) of each node's rates, by index; ``_cell_of[i]``: data series ``i``'s."""
        self._cell_ids: dict[tuple[str, str], int] = {}
        self._cell_of = np.empty(0, np.int32)
        self._last = np.empty((0, 2))
        """Each data series' newest point (t, value) held; NaN where it holds none."""
        self._rates = PointColumns("t1", "cell", "rate", "dt")
        """A row per pair of consecutive points of a data series whose counter rose: ``t`` the pair's first
        point, ``t1`` its second, the bytes/s between them, ``dt`` seconds between them, the series' node; in
        (t1, node, rate) order while ``_rates_in_order`` (a read's pairs are newer than those kept, nearly
        always), so that a node's rate at a scrape is one sum over consecutive rows, without sorting the window."""
        self._rates_in_order = True
        self._last_key: tuple[float, int, float] | None = None

    def add(self, samples: Iterable[Sample]) -> None:
        memo: dict[tuple[str, int], tuple[Mapping[str, str], tuple[int, int]]] = {}
        codes, t, values = [], [], []
        for s in samples:
            hit = memo.get((s.metric, id(s.labels)))
            if hit is None:  # the store's readers share one labels mapping per series: a key a series
                hit = memo[(s.metric, id(s.labels))] = (s.labels, self._ids_of(s.metric, s.labels))
            if hit[1][0] >= 0:
                codes.append(hit[1])
                t.append(s.t)
                values.append(s.value)
        ids = np.array(codes, np.int64).reshape(-1, 2)
        self._add_points(ids[:, 0], ids[:, 1], np.array(t, float), np.array(values, float))

    def add_table(self, table: pa.Table) -> None:
        """The rows of a table with ``metric``, ``labels`` (JSON text), ``t`` and ``value`` columns."""
        ids = self._pair_ids.of_table(table)
        self._add_points(ids[:, 0], ids[:, 1], table["t"].to_numpy(), table["value"].to_numpy())

    def forget_before(self, t: float) -> None:
        """Drop the points before ``t``, and the rates of the pairs whose first point they were."""
        for points in self.points.values():
            points.forget_before(t)
        self._rates.forget_before(t)
        held = np.bincount(self.points["data"].columns()["series"].astype(np.int64), minlength=len(self._last))
        self._last[held == 0] = np.nan  # a series that left the window starts again with its next point
        for group in _GROUPS:
            self._renumber(group)

    def _renumber(self, group: str) -> None:
        """Forget the series of ``group`` that left the window, when they are most of those known."""
        renumbered = numbering_of_held(self.points[group].columns()["series"].astype(np.int64), len(self.keys[group]))
        if renumbered is None:
            return
        held, numbers = renumbered
        self.points[group].renumber("series", numbers)
        self.keys[group] = [self.keys[group][i] for i in held.tolist()]
        self._ids[group] = {key: i for i, key in enumerate(self.keys[group])}
        if group == "data":
            self._cell_of, self._last = self._cell_of[held], self._last[held]
        self._pair_ids = PairIds(2, self._ids_of, _KEPT_PAIRS)  # its ids are the old ones

    def __len__(self) -> int:
        return sum(len(points) for points in self.points.values())

    @property
    def groups(self) -> dict[str, dict[tuple, list[tuple[float, float]]]]:
        """The points as lists: group -> series key -> [(t, value)] in the order added (what a test compares)."""
        out: dict[str, dict[tuple, list[tuple[float, float]]]] = {}
        for group, points in self.points.items():
            c, keys, held = points.columns(), self.keys[group], out.setdefault(group, {})
            for series, t, value in zip(c["series"].tolist(), c["t"].tolist(), c["value"].tolist()):
                held.setdefault(keys[int(series)], []).append((t, value))
        return out

    def node_rates(self) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """host -> its scrapes' (times, seconds since the previous scrape: the longest of its ports', bytes/s
        summed over its ports and directions), in time order. A node scraped by both collectors counts its ports
        once, from node-exporter."""
        if self.in_time_order:
            if not self._rates_in_order:  # a read brought a pair older than the newest kept: sorted once
                rates = _in_rate_order(self._rates.columns())
                self._rates = PointColumns("t1", "cell", "rate", "dt")
                self._rates.add(**rates)
                self._rates_in_order = True
            rates = self._rates.columns()
            held = ~np.isnan(self._last[: len(self.keys["data"]), 0])
        else:
            points = self.points["data"].columns()
            rates = _in_rate_order(self._rates_of(points))
            held = np.bincount(points["series"].astype(np.int64), minlength=len(self.keys["data"])) > 0
        if not len(rates["t"]):
            return {}
        # In (time, node, rate) order whatever the reads were, so the same sums in the same order.
        cell, t1, rate, dt = rates["cell"], rates["t1"], rates["rate"], rates["dt"]
        starts = np.flatnonzero(np.r_[True, (cell[1:] != cell[:-1]) | (t1[1:] != t1[:-1])])
        cell, t1 = cell[starts], t1[starts]
        summed, longest = np.add.reduceat(rate, starts), np.maximum.reduceat(dt, starts)
        by_node = np.argsort(cell, kind="stable")  # each node's scrapes stay in time order
        cell, t1, summed, longest = cell[by_node], t1[by_node], summed[by_node], longest[by_node]
        exported = {
            self._cells[c][1]
            for c in np.unique(self._cell_of[: len(held)][held]).tolist()
            if self._cells[c][0] == "node_exporter"
        }
        edges = np.flatnonzero(np.diff(cell)) + 1
        out = {}
        for lo, hi in zip(np.r_[0, edges].tolist(), np.r_[edges, len(cell)].tolist()):
            family, host = self._cells[int(cell[lo])]
            if family == "node_exporter" or host not in exported:
                out[host] = (t1[lo:hi], longest[lo:hi], summed[lo:hi])
        return out

    def host_rates(self) -> dict[str, dict[float, tuple[float, float]]]:
        """``node_rates`` as dictionaries: host -> scrape time -> (bytes/s, seconds since the previous scrape)."""
        return {
            host: {t: (r, dt) for t, dt, r in zip(ends.tolist(), dts.tolist(), values.tolist())}
            for host, (ends, dts, values) in self.node_rates().items()
        }

    def rises(self) -> dict[tuple, list[tuple[float, float]]]:
        """Each error series that rises in the window: its rises (time, increase), in time order."""
        c = self.points["errors"].columns()
        series, t, value = c["series"].astype(np.int64), c["t"], c["value"]
        if not len(t):
            return {}
        low, high = np.full(len(self.keys["errors"]), np.inf), np.full(len(self.keys["errors"]), -np.inf)
        np.minimum.at(low, series, value)
        np.maximum.at(high, series, value)
        moved = high > low  # a counter that never changed cannot rise: most of them
        rows = np.flatnonzero(moved[series])
        rows = rows[np.lexsort((value[rows], t[rows], series[rows]))]  # each series' points as sorted tuples
        series, t, value = series[rows], t[rows], value[rows]
        rise = np.flatnonzero((series[1:] == series[:-1]) & (value[1:] > value[:-1])) + 1
        out: dict[tuple, list[tuple[float, float]]] = {}
        keys = self.keys["errors"]
        for i, t1, increase in zip(series[rise].tolist(), t[rise].tolist(), (value[rise] - value[rise - 1]).tolist()):
            out.setdefault(keys[i], []).append((t1, increase))
        return out

    def rising(self) -> list[tuple]:
        """The error series that rise somewhere in the window."""
        return list(self.rises())

    def _ids_of(self, metric: str, labels: Mapping[str, str]) -> tuple[int, int]:
        """(the index of the series' group, or -1 when none reads it; the series' id in its group)."""
        kind = _kind_of(metric)
        if kind == "lustre":
            key: tuple | None = (labels["jobid"], metric, labels.get("target")) if labels.get("jobid") else None
        elif kind is not None and (host := host_of(labels)) is not None:
            pairs = tuple(sorted(labels.items()))
            key = (_DATA_NAMES[metric], host, metric, pairs) if kind == "data" else (host, metric, pairs)
        else:
            key = None
        if key is None or kind is None:
            return -1, 0
        ids = self._ids[kind]
        series = ids.get(key)
        if series is None:
            series = ids[key] = len(self.keys[kind])
            self.keys[kind].append(key)
            if kind == "data":
                self._new_data_series(key[0], key[1])
        return _GROUPS.index(kind), series

    def _new_data_series(self, family: str, host: str) -> None:
        cell = self._cell_ids.setdefault((family, host), len(self._cells))
        if cell == len(self._cells):
            self._cells.append((family, host))
        if len(self.keys["data"]) > len(self._cell_of):  # room for twice as many series
            grown = max(2 * len(self._cell_of), 64)
            self._cell_of = np.resize(self._cell_of, grown)
            self._last = np.vstack([self._last, np.full((grown - len(self._last), 2), np.nan)])
        self._cell_of[len(self.keys["data"]) - 1] = cell

    def _add_points(self, groups: np.ndarray, series: np.ndarray, t: np.ndarray, values: np.ndarray) -> None:
        """Points in arrival order: each one's group (index in ``_GROUPS``; -1: none), series, time and value."""
        for code, group in enumerate(_GROUPS):
            mine = groups == code
            if mine.any():
                self.points[group].add(t=t[mine], series=series[mine].astype(np.int32), value=values[mine])
        data = groups == 0
        if self.in_time_order and data.any():
            self._pair(series[data], t[data], values[data])

    def _pair(self, series: np.ndarray, t: np.ndarray, values: np.ndarray) -> None:
        """The rates of the pairs the data points ``series``, ``t``, ``values`` (in arrival order) make with their
        series' previous points."""
        order = np.argsort(series, kind="stable")
        series, t, values = series[order], t[order], values[order]
        first = np.r_[True, series[1:] != series[:-1]]
        before_t = np.where(first, self._last[series, 0], np.r_[np.nan, t[:-1]])
        before_v = np.where(first, self._last[series, 1], np.r_[np.nan, values[:-1]])
        if np.any((t < before_t) | ((t == before_t) & (values < before_v))):
            self.in_time_order = False  # a point came before its series' previous one: rates from the points
            self._rates = PointColumns("t1", "cell", "rate", "dt")
            self._rates_in_order, self._last_key = True, None
            return
        last = np.r_[first[1:], True]
        self._last[series[last]] = np.column_stack([t[last], values[last]])
        rose = (t > before_t) & (values >= before_v)
        dt = t[rose] - before_t[rose]
        rates = _in_rate_order(
            {
                "t": before_t[rose],
                "t1": t[rose],
                "cell": self._cell_of[series[rose]],
                "rate": (values[rose] - before_v[rose]) / dt,
                "dt": dt,
            }
        )
        if len(rates["t"]):
            first_key = (rates["t1"][0], rates["cell"][0], rates["rate"][0])
            self._rates_in_order = self._rates_in_order and (self._last_key is None or self._last_key <= first_key)
            self._last_key = (rates["t1"][-1], rates["cell"][-1], rates["rate"][-1])
            self._rates.add(**rates)

    def _rates_of(self, points: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``_rates``' rows made from the data points, each series sorted by (t, value)."""
        series, t, values = points["series"], points["t"], points["value"]
        order = np.lexsort((values, t, series))
        series, t, values = series[order], t[order], values[order]
        pair = (series[1:] == series[:-1]) & (t[1:] > t[:-1]) & (values[1:] >= values[:-1])
        dt = (t[1:] - t[:-1])[pair]
        return {
            "t": t[:-1][pair],
            "t1": t[1:][pair],
            "cell": self._cell_of[series[1:][pair]],
            "rate": (values[1:] - values[:-1])[pair] / dt,
            "dt": dt,
        }


def _in_rate_order(rates: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``RdmaSeries._rates``' rows sorted by (t1, node, rate)."""
    order = np.lexsort((rates["rate"], rates["cell"], rates["t1"]))
    return {name: column[order] for name, column in rates.items()}


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
    """Each host's rates as arrays in time order: interval ends, lengths and rates (``RdmaSeries.node_rates``)."""

    def __init__(self, rates: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        self._rates = rates

    @classmethod
    def of_dicts(cls, rates: Mapping[str, Mapping[float, tuple[float, float]]]) -> _Timelines:
        """From ``RdmaSeries.host_rates``' form: host -> interval end -> (rate, length)."""
        arrays = {}
        for host, by_t in rates.items():
            ends = sorted(by_t)
            arrays[host] = (
                np.array(ends, dtype=np.float64),
                np.array([by_t[t][1] for t in ends], dtype=np.float64),
                np.array([by_t[t][0] for t in ends], dtype=np.float64),
            )
        return cls(arrays)

    def __contains__(self, host: str) -> bool:
        return host in self._rates

    @property
    def hosts(self) -> Iterable[str]:
        return self._rates.keys()

    def arrays(self, host: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``host``'s intervals in time order: their ends, their lengths (seconds since the previous scrape),
        their rates."""
        return self._rates[host]

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


def _lustre_rates(series: RdmaSeries) -> dict[str, float]:
    """job id -> mean Lustre bytes/s (read + write, all targets) over the window the samples cover: per counter,
    from its first point to its last (as tuples (t, value)), unless it went down."""
    c = series.points["lustre"].columns()
    if not len(c["t"]):
        return {}
    ids, t, value = c["series"].astype(np.int64), c["t"], c["value"]
    count = len(series.keys["lustre"])
    t0, t1 = np.full(count, np.inf), np.full(count, -np.inf)
    np.minimum.at(t0, ids, t)
    np.maximum.at(t1, ids, t)
    v0, v1 = np.full(count, np.inf), np.full(count, -np.inf)
    at_first, at_last = t == t0[ids], t == t1[ids]
    np.minimum.at(v0, ids[at_first], value[at_first])  # the first point as tuples: the least value at the least t
    np.maximum.at(v1, ids[at_last], value[at_last])
    kept = (t1 > t0) & (v1 >= v0)
    out: dict[str, list[float]] = defaultdict(list)
    keys = series.keys["lustre"]
    for i, rate in zip(np.flatnonzero(kept).tolist(), ((v1 - v0)[kept] / (t1 - t0)[kept]).tolist()):
        out[keys[i][0]].append(rate)
    return {job: math.fsum(rates) for job, rates in out.items()}


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
    for (host, metric, labels), rises in sorted(series.rises().items()):
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
