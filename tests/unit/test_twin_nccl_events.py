"""The live twin's ``nccl_rank`` events are what the NCCL log reader makes of the logs the twin writes."""

from __future__ import annotations

import json

import pytest

from hpcwatch.model.cluster import reference_cluster
from hpcwatch.sources.nccl_log import parse_nccl_log
from hpcwatch.twin import Twin
from hpcwatch.twin.nccl import nccl_conf_of, socket_nodes_of, write_nccl_logs
from hpcwatch.vocab import EventKind


def _key(attrs: dict) -> str:
    return json.dumps(attrs, sort_keys=True)


@pytest.mark.parametrize(
    "scenarios",
    [(), ("nccl_socket_fallback",), ("nccl_conf_stale",)],
    ids=["ib", "socket_fallback", "node2_nccl_conf_p2p_off"],
)
def test_twin_nccl_events_are_what_the_reader_makes_of_its_logs(tmp_path, scenarios):
    twin = Twin(reference_cluster(), seed=0, scenarios=scenarios)
    told = []
    for _ in range(3):
        twin.advance(1.0)
        told += [e for e in twin.events() if e.kind == EventKind.NCCL_RANK]
    socket, conf = socket_nodes_of(twin.scenarios), nccl_conf_of(twin.scenarios)
    write_nccl_logs(twin, tmp_path, socket_nodes=socket, conf=conf)
    read = [
        e
        for p in sorted((tmp_path / "nccl").iterdir())
        for e in parse_nccl_log(p.read_text().splitlines(), path=p.name)
    ]
    assert len(told) == len(read) == len(twin.ranks(twin.training_job))  # each rank once over the ticks
    assert sorted(_key(e.attrs) for e in told) == sorted(_key(e.attrs) for e in read)
    assert {e.source for e in told} == {f"nccl/{e.source}" for e in read}


def test_the_live_socket_fallback_fires_the_nccl_rule_on_the_stored_events():
    from hpcwatch.reports.nccl import nccl_report_of

    twin = Twin(reference_cluster(), seed=0, scenarios=("nccl_socket_fallback",))
    twin.advance(1.0)
    report = nccl_report_of(twin.events())
    fired = {r.rule: r for r in report.rules}
    assert "nccl_socket_fallback" in fired and set(fired["nccl_socket_fallback"].hosts) == {"node2"}
    clean = Twin(reference_cluster(), seed=0)
    clean.advance(1.0)
    assert [r.rule for r in nccl_report_of(clean.events()).rules] == []  # every rank on NET/IB: nothing fires


def test_live_twin_store_shows_the_ml_stack_collector_and_the_health_rule(tmp_path):
    from hpcwatch.reports.health import node_health
    from hpcwatch.reports.live import latest_t, live_snapshot
    from hpcwatch.store import Store
    from hpcwatch.twin.live import LiveTwin

    with Store(tmp_path / "store") as store:
        live = LiveTwin(store, reference_cluster(), seed=0, scenarios=("nccl_socket_fallback",), start=1.7e9)
        for _ in range(3):
            live.step()
        ranks = store.events(EventKind.NCCL_RANK)
        n = len(live.twin.ranks(live.twin.training_job))
        assert len(ranks) == len({(e.attrs["host"], e.attrs["pid"]) for e in ranks}) == n > 1
        # the training spans left out: the ML-stack collector's tick comes from the NCCL events alone
        snap = live_snapshot(
            store, weights_path="/weights", now=latest_t(store), exclude_jobs=[j.id for j in store.jobs()]
        )
        assert snap["collectors"]["torch_nccl"]["arriving"] and snap["collectors"]["torch_nccl"]["count"] == n
        verdicts = {n.node: {c.rule: c.verdict for c in n.checks} for n in node_health(store).nodes}
        assert verdicts["node2"].get("nccl_socket_fallback") == "warn"
        assert verdicts["node1"].get("nccl_socket_fallback") in (None, "ok")
