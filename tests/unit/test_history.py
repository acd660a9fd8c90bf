"""The last minutes of a GPU or node (reports/history.py) and GET /api/history, on a real dcgm-exporter scrape."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from hpcwatch.errors import InputError
from hpcwatch.model import reference_cluster
from hpcwatch.reports.history import HISTORY_METRICS, element_history
from hpcwatch.sources.prometheus_text import parse_prometheus_text
from hpcwatch.store import Store
from hpcwatch.web.app import create_app

# A real scrape (tests/data/SOURCES.md): node1, GPU 0 at 97 % and GPU 6 at 41 %. Taken again every 10 s.
SCRAPE = (Path(__file__).parents[1] / "data" / "prometheus" / "dcgm_exporter_node1.prom").read_text()
SCRAPE_EVERY_S = 10.0
T_END = 1_700_000_300.0


@pytest.fixture(scope="module")
def store():
    s = Store(":memory:")
    for k in range(30):  # 30 scrapes: T_END - 290 ... T_END
        s.add(list(parse_prometheus_text(SCRAPE, path="dcgm_exporter_node1.prom", t=T_END - 290 + k * SCRAPE_EVERY_S)))
    return s


def _util(history):
    return next(s for s in history.series if s.field == "util_pct").values


def test_gpu_history_buckets_the_scrapes_and_leaves_gaps_as_none(store):
    h = element_history(store, host="node1", gpu="0", t1=T_END, range_s=300, points=60)
    values = _util(h)
    assert len(values) == 60 and h.step_s == 5.0 and h.t0 == T_END - 300
    assert [v for v in values if v is not None] == [97.0] * 30  # one scrape per 10 s: every other bucket
    assert values.count(None) == 30
    assert {s.field for s in h.series} == {"util_pct", "power_w", "temp_c"}


def test_node_history_is_the_mean_over_its_gpus(store):
    values = [v for v in _util(element_history(store, host="node1", gpu=None, t1=T_END, range_s=300)) if v]
    assert values and all(v == pytest.approx((97 + 41) / 2) for v in values)


def test_a_shorter_range_only_sees_its_own_samples(store):
    values = _util(element_history(store, host="node1", gpu="6", t1=T_END, range_s=60, points=6))
    assert values == (41.0,) * 6


def test_history_takes_any_samples_source_not_only_a_store(store):
    """What serve --prometheus passes: an object whose samples() returns the store's table."""
    calls = []

    class Source:
        def samples(self, metric=None, *, host=None, job=None, t0=None, t1=None):
            calls.append((tuple(metric), host, t0, t1))
            return store.samples(metric, host=host, t0=t0, t1=t1)

    h = element_history(Source(), host="node1", gpu="0", t1=T_END, range_s=300)
    assert calls == [(HISTORY_METRICS, "node1", T_END - 300, T_END)]
    assert 97.0 in _util(h)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"range_s": 0}, "range_s"),  # an empty window
        ({"range_s": -60}, "range_s"),  # a window that ends before it starts
        ({"range_s": math.nan}, "range_s"),  # NaN from a bad query string
        ({"range_s": 300, "points": 0}, "points"),  # no bucket to put anything in
    ],
)
def test_history_rejects_bad_ranges(store, kw, message):
    with pytest.raises(InputError, match=message):
        element_history(store, host="node1", gpu="0", t1=T_END, **kw)


@pytest.fixture(scope="module")
def client(store):
    with TestClient(create_app(store, reference_cluster())) as c:
        yield c


def test_api_history_of_a_gpu(client):
    doc = client.get("/api/history", params={"el": "gpu:node1/0", "range_s": 300}).json()
    assert doc["el"] == "gpu:node1/0" and doc["t1"] == T_END
    util = next(s for s in doc["series"] if s["field"] == "util_pct")["values"]
    assert 97.0 in util and None in util


@pytest.mark.parametrize(
    "params, status",
    [
        ({"el": "weights"}, 400),  # not a GPU or a node
        ({"el": "gpu:node1"}, 400),  # a GPU without its index
        ({"el": "gpu:node9/0"}, 404),  # a node the model does not have
        ({"el": "node:node1", "range_s": 0}, 422),  # range must be > 0
        ({"el": "node:node1", "range_s": 10**6}, 422),  # more than a day
    ],
)
def test_api_history_rejects_bad_requests(client, params, status):
    assert client.get("/api/history", params=params).status_code == status
