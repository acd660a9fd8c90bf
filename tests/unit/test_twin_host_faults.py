"""The twin plants one fault per family of host rule, in the real format of the tool that shows it, and
``ingest`` then ``health`` names the rule on the right node (and not on the other)."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from hpcwatch.cli import app
from hpcwatch.twin.host_faults import HOST_FAULT_RULES


@pytest.mark.parametrize(("scenario", "rule"), sorted(HOST_FAULT_RULES.items()))
def test_each_planted_host_fault_fires_its_rule_on_its_node(tmp_path, scenario, rule):
    runner = CliRunner()
    out, db = tmp_path / "run", str(tmp_path / "h.duckdb")
    ran = runner.invoke(app, ["twin", "run", "--out", str(out), "--scenario", scenario, "--duration", "30"])
    assert ran.exit_code == 0, ran.output
    (folder,) = (out / "host").iterdir()  # one node's captures, as its agent would ship them
    for args in (["ingest", str(out)], ["ingest", "--host", folder.name, str(folder)]):
        ingested = runner.invoke(app, [*args, "--db", db])
        assert ingested.exit_code == 0, ingested.output
    result = runner.invoke(app, ["health", "--db", db, "--json"])
    assert result.exit_code == 0, result.output
    nodes = {n["node"]: n for n in orjson.loads(result.stdout)["nodes"]}

    def fired(node: str) -> set[str]:
        return {c["rule"] for c in nodes[node]["checks"] if c["verdict"] != "ok"}

    assert rule in fired(folder.name), fired(folder.name)
    assert rule not in fired("node1" if folder.name == "node2" else "node2")


def test_every_host_family_has_a_plant():
    from hpcwatch.analysis.health_rules import health_rule

    families = {health_rule(rule).family for rule in HOST_FAULT_RULES.values()}
    assert families == {"storage", "pcie", "clock", "services", "kernel", "bmc"}


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
