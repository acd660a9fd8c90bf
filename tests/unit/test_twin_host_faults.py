"""The twin plants one fault per family of host rule, in the real format of the tool that shows it. That ``ingest``
then ``health`` names each one's rule on its node (and nothing on the other) is checked with every other planted
fault in test_twin_fault_plants.py."""

from __future__ import annotations

from click.testing import CliRunner

from hpcwatch.cli import app
from hpcwatch.twin.host_faults import HOST_FAULT_RULES


def test_every_host_family_has_a_plant():
    from hpcwatch.analysis.health_rules import health_rule

    families = {health_rule(rule).family for rule in HOST_FAULT_RULES.values()}
    assert families == {"storage", "memory", "pcie", "clock", "services", "kernel", "bmc", "benchmark", "fabric"}


def test_the_planted_hca_fault_is_marked_on_its_node_in_the_schematic(tmp_path):
    """The live page's problems (what the schematic draws its marks from) name node1 with a drain mark."""
    from hpcwatch.reports.live import problems
    from hpcwatch.store import Store

    runner = CliRunner()
    out, db = tmp_path / "run", tmp_path / "store"
    ran = runner.invoke(app, ["twin", "run", "--out", str(out), "--scenario", "hca_firmware_hung", "--duration", "30"])
    assert ran.exit_code == 0, ran.output
    for args in (["ingest", str(out)], ["ingest", "--host", "node1", str(out / "host" / "node1")]):
        assert runner.invoke(app, [*args, "--db", str(db)]).exit_code == 0
    with Store(db) as store:
        marks = [(p["el"], p["mark"]) for p in problems(store, training_job=None) if p.get("rule") == "nic_driver"]
    assert marks == [("node:node1", "drain")]
