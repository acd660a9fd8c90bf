"""`hpcwatch health` end to end: the twin's scenarios found by the rules, the CLI, the Slurm health check."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
from click.testing import CliRunner

import hpcwatch.twin.failures  # noqa: F401  (registers the scenarios)
from hpcwatch.analysis.health import judge, passive_checks
from hpcwatch.cli import app
from hpcwatch.model import reference_cluster
from hpcwatch.sources.prometheus_text import parse_prometheus_columns
from hpcwatch.store import Store
from hpcwatch.twin.core import Twin

REPO = Path(__file__).resolve().parents[2]
HEALTHCHECK = REPO / "deploy" / "slurm" / "healthcheck"
HPCWATCH = Path(sys.executable).with_name("hpcwatch")


def twin_scrapes(scenario: str | None, *, ticks: int = 16, dt_s: float = 15.0) -> tuple[pa.Table, list]:
    """Scrape the twin's dcgm-exporter and node-exporter text every tick, parse it, as Prometheus would."""
    twin = Twin(reference_cluster(), seed=1, scenarios=[scenario] if scenario else [])
    tables, events = [], []
    for _ in range(ticks):
        twin.advance(dt_s)
        events += twin.events()
        for node in ("node1", "node2"):
            tables.append(parse_prometheus_columns(twin.dcgm_text(node), path=f"{node}.dcgm", t=twin.now))
            tables.append(
                parse_prometheus_columns(
                    twin.node_exporter_text(node, target_labels=True), path=f"{node}.node", t=twin.now
                )
            )
    return pa.concat_tables(tables), events


def report_for(scenario: str | None):
    samples, events = twin_scrapes(scenario)
    return judge(passive_checks(samples, events), samples=samples, events=events)


def test_healthy_twin_is_ok_everywhere():
    report = report_for(None)
    assert [(n.node, n.verdict) for n in report.nodes] == [("node1", "ok"), ("node2", "ok")]
    assert {"xid", "ib_link", "stalled_nccl"} <= {c.rule for c in report.node("node1").checks}


def test_xid79_scenario_drains_node2_only():
    report = report_for("xid79")
    assert report.node("node2").verdict == "drain" and report.node("node1").verdict == "ok"
    xid = next(c for c in report.node("node2").checks if c.rule == "xid")
    assert xid.evidence["xid"] == 79 and xid.evidence["gpu"] == "3"


def test_ib_flap_scenario_drains_node1():
    report = report_for("ib_flap")
    assert report.node("node1").verdict == "drain"
    rules = {c.rule: c.verdict for c in report.node("node1").checks}
    assert rules["ib_link"] == "drain" and rules["ib_errors"] == "warn"
    assert report.node("node2").verdict == "ok"


def test_stalled_nccl_scenario_warns_on_every_node():
    report = report_for("stalled_nccl")
    for node in ("node1", "node2"):
        stalled = [c for c in report.node(node).checks if c.rule == "stalled_nccl"]
        assert stalled and all(c.verdict == "warn" for c in stalled)


@pytest.fixture
def xid79_db(tmp_path) -> Path:
    samples, events = twin_scrapes("xid79")
    db = tmp_path / "health.duckdb"
    with Store(db) as store:
        store.add_sample_table(samples)
        store.add(events)
    return db


def test_health_cli_json_contract(xid79_db):
    result = CliRunner().invoke(app, ["health", "--db", str(xid79_db), "--json"])
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.stdout)
    nodes = {n["node"]: n for n in doc["nodes"]}
    assert nodes["node2"]["verdict"] == "drain" and nodes["node1"]["verdict"] == "ok"
    check = next(c for c in nodes["node2"]["checks"] if c["rule"] == "xid")
    assert {"rule", "verdict", "title", "evidence"} <= set(check)


def test_health_cli_active_inputs_and_fail_on(xid79_db, data_dir):
    diag = data_dir / "health" / "dcgmi_diag_r3_dcgm4_fail.json"
    result = CliRunner().invoke(
        app,
        [
            "health",
            "--db",
            str(xid79_db),
            "--node",
            "node1",
            "--dcgmi-diag",
            str(diag),
            "--summary",
            "--fail-on",
            "drain",
        ],
    )
    assert result.exit_code == 1
    assert result.stdout.startswith("drain: node1: dcgm_diag: dcgmi diag memory fail on GPU 5")


def _fake_scontrol(tmp_path: Path) -> tuple[Path, Path]:
    log = tmp_path / "scontrol.args"
    fake = tmp_path / "bin" / "scontrol"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done >> "{log}"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return fake.parent, log


def _run_healthcheck(tmp_path: Path, node: str, db: Path) -> tuple[subprocess.CompletedProcess, Path]:
    bindir, log = _fake_scontrol(tmp_path)
    env = {
        **os.environ,
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "HPCWATCH": str(HPCWATCH),
        "HPCWATCH_DB": str(db),
        "HPCWATCH_NODE": node,
    }
    done = subprocess.run(["bash", str(HEALTHCHECK)], env=env, capture_output=True, text=True, timeout=120)
    return done, log


def test_healthcheck_drains_a_sick_node_through_scontrol(tmp_path, xid79_db):
    done, log = _run_healthcheck(tmp_path, "node2", xid79_db)
    assert done.returncode == 0, done.stderr
    args = log.read_text().splitlines()
    assert args[:3] == ["update", "nodename=node2", "state=drain"]
    assert args[3].startswith("reason=hpcwatch: drain: node2: xid: XID 79 on GPU 3")


def test_healthcheck_leaves_a_healthy_node_alone(tmp_path, xid79_db):
    done, log = _run_healthcheck(tmp_path, "node1", xid79_db)
    assert done.returncode == 0 and not log.exists()


def test_healthcheck_that_cannot_read_its_store_does_not_drain(tmp_path):
    bad = tmp_path / "not-a-store"
    bad.write_text("this is not a DuckDB file\n")
    done, log = _run_healthcheck(tmp_path, "node1", bad)
    assert done.returncode == 0 and not log.exists()
    assert "could not run" in done.stderr
