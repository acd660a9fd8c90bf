"""slurmrestd answers of a real Slurm 22.05.8 (Debian 12), captured by this project: jobs, nodes, partitions, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcwatch import vocab
from hpcwatch.errors import ParseError
from hpcwatch.sources.slurmrest import (
    SlurmApiError,
    parse_rest_accounting,
    parse_rest_jobs,
    parse_rest_nodes,
    parse_rest_partitions,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


def text(name: str) -> str:
    return (DATA / name).read_text()


def test_rest_jobs_of_alice_and_bob_with_their_gpus():
    jobs = {j.id: j for j in parse_rest_jobs(text("slurmrestd_v0038_jobs.json"))}
    assert {j.user for j in jobs.values()} == {"alice", "bob"}
    bob = next(j for j in jobs.values() if j.user == "bob")
    assert bob.nodes == ("node1", "node2") and bob.gpus == 2 and bob.state == "RUNNING"


def test_rest_nodes_become_samples_per_node():
    samples = list(parse_rest_nodes(text("slurmrestd_v0038_nodes.json"), t=100.0))
    by = {(s.metric, s.labels["node"]): s.value for s in samples}
    assert by[(vocab.SLURM_NODE_UP, "node1")] == 1.0
    assert by[(vocab.SLURM_NODE_GPUS, "node1")] == 8.0
    assert by[(vocab.SLURM_NODE_CPUS, "node2")] == 8.0
    assert sum(by[(vocab.SLURM_NODE_ALLOC_GPUS, n)] for n in ("node1", "node2")) == 4.0  # 2 (alice) + 2x1 (bob)
    assert {s.labels["state"] for s in samples} == {"mixed"}


def test_rest_partitions_count_nodes_and_cpus():
    samples = {s.metric: s for s in parse_rest_partitions(text("slurmrestd_v0038_partitions.json"), t=1.0)}
    assert samples[vocab.SLURM_PARTITION_NODES].value == 2.0
    assert samples[vocab.SLURM_PARTITION_CPUS].value == 16.0
    assert samples[vocab.SLURM_PARTITION_NODES].labels == {"partition": "gpu", "state": "up"}


def test_rest_accounting_nothing_found_is_no_job_not_an_error():
    assert list(parse_rest_accounting(text("slurmrestd_dbv0038_jobs_nothing_found.json"))) == []


def test_rest_error_answer_is_slurms_own_words():
    with pytest.raises(SlurmApiError, match=r"Unable to parse time format .*source.*|start_time"):
        list(parse_rest_accounting(text("slurmrestd_dbv0038_bad_start_time.json")))


def test_a_drained_node_is_not_up():
    answer = '{"errors": [], "nodes": [{"name": "n1", "state": ["IDLE", "DRAIN"], "cpus": 8, "alloc_cpus": 0}]}'
    up = next(s for s in parse_rest_nodes(answer, t=0.0) if s.metric == vocab.SLURM_NODE_UP)
    assert up.value == 0.0 and up.labels["state"] == "idle"


BAD = [
    ("{", "not JSON"),  # cut answer
    ("[]", "not a slurmrestd answer"),  # not an object
    ('{"errors": []}', 'no "nodes" list'),  # no list
    ('{"errors": [], "nodes": [{"state": "idle"}]}', "without a name"),  # a node without name
    ('{"errors": [], "nodes": [{"name": "n", "cpus": "8"}]}', "cpus is not a number"),  # a string count
]


@pytest.mark.parametrize("answer, message", BAD)
def test_bad_node_answers_are_one_line_errors(answer, message):
    with pytest.raises(ParseError, match=message):
        list(parse_rest_nodes(answer, t=0.0, path="slurmrestd /nodes"))
