"""reports/livesamples.py: the live snapshot's sample questions answered by a Prometheus.

The answers are a real Prometheus 2.42's (Debian 12) to every request of one live snapshot while it
scraped the twin's per-node dcgm-exporter and node-exporter endpoints at 1 s
(tests/data/prometheus_api/live_snapshot_answers.json, recorded by this project; see tests/data/SOURCES.md),
replayed through httpx.MockTransport.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs

import httpx
import pytest

from hpcwatch import promql
from hpcwatch.errors import BackendError
from hpcwatch.promql import PrometheusBackend
from hpcwatch.reports.live import COLLECTOR_PREFIXES, data_seen, live_snapshot
from hpcwatch.reports.livesamples import PromSamples
from hpcwatch.store import Store

API = Path(__file__).resolve().parents[1] / "data" / "prometheus_api"
RECORDED = json.loads((API / "live_snapshot_answers.json").read_text())


def _answer_of(path: str, query: str | None) -> dict:
    """The recorded answer to this request (queries are matched exactly; label values by path)."""
    for r in RECORDED["requests"]:
        if r["path"] == path and (query is None or r["query"] == query):
            return r["answer"]
    raise AssertionError(f"no recorded answer for {path} {query!r}")


def _backend(seen: list[str]) -> PrometheusBackend:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/label/__name__/values"):
            seen.append("label_values " + " ".join(request.url.params.get_list("match[]")))
            return httpx.Response(200, json=_answer_of(request.url.path, None))
        query = parse_qs(request.content.decode())["query"][0]
        seen.append(query)
        return httpx.Response(200, json=_answer_of(request.url.path, query))

    return PrometheusBackend("http://prom.test:9090", client=httpx.Client(transport=httpx.MockTransport(handle)))


@pytest.fixture
def prom_samples():
    seen: list[str] = []
    store = Store(":memory:")
    yield PromSamples(_backend(seen), store), seen
    store.close()


def test_activity_per_prefix_from_a_real_prometheus(prom_samples):
    samples, seen = prom_samples
    now = samples.latest_t()
    rows = {m: (n, t) for m, n, t in samples.metric_activity(since=now - 60, prefixes=COLLECTOR_PREFIXES)}
    assert set(rows) == {"DCGM_", "node_"}  # the twin serves dcgm-exporter and node-exporter only
    assert rows["DCGM_"][0] % 16 == 0  # 16 GPUs, every DCGM series counted
    assert all(now - 60 <= t <= now for _, t in rows.values())
    # timestamp() is asked of one name per prefix: over several it fails on a real Prometheus.
    bad = _answer_of("/api/v1/query", 'max(timestamp({__name__=~"DCGM_.+"}))')
    assert bad["status"] == "error" and "same labelset" in bad["error"]
    assert all(q.count("timestamp(") == q.count("label_replace(") for q in seen if "label_replace" in q)
    asked = len(seen)
    samples.metric_activity(since=now - 60, prefixes=COLLECTOR_PREFIXES)
    assert len(seen) == asked  # cached for PROM_ACTIVITY_EVERY_S


def test_ib_rates_are_summed_per_node(prom_samples):
    samples, _ = prom_samples
    rows = samples.counter_rates(("node_infiniband_port_data_transmitted_bytes_total",), since=0.0, group="host")
    by_host = {h: v for _, h, v in rows}
    assert set(by_host) == {"node1", "node2"} and all(v > 1e9 for v in by_host.values())  # twin: > 1 GB/s a node


def test_prefixes_seen_from_the_label_index(prom_samples):
    samples, seen = prom_samples
    assert samples.prefixes_seen(COLLECTOR_PREFIXES) == {"DCGM", "node"}
    assert seen[-1] == "label_values " + promql.prefix_selector(COLLECTOR_PREFIXES)
    assert samples.prefixes_seen(()) == set()


def test_snapshot_under_prometheus_says_so_and_marks_unseen_collectors(prom_samples):
    samples, _ = prom_samples
    now = samples.latest_t()
    doc = live_snapshot(
        samples.store,
        weights_path="/lustre/checkpoints",
        now=now,
        samples=samples,
        seen=data_seen(samples.store, samples),
    )
    states = {k: v["state"] for k, v in doc["collectors"].items()}
    assert states["dcgm_exporter"] == "answering" and states["node_host"] == "answering"
    assert states["ib_tools"] == "not_configured" and states["lustre_metrics"] == "not_configured"
    assert doc["source"] == {"samples": "prometheus", "prometheus": "http://prom.test:9090", "store": ":memory:"}
    assert doc["nodes"]["node1"]["ib_tx_bytes_s"] > 1e9


def test_source_never_shows_credentials():
    store = Store(":memory:")
    prom = PrometheusBackend("http://ann:secret@prom.test:9090")
    assert "secret" not in str(PromSamples(prom, store).describe())
    store.close()


def test_a_prometheus_that_refuses_is_a_backend_error():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    prom = PrometheusBackend("http://prom.test:9090", client=httpx.Client(transport=httpx.MockTransport(refuse)))
    with pytest.raises(BackendError, match="ConnectError"):
        prom.label_values("__name__")
    with pytest.raises(BackendError, match="ConnectError"):
        promql.server_time(prom)
