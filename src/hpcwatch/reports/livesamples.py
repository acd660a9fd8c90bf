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

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from hpcwatch import promql
from hpcwatch.promql import safe_url
from hpcwatch.schemas import sample_keys
from hpcwatch.store import Store, queries
from hpcwatch.store.queries import GpuValueRow

if TYPE_CHECKING:
    from hpcwatch.promql import PrometheusBackend

__all__ = [
    "StoreSamples",
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

    def counter_rates(self, metrics: Sequence[str], *, since: float, group: str) -> list[tuple[str, str, float]]:
        return queries.counter_rates(self.store, metrics, since=since, group=group)

    def metric_activity(self, *, since: float, prefixes: Sequence[str] = ()) -> list[tuple[str, int, float]]:
        return queries.metric_activity(self.store, since=since)

    def prefixes_seen(self, prefixes: Sequence[str] = ()) -> set[str]:
        return queries.data_seen(self.store)[0]


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


LiveSamples = StoreSamples | PromSamples


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
