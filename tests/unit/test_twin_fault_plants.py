"""Every health rule has a twin scenario that plants its fault (twin/plants.py), and each one, run through the
twin, the readers (``hpcwatch ingest``) and the rules, fires on its node only and marks that node on the live page
(``reports.live.problems``, what the schematic draws its marks from).

The list of rules comes from ``HEALTH_RULES``: a rule added there without a planted scenario fails here until one
is written, or it is listed in ``NOT_ONE_NODE_FAULTS`` with the reason no one-node plant can show it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcwatch.analysis.health_rules import HEALTH_RULE_IDS, HEALTH_RULES, health_rule
from hpcwatch.cli import app
from hpcwatch.reports.health import node_health
from hpcwatch.reports.live import problems
from hpcwatch.store import Store
from hpcwatch.twin import scenario_names
from hpcwatch.twin.plants import FAULT_PLANTS, Plant

#: Rules no plant of the twin can show as one node's fault, each with the reason (and where it is tested instead).
#: Every other rule of HEALTH_RULES needs a row in FAULT_PLANTS.
NOT_ONE_NODE_FAULTS: dict[str, str] = {
    # a hung collective is the job's: the stalled_nccl scenario fires it on every GPU of every node of the job
    # (tests/unit/test_failures.py checks the scenario, tests/unit/test_health.py the rule)
    "stalled_nccl": "job-wide: every GPU of the hung job spins at idle power",
    # the twin's own workload plays it: its notebook jobs (twin/workload.py) hold GPUs idle, so any run past
    # idle_min_s (600 s) shows it wherever one runs, and a planted idle GPU could not be the only one
    # (tests/unit/test_health.py judges it on real-format lines)
    "idle_allocated": "the twin's own notebook jobs idle their GPUs on any node past idle_min_s",
    # NCCL agrees on one channel count across a communicator (the minimum over its ranks): a node that caps its
    # channels lowers them on every host of the job (tests/unit/test_nccl_rules.py, on real logs)
    "nccl_few_channels": "job-wide: a communicator's ranks share its channel count",
    # the rule names every rank whose version, runtime or plugin differs from another's, the majority's hosts too
    # (tests/unit/test_nccl_rules.py, on real logs); a node on another NCCL is nccl_drift's nccl_fleet_mismatch
    "nccl_version_mismatch": "job-wide: it names the hosts of every version in the job",
    # PyTorch's watchdog fires on every rank left waiting in the collective, on every host but the stuck one's
    # (nccl_hang plants the hang, hpcwatch hang names the stuck rank; tests/unit/test_nccl_log.py reads real
    # watchdog lines)
    "nccl_timeout": "job-wide: every waiting rank's watchdog times out",
}

_BY_SCENARIO: dict[str, list[Plant]] = {}
for _plant in FAULT_PLANTS:
    _BY_SCENARIO.setdefault(_plant.scenario, []).append(_plant)


def test_every_health_rule_has_a_planted_fault_or_a_reason_it_cannot():
    planted = {p.rule for p in FAULT_PLANTS}
    missing = set(HEALTH_RULE_IDS) - planted - set(NOT_ONE_NODE_FAULTS)
    assert missing == set(), f"health rules with no twin scenario planting them and no reason why not: {missing}"
    assert not planted & set(NOT_ONE_NODE_FAULTS), "a rule listed as not plantable is planted now: drop it"
    assert set(NOT_ONE_NODE_FAULTS) <= set(HEALTH_RULE_IDS), "a reason for a rule that no longer exists"


def test_every_family_of_health_rule_has_a_planted_fault():
    assert {rule.family for rule in HEALTH_RULES} == {health_rule(p.rule).family for p in FAULT_PLANTS}


def test_the_rows_of_one_scenario_share_its_run():
    """The test below runs each scenario once, with its first row's model, nodes and duration."""
    for plants in _BY_SCENARIO.values():
        assert len({(p.model, p.nodes, p.duration_s) for p in plants}) == 1, plants
    assert len({(p.scenario, p.rule, p.verdict) for p in FAULT_PLANTS}) == len(FAULT_PLANTS)


def test_every_plant_names_a_rule_and_a_scenario_that_exist():
    assert {p.rule for p in FAULT_PLANTS} <= set(HEALTH_RULE_IDS)
    assert {p.scenario for p in FAULT_PLANTS} <= set(scenario_names())
    assert all(p.verdict in health_rule(p.rule).actions for p in FAULT_PLANTS)


def test_every_host_fault_is_a_plant_with_the_same_rule():
    """test_twin_host_faults.py leaves running the host faults to this file: none may be left out of the table."""
    from hpcwatch.twin.host_faults import HOST_FAULT_RULES

    assert set(HOST_FAULT_RULES.items()) <= {(p.scenario, p.rule) for p in FAULT_PLANTS}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--scenario", "driver_drift"], "(--nodes 3)"),  # two nodes: the odd one out would be a tie
        (["--scenario", "ofed_drift"], "(--nodes 3)"),
        (["--scenario", "row_remap_failed", "--model", "mi300x"], "NVIDIA model"),  # AMD GPUs: it would plant nothing
        (["--scenario", "amd_xgmi_errors"], "--model mi300x"),  # NVIDIA GPUs: it would plant nothing
        (["--scenario", "amd_vbios_drift", "--nodes", "3"], "--model mi300x"),
    ],
)
def test_a_scenario_that_would_plant_nothing_here_says_what_it_needs(tmp_path, run_cli, args, said):
    code, _, err = run_cli(["twin", "run", "--out", str(tmp_path), *args])
    assert code != 0 and said in err and "Traceback" not in err


def test_the_amd_scrape_carries_the_planted_families_on_every_gpu_of_every_node():
    """Zeros where nothing is wrong (so the rules looked there), the fault on its one GPU, the exporter's labels."""
    from hpcwatch import vocab
    from hpcwatch.sources.amd_exporter import parse_amd_exporter_text
    from hpcwatch.twin import Twin
    from hpcwatch.twin.run import sized_model

    twin = Twin(sized_model("mi300x"), seed=1, scenarios=["amd_xgmi_errors"])
    twin.advance(20.0)
    wafl = {
        (s.labels["hostname"], s.labels["gpu"]): s.value
        for node in twin.node_names
        for s in parse_amd_exporter_text(twin.dcgm_text(node, timestamp=True))
        if s.metric == vocab.GPU_ECC_UNCORRECT_XGMI_WAFL
    }
    assert len(wafl) == 16 and {k for k, v in wafl.items() if v} == {("node2", "5")}


def test_the_twin_s_amd_labels_are_those_of_a_real_exporter_scrape():
    """The labels the fleet and AMD scenarios lean on (driver_version, vbios_version) are among those a real
    device-metrics-exporter writes (the MI300X scrape of ROCm/device-metrics-exporter issue #171)."""
    from hpcwatch.sources.prometheus_text import parse_prometheus_text
    from hpcwatch.twin import Twin
    from hpcwatch.twin.run import sized_model
    from tests.conftest import DATA

    real = (DATA / "amd" / "dme_issue171_mi300x_vf_edge_temperature.prom").read_text()
    (sample,) = parse_prometheus_text(real, t=0.0)
    twin = Twin(sized_model("mi300x"), seed=1)
    twin.advance(10.0)
    ours = {key for s in parse_prometheus_text(twin.dcgm_text("node1"), t=0.0) for key in s.labels}
    assert {"driver_version", "vbios_version", "job_id"} <= ours <= set(sample.labels)


def test_the_kernel_drift_is_in_every_node_exporter_scrape_one_node_at_a_time_too():
    """``twin serve`` writes a node's node-exporter text alone (not scrape_all's batch the plant runs use): it
    carries the scenario's node_uname_info too, the odd release on the last node only."""
    from hpcwatch.sources.prometheus_text import parse_prometheus_text
    from hpcwatch.twin import Twin
    from hpcwatch.twin.fleet_faults import KERNEL_RELEASE
    from hpcwatch.twin.run import sized_model

    twin = Twin(sized_model("reference", 3), seed=1, scenarios=["kernel_drift"])
    twin.advance(10.0)
    releases = {
        s.labels["node"]: s.labels["release"]
        for node in twin.node_names
        for s in parse_prometheus_text(twin.node_exporter_text(node, target_labels=True), t=0.0)
        if s.metric == "node_uname_info"
    }
    assert releases == {"node1": KERNEL_RELEASE, "node2": KERNEL_RELEASE, "node3": "6.8.0-40-generic"}


def _run_and_ingest(tmp: Path, plant: Plant) -> Path:
    """The twin's run, ingested as a cluster ships it: the collectors' folders, then each node's own captures
    with ``--host`` (none of those tools names its host)."""
    runner = CliRunner()
    out, db = tmp / "run", tmp / "store"
    args = ["twin", "run", "--out", str(out), "--scenario", plant.scenario, "--model", plant.model]
    args += ["--duration", f"{plant.duration_s:g}", *(["--nodes", str(plant.nodes)] if plant.nodes else [])]
    ran = runner.invoke(app, args)
    assert ran.exit_code == 0, ran.output
    collected = [str(p) for p in sorted(out.iterdir()) if p.name != "host"]
    batches = [collected] + [["--host", f.name, str(f)] for f in sorted((out / "host").glob("*"))]
    for batch in batches:
        ingested = runner.invoke(app, ["ingest", *batch, "--db", str(db)])
        assert ingested.exit_code == 0, ingested.output
    return db


@pytest.mark.parametrize("scenario", sorted(_BY_SCENARIO))
def test_each_planted_fault_fires_its_rule_on_its_node_only_and_marks_it(tmp_path, scenario):
    plants = _BY_SCENARIO[scenario]
    db = _run_and_ingest(tmp_path, plants[0])
    with Store(db) as store:
        report = node_health(store)
        marked = [p for p in problems(store, training_job=None) if p["kind"] == "health"]
    fired = {n.node: {(c.rule, c.verdict) for c in n.checks if c.verdict != "ok"} for n in report.nodes}
    for plant in plants:
        assert (plant.rule, plant.verdict) in fired.get(plant.node, set()), (plant, fired)
        assert any(p["rule"] == plant.rule and p["node"] == plant.node for p in marked), marked
    sick = {plant.node for plant in plants}
    assert {node for node, rules in fired.items() if rules} == sick, fired  # the healthy nodes stay quiet
    assert {p["el"].split(":", 1)[1].split("/")[0] for p in marked} == sick  # node:nodeN or gpu:nodeN/g
