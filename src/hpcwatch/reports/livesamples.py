"""Where the live snapshot reads its samples: the store, or a Prometheus (``hpcwatch serve --prometheus``).

The live snapshot (``reports.live``) asks five questions of samples; each backend answers them with the
same rows, so the snapshot is one code path whatever the source:

=====================  ==============================================  =====================================
question               store (``store.queries``, SQL)                  Prometheus (PromQL over HTTP)
=====================  ==============================================  =====================================
``latest_t``           newest sample time                              newest scrape: ``max(timestamp(up))``
``latest_gpu_values``  newest value per (metric, host, gpu)            raw points of the window, the newest
``counter_rates``      last two samples per series, summed by group    ``rate(m[w])``, summed by group here
``metric_activity``    samples per metric since ``since``              series per prefix + ``timestamp``
``prefixes_seen``      every metric prefix the store ever held          ``__name__`` values of the last hour
=====================  ==============================================  =====================================

Slurm jobs, spans (steps), events and findings always come from the store: Prometheus holds none of them.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from hpcwatch import promql
from hpcwatch.promql import safe_url
from hpcwatch.schemas import sample_keys
from hpcwatch.store import Store, queries
from hpcwatch.store.queries import GpuValueRow

if TYPE_CHECKING:
    from hpcwatch.promql import PrometheusBackend

__all__ = [
    "StoreSamples",
    "FollowedStoreSamples",
    "PromSamples",
    "LiveSamples",
    "LATEST_HINT_S",
    "PROM_RATE_WINDOW_S",
    "PROM_SEEN_WINDOW_S",
    "PROM_ACTIVITY_EVERY_S",
]

#: ``rate()`` window under Prometheus: four scrape intervals at Prometheus' default 15 s, as Grafana's
#: ``$__rate_interval`` takes (https://grafana.com/docs/grafana/latest/datasources/prometheus/template-variables/);
#: a shorter window holds one point at that interval and rate() answers nothing.
PROM_RATE_WINDOW_S = 60.0
#: A metric Prometheus held in this window counts as configured (then silent, when it stops). Ours: the
#: PromQL backend's default look-back (``promql.DEFAULT_LOOKBACK_S``).
PROM_SEEN_WINDOW_S = 3600.0
#: The newest sample is searched this far below the last one known first (then everywhere).
LATEST_HINT_S = 3600.0
#: Collector activity is asked of Prometheus at most this often (ours: it scans every series of the
#: prefixes, node-exporter's included, and scrapes come every 15 s by default; the page's problems refresh
#: at the same pace, ``web.live.PROBLEMS_INTERVAL_S``).
PROM_ACTIVITY_EVERY_S = 5.0


@dataclass(frozen=True, slots=True)
class StoreSamples:
    """The store answers (the default)."""

    store: Store

    def describe(self) -> dict[str, Any]:
        return {"samples": "store", "prometheus": None, "store": _store_path(self.store)}

    def latest_t(self, *, hint: float | None = None) -> float | None:
        """The newest sample's time; ``hint`` (the last one known) lets the search skip old row groups."""
        if hint is not None:
            found = queries.latest_sample_t(self.store, since=hint - LATEST_HINT_S)
            if found is not None:
                return found
        return queries.latest_sample_t(self.store)

    def latest_gpu_values(self, metrics: Sequence[str], *, since: float) -> list[GpuValueRow]:
        return queries.latest_gpu_values(self.store, metrics, since=since)

    def gpus_changed(self, mark: object, *, metrics: Sequence[str], since: float) -> tuple[object, None]:
        """Nothing kept between questions: every GPU is to be read (see ``FollowedStoreSamples``)."""
        return None, None

    def counter_rates(self, metrics: Sequence[str], *, since: float, group: str) -> list[tuple[str, str, float]]:
        return queries.counter_rates(self.store, metrics, since=since, group=group)

    def metric_activity(self, *, since: float, prefixes: Sequence[str] = ()) -> list[tuple[str, int, float]]:
        return queries.metric_activity(self.store, since=since)

    def prefixes_seen(self, prefixes: Sequence[str] = ()) -> set[str]:
        return queries.data_seen(self.store)[0]


class _Counter:
    """One counter metric's series, their two newest samples each, kept between questions as columns, and their
    rates summed per host or per job, all series at once (numpy): at 1,024 nodes a Lustre metric has ~13,000
    series (3,000 jobs on 4 OSTs), and summing them group by group was the snapshot's largest part (cProfile);
    then making the columns again from one Python list per series at each question was a fifth of what the
    kept samples cost a snapshot."""

    def __init__(self) -> None:
        self._slot: dict[tuple[str | None, str | None, str], int] = {}
        """(host, job, labels) -> the series' row in ``_top``, in the order the series came."""
        self._top = np.empty((0, 4))
        """Per series: t1, v1 (its newest sample), t2, v2 (the one before; t2 is -inf while only one came)."""
        self._groups = {"host": _Groups(), "job": _Groups()}

    def add(self, hosts: list[Any], jobs: list[Any], labels: list[Any], t: np.ndarray, values: np.ndarray) -> None:
        """Samples in the order they came, one a row of the columns: the two newest of each series kept as if
        they were taken one by one (a sample at or after the newest becomes it; one between the two, the one
        before). A series' samples after its first in one call are taken in turns, its second of the call in the
        second turn, and so on (a call holds one sample a series, but after a pause or on the first read of a window
        it may hold several)."""
        slots = np.fromiter((self._slot_of(key) for key in zip(hosts, jobs, labels)), dtype=np.int64, count=len(hosts))
        if len(self._top) < len(self._slot):
            grown = np.full((max(len(self._slot), 2 * len(self._top)), 4), -np.inf)
            grown[: len(self._top)] = self._top
            self._top = grown
        order = np.argsort(slots, kind="stable")
        first = np.r_[True, slots[order][1:] != slots[order][:-1]] if len(order) else np.zeros(0, bool)
        turn = np.empty(len(order), np.int64)
        turn[order] = np.arange(len(order)) - np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
        for n in range(int(turn.max(initial=-1)) + 1):
            now = turn == n
            self._take_turn(slots[now], t[now], values[now])

    def _take_turn(self, slots: np.ndarray, t: np.ndarray, values: np.ndarray) -> None:
        """One sample a series (``slots`` distinct) into the two newest."""
        top = self._top
        newest = t >= top[slots, 0]
        between = ~newest & (t > top[slots, 2])
        moved = slots[newest]
        top[moved, 2:] = top[moved, :2]
        top[moved, 0], top[moved, 1] = t[newest], values[newest]
        top[slots[between], 2], top[slots[between], 3] = t[between], values[between]

    def _slot_of(self, key: tuple[str | None, str | None, str]) -> int:
        slot = self._slot.get(key)
        if slot is None:
            slot = self._slot[key] = len(self._slot)
            self._join(key[0], key[1])
        return slot

    def rates(self, group: str, since: float) -> dict[str, float]:
        """Per host (``group`` "host") or job: the sum of its series' rates between their two newest samples,
        both at or after ``since`` (a counter that went down was reset: 0), in the order the series came (the
        sum a loop over them makes). Groups with no such series are left out."""
        n = len(self._slot)
        if not n:
            return {}
        t1, v1, t2, v2 = self._top[:n].T
        groups = self._groups[group]
        codes = groups.codes()
        counted = (t2 >= since) & (t1 > t2) & (codes >= 0)
        rate = np.maximum(v1 - v2, 0.0)[counted] / (t1 - t2)[counted]
        sums = np.bincount(codes[counted], weights=rate, minlength=len(groups.names))
        present = np.bincount(codes[counted], minlength=len(groups.names)) > 0
        return {groups.names[i]: float(sums[i]) for i in np.flatnonzero(present).tolist()}

    def forget_before(self, horizon: float) -> None:
        """Drop the series whose newest sample is older than ``horizon``."""
        n = len(self._slot)
        kept = self._top[:n, 0] >= horizon
        keys = [key for key, keep in zip(self._slot, kept.tolist()) if keep]
        self._top = self._top[:n][kept]
        self._slot = {key: i for i, key in enumerate(keys)}
        for groups in self._groups.values():
            groups.keep(kept)

    def _join(self, host: str | None, job: str | None) -> None:
        """The next series is of ``host`` and ``job``."""
        self._groups["host"].join(host)
        self._groups["job"].join(job)


class _Groups:
    """The group (a host, a job) of each series of a ``_Counter``, in the series' order, as codes."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._code_of: dict[str, int] = {}
        self._codes: list[int] = []
        self._array: np.ndarray | None = None

    def join(self, name: str | None) -> None:
        """The next series is of group ``name`` (None: of none)."""
        code = -1 if name is None else self._code_of.setdefault(name, len(self._code_of))
        if code == len(self.names):
            self.names.append(name)  # type: ignore[arg-type]
        self._codes.append(code)
        self._array = None

    def codes(self) -> np.ndarray:
        if self._array is None:
            self._array = np.array(self._codes, dtype=np.int64)
        return self._array

    def keep(self, kept: np.ndarray) -> None:
        """Only the series ``kept`` marks (one boolean a series, in their order); a group left with none is
        forgotten (at 1,024 nodes thousands of jobs end an hour)."""
        codes = self.codes()[kept]
        grouped = codes >= 0
        used, inverse = np.unique(codes[grouped], return_inverse=True)
        codes[grouped] = inverse
        self.names = [self.names[i] for i in used.tolist()]
        self._code_of = {name: i for i, name in enumerate(self.names)}
        self._codes, self._array = codes.tolist(), codes


class FollowedStoreSamples:
    """The store answers as ``StoreSamples`` does, from what it keeps of the rows as they are committed: the
    live view's, which asks every second. ``latest_t``, ``latest_gpu_values`` of the ``latest`` metrics and
    ``counter_rates`` of the ``counters`` read only the rows committed since the previous question
    (``queries.sample_rows_since``), where ``StoreSamples`` reads its whole window each time: at 1,024 nodes
    a window holds 20-30 ticks of rows, and those queries were half of a snapshot's time (py-spy).

    The rows are ``StoreSamples``' for a ``since`` no further back than ``keep_s`` before the newest sample
    (the kept state forgets series silent for longer); a question further back, or about other metrics, is
    asked of the store as ``StoreSamples`` asks it. A row committed late with an old time counts as it would
    in the store: each key keeps its newest samples by time, not by arrival."""

    def __init__(self, store: Store, *, latest: Sequence[str], counters: Sequence[str], keep_s: float) -> None:
        self.store = store
        self._asked = StoreSamples(store)
        self._latest_metrics = frozenset(latest)
        self._counter_metrics = frozenset(counters)
        self._metrics = sorted(self._latest_metrics | self._counter_metrics)
        self._keep_s = keep_s
        self._lock = threading.Lock()
        self._version: int | None = None
        """The store version read up to (None: nothing read yet)."""
        self._floor = math.inf
        """Answers are kept for a ``since`` at or after this."""
        self._newest_t: float | None = None
        self._latest: dict[tuple[str, str, str], tuple[float, str | None, float]] = {}
        """(metric, host, gpu) -> (value, job, t) of its newest sample."""
        self._reads = 0
        """The reads taken in so far (``_take``): the marks of ``gpus_changed``."""
        self._gpu_changed: dict[tuple[str, str], int] = {}
        """(host, gpu) -> the read that last changed one of its newest samples."""
        self._counters: dict[str, _Counter] = {}

    def describe(self) -> dict[str, Any]:
        return self._asked.describe()

    def latest_t(self, *, hint: float | None = None) -> float | None:
        with self._lock:
            self._follow()
            return self._newest_t

    def latest_gpu_values(self, metrics: Sequence[str], *, since: float) -> list[GpuValueRow]:
        with self._lock:
            self._follow()
            if since < self._floor or not self._latest_metrics.issuperset(metrics):
                return self._asked.latest_gpu_values(metrics, since=since)
            wanted = set(metrics)
            return [
                (metric, host, gpu, value, job, t)
                for (metric, host, gpu), (value, job, t) in self._latest.items()
                if t >= since and metric in wanted
            ]

    def gpus_changed(
        self, mark: object, *, metrics: Sequence[str], since: float
    ) -> tuple[object, set[tuple[str, str]] | None]:
        """(the mark to give next time, the (host, gpu) whose newest sample of a ``metrics`` changed since the
        call that returned ``mark``); None for the GPUs when they cannot be told (no mark, a question the kept
        rows do not answer): then every GPU is to be read. What a caller that keeps the GPUs between snapshots
        asks (``reports.live.GpuTable``)."""
        with self._lock:
            self._follow()
            reads = self._reads
            if not isinstance(mark, int) or since < self._floor or not self._latest_metrics.issuperset(metrics):
                return reads, None
            return reads, {gpu for gpu, read in self._gpu_changed.items() if read > mark}

    def latest_gpu_values_of(
        self, gpus: Iterable[tuple[str, str]], metrics: Sequence[str], *, since: float
    ) -> list[GpuValueRow]:
        """``latest_gpu_values`` of the GPUs ``gpus`` only, from the kept rows (after ``gpus_changed`` said it
        can answer)."""
        with self._lock:
            latest = self._latest
            return [
                (metric, host, gpu, value, job, t)
                for host, gpu in gpus
                for metric in metrics
                if (kept := latest.get((metric, host, gpu))) is not None
                for value, job, t in (kept,)
                if t >= since
            ]

    def counter_rates(self, metrics: Sequence[str], *, since: float, group: str) -> list[tuple[str, str, float]]:
        with self._lock:
            self._follow()
            if since < self._floor or not self._counter_metrics.issuperset(metrics) or group not in ("host", "job"):
                return self._asked.counter_rates(metrics, since=since, group=group)
            return [
                (metric, value, rate)
                for metric in dict.fromkeys(metrics)
                if metric in self._counters
                for value, rate in self._counters[metric].rates(group, since).items()
            ]

    def metric_activity(self, *, since: float, prefixes: Sequence[str] = ()) -> list[tuple[str, int, float]]:
        return self._asked.metric_activity(since=since, prefixes=prefixes)

    def prefixes_seen(self, prefixes: Sequence[str] = ()) -> set[str]:
        return self._asked.prefixes_seen(prefixes)

    def _follow(self) -> None:
        """Take in the rows committed since the last question (the first time: the last ``keep_s``)."""
        version = self.store.version
        if version == self._version:
            return
        if self._version is None:
            newest = queries.latest_sample_t(self.store)
            floor = -math.inf if newest is None else newest - self._keep_s
            read_at, table, self._newest_t = queries.sample_rows_since(
                self.store, 0, self._metrics, t0=None if newest is None else floor
            )
            self._floor = floor
        else:
            read_at, table, newest = queries.sample_rows_since(self.store, self._version, self._metrics)
            if newest is not None:
                self._newest_t = newest if self._newest_t is None else max(self._newest_t, newest)
        self._take(table)
        self._version = read_at
        self._forget_silent()

    def _take(self, table: pa.Table) -> None:
        """The rows read (``queries.sample_rows_since``) into the newest samples and the counters, metric by
        metric: the rows of a metric are handed over as columns, not looked at one by one here."""
        self._reads += 1
        metric = table["metric"]
        latest = table.filter(pc.is_in(metric, value_set=pa.array(sorted(self._latest_metrics), pa.string())))
        self._take_latest(latest.filter(pc.and_(pc.is_valid(latest["host"]), pc.is_valid(latest["gpu"]))))
        for name in sorted(self._counter_metrics):
            rows = table.filter(pc.equal(metric, name))
            if rows.num_rows:
                hosts, jobs, labels = (rows[c].to_pylist() for c in ("host", "job", "labels"))
                t, values = rows["t"].to_numpy(), rows["value"].to_numpy()
                self._counters.setdefault(name, _Counter()).add(hosts, jobs, labels, t, values)

    def _take_latest(self, rows: pa.Table) -> None:
        """Rows of the ``latest`` metrics with a host and a GPU: each key's newest by time kept."""
        latest, changed, read = self._latest, self._gpu_changed, self._reads
        columns = (rows[c].to_pylist() for c in ("metric", "host", "gpu", "job", "value", "t"))
        for metric, host, gpu, job, value, t in zip(*columns):
            key = (metric, host, gpu)
            kept = latest.get(key)
            if kept is None or t >= kept[2]:
                latest[key] = (value, job, t)
                changed[(host, gpu)] = read

    def _forget_silent(self) -> None:
        """Drop the keys with no sample in the last ``keep_s`` (a GPU gone, a job's counters after it ended):
        what is kept stays the size of what reports now. Answers further back are asked of the store."""
        if self._newest_t is None:
            return
        horizon = self._newest_t - self._keep_s
        if horizon - self._floor < self._keep_s / 4:  # not every second: each pass walks every key
            return
        self._latest = {k: v for k, v in self._latest.items() if v[2] >= horizon}
        gpus = {(host, gpu) for _, host, gpu in self._latest}
        self._gpu_changed = {gpu: read for gpu, read in self._gpu_changed.items() if gpu in gpus}
        for counter in self._counters.values():
            counter.forget_before(horizon)
        self._floor = horizon


class PromSamples:
    """Prometheus answers (``hpcwatch serve --prometheus URL``); ``BackendError`` when it does not."""

    def __init__(self, prom: PrometheusBackend, store: Store) -> None:
        self.prom = prom
        self.store = store
        self._activity: tuple[float, list[tuple[str, int, float]]] | None = None

    def describe(self) -> dict[str, Any]:
        return {"samples": "prometheus", "prometheus": safe_url(self.prom.config.url), "store": _store_path(self.store)}

    def latest_t(self, *, hint: float | None = None) -> float | None:
        return promql.newest_scrape_t(self.prom)

    def latest_gpu_values(self, metrics: Sequence[str], *, since: float) -> list[GpuValueRow]:
        table = self.prom.samples(list(metrics), t0=since)
        newest: dict[tuple[str, str, str], GpuValueRow] = {}
        # samples() is ordered metric, host, gpu, t: the last row of a key is its newest point.
        for metric, host, gpu, value, job, t in zip(
            *(table[c].to_pylist() for c in ("metric", "host", "gpu", "value", "job", "t"))
        ):
            if host is not None and gpu is not None:
                newest[(metric, host, gpu)] = (metric, host, gpu, value, job, t)
        return list(newest.values())

    def gpus_changed(self, mark: object, *, metrics: Sequence[str], since: float) -> tuple[object, None]:
        """Nothing kept between questions: every GPU is to be read (see ``FollowedStoreSamples``)."""
        return None, None

    def counter_rates(self, metrics: Sequence[str], *, since: float, group: str) -> list[tuple[str, str, float]]:
        # Prometheus' rate() over its own window (``since`` is the store's rule of two newest samples).
        window_s = PROM_RATE_WINDOW_S
        sums: dict[tuple[str, str], float] = {}
        for metric in metrics:
            table = promql.counter_rate(self.prom, metric, window_s=window_s)
            for labels_json, value in zip(table["labels"].to_pylist(), table["value"].to_pylist()):
                key = _group_value(labels_json, metric, group)
                if key is not None:
                    sums[(metric, key)] = sums.get((metric, key), 0.0) + value
        return [(m, g, v) for (m, g), v in sums.items()]

    def metric_activity(self, *, since: float, prefixes: Sequence[str] = ()) -> list[tuple[str, int, float]]:
        """One row per collector prefix (``prefixes``: the page's collectors', ``reports.live.COLLECTORS``) whose newest point is since ``since``: ``(prefix + "_", series, newest
        t)`` (``promql.prefix_activity``: Prometheus counts series, the store counts points). Asked at most
        every ``PROM_ACTIVITY_EVERY_S``."""
        now = time.monotonic()
        if self._activity is not None and now - self._activity[0] < PROM_ACTIVITY_EVERY_S:
            return self._activity[1]
        found = promql.prefix_activity(self.prom, prefixes)
        rows = [(f"{p}_", n, t) for p, n, t in found if t >= since]
        self._activity = (now, rows)
        return rows

    def prefixes_seen(self, prefixes: Sequence[str] = ()) -> set[str]:
        """The ``prefixes`` of metric names Prometheus held in the last ``PROM_SEEN_WINDOW_S``."""
        if not prefixes:
            return set()
        now = time.time()
        names = self.prom.label_values(
            "__name__", match=[promql.prefix_selector(prefixes)], t0=now - PROM_SEEN_WINDOW_S, t1=now
        )
        return {n.split("_", 1)[0] for n in names}


LiveSamples = StoreSamples | FollowedStoreSamples | PromSamples


def _group_value(labels_json: str, metric: str, group: str) -> str | None:
    """The host or job of one series (``schemas.sample_keys``; a node-exporter series with neither ``node``
    nor ``Hostname`` takes the host part of its ``instance``)."""
    labels = orjson.loads(labels_json)
    host, _, job = sample_keys(labels, metric)
    if group == "job":
        return job
    if host is None and labels.get("instance"):
        host = str(labels["instance"]).rsplit(":", 1)[0]
    return host


def _store_path(store: Store) -> str:
    return str(store.config.path)
