"""`hpcwatch ingest` reads each content once: a re-run adds nothing, a killed run is completed by the next,
readers work while it writes, and the project's own outputs are all taken."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from hpcwatch.store import Store
from tests.conftest import DATA, free_port

HPCWATCH = [sys.executable, "-m", "hpcwatch"]


def _run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*HPCWATCH, *args], capture_output=True, text=True, timeout=timeout)


def _snapshot(db: Path) -> dict[str, list]:
    """Every row of every table, sorted: two stores are equal when their snapshots are."""
    with Store(db) as store:
        return {
            table: sorted(map(repr, store.query(f"SELECT * FROM {table}")))
            for table in ("samples", "events", "spans", "jobs", "findings")
        }


def test_ingesting_the_same_files_twice_adds_nothing_and_says_so(run_cli, tmp_path):
    db = str(tmp_path / "s")
    files = [str(DATA / "prometheus" / "dcgm_exporter_node1.prom"), str(DATA / "slurm" / "squeue.json")]
    code, out, err = run_cli(["ingest", *files, "--db", db, "--json"])
    assert code == 0, err
    first = orjson.loads(out)
    assert first["samples"] == 9 + 2 * 3 and first["jobs"] == 10  # + squeue's 3 running jobs' elapsed, limit
    before = _snapshot(Path(db))
    code, out, err = run_cli(["ingest", *files, "--db", db, "--json"])
    again = orjson.loads(out)
    assert code == 0 and again["samples"] == 0 and again["jobs"] == 0
    assert again["already_ingested"] == files and again["status"] == {"already": 2}
    assert _snapshot(Path(db)) == before
    code, out, err = run_cli(["ingest", *files, "--db", db])
    assert code == 0 and out.count("already in the store") == 2


def test_a_copy_of_a_scrape_written_at_another_time_is_a_new_scrape(run_cli, tmp_path):
    """Formats dated by the file's write time key on it: the same bytes an hour later are new samples."""
    text = '# TYPE up gauge\nup{instance="n1:9100"} 1\n'
    a, b = tmp_path / "a.prom", tmp_path / "b.prom"
    a.write_text(text)
    b.write_text(text)
    os.utime(b, (time.time() - 3600, time.time() - 3600))
    code, out, _ = run_cli(["ingest", str(a), str(b), "--db", str(tmp_path / "s"), "--json"])
    assert code == 0 and orjson.loads(out)["samples"] == 2


def _big_scrape(path: Path, copies: int, start_ms: int = 1_767_225_600_000) -> None:
    """A dcgm-exporter text with ``copies`` repeats of a real scrape, a second apart from ``start_ms`` (seconds to
    ingest)."""
    lines = [
        ln
        for ln in (DATA / "prometheus" / "dcgm_exporter_node1.prom").read_text().splitlines()
        if ln and not ln.startswith("#")
    ]
    with path.open("w") as out:
        for k in range(copies):
            out.write("\n".join(f"{ln} {start_ms + k * 1000}" for ln in lines) + "\n")


def _committed_samples(db: Path) -> int | None:
    """How many sample parts the store's manifest lists (None: no manifest yet, or one being replaced)."""
    try:
        return len(orjson.loads((db / "manifest.json").read_bytes())["tables"]["samples"])
    except (OSError, ValueError, KeyError):
        return None


def _staging_parts(db: Path) -> int:
    """Parts a writer has in its staging folder, not yet committed."""
    folders = (db / "staging").glob("*/") if (db / "staging").is_dir() else ()
    return sum(1 for folder in folders for _ in folder.glob("*.parquet"))


def _kill_when(proc: subprocess.Popen, reached, what: str) -> None:
    """SIGKILL ``proc`` once ``reached()`` holds (the store's files, polled), not after a time: on a loaded machine
    the ingest runs slower, and a kill timed for the middle of a file lands after its end."""
    while not reached():
        assert proc.poll() is None, f"the ingest ended before {what}"
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
def test_a_killed_ingest_is_completed_by_the_next_and_equals_a_clean_one(tmp_path):
    first, second = tmp_path / "first.prom", tmp_path / "second.prom"
    _big_scrape(first, 30_000)  # 270k samples
    _big_scrape(second, 10_000, start_ms=1_767_300_000_000)
    files = [str(DATA / "slurm" / "squeue.json"), str(first), str(second), str(DATA / "lustre")]
    clean = tmp_path / "clean"
    assert _run("ingest", *files, "--db", str(clean)).returncode == 0
    expected = _snapshot(clean)
    # squeue.json commits one sample part (its node states) with its jobs, then each scrape one of its own.
    stages = {
        "the store opened, nothing committed": lambda db: _committed_samples(db) == 0,
        "the first scrape being written": lambda db: _committed_samples(db) == 1 and _staging_parts(db) > 0,
        "the second scrape being written": lambda db: _committed_samples(db) == 2 and _staging_parts(db) > 0,
    }
    for n, (what, reached) in enumerate(stages.items()):
        db = tmp_path / f"killed-{n}"
        proc = subprocess.Popen(
            [*HPCWATCH, "ingest", *files, "--db", str(db)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _kill_when(proc, lambda db=db, reached=reached: reached(db), what)
        done = _run("ingest", *files, "--db", str(db), "--json")
        assert done.returncode == 0, done.stderr
        assert _snapshot(db) == expected, f"killed with {what}"


@pytest.mark.slow
def test_readers_work_while_an_ingest_writes(tmp_path):
    big = tmp_path / "big.prom"
    _big_scrape(big, 30_000)
    db = tmp_path / "s"
    assert _run("ingest", str(DATA / "slurm" / "squeue.json"), "--db", str(db)).returncode == 0
    quiet = len(orjson.loads(_run("jobs", "--db", str(db), "--json").stdout)["jobs"])
    writer = subprocess.Popen(
        [*HPCWATCH, "ingest", str(big), "--db", str(db)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    answers = []
    while writer.poll() is None and len(answers) < 6:
        done = _run("jobs", "--db", str(db), "--json")
        assert done.returncode == 0, done.stderr  # never DuckDB's lock message
        answers.append(len(orjson.loads(done.stdout)["jobs"]))
    assert writer.wait(timeout=180) == 0, writer.stderr.read()
    assert answers and set(answers) == {quiet} and quiet > 0


def test_the_projects_own_outputs_are_ingested(run_cli, tmp_path):
    out = tmp_path / "run"
    code, _, err = run_cli(
        ["twin", "run", "--out", str(out), "--duration", "20", "--spans", "--scenario", "threat_supply_chain"]
    )
    assert code == 0, err
    code, stdout, err = run_cli(["ingest", str(out), "--db", str(tmp_path / "s"), "--json"])
    assert code == 0, err
    doc = orjson.loads(stdout)
    assert doc["spans"] > 0 and doc["samples"] > 0 and doc["jobs"] > 0
    assert "hook-jsonl" in doc["formats"], doc["formats"]  # the twin's spans.jsonl


def test_threat_fixtures_ingest_whole_and_scan_the_same_from_the_store(run_cli, tmp_path):
    from hpcwatch.twin.threats import write_threat_fixtures

    fixture = write_threat_fixtures(tmp_path / "f", "threat_supply_chain")
    db = str(tmp_path / "s")
    code, out, err = run_cli(["ingest", str(tmp_path / "f"), "--db", db, "--json"])
    assert code == 0, err
    assert "site-packages" in orjson.loads(out)["formats"]
    code, out, err = run_cli(["scan", "--db", db, "--json"])
    from_store = {f["rule"] for f in orjson.loads(out)["findings"]}
    code, out, err = run_cli(["scan", str(tmp_path / "f"), "--json"])
    from_files = {f["rule"] for f in orjson.loads(out)["findings"]}
    assert from_store == from_files == fixture.expected


@pytest.mark.parametrize(
    "forced, path, what",
    [
        # a Slurm file forced as perfquery: the reader finds no perfquery line
        ("perfquery", DATA / "slurm" / "squeue.json", "not a perfquery"),
        # any text forced as partitions.conf used to store garbage
        ("opensm-partitions", DATA / "prometheus" / "dcgm_exporter_node1.prom", ""),
        # a trace is read by `hpcwatch steps`, not stored
        ("kineto", DATA / "kineto" / "hta_a100_nccl_rank0.json.gz", "read by its own command"),
    ],
)
def test_a_forced_format_that_does_not_fit_is_an_error(run_cli, tmp_path, forced, path, what):
    code, _out, err = run_cli(["ingest", str(path), "--format", forced, "--db", str(tmp_path / "s")])
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"hpcwatch: {path}")
    assert what in err
    with Store(tmp_path / "s") as store:
        assert store.sources() == []


def test_a_folder_named_like_a_file_is_walked(run_cli, tmp_path):
    odd = tmp_path / "traces.json"
    odd.mkdir()
    (odd / "squeue.json").write_bytes((DATA / "slurm" / "squeue.json").read_bytes())
    code, out, err = run_cli(["ingest", str(tmp_path), "--db", str(tmp_path / "s"), "--json"])
    assert code == 0, err
    assert orjson.loads(out)["jobs"] == 10


def test_ingest_and_scan_read_a_perfquery_file_alike(tmp_path):
    """There used to be two loaders: ingest stored {lid, port} at the file's time, scan {node} at t = 0."""
    from hpcwatch.ingest import ingest_paths
    from tests.conftest import records_of

    spool = tmp_path / "node2"
    spool.mkdir()
    path = spool / "perfquery-node2.out"
    path.write_bytes((DATA / "infiniband" / "perfquery_x_switch_port1.out").read_bytes())
    with Store(":memory:") as store:
        ingest_paths(store, [path], hosts=["node1", "node2"])
        stored = sorted((s.metric, s.labels.get("node"), s.t) for s in store.iter_samples())
    scanned = sorted((s.metric, s.labels.get("node"), s.t) for s in records_of([path], hosts=["node1", "node2"]))
    assert stored == scanned and stored
    assert {node for _, node, _ in stored} == {"node2"} and {t for *_, t in stored} == {path.stat().st_mtime}


def test_a_log_with_a_bad_line_keeps_its_good_lines_and_names_the_bad_one(run_cli, tmp_path):
    good = '{"process_exec": {"process": {"binary": "/bin/sh"}}, "node_name": "node1", "time": "2026-01-01T00:00:00Z"}'
    log = tmp_path / "tetragon.log"
    log.write_text(f"{good}\n" + '{"process_exec": {"process": {}}, "node_name": "node1"}\n' + f"{good}\n")
    code, out, err = run_cli(["ingest", str(log), "--db", str(tmp_path / "s"), "--json"])
    assert code == 0, err
    doc = orjson.loads(out)
    assert doc["events"] == 2 and doc["bad_lines"][0]["count"] == 1
    assert doc["bad_lines"][0]["first"][0].startswith(f"{log}:2:")
    code, out, err = run_cli(["ingest", str(log), "--db", str(tmp_path / "t")])
    assert code == 0 and f"hpcwatch: warning: {log}:2:" in err
    assert "1 bad line(s) skipped, the good ones kept" in err


def test_a_corrupt_parquet_is_one_line_without_control_bytes(run_cli, tmp_path):
    bad = tmp_path / "trace.parquet"
    bad.write_bytes(b"PAR1" + bytes(range(256)) + b"\n\x1b[2J" + b"PAR1")
    code, _out, err = run_cli(["whatif", str(bad), "--json"])
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"hpcwatch: {bad}")
    assert "\x1b" not in err


def test_an_untouched_file_is_skipped_without_being_read_again(tmp_path, monkeypatch):
    from hpcwatch import ingest
    from hpcwatch.ingest import ingest_paths

    # sacct JSON: its records do not take the file's time (squeue's running jobs do: touched, it is a new snapshot)
    path = tmp_path / "sacct.json"
    path.write_bytes((DATA / "slurm" / "sacct.json").read_bytes())
    with Store(tmp_path / "s") as store:
        assert ingest_paths(store, [path]).by_status() == {"stored": 1}
        jobs = len(store.jobs())
        monkeypatch.setattr(ingest, "source_key", lambda item: pytest.fail("hashed an untouched file"))
        assert ingest_paths(store, [path]).by_status() == {"already": 1}
        monkeypatch.undo()
        os.utime(path, ns=(time.time_ns(), time.time_ns()))  # touched: hashed again, same content: still once
        assert ingest_paths(store, [path]).by_status() == {"already": 1}
        assert jobs > 0 and len(store.jobs()) == jobs


_WRITER = """
import sys, time
from hpcwatch.model import reference_cluster
from hpcwatch.store import Store
from hpcwatch.twin import Twin
twin = Twin(reference_cluster(), seed=3, start=1_767_225_600.0)
with Store(sys.argv[1]) as store:
    deadline = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < deadline:   # a live twin: one commit a tick
        twin.advance(10.0)
        store.add_sample_table(twin.sample_table())
        store.add(r for r in twin.records() if type(r).__name__ != "Sample")
"""


@pytest.mark.slow
def test_every_reader_works_while_a_live_twin_writes(tmp_path):
    """jobs, job, health, scan --db, exporter and serve on a store a live twin commits to every tick."""
    import httpx

    db = tmp_path / "live"
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(db), "40"], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (db / "manifest.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        for args in (["jobs", "--json"], ["health", "--json"], ["scan", "--json"]):
            done = _run(*args, "--db", str(db))
            assert done.returncode == 0, (args, done.stderr)
        port = free_port()
        server = subprocess.Popen(
            [*HPCWATCH, "serve", "--db", str(db), "--port", str(port), "--duration", "25"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        exporter = subprocess.Popen(
            [*HPCWATCH, "exporter", "--db", str(db), "--port", str(port + 1), "--duration", "25"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            live = _get_when_up(f"http://127.0.0.1:{port}/api/live", httpx)
            metrics = _get_when_up(f"http://127.0.0.1:{port + 1}/metrics", httpx)
            assert live.status_code == 200 and live.json()["gpus"]
            assert metrics.status_code == 200 and "hpcwatch_job_gpu_hours" in metrics.text
        finally:
            for proc in (server, exporter):
                proc.terminate()
                proc.wait(timeout=20)
    finally:
        writer.terminate()
        writer.wait(timeout=20)


def _get_when_up(url: str, httpx, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return httpx.get(url, timeout=10)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
