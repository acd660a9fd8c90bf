"""The live stream's deltas: what changed since the viewer's version, and when a viewer needs a full frame."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from hpcwatch.model import reference_cluster
from hpcwatch.sources.prometheus_text import parse_prometheus_text
from hpcwatch.store import Store
from hpcwatch.web.live import LiveView, StreamFrames
from hpcwatch.web.livedelta import delta, stream_doc

SCRAPE = (Path(__file__).parents[1] / "data" / "prometheus" / "dcgm_exporter_node1.prom").read_text()


def _merge(snap: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """What static/app.js mergeDelta does, in Python."""
    merged = {**snap, **change["set"]}
    for key in ("gpus", "nodes"):
        entries = dict(snap.get(key) or {})
        for name, fields in (change.get(key) or {}).items():
            if fields is None:
                entries.pop(name, None)
                continue
            entry = dict(entries.get(name) or {})
            for field, value in fields.items():
                if value is None:
                    entry.pop(field, None)
                else:
                    entry[field] = value
            entries[name] = entry
        merged[key] = entries
    for key in ("job_gpus",):
        if key in change:
            entries = dict(snap.get(key) or {})
            for name, value in change[key].items():
                if value is None:
                    entries.pop(name, None)
                else:
                    entries[name] = value
            merged[key] = entries
    return {k: v for k, v in merged.items() if v is not None}


values = st.one_of(st.integers(0, 3), st.text("ab", max_size=2))
entries = st.dictionaries(st.sampled_from(["util_pct", "job", "temp_c"]), values)
docs = st.fixed_dictionaries(
    {
        "gpus": st.dictionaries(st.sampled_from(["n1/0", "n1/1", "n2/0"]), entries),
        "nodes": st.dictionaries(st.sampled_from(["n1", "n2"]), entries),
        "queue": values,
        "job_gpus": st.dictionaries(st.sampled_from(["4101", "4102"]), st.lists(st.sampled_from(["n1/0", "n2/0"]))),
    },
    optional={"training": values},
)


@given(docs, docs)
def test_a_delta_applied_to_the_old_document_gives_the_new(old, new):
    assert _merge(old, delta(old, new)) == new


gpu_entries = st.dictionaries(
    st.sampled_from(["util_pct", "job", "power_w", "mem_used_bytes", "t"]),
    st.one_of(st.integers(0, 3), st.sampled_from([650.01, 650.04, 2.0**33, float("nan")]), st.text("ab", max_size=2)),
)
reports = st.fixed_dictionaries({"gpus": st.dictionaries(st.sampled_from(["n1/0", "n1/1", "n2/0"]), gpu_entries)})


@given(reports, reports)
def test_the_gpus_kept_from_the_tick_before_are_the_gpus_made_anew(old, new):
    streamed_old = stream_doc(old)
    kept = stream_doc(new, (old, streamed_old))
    anew = stream_doc(new)
    assert orjson.dumps(kept) == orjson.dumps(anew)
    page = orjson.dumps(_merge(streamed_old, delta(streamed_old, kept)))
    assert page == orjson.dumps(_merge(streamed_old, delta(streamed_old, anew)))  # the page shows the same
    for gid, entry in new["gpus"].items():
        if old["gpus"].get(gid) == entry:
            assert kept["gpus"][gid] is streamed_old["gpus"][gid]  # the very object: ``delta`` skips it


def test_a_delta_carries_only_what_moved_on_the_page():
    old = stream_doc({"t": 1.0, "gpus": {"n1/0": {"t": 1.0, "util_pct": 97.0, "power_w": 650.01, "job": "1"}}})
    new = stream_doc({"t": 2.0, "gpus": {"n1/0": {"t": 2.0, "util_pct": 97.0, "power_w": 650.04, "job": "1"}}})
    assert delta(old, new) == {"set": {"t": 2.0}}  # sample time dropped, power at the page's 0.1 W
    moved = stream_doc({"t": 3.0, "gpus": {"n1/0": {"t": 3.0, "util_pct": 12.0, "power_w": 650.0}}})
    assert delta(new, moved) == {"gpus": {"n1/0": {"util_pct": 12.0, "job": None}}, "set": {"t": 3.0}}


def test_a_viewer_gets_the_delta_only_from_the_version_it_holds():
    frames = StreamFrames(version=5, base=4, full=b"full", delta=b"delta")
    assert frames.for_viewer(None) == b"full"  # just connected
    assert frames.for_viewer(4) == b"delta"
    assert frames.for_viewer(3) == b"full"  # missed version 4
    assert frames.for_viewer(5) is None  # nothing new yet


def _event(frame: bytes) -> tuple[str, int, dict[str, Any]]:
    kind, ident, data = frame.rstrip(b"\n").split(b"\n")
    return kind.removeprefix(b"event: ").decode(), int(ident.removeprefix(b"id: ")), orjson.loads(data[6:])


def test_versions_follow_one_another_and_the_delta_rebuilds_the_full_frame():
    store = Store(":memory:")
    store.add(list(parse_prometheus_text(SCRAPE, path="dcgm_exporter_node1.prom", t=1_700_000_000.0)))
    live = LiveView(store, reference_cluster(), min_interval_s=0.0)
    first = live.stream_frames()
    assert first.base is None and _event(first.full)[:2] == ("live", first.version)
    store.add(list(parse_prometheus_text(SCRAPE.replace(" 97", " 12"), path="later.prom", t=1_700_000_005.0)))
    second = live.stream_frames()
    assert second.version == first.version + 1 and second.base == first.version
    assert second._full is None  # encoded for the first viewer that needs it, not for those taking the delta
    kind, version, change = _event(second.delta or b"")
    assert (kind, version, change["base"]) == ("delta", second.version, first.version)
    assert change["gpus"]["node1/0"]["util_pct"] == 12.0
    whole = _event(second.full)[2]
    merged = _merge(_event(first.full)[2], change) | {"v": change["v"]}
    assert {k: v for k, v in merged.items() if k not in ("base", "query_ms")} == {
        k: v for k, v in whole.items() if v is not None and k != "query_ms"
    }


def test_only_one_stream_caller_is_sent_to_compute_the_next_frames():
    store = Store(":memory:")
    store.add(list(parse_prometheus_text(SCRAPE, path="dcgm_exporter_node1.prom", t=1_700_000_000.0)))
    live = LiveView(store, reference_cluster(), min_interval_s=0.0)
    assert live.fresh_stream_frames(0.0) is None  # nothing yet: compute it
    first = live.stream_frames(0.0)
    assert live.fresh_stream_frames(0.0) is None  # stale: this caller computes...
    assert live.fresh_stream_frames(0.0) is first  # ...the others keep the last frames meanwhile
    assert live.stream_frames(0.0).version == first.version + 1
    assert live.fresh_stream_frames(0.0) is None  # the next tick: one caller again


def test_a_viewer_that_leaves_before_its_thread_ran_hands_the_computation_to_the_next():
    """A viewer sent to compute the next frames that is cancelled (its page closed) while it waits for a thread:
    the next viewer is sent instead. Kept, the turn froze every stream on the last version (a loaded CI run:
    the 128-node page got no delta for 180 s while the server answered everything else)."""
    import anyio

    from hpcwatch.web.api import next_frames

    store = Store(":memory:")
    store.add(list(parse_prometheus_text(SCRAPE, path="dcgm_exporter_node1.prom", t=1_700_000_000.0)))
    live = LiveView(store, reference_cluster(), min_interval_s=0.0)
    first = live.stream_frames(0.0)

    async def leave_while_waiting_for_a_thread():
        limiter = anyio.to_thread.current_default_thread_limiter()
        limiter.total_tokens = 1
        # the only thread token held: the viewer's computation waits for one
        async with limiter, anyio.create_task_group() as viewers:
            viewers.start_soon(next_frames, live, 0.0)
            await anyio.wait_all_tasks_blocked()
            viewers.cancel_scope.cancel()  # the viewer leaves

    anyio.run(leave_while_waiting_for_a_thread)
    assert live.fresh_stream_frames(0.0) is None  # the next viewer computes (not: the last frames for ever)
    assert live.stream_frames(0.0).version == first.version + 1


def test_a_job_that_started_or_ended_is_sent_alone_not_every_jobs_gpus():
    jobs = {str(j): [f"n{j}/0", f"n{j}/1"] for j in range(500)}
    old = {"gpus": {}, "nodes": {}, "job_gpus": jobs}
    new = {"gpus": {}, "nodes": {}, "job_gpus": {**{k: v for k, v in jobs.items() if k != "7"}, "900": ["n7/0"]}}
    change = delta(old, new)
    assert change["job_gpus"] == {"7": None, "900": ["n7/0"]} and "job_gpus" not in change["set"]
    assert _merge(old, change) == new


def test_a_gpu_memory_of_nan_or_inf_does_not_stop_the_stream():
    """Prometheus text allows NaN and +Inf; rounding one to the page's 0.1 GiB raised, every tick."""
    store = Store(":memory:")
    for t, value in ((1_700_000_000.0, "NaN"), (1_700_000_005.0, "+Inf")):
        scrape = SCRAPE.replace('hpc_job="7"} 61234', f'hpc_job="7"}} {value}')
        assert scrape != SCRAPE
        store.add(list(parse_prometheus_text(scrape, path="dcgm_exporter_node1.prom", t=t)))
        frames = LiveView(store, reference_cluster(), min_interval_s=0.0).stream_frames()
        assert _event(frames.full)[2]["gpus"]["node1/0"]["mem_used_bytes"] is None  # JSON has no NaN: null
