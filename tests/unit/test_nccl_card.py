"""The ML-stack card's NCCL view: per job, from reports/nccl.nccl_card over the store, through /api/live."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from hpcwatch.model.cluster import reference_cluster
from hpcwatch.records import Event, Job
from hpcwatch.reports.nccl import nccl_card
from hpcwatch.sources.nccl_log import parse_nccl_log
from hpcwatch.store import Store
from hpcwatch.twin.live import LiveTwin
from hpcwatch.web.app import create_app

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"


def test_live_api_shows_the_socket_fallback_job_with_its_transports_and_verdict(tmp_path):
    with Store(tmp_path / "store") as store:
        live = LiveTwin(store, reference_cluster(), seed=0, scenarios=("nccl_socket_fallback",), start=1.7e9)
        for _ in range(2):
            live.step()
        job = live.twin.training_job.id
        with TestClient(create_app(store, reference_cluster())) as c:
            doc = c.get("/api/live").json()
    (entry,) = [n for n in doc["nccl"] if n["job"] == job]
    assert entry["versions"] == {"2.21.5": ["node1"]}  # rank 0 prints the version
    assert set(entry["transports"]) >= {"NET/Socket", "NET/IB"}  # node2's ranks over TCP, node1's over IB
    assert entry["coll_channels"] == [16]
    assert {(r["rule"], r["verdict"], tuple(r["hosts"])) for r in entry["rules"]} == {
        ("nccl_socket_fallback", "warn", ("node2",)),  # node2 sends over TCP while node1 has IB
        ("nccl_ib_missing", "drain", ("node2",)),
    }  # and lists no HCA: a host fault (analysis/nccl.py)


def test_a_real_log_is_given_to_the_job_that_ran_on_its_host():
    """nccl-tests #367 (docker, sockets, NCCL_TREE_THRESHOLD set): the job on its host gets it, forced variable named."""
    events = list(
        parse_nccl_log(
            (DATA / "nccl_367_docker_socket_tree_threshold.log").read_text().splitlines(), path="nccl_367", t=1000.0
        )
    )
    hosts = sorted({e.attrs["host"] for e in events})
    store = Store(":memory:")
    store.add(
        [
            Job(id="77", user="u", nodes=tuple(hosts), gpus=1, start=900.0, end=None, state="RUNNING"),
            Job(id="76", user="u", nodes=tuple(hosts), gpus=1, start=100.0, end=800.0, state="COMPLETED"),
            *events,
        ]
    )
    (entry,) = nccl_card(store)
    assert entry["job"] == "77"  # the job that ran then, not the one before
    assert "NCCL_TREE_THRESHOLD" in entry["forcing"] and "NCCL_TREE_THRESHOLD" in entry["env"]
    assert "nccl_forced_tuning" in {r["rule"] for r in entry["rules"]}


def test_events_no_job_explains_are_shown_together():
    store = Store(":memory:")
    store.add(parse_nccl_log((DATA / "nccl_447_gcp_socket_2node_v2.7.8.log").read_text().splitlines(), t=5.0))
    (entry,) = nccl_card(store)
    assert entry["job"] is None and entry["networks"] == {"Socket": 2}
    assert entry["versions"] == {"2.7.8": ["slurm-train-compute-0-0"]}


def test_the_live_page_reads_the_card_again_when_nccl_events_or_the_jobs_on_their_hosts_change(tmp_path, monkeypatch):
    """The live view keeps the card while the NCCL events hold the same rows (it reads every NCCL event) and the
    jobs on the hosts they name are the same: a job elsewhere cannot be told their job."""
    from hpcwatch.web import live as web_live
    from hpcwatch.web.live import LiveView

    calls = []
    monkeypatch.setattr(web_live, "nccl_card", lambda store, **kw: calls.append(1) or nccl_card(store, **kw))
    due = [False]  # whether PROBLEMS_INTERVAL_S went by since the slow parts were last looked at
    monkeypatch.setattr(web_live, "_due", lambda last: last is None or due[0])

    def later(view: LiveView) -> dict:
        """A snapshot PROBLEMS_INTERVAL_S after the last."""
        due[0] = True
        try:
            return view.snapshot()
        finally:
            due[0] = False

    events = list(
        parse_nccl_log(
            (DATA / "nccl_367_docker_socket_tree_threshold.log").read_text().splitlines(), path="nccl_367", t=1000.0
        )
    )
    hosts = tuple(sorted({e.attrs["host"] for e in events}))
    with Store(tmp_path / "store") as store:
        store.add([Job(id="77", user="u", nodes=hosts, gpus=1, start=900.0, end=None, state="RUNNING")])
        view = LiveView(store, reference_cluster(), min_interval_s=0.0)
        assert view.snapshot()["nccl"] == [] and view.snapshot()["nccl"] == []
        assert later(view)["nccl"] == [] and len(calls) == 1  # nothing new: kept
        store.add(events)
        assert view.snapshot()["nccl"] == []  # not looked at again before PROBLEMS_INTERVAL_S
        assert [entry["job"] for entry in later(view)["nccl"]] == ["77"]
        assert len(calls) == 2
        store.add([Event(kind="tetragon", t=1001.0, source="node1", attrs={})])  # not an NCCL event: kept
        store.add([Job(id="90", user="u", nodes=("elsewhere",), gpus=1, start=950.0, state="RUNNING")])  # kept
        later(view)
        assert len(calls) == 2
        # A job on their hosts that starts or ends moves which job the events are told under: read again.
        store.add([Job(id="78", user="u", nodes=hosts, gpus=1, start=950.0, end=None, state="RUNNING")])
        assert [entry["job"] for entry in later(view)["nccl"]] == ["78"] and len(calls) == 3
        assert later(view)["nccl"] == nccl_card(store) and len(calls) == 3
