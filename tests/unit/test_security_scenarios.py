"""Every threat scenario, written in its real formats and read back by ``hpcwatch scan``: attacks fire
exactly their rules, look-alikes fire nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcwatch.model import reference_cluster
from hpcwatch.records import VECTOR_TABLE
from hpcwatch.security.scan import ScanConfig, scan_records, scan_store, sort_findings
from hpcwatch.store import Store
from hpcwatch.twin.threats import EXPECTED_RULES, THREAT_SCENARIOS, write_threat_fixtures
from tests.conftest import records_of, scan_folder

CLUSTER = reference_cluster()


def _scan(folder: Path) -> list:
    return scan_folder(folder, CLUSTER)


@pytest.mark.parametrize("scenario", THREAT_SCENARIOS)
def test_scenario_fires_exactly_its_rules(scenario: str, tmp_path: Path) -> None:
    fixture = write_threat_fixtures(tmp_path, scenario)
    assert {f.rule for f in _scan(tmp_path)} == fixture.expected


def test_every_vector_has_an_attack_and_a_look_alike() -> None:
    attacks = [s for s in THREAT_SCENARIOS if EXPECTED_RULES[s]]
    assert len(attacks) == len(VECTOR_TABLE) and len(THREAT_SCENARIOS) == 2 * len(VECTOR_TABLE)
    assert {s.removeprefix("threat_") for s in attacks} == {v.short for v in VECTOR_TABLE}


def test_findings_name_the_planted_targets(tmp_path: Path) -> None:
    write_threat_fixtures(tmp_path / "g", "threat_gradient")
    write_threat_fixtures(tmp_path / "d", "threat_data_poisoning")
    findings = {f.rule: f for f in _scan(tmp_path / "g") + _scan(tmp_path / "d")}
    assert findings["gradient.norm_outlier"].evidence["rank"] == 5
    assert findings["gradient.sketch_direction"].evidence["rank"] == 2
    assert findings["data_poisoning.shard_mismatch"].target.endswith("train-00001.bin")


def test_cli_scan_json_sarif_and_store(tmp_path: Path) -> None:
    write_threat_fixtures(tmp_path / "in", "threat_container_escape")
    db, sarif = tmp_path / "s.duckdb", tmp_path / "out.sarif"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcwatch",
            "scan",
            str(tmp_path / "in"),
            "--json",
            "--db",
            str(db),
            "--sarif",
            str(sarif),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert {f["rule"] for f in doc["findings"]} == EXPECTED_RULES["threat_container_escape"]
    assert set(doc["findings"][0]) == {"vector", "severity", "target", "title", "evidence", "rule", "t"}
    results = json.loads(sarif.read_text())["runs"][0]["results"]
    assert len(results) == len(doc["findings"]) and results[0]["level"] == "error"
    with Store(db) as store:
        assert len(store.findings("container_escape")) == len(doc["findings"])


def test_cli_scan_of_a_missing_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "hpcwatch", "scan", str(tmp_path / "nope.json"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and run.stderr.strip() == f"hpcwatch: {tmp_path / 'nope.json'}: no such file or folder"


def test_live_twin_with_rdma_and_remanence_threats_is_caught() -> None:
    from hpcwatch.twin import Twin

    twin = Twin(CLUSTER, seed=1, scenarios=["threat_rdma", "threat_remanence", "threat_container_escape"])
    samples, events, jobs = [], [], []
    for _ in range(6):
        twin.advance(15.0)
        for record in twin.records():
            kind = type(record).__name__
            (samples if kind == "Sample" else events if kind == "Event" else jobs if kind == "Job" else []).append(
                record
            )
    rules = {f.rule for f in scan_records(samples, events, jobs, config=ScanConfig.for_cluster(CLUSTER))}
    assert "container_escape.release_agent" in rules
    assert rules & {"rdma.traffic_disproportion", "rdma.traffic_no_job"}
    assert "remanence.scrub_disabled" in rules


def test_tetragon_policy_watches_the_models_weights_path() -> None:
    import yaml

    policy = yaml.safe_load((Path(__file__).parents[2] / "deploy" / "tetragon" / "weights-read.yaml").read_text())
    kprobes = policy["spec"]["kprobes"]
    assert policy["kind"] == "TracingPolicy"
    assert {k["call"] for k in kprobes} == {"security_file_permission", "security_mmap_file"}
    matches = [m for k in kprobes for sel in k["selectors"] for m in sel["matchArgs"]]
    assert {m["operator"] for m in matches} == {"Prefix"}
    assert {v for m in matches for v in m["values"]} == {CLUSTER.weights.path}


def test_cli_scan_db_reports_who_read_the_weights(tmp_path: Path) -> None:
    write_threat_fixtures(tmp_path / "in", "threat_weights")
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        store.add(records_of([tmp_path / "in"]))
    run = subprocess.run(
        [sys.executable, "-m", "hpcwatch", "scan", "--db", str(db), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert [(r["user"], r["access"], r["job"]) for r in doc["weights_reads"]] == [
        ("alice", "write", "4242"),
        ("alice", "mmap", "4242"),
        ("bob", "read", "4100"),
        ("alice", "read", None),
    ]
    assert {f["rule"] for f in doc["findings"]} == EXPECTED_RULES["threat_weights"]


def test_rescan_replaces_stored_findings(tmp_path: Path) -> None:
    from hpcwatch.security import rescan

    write_threat_fixtures(tmp_path, "threat_container_escape")
    with Store(":memory:") as store:
        store.add(records_of([tmp_path]))
        first = rescan(store)
        again = rescan(store)
        assert len(store.findings()) == len(first) == len(again) == 3


@pytest.mark.parametrize("vector", ["container_escape", "weights", "data_poisoning", "remanence"])
def test_twin_events_are_what_the_readers_make_of_its_files(vector: str) -> None:
    """The live twin builds its Events without the readers: they must equal the readers' on the same documents."""
    from hpcwatch.sources.falco import parse_falco_json
    from hpcwatch.sources.procparams import parse_nvidia_params
    from hpcwatch.sources.tetragon import parse_tetragon_json
    from hpcwatch.twin import threats

    plant = threats._PLANTS[vector](threats.fixture_world(), True)
    read = []
    for rel, data in sorted(plant.files.items()):
        lines = data.decode().splitlines() if not rel.endswith(".bin") else []
        if rel.startswith("falco/"):
            read += parse_falco_json(lines, path="<twin falco>")
        elif rel.startswith("tetragon/"):
            read += parse_tetragon_json(lines, path="<twin tetragon>")
        elif rel.endswith("nvidia/params"):
            read += parse_nvidia_params(
                lines, path="/proc/driver/nvidia/params", host="node2", t=threats.fixture_world().t0
            )
    key = lambda e: (e.kind, e.t, json.dumps(e.attrs, sort_keys=True))  # noqa: E731
    assert read and sorted(map(key, plant.events)) == sorted(map(key, read))


def test_twin_sketch_and_signature_match_security_and_sources() -> None:
    import numpy as np

    from hpcwatch.security.gradients import SKETCH_DIMS, grad_sketch
    from hpcwatch.sources.manifest import SIGNATURE_ALG, parse_manifest, signature_valid
    from hpcwatch.twin import threats

    assert threats.SKETCH_DIMS == SKETCH_DIMS and threats._SIGNATURE_ALG == SIGNATURE_ALG
    flat = np.random.default_rng(3).standard_normal(5000)
    assert np.allclose(threats._grad_sketch(flat, seed=0), grad_sketch(flat, seed=0))
    doc = threats._sign_manifest("ds", [{"path": "a.bin", "sha256": "0" * 64, "bytes": 3, "samples": None}], b"k")
    manifest = parse_manifest(json.dumps(doc))
    assert signature_valid(manifest, b"k") and not signature_valid(manifest, b"other")


def _fixture_records(tmp_path: Path, scenario: str) -> tuple[list, object]:
    write_threat_fixtures(tmp_path, scenario)
    return records_of([tmp_path], hosts=[n.name for n in CLUSTER.nodes]), None


@pytest.mark.parametrize("scenario", ["threat_rdma", "threat_remanence", "threat_container_escape"])
def test_live_scan_fed_in_slices_finds_what_a_full_scan_finds(scenario: str, tmp_path: Path) -> None:
    from hpcwatch.records import Sample
    from hpcwatch.security.scan import LiveScan

    records, _ = _fixture_records(tmp_path, scenario)
    config = ScanConfig.for_cluster(CLUSTER)
    with Store(":memory:") as whole:
        whole.add(records)
        full = scan_store(whole, config=config)
    samples = sorted((r for r in records if isinstance(r, Sample)), key=lambda s: s.t)
    others = [r for r in records if not isinstance(r, Sample)]
    everything, windowed = LiveScan(config=config, window_s=1e9), LiveScan(config=config)
    with Store(":memory:") as store:
        store.add(others)
        found, kept = everything(store), windowed(store)
        for lo in range(0, len(samples), max(len(samples) // 6, 1)):
            store.add(samples[lo : lo + max(len(samples) // 6, 1)])
            found = everything(store)
            kept = windowed(store)
        assert found == full  # an unbounded window is the full scan, however the rows arrived
        assert {f.rule for f in kept} == {f.rule for f in full} == EXPECTED_RULES[scenario]
        assert sort_findings(store.findings()) == kept


def test_live_scan_reads_each_row_once(tmp_path: Path) -> None:
    from hpcwatch.security.scan import LiveScan

    records, _ = _fixture_records(tmp_path, "threat_rdma")
    scan = LiveScan(config=ScanConfig.for_cluster(CLUSTER))
    with Store(":memory:") as store:
        store.add(records)
        first = scan(store)
        held = scan.held
        assert scan(store) == first and scan.held == held  # nothing new: nothing read twice
    with pytest.raises(ValueError):
        LiveScan(window_s=0)
