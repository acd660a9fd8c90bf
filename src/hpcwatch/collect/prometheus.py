"""Metrics, polled: a Prometheus / VictoriaMetrics over PromQL (``[[prometheus]]``), or an exporter's
``/metrics`` scraped directly (``[[scrape]]``, for sites without a Prometheus).

PromQL: each poll reads the raw points of (last end, now] (``PrometheusBackend.samples``, a range
selector), and the end is a cursor committed with them, so consecutive polls neither overlap nor
leave a gap, across restarts too. A scrape stores the endpoint's text at the time of the scrape.
"""

from __future__ import annotations

import time

import httpx
import pyarrow.compute as pc

from hpcwatch.collect.base import RunResult
from hpcwatch.collect.config import PrometheusSection, ScrapeSection
from hpcwatch.collect.cursor import Cursor
from hpcwatch.errors import BackendError
from hpcwatch.promql import PrometheusBackend
from hpcwatch.sources.prometheus_text import parse_prometheus_columns
from hpcwatch.store import Store

__all__ = ["PromqlCollector", "ScrapeCollector"]


class PromqlCollector:
    def __init__(self, store: Store, section: PrometheusSection, *, client: httpx.Client | None = None) -> None:
        self.section = section
        self.backend = PrometheusBackend(section.url, client=client, timeout_s=section.timeout_s)
        self.cursor = Cursor(store, f"prometheus:{section.name}", path=section.url)

    def close(self) -> None:
        self.backend.close()

    def run(self) -> RunResult:
        now = float(self.backend.api("query", {"query": "time()"})["result"][0])  # Prometheus' clock, not ours
        start = float(self.cursor.state.get("end") or now - self.section.lookback_s)
        table = self.backend.samples(list(self.section.metrics) or None, t0=start, t1=now)
        table = table.filter(pc.greater(table["t"], start))  # (start, now]: the last poll took start
        with self.cursor.commit({"end": now}) as tx:
            if table.num_rows:
                tx.add_sample_table(table)
        newest = pc.max(table["t"]).as_py() if table.num_rows else None
        return RunResult(records=table.num_rows, lag_s=None if newest is None else max(0.0, now - newest))


class ScrapeCollector:
    def __init__(self, store: Store, section: ScrapeSection, *, client: httpx.Client | None = None) -> None:
        self.store, self.section = store, section
        self._client = client or httpx.Client(timeout=section.timeout_s, trust_env=False)

    def close(self) -> None:
        self._client.close()

    def run(self) -> RunResult:
        t = time.time()
        try:
            response = self._client.get(self.section.url)
        except httpx.HTTPError as err:
            raise BackendError(f"{self.section.url}: {type(err).__name__}: {err}") from err
        if response.status_code != 200:
            raise BackendError(f"{self.section.url}: HTTP {response.status_code}")
        table = parse_prometheus_columns(response.text, path=self.section.url, t=t)
        with self.store.transaction() as tx:
            tx.add_sample_table(table)
        return RunResult(records=table.num_rows, lag_s=0.0)
