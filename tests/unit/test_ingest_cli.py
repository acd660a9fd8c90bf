"""``hpcwatch ingest``: counts per kind, JSON output, and one-line errors that keep earlier files."""

from __future__ import annotations

import subprocess
import sys

import orjson
from click.testing import CliRunner

from hpcwatch.cli import app
from hpcwatch.store import Store
from tests.conftest import DATA

GOOD = [
    DATA / "prometheus" / "dcgm_exporter_node1.prom",
    DATA / "slurm" / "squeue.json",
    DATA / "nvidia_smi" / "nvidia_smi_q_with_processes.xml",
    DATA / "lustre",
    DATA / "infiniband" / "perfquery_x_empty.out",
]


def test_ingest_json_counts_each_kind(tmp_path):
    db = tmp_path / "s.duckdb"
    result = CliRunner().invoke(app, ["ingest", *map(str, GOOD), "--db", str(db), "--json"])
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.stdout)
    # 9 dcgm samples + 9 nvidia-smi readings + 504 OST + 240 MDT job stats + elapsed and limit of 3 running jobs
    assert doc["files"] == 6 and doc["jobs"] == 10 and doc["events"] == 2 and doc["empty_files"] == 1
    assert doc["samples"] == 9 + 9 + 504 + 240 + 2 * 3
    assert doc["formats"] == {"lustre-job-stats": 2, "nvidia-smi-xml": 1, "prometheus": 1, "squeue-json": 1}
    with Store(db) as store:
        assert store.job("9").gpus_by_node == {"node1": (6, 7), "node2": (0, 1)}
        util = store.samples("DCGM_FI_DEV_GPU_UTIL", job="7").to_pylist()
        assert [(r["host"], r["gpu"], r["value"]) for r in util] == [("node1", "0", 97.0)]
        assert [e.attrs["pid"] for e in store.events("gpu_process")] == [48213, 50977]


def test_ingest_human_output_and_forced_format(tmp_path):
    result = CliRunner().invoke(
        app,
        ["ingest", str(DATA / "slurm" / "sacct.json"), "--format", "sacct-json", "--db", str(tmp_path / "s.duckdb")],
    )
    assert result.exit_code == 0 and "jobs" in result.stdout and "10" in result.stdout


def _hpcwatch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcwatch", *args], capture_output=True, text=True, timeout=120)


def test_garbage_exits_2_with_one_line_and_keeps_the_good_files(tmp_path):
    db = tmp_path / "s.duckdb"
    garbage = tmp_path / "garbage.prom"
    garbage.write_text("# TYPE up gauge\nup 1\nup{broken 2\n")
    done = _hpcwatch("ingest", str(DATA / "slurm" / "squeue.json"), str(garbage), "--db", str(db))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"hpcwatch: {garbage}:3: not a sample line (want: name{{labels}} value [timestamp_ms]) (found: 'up{{broken 2')"
    ]
    with Store(db) as store:
        assert len(store.jobs()) == 10  # the file before the bad one is in
        assert store.samples("up").num_rows == 0  # nothing of the bad file


def test_unknown_binary_file_exits_2_naming_it(tmp_path):
    blob = tmp_path / "core.bin"
    blob.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    done = _hpcwatch("ingest", str(blob), "--db", str(tmp_path / "s.duckdb"))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith(f"hpcwatch: {blob}:1: unknown format")
