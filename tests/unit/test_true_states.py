"""Issue 27 points 1 and 4 in the reports: true states and the recent events of the live snapshot, one XID
count for the job page and the jobs list, goodput that counts barrier wait, the job's cost."""

from __future__ import annotations

import pytest

from hpcwatch.model import reference_cluster
from hpcwatch.reports.goodput import goodput_report
from hpcwatch.reports.jobs import job_cost, job_report, jobs_report
from hpcwatch.reports.live import latest_t, live_snapshot
from hpcwatch.reports.timeline import job_timeline
from hpcwatch.store import Store
from hpcwatch.twin import Twin
from hpcwatch.twin.live import LiveTwin


def _twin_store(path, scenario: str, ticks: int):
    twin = Twin(reference_cluster(), seed=1, scenarios=[scenario])
    store = Store(path)
    for _ in range(ticks):
        twin.advance(10.0)
        store.add(list(twin.records()))
    return store, twin.training_job.id


@pytest.fixture(scope="module")
def xid_store(tmp_path_factory):
    store, job = _twin_store(tmp_path_factory.mktemp("xid") / "store", "xid79", 40)
    yield store, job
    store.close()


def test_the_job_page_and_the_jobs_list_count_the_same_xid_of_a_requeued_job(xid_store):
    store, job = xid_store
    listed = next(r for r in jobs_report(store) if r.id == job)
    assert listed.xid_errors == 1
    assert job_report(store, job).xid_errors == listed.xid_errors


def test_a_job_costs_its_gpu_hours_at_the_configured_price_and_none_without_one(xid_store):
    store, job = xid_store
    report = job_report(store, job)
    cost = job_cost(report, price_per_gpu_hour=2.0, currency="EUR")
    assert cost.cost == pytest.approx(2.0 * report.gpu_hours_allocated) and cost.energy_kwh == report.energy_kwh > 0
    assert job_cost(report, price_per_gpu_hour=None).cost is None


def test_the_job_timeline_tells_failure_xid_and_requeue_in_order(xid_store):
    store, job = xid_store
    whats = [e["what"] for e in job_timeline(store, job)]
    assert {"failure", "xid", "requeue"} <= set(whats)
    assert whats.index("requeue") > whats.index("failure")


def test_goodput_counts_the_straggler_barrier_wait_apart(tmp_path):
    store, job = _twin_store(tmp_path / "store", "straggler", 6)
    with store:
        report = goodput_report(store, job)
    assert report.barrier_wait_s > 0.2 * report.productive_s  # a third of a step waits for the straggler
    assert report.compute_goodput < report.goodput - 0.2
    assert report.to_dict()["compute_goodput"] == report.compute_goodput


def test_a_lost_gpu_has_no_numbers_and_its_node_is_drained(tmp_path):
    with Store(tmp_path / "store") as store:
        live = LiveTwin(store, reference_cluster(), seed=0, scenarios=("xid79",), start=1.7e9)
        for _ in range(90):
            live.step()
        snap = live_snapshot(store, weights_path="/weights", now=latest_t(store))
    lost = snap["gpus"]["node2/3"]
    assert lost["state"] == "lost" and lost["util_pct"] is None and lost["power_w"] is None
    assert snap["node_states"]["node2"]["state"] == "drained"
    assert snap["gpus"]["node2/0"]["state"] == "drained" and snap["gpus"]["node1/0"]["state"] == "ok"
    assert any(j["requeued"] for j in snap["queue"]["jobs"])
    whats = [e["what"] for e in snap["events"]]
    assert {"xid", "failure", "requeue", "drain"} <= set(whats)
    assert [e["t"] for e in snap["events"]] == sorted((e["t"] for e in snap["events"]), reverse=True)
    assert all(e["node"] == "node2" for e in snap["node_events"]["node2"])


def test_an_xid_known_only_from_dcgm_samples_is_in_its_job_story_once(tmp_path):
    from hpcwatch import vocab
    from hpcwatch.records import Job, Sample

    labels = {"Hostname": "node2", "gpu": "3", "hpc_job": "77"}
    # dcgm-exporter's "last XID" gauge: 0, then 79 on three scrapes (one error), then the GPU is gone.
    values = [(100.0, 0.0), (110.0, 79.0), (120.0, 79.0), (130.0, 79.0)]
    with Store(tmp_path / "store") as store:
        store.add([Job(id="77", nodes=("node2",), gpus=8, start=90.0, state="RUNNING")])
        store.add([Sample(metric=vocab.DCGM_FI_DEV_XID_ERRORS, labels=labels, t=t, value=v) for t, v in values])
        story = job_timeline(store, "77")
        assert job_timeline(store, "78") == []
    assert [(e["what"], e["t"], e["node"], e["gpu"], e["detail"]) for e in story] == [
        ("xid", 110.0, "node2", "3", {"xid": 79})
    ]


def test_hpcwatch_job_json_carries_the_cost_at_the_given_price(xid_store):
    import orjson
    from click.testing import CliRunner

    from hpcwatch.cli import app

    store, job = xid_store
    args = ["job", job, "--db", str(store.config.path), "--json"]
    priced = CliRunner().invoke(app, [*args, "--gpu-hour-price", "3", "--currency", "EUR"])
    assert priced.exit_code == 0, priced.output
    cost = orjson.loads(priced.stdout)["cost"]
    assert cost["currency"] == "EUR" and cost["cost"] == pytest.approx(3 * cost["gpu_hours"]) and cost["gpu_hours"] > 0
    unpriced = CliRunner().invoke(app, args)
    assert orjson.loads(unpriced.stdout)["cost"]["cost"] is None


def test_a_run_of_drain_verdicts_is_one_entry_at_its_start_and_never_crowds_the_strip_out(tmp_path):
    """A health run stores a verdict a node (collect every 600 s, the demo every simulated minute): node2 drained
    over 200 runs is two entries, where each of its runs of drain verdicts began; node1's ok ones are none."""
    from hpcwatch.records import Event
    from hpcwatch.reports.timeline import MAX_EVENTS, timeline
    from hpcwatch.vocab import EventKind

    def verdict(t: float, node: str, v: str) -> Event:
        return Event(kind=EventKind.HEALTH_VERDICT, t=t, source="hpcwatch demo", attrs={"node": node, "verdict": v})

    node2 = ["drain"] * 100 + ["ok"] * 5 + ["drain"] * 95
    with Store(tmp_path / "store") as store:
        store.add([Event(kind=EventKind.XID, t=5.0, source="kernel", attrs={"node": "node2", "gpu": 3, "xid": 79})])
        store.add([verdict(10.0 + 60 * i, "node2", v) for i, v in enumerate(node2)])
        store.add([verdict(10.0 + 60 * i, "node1", "ok") for i in range(200)])
        strip = timeline(store, now=20_000.0)
    drains = [e["t"] for e in strip if e["what"] == "drain"]
    assert drains == [10.0 + 60 * 105, 10.0] and len(strip) <= MAX_EVENTS
    assert [e["what"] for e in strip if e["what"] == "xid"] == ["xid"]  # 400 verdicts later, still there
