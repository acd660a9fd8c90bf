"""The live snapshot's ``problems``, ``job_gpus`` and staleness fields, on live-twin stores.

What the page's alert strip, GPU marks and job highlight draw is decided here (reports/live.py);
the twin's scenarios supply a straggler, an XID 79 and a clean run.
"""

from __future__ import annotations

from hpcwatch.model import reference_cluster
from hpcwatch.reports.live import STALE_AFTER_S, latest_t, live_snapshot
from hpcwatch.store import Store
from hpcwatch.twin.live import LiveTwin


def _snapshot(tmp_path, scenarios, steps=25):
    with Store(tmp_path / "store") as store:
        live = LiveTwin(store, reference_cluster(), seed=0, scenarios=tuple(scenarios), start=1.7e9)
        for _ in range(steps):
            live.step()
        return live_snapshot(store, weights_path="/weights", now=latest_t(store)), live


def test_a_clean_run_has_no_problems_and_each_job_lists_its_gpus(tmp_path):
    snap, live = _snapshot(tmp_path, ())
    assert snap["problems"] == []
    job = live.twin.training_job.id
    assert snap["job_gpus"][job] and all(snap["gpus"][g]["job"].split(",").count(job) for g in snap["job_gpus"][job])


def test_the_straggler_is_named_on_its_gpu(tmp_path):
    snap, live = _snapshot(tmp_path, ("straggler",))
    found = [p for p in snap["problems"] if p["kind"] == "straggler"]
    assert len(found) == 1
    assert found[0]["el"] == "gpu:node1/2" and found[0]["job"] == live.twin.training_job.id
    assert found[0]["evidence"]["excess_ms"] > 0


def test_an_xid_79_is_a_drain_on_its_gpu_with_its_code(tmp_path):
    snap, _ = _snapshot(tmp_path, ("xid79",), steps=60)
    xids = [p for p in snap["problems"] if p["rule"] == "xid"]
    assert xids and xids[0]["severity"] == "drain" and xids[0]["el"].startswith("gpu:")
    assert xids[0]["evidence"]["xid"] == 79
    assert snap["problems"][0]["severity"] == "drain"  # worst first


def test_a_replayed_store_is_stale_by_its_age(tmp_path):
    snap, _ = _snapshot(tmp_path, (), steps=2)
    assert snap["stale_after_s"] == STALE_AFTER_S
    assert snap["age_s"] > STALE_AFTER_S  # samples of 1.7e9 (2023), read now


def test_an_empty_store_has_no_problems_and_no_age(tmp_path):
    with Store(tmp_path / "store") as store:
        snap = live_snapshot(store, weights_path="/weights", now=None)
    assert snap["problems"] == [] and snap["age_s"] is None and snap["job_gpus"] == {}


def test_the_live_view_keeps_problems_between_its_slower_refreshes(tmp_path):
    from hpcwatch.web.live import LiveView

    with Store(tmp_path / "store") as store:
        cluster = reference_cluster()
        live = LiveTwin(store, cluster, seed=0, scenarios=("straggler",), start=1.7e9)
        for _ in range(25):
            live.step()
        view = LiveView(store, cluster, min_interval_s=0.0)
        first = view.snapshot()["problems"]
        assert [p["el"] for p in first if p["kind"] == "straggler"] == ["gpu:node1/2"]
        assert view.snapshot()["problems"] is first  # within PROBLEMS_INTERVAL_S: not judged again
