"""The live view's shared frame: one snapshot, encoded once, for every SSE viewer."""

from __future__ import annotations

import threading
from pathlib import Path

import orjson

from hpcwatch.model import reference_cluster
from hpcwatch.sources.prometheus_text import parse_prometheus_text
from hpcwatch.store import Store
from hpcwatch.web.live import LiveView

SCRAPE = (Path(__file__).parents[1] / "data" / "prometheus" / "dcgm_exporter_node1.prom").read_text()


def _live(min_interval_s: float) -> LiveView:
    store = Store(":memory:")
    store.add(list(parse_prometheus_text(SCRAPE, path="dcgm_exporter_node1.prom", t=1_700_000_000.0)))
    return LiveView(store, reference_cluster(), min_interval_s=min_interval_s)


def test_every_viewer_gets_the_same_encoded_frame_within_the_interval():
    live = _live(60.0)
    first = live.frame()
    assert live.frame() is first and live.fresh_frame() is first  # encoded once, not once per viewer
    event, data = first.split(b"\n", 1)
    assert event == b"event: live" and first.endswith(b"\n\n")
    doc = orjson.loads(data.removeprefix(b"data: "))
    assert doc["gpus"]["node1/0"]["util_pct"] == 97.0 and doc == orjson.loads(
        orjson.dumps(live.snapshot(), default=str)
    )


def test_no_fresh_frame_before_the_first_snapshot():
    assert _live(60.0).fresh_frame() is None


def test_concurrent_viewers_all_get_a_frame():
    live = _live(0.0)  # every call due: callers meet one being computed and take the last one
    frames: list[bytes] = []
    threads = [threading.Thread(target=lambda: frames.append(live.frame())) for _ in range(16)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert len(frames) == 16 and all(f.startswith(b"event: live\ndata: ") for f in frames)
