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


def test_a_snapshot_is_due_a_tick_after_it_began_not_after_it_was_ready(monkeypatch):
    """A stream that ticks every second gets a version each second while a snapshot takes less than one (at
    1,024 nodes one takes most of a second: counted from its end, the stream got one every ~2 s)."""
    from hpcwatch.web import live as web_live

    clock = [1000.0]
    monkeypatch.setattr(web_live.time, "monotonic", lambda: clock[0])
    live = _live(1.0)
    compute = live._compute

    def slow_compute():
        clock[0] += 0.6  # the snapshot's own time
        return compute()

    monkeypatch.setattr(live, "_compute", slow_compute)
    first = live.stream_frames()
    clock[0] += 0.3  # 0.9 s after it began
    assert live.fresh_stream_frames() is first
    clock[0] += 0.1  # a tick after it began, 0.4 s after it was ready
    assert live.fresh_stream_frames() is None  # this caller is sent to compute the next
    assert live.stream_frames().version == first.version + 1
