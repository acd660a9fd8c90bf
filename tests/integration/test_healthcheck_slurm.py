"""deploy/slurm/healthcheck against a real slurmctld: a GPU that fell off the bus drains its node.

The store holds what dcgm-exporter printed on node1 and node2 (the twin's xid79 run: node2's GPU 3
reports XID 79, then leaves the scrape), read with ``hpcwatch ingest`` as a real scrape would be.
The health check runs as slurmd would run it, once per node, with the real ``scontrol`` on PATH:
node2 must come out drained with an ``hpcwatch:`` reason, node1 untouched. node2 is resumed at
the end whatever happens, so the other integration tests find both nodes idle.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from .conftest import wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
HEALTHCHECK = REPO / "deploy" / "slurm" / "healthcheck"
HPCWATCH = Path(sys.executable).with_name("hpcwatch")


@pytest.fixture(scope="module")
def xid79_store(tmp_path_factory) -> Path:
    """Three minutes of the twin's dcgm-exporter / node-exporter text with node2's GPU 3 lost, ingested."""
    from hpcwatch.cli import app

    d = tmp_path_factory.mktemp("healthcheck")
    runner = CliRunner()
    ran = runner.invoke(
        app, ["twin", "run", "--out", str(d / "run"), "--scenario", "xid79", "--duration", "180", "--seed", "1"]
    )
    assert ran.exit_code == 0, ran.output
    assert (d / "run" / "dcgm" / "node2.prom").read_text().count(" 79 ") >= 1
    ingested = runner.invoke(app, ["ingest", str(d / "run"), "--db", str(d / "h.duckdb")])
    assert ingested.exit_code == 0, ingested.output
    return d / "h.duckdb"


def node_info(slurm, node: str) -> dict[str, str]:
    """``scontrol show node -o``: one line of Key=Value; Reason runs to the end of the line."""
    line = slurm.run("scontrol", "-o", "show", "node", node).stdout.strip()
    head, _, reason = line.partition(" Reason=")
    info = dict(field.split("=", 1) for field in head.split() if "=" in field)
    info["Reason"] = reason
    return info


def sinfo_node(slurm, node: str) -> dict:
    """The node as ``sinfo --json`` (Slurm 22.05's data_parser) shows it."""
    doc = json.loads(slurm.run("sinfo", "--json").stdout)
    return next(n for n in doc["nodes"] if n.get("name", n.get("hostname")) == node)


def run_healthcheck(slurm, node: str, db: Path) -> subprocess.CompletedProcess:
    """As slurmd runs HealthCheckProgram: root, the node's name, the real scontrol on PATH."""
    env = {**slurm.env, "HPCWATCH": str(HPCWATCH), "HPCWATCH_DB": str(db), "HPCWATCH_NODE": node}
    env.pop("SCONTROL", None)
    return subprocess.run(["bash", str(HEALTHCHECK)], env=env, capture_output=True, text=True, timeout=60)


def drained(info: dict[str, str]) -> bool:
    return "DRAIN" in info.get("State", "")


def test_healthcheck_drains_the_sick_node_in_slurmctld_and_leaves_the_healthy_one(slurm, xid79_store):
    wait_until(
        lambda: not drained(node_info(slurm, "node1")) and not drained(node_info(slurm, "node2")),
        timeout_s=15,
        what="node1 and node2 to start undrained",
    )
    try:
        sick = run_healthcheck(slurm, "node2", xid79_store)
        assert sick.returncode == 0, sick.stderr
        assert "drained node2" in sick.stderr
        wait_until(lambda: drained(node_info(slurm, "node2")), timeout_s=10, what="slurmctld to show node2 drained")
        info = node_info(slurm, "node2")
        assert info["Reason"].startswith("hpcwatch: drain: node2: "), info["Reason"]
        assert "XID 79 on GPU 3" in info["Reason"]
        via_sinfo = sinfo_node(slurm, "node2")
        states = via_sinfo.get("state_flags", []) + [str(via_sinfo.get("state", ""))]
        assert any("DRAIN" in str(s).upper() for s in states), via_sinfo
        assert str(via_sinfo.get("reason", "")).startswith("hpcwatch:")

        healthy = run_healthcheck(slurm, "node1", xid79_store)
        assert healthy.returncode == 0 and "drained" not in healthy.stderr, healthy.stderr
        node1 = node_info(slurm, "node1")
        assert not drained(node1) and not node1["Reason"].startswith("hpcwatch"), node1
    finally:
        slurm.run("scontrol", "update", "nodename=node2", "state=resume", check=False)
    wait_until(lambda: not drained(node_info(slurm, "node2")), timeout_s=10, what="node2 to resume")
