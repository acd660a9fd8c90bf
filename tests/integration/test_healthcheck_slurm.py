"""deploy/slurm/healthcheck against a real slurmctld: a GPU that fell off the bus drains its node.

The store holds what dcgm-exporter printed on node1 and node2 (the twin's xid79 run: node2's GPU 3
reports XID 79, then leaves the scrape), read with ``hpcwatch ingest`` as a real scrape would be.
The health check runs as slurmd would run it, once per node, with the real ``scontrol`` on PATH:
node2 must come out drained with an ``hpcwatch:`` reason, node1 untouched. node2 is resumed at
the end whatever happens, so the other integration tests find both nodes idle.

With ``hpcwatch act``'s remediation on the same real slurmctld, the check and the policy must not
fight: the health check leaves node2 to the checks while they run in its maintenance reservation,
and once they passed it does not drain node2 back for the XID they answered.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
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


def test_the_health_check_and_the_remediation_do_not_fight_over_a_node(slurm, xid79_store, tmp_path):
    from hpcwatch.act.audit import recorded
    from hpcwatch.reports.health import verdict_events
    from hpcwatch.store import Store

    from .test_act_slurm import _actor, _until_concluded, _until_started

    db = tmp_path / "h.duckdb"
    (shutil.copytree if xid79_store.is_dir() else shutil.copy2)(xid79_store, db)
    store = Store(db)
    _, newest = store.time_range()
    assert newest is not None
    began = time.monotonic()
    try:
        drained_by_check = run_healthcheck(slurm, "node2", db)
        assert "drained node2" in drained_by_check.stderr, drained_by_check.stderr
        wait_until(lambda: drained(node_info(slurm, "node2")), timeout_s=10, what="slurmctld to show node2 drained")
        # collect's health task: node2's drain verdict, on the store's clock, as the actor's
        store.add(verdict_events(store, t=newest, source="hpcwatch collect", window_s=900.0))
        actor, _ = _actor(slurm, tmp_path, store, "pass")
        actor.clock = lambda: newest + (time.monotonic() - began)
        assert _until_started(actor)[-3:] == ["reserve", "resume", "check"]
        assert not drained(node_info(slurm, "node2"))  # resumed into the reservation

        during = run_healthcheck(slurm, "node2", db)
        assert during.returncode == 0 and "left to hpcwatch act's checks" in during.stderr, during.stderr
        assert "drained" not in during.stderr and not drained(node_info(slurm, "node2"))

        steps = _until_concluded(actor)
        assert steps[-2:] == ["result", "release"], [r.action.why for r in recorded(store)]
        after = run_healthcheck(slurm, "node2", db)
        assert after.returncode == 0 and "drained" not in after.stderr, after.stderr
        info = node_info(slurm, "node2")
        assert not drained(info), info
    finally:
        store.close()
        for line in slurm.run("scontrol", "show", "reservation", check=False).stdout.splitlines():
            if line.startswith("ReservationName=hpcwatch-"):
                name = line.split()[0].split("=", 1)[1]
                slurm.run("scontrol", "delete", f"reservationname={name}", check=False)
        slurm.run("scontrol", "update", "nodename=node2", "state=resume", check=False)
    wait_until(lambda: not drained(node_info(slurm, "node2")), timeout_s=10, what="node2 to resume")
