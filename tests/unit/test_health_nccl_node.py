"""``hpcwatch health --node X`` keeps the NCCL rules that compare hosts (judged before the node filter).

Inputs: two real NCCL logs of two clusters (nccl-tests on 2 DGX H100 over RoCE with NCCL 2.19.3; a GCP
pair on sockets with NCCL 2.7.8, tests/data/SOURCES.md) stored as one job (a Slurm job of the store runs
on all four hosts, so the logs are judged together): the socket hosts have no HCA while the others list
theirs, and the versions differ — rules only a look across hosts can fire.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcwatch.records import Job
from hpcwatch.reports.health import node_health
from hpcwatch.sources.nccl_log import parse_nccl_log
from hpcwatch.store import Store

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"


@pytest.fixture(scope="module")
def store() -> Store:
    events = []
    for name in ("nccl_tests_185_roce_2node_v2.19.3.log", "nccl_447_gcp_socket_2node_v2.7.8.log"):
        events += parse_nccl_log((DATA / name).read_text().splitlines(), path=name, t=100.0)
    hosts = ("dgxh100-3", "dgxh100-4", "slurm-train-compute-0-0", "slurm-train-compute-0-1")
    s = Store(":memory:")
    s.add([*events, Job(id="4242", nodes=hosts, gpus=10, start=50.0, end=200.0)])
    return s


def _fired(report, node: str) -> list[tuple[str, str]]:
    (health,) = [n for n in report.nodes if n.node == node]
    return sorted((c.rule, c.verdict) for c in health.checks if c.verdict != "ok")


@pytest.mark.parametrize("node", ["dgxh100-4", "slurm-train-compute-0-0", "slurm-train-compute-0-1"])
def test_one_node_gets_the_cross_host_nccl_verdicts_of_the_whole_report(store, node):
    whole = node_health(store)
    alone = node_health(store, node=node)
    assert [n.node for n in alone.nodes] == [node]
    assert _fired(alone, node) == _fired(whole, node) != []
    assert alone.nodes[0].verdict == next(n.verdict for n in whole.nodes if n.node == node)


def test_the_host_without_hcas_is_drained_when_judged_alone(store):
    alone = node_health(store, node="slurm-train-compute-0-1")
    assert ("nccl_ib_missing", "drain") in _fired(alone, "slurm-train-compute-0-1")
    assert alone.nodes[0].verdict == "drain"


def test_another_nodes_nccl_checks_do_not_leak_into_this_one(store):
    alone = node_health(store, node="dgxh100-4")
    assert {c.node for n in alone.nodes for c in n.checks} == {"dgxh100-4"}
    assert ("nccl_ib_missing", "drain") not in _fired(alone, "dgxh100-4")
