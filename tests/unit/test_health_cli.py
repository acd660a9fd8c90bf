"""`hpcwatch health` end to end: the twin's scenarios found by the rules, the CLI, the Slurm health check."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from dataclasses import replace
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


# -- what hpcwatch act's checks answered ------------------------------------------------------------------


def _xid_onset(db: Path, node: str = "node2") -> tuple[float, float]:
    """When node2's XID 79 was first scraped, and the window's end (the newest sample)."""
    with Store(db) as store:
        ((onset,),) = store.query(
            "SELECT min(t) FROM samples WHERE metric = 'DCGM_FI_DEV_XID_ERRORS' AND host = ? AND value = 79", [node]
        )
        _, newest = store.time_range()
    return float(onset), float(newest)


def _acted(
    db: Path, steps: dict[str, float], *, passed: bool = True, undone: str = "", node: str = "node2"
) -> dict[str, str]:
    """The audit of a remediation episode of ``node`` as ``hpcwatch act`` writes it: each step at its time; the
    ``result`` passed or not; ``undone``: that step's successful undo. Returns step -> action id."""
    from hpcwatch.act.audit import Action, Undo, action_id

    episode, ids, events = f"remediate/{node}/{min(steps.values()) - 60:.3f}", {}, []
    for step, t in steps.items():
        ids[step] = action_id(episode, step, t)
        argv = ("scontrol", "create", "reservation", "duration=60") if step == "reserve" else ()
        action = Action(
            id=ids[step],
            policy="remediate",
            step=step,
            episode=episode,
            target=f"node {node}",
            t=t,
            who="test",
            why=step,
            argv=argv,
            rc=0 if argv else None,
            evidence={"passed": passed} if step == "result" else {},
        )
        events.append(action.to_event())
    if undone:
        events.append(Undo(of=ids[undone], t=max(steps.values()) + 1, who="ops", argv=(), rc=0).to_event())
    with Store(db) as store:
        store.add(events)
    return ids


def _health(db: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["health", "--db", str(db), *args])
    return result.exit_code, result.stdout


def test_a_node_under_hpcwatch_acts_checks_is_not_drained_by_the_health_check(tmp_path, xid79_db):
    onset, newest = _xid_onset(xid79_db)
    ids = _acted(xid79_db, {"warn": onset + 1, "reserve": newest - 30, "resume": newest - 29, "check": newest - 28})
    code, out = _health(xid79_db, "--json")
    node2 = next(n for n in orjson.loads(out)["nodes"] if n["node"] == "node2")
    assert node2["verdict"] == "drain" and node2["under_test"] == ids["resume"]  # the verdict is kept
    code, out = _health(xid79_db, "--node", "node2", "--summary", "--fail-on", "drain")
    assert code == 0 and out.startswith(f"ok | node2 under test ({ids['resume']}), its checks decide: drain: xid:")
    done, log = _run_healthcheck(tmp_path, "node2", xid79_db)
    assert done.returncode == 0 and not log.exists(), done.stderr  # slurmd's health check leaves it to them


def test_a_node_under_test_past_its_reservation_is_judged_again(xid79_db):
    onset, newest = _xid_onset(xid79_db)
    _acted(xid79_db, {"warn": onset - 4000, "reserve": newest - 3601, "resume": newest - 3600})  # 60 min ago
    code, out = _health(xid79_db, "--node", "node2", "--summary", "--fail-on", "drain")
    assert code == 1 and out.startswith("drain: node2: xid: XID 79 on GPU 3")


@pytest.mark.parametrize("undone", ["resume", "release"])
def test_checks_whose_resume_or_release_was_undone_answer_nothing(xid79_db, undone):
    onset, newest = _xid_onset(xid79_db)
    steps = {"warn": onset + 1, "reserve": newest - 30, "resume": newest - 29, "check": newest - 28}
    _acted(xid79_db, steps | {"result": newest - 5, "release": newest - 4}, undone=undone)
    code, out = _health(xid79_db, "--node", "node2", "--summary", "--fail-on", "drain")
    assert code == 1 and out.startswith("drain: node2: xid: XID 79 on GPU 3")


@pytest.mark.parametrize(("passed", "verdict"), [(True, "ok"), (False, "drain")])
def test_checks_that_passed_answer_what_the_node_showed_before_them(tmp_path, xid79_db, passed, verdict):
    onset, newest = _xid_onset(xid79_db)
    steps = {"warn": onset + 1, "reserve": newest - 30, "resume": newest - 29, "check": newest - 28}
    _acted(xid79_db, steps | {"result": newest - 5, "release": newest - 4}, passed=passed)
    code, out = _health(xid79_db, "--json", "--node", "node2")
    (node2,) = orjson.loads(out)["nodes"]
    assert code == 0 and node2["verdict"] == verdict and node2["under_test"] is None
    done, log = _run_healthcheck(tmp_path, "node2", xid79_db)
    assert done.returncode == 0 and log.exists() == (not passed), done.stderr
    with Store(xid79_db) as store:  # the other node's evidence is untouched
        assert store.samples(["DCGM_FI_DEV_XID_ERRORS"], host="node1").num_rows > 0


def test_checks_that_passed_do_not_answer_a_fault_that_came_after_them(xid79_db):
    onset, _ = _xid_onset(xid79_db)
    steps = {"warn": onset - 90, "reserve": onset - 80, "resume": onset - 79, "check": onset - 78}
    _acted(xid79_db, steps | {"result": onset - 40, "release": onset - 39})
    code, out = _health(xid79_db, "--node", "node2", "--summary", "--fail-on", "drain")
    assert code == 1 and out.startswith("drain: node2: xid: XID 79 on GPU 3")


@pytest.mark.parametrize(("first", "then", "code"), [("fail", "pass", 0), ("pass", "fail", 1)])
def test_the_newest_run_of_a_test_on_a_node_supersedes_the_older(xid79_db, data_dir, first, then, code):
    from hpcwatch.sources.healthtools import read_dcgmi_diag

    files = {"fail": "dcgmi_diag_r3_dcgm4_fail.json", "pass": "dcgmi_diag_r1_dcgm3_pass.json"}
    _, newest = _xid_onset(xid79_db)
    with Store(xid79_db) as store:
        for i, name in enumerate((first, then)):
            (diag,) = read_dcgmi_diag(data_dir / "health" / files[name], node="node1")
            store.add([replace(diag, t=newest - 600 + i * 300)])
    got, out = _health(xid79_db, "--node", "node1", "--summary", "--fail-on", "drain")
    assert got == code, out
    assert ("dcgmi diag memory fail on GPU 5" in out) == (then == "fail")


def test_a_real_kernel_xid_is_answered_by_checks_that_passed_after_it(tmp_path, data_dir):
    """Xid 31 and 48 as dmesg -T printed them (facebookresearch/gcm's test data): 48, a double-bit ECC error,
    drains; checks resumed after it and passed answer it; checks under way leave the node to them."""
    from hpcwatch.sources.kernel_log import read_kernel_log

    db = tmp_path / "xid.duckdb"
    events = list(read_kernel_log(data_dir / "kernel_log" / "dmesg_T_nvrm_xid_31_48_gcm.txt", node="gpu07"))
    with Store(db) as store:
        store.add(events)
    xid_t = max(e.t for e in events)
    code, out = _health(db, "--node", "gpu07", "--summary", "--fail-on", "drain")
    assert code == 1 and out.startswith("drain: gpu07: xid: XID 48"), out
    steps = {"warn": xid_t + 60, "reserve": xid_t + 900, "resume": xid_t + 901, "check": xid_t + 902}
    _acted(db, steps, node="gpu07")
    code, out = _health(db, "--node", "gpu07", "--summary", "--fail-on", "drain")
    assert code == 0 and "gpu07 under test (act-" in out and "XID 48" in out, out
    _acted(db, steps | {"result": xid_t + 1500, "release": xid_t + 1501}, node="gpu07")
    code, out = _health(db, "--node", "gpu07", "--json")
    (gpu07,) = orjson.loads(out)["nodes"]
    assert gpu07["verdict"] == "ok" and gpu07["under_test"] is None, gpu07
