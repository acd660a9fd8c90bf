"""A Socket transport is seen without ``--expect-ib``, and logs of unrelated jobs are never compared.

Inputs (tests/data/SOURCES.md): NVIDIA/nccl#634, 4 nodes whose inter-node connections run over
``NET/Socket`` and whose excerpt has no ``Using network`` and no ``Init`` line (ranks only in
``a[busId] -> b[busId] [send|receive]``); NVIDIA/nccl#983 (NCCL 2.13.4, 4 IB HCAs) and #447 (NCCL
2.7.8, a GCP pair on sockets), two clusters that never met, ingested into one store.
"""

from __future__ import annotations

from pathlib import Path

from hpcwatch.analysis.nccl import NcclConfig, nccl_rules, summarize_nccl
from hpcwatch.records import Job, Sample
from hpcwatch.reports.health import node_health
from hpcwatch.sources.nccl_log import parse_nccl_log
from hpcwatch.store import Store
from hpcwatch.vocab import IB_PORT_UP, EventKind

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"
SOCKET_4NODE = "nccl_634_socket_4node_busid_channels.log"


def _events(name: str, t: float = 100.0) -> list:
    return list(parse_nccl_log((DATA / name).read_text().splitlines(), path=name, t=t))


def _ranks(name: str) -> list[dict]:
    return [dict(e.attrs) for e in _events(name) if e.kind == EventKind.NCCL_RANK]


def _nccl_checks(store: Store) -> dict[str, set[tuple[str, str]]]:
    return {
        n.node: {(c.rule, c.verdict) for c in n.checks if c.rule.startswith("nccl_")} for n in node_health(store).nodes
    }


def test_ranks_come_from_the_connection_lines_when_no_init_line_names_them():
    by_process = {(r["host"], r["pid"]): r["rank"] for r in _ranks(SOCKET_4NODE)}
    assert by_process[("gcn5", 3350890)] == 10  # receives 7 -> 10, sends 10 -> 14
    assert by_process[("gcn3", 3098418)] == 0  # sends 0 -> 4
    assert by_process[("gcn4", 322652)] == 5  # receives 8 -> 5
    assert summarize_nccl(_ranks(SOCKET_4NODE)).ranks == (0, 2, 4, 5, 6, 7, 8, 10, 11, 12, 14)


def test_the_transports_say_socket_and_the_rule_notes_it_without_a_flag():
    top = summarize_nccl(_ranks(SOCKET_4NODE))
    assert top.networks == {"Socket": 11}
    (rule,) = nccl_rules(top)
    assert (rule.rule, rule.verdict) == ("nccl_socket_fallback", "ok")
    assert rule.hosts == ("gcn3", "gcn4", "gcn5", "gcn6")


def test_the_rule_warns_where_the_store_knows_the_host_has_hcas():
    (rule,) = nccl_rules(summarize_nccl(_ranks(SOCKET_4NODE)), config=NcclConfig(ib_hosts=frozenset({"gcn4"})))
    assert rule.verdict == "warn" and "IB ports of gcn4" in rule.title
    store = Store(":memory:")
    port = {"node": "gcn4", "device": "mlx5_0", "port": "1"}
    store.add([*_events(SOCKET_4NODE), Sample(metric=IB_PORT_UP, labels=port, t=90.0, value=1.0)])
    assert ("nccl_socket_fallback", "warn") in _nccl_checks(store)["gcn4"]


def test_logs_of_two_clusters_in_one_store_are_judged_apart():
    store = Store(":memory:")
    store.add(_events("nccl_983_ib_4hca_v2.13.4.log") + _events("nccl_447_gcp_socket_2node_v2.7.8.log"))
    checks = _nccl_checks(store)
    fired = {check for node in checks.values() for check in node}
    assert not {rule for rule, verdict in fired if verdict != "ok"}, fired  # no mismatch, no HCA missing
    assert checks["slurm-train-compute-0-0"] == {("nccl_socket_fallback", "ok")}


def test_logs_the_store_places_in_one_slurm_job_are_judged_together():
    store = Store(":memory:")
    hosts = ("4c217144f0b1", "e0a95b6643f4", "slurm-train-compute-0-0", "slurm-train-compute-0-1")
    events = _events("nccl_983_ib_4hca_v2.13.4.log") + _events("nccl_447_gcp_socket_2node_v2.7.8.log")
    store.add([*events, Job(id="7", nodes=hosts, gpus=4, start=50.0, end=200.0)])
    fired = _nccl_checks(store)["slurm-train-compute-0-0"]
    assert {("nccl_version_mismatch", "warn"), ("nccl_socket_fallback", "warn")} <= fired


# -- nccl_intranode_net: two GPUs of one host over NET instead of P2P/SHM ---------------------------------
# No public log of an intra-node NET connection was found (NCCL prints one with NCCL_P2P_DISABLE=1 and
# NCCL_SHM_DISABLE=1 on a multi-node job, NVIDIA/nccl#1560): the firing case is NVIDIA/nccl#1027's real
# one-node log with its one SHM line written as NCCL writes a NET send.
P2P_SHM_1NODE = "nccl_1027_1node_8gpu_p2p_shm.log"
SHM_LINE = "3[3] -> 4[4] via SHM/direct/direct"


def _intranode(lines: list[str]) -> list:
    ranks = [dict(e.attrs) for e in parse_nccl_log(lines) if e.kind == EventKind.NCCL_RANK]
    return [r for r in nccl_rules(summarize_nccl(ranks)) if r.rule == "nccl_intranode_net"]


def test_intranode_net_fires_where_two_gpus_of_one_host_connect_over_the_network():
    lines = (DATA / P2P_SHM_1NODE).read_text().splitlines()
    assert any(SHM_LINE in ln for ln in lines) and _intranode(lines) == []
    (rule,) = _intranode([ln.replace(SHM_LINE, "3[3] -> 4[4] [send] via NET/IB/0/GDRDMA") for ln in lines])
    assert rule.verdict == "warn" and rule.hosts == ("UIBE-DC-GPUSVR-01",) and rule.evidence["pairs"] == [[3, 4]]


def test_intranode_net_stays_quiet_on_inter_node_connections_and_on_a_name_shared_by_nodes():
    lines = (DATA / SOCKET_4NODE).read_text().splitlines()
    assert _intranode(lines) == []
    # the same connections with every host anonymised to one name (as NVIDIA/nccl#952 pastes them)
    anonymised = [ln.replace(ln.split(":", 1)[0], "<cluster_name>", 1) for ln in lines]
    assert _intranode(anonymised) == []
