"""``hpcwatch ingest``: counts per kind, JSON output, and one-line errors that keep earlier files."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest
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
    # 9 dcgm samples + 9 nvidia-smi readings and 5 of its PCIe link + 504 OST + 240 MDT job stats + elapsed and
    # limit of 3 running jobs
    assert doc["files"] == 6 and doc["jobs"] == 10 and doc["events"] == 2 and doc["empty_files"] == 1
    assert doc["samples"] == 9 + 9 + 5 + 504 + 240 + 2 * 3
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


def test_a_bad_file_in_a_folder_is_named_and_the_good_ones_after_it_are_stored(run_cli, tmp_path):
    """A spool folder of real files with one bad Prometheus scrape in the middle (sorted order): the walk
    used to stop at it, so the files after it were never read and every later run stopped there again."""
    spool = tmp_path / "spool"
    spool.mkdir()
    real = {
        "a_dcgm.prom": DATA / "prometheus" / "dcgm_exporter_l40s_kubernetes_dcgm226.prom",
        "n_jobs.json": DATA / "slurm" / "slurmweb_25.11_v0044_slurm_jobs.json",
        "z_squeue.json": DATA / "slurm" / "squeue.json",
    }
    for name, source in real.items():
        (spool / name).write_bytes(source.read_bytes())
    bad = spool / "m_bad.prom"
    bad.write_text("# TYPE up gauge\nup 1\nup{broken 2\n")
    other_bad = spool / "sub" / "also_bad.prom"  # a second one, in a sub-folder: named too
    other_bad.parent.mkdir()
    other_bad.write_text("# TYPE up gauge\nup{x= 1\n")
    db = tmp_path / "s"
    code, out, err = run_cli(["ingest", str(spool), "--db", str(db), "--json"])
    assert code == 2
    first, second = err.splitlines()  # one line per bad file, in walk order
    assert first == (
        f"hpcwatch: {bad}:3: not a sample line (want: name{{labels}} value [timestamp_ms]) (found: 'up{{broken 2')"
    )
    assert second.startswith(f"hpcwatch: {other_bad}:2: ")
    doc = orjson.loads(out)
    assert [f["path"] for f in doc["bad_files"]] == [str(bad), str(other_bad)]
    assert doc["files"] == 3 and doc["status"] == {"stored": 3, "bad": 2}
    with Store(db) as store:
        assert {s.path for s in store.sources()} == {str(spool / name) for name in real}
        assert store.job("9").user == "alice"  # squeue.json: after the bad file
        assert store.samples("up").num_rows == 0  # nothing of the bad files
    code, out, err = run_cli(["ingest", str(spool), "--db", str(db)])  # the next cron run: same answer
    assert code == 2 and len(err.splitlines()) == 2 and "files: bad" in out and "files: already" in out


def test_a_missing_path_given_first_does_not_stop_the_paths_after_it(run_cli, tmp_path):
    missing = tmp_path / "gone.json"
    code, _out, err = run_cli(
        ["ingest", str(missing), str(DATA / "slurm" / "squeue.json"), "--db", str(tmp_path / "s")]
    )
    assert code == 2 and err.splitlines() == [f"hpcwatch: {missing}: no such file or folder"]
    with Store(tmp_path / "s") as store:
        assert len(store.jobs()) == 10


def test_a_symlink_into_proc_or_dev_inside_a_tree_is_passed_over_and_named(run_cli, tmp_path):
    """``ingest /`` (or a tree with a link to /proc) used to walk /proc: a folder per process, /proc/kcore,
    until a file it could not open stopped it (here: /proc/1/cwd, exit 2, the files after it never read)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "proc").symlink_to("/proc")
    (tree / "null").symlink_to("/dev/null")  # a device: refused as one, as before
    (tree / "devices").symlink_to("/dev")
    (tree / "sysfs").symlink_to("/sys/class")
    (tree / "squeue.json").write_bytes((DATA / "slurm" / "squeue.json").read_bytes())
    code, out, err = run_cli(["ingest", str(tree), "--db", str(tmp_path / "s"), "--json"])
    assert code == 0, err
    doc = orjson.loads(out)
    assert doc["jobs"] == 10 and doc["files"] == 1
    assert {s["path"]: s["reason"].split(",")[0] for s in doc["skipped"]} == {
        str(tree / "null"): "a device",
        str(tree / "devices"): "in /dev",
        str(tree / "proc"): "in /proc",
        str(tree / "sysfs"): "in /sys",
    }
    code, out, err = run_cli(["ingest", str(tree), "--db", str(tmp_path / "t")])
    # the terminal may wrap the long path anywhere: compare without whitespace
    said = f"skipped: {tree / 'proc'}: in /proc, a kernel pseudo-filesystem"
    assert code == 0 and "".join(said.split()) in "".join(out.split()), out


@pytest.mark.parametrize("given", ["/proc", "/proc/self/status", "/sys", "/dev"])
def test_a_pseudo_filesystem_given_directly_is_refused_in_one_line(run_cli, tmp_path, given):
    code, _out, err = run_cli(["ingest", given, str(DATA / "slurm" / "squeue.json"), "--db", str(tmp_path / "s")])
    root = "/" + given.split("/")[1]
    assert code == 2 and err.splitlines() == [
        f"hpcwatch: {given}: in {root}, a kernel pseudo-filesystem (live kernel state, not saved files): refused; "
        "copy a file out of it to read it (cp /proc/driver/nvidia/params node1/)"
    ]
    with Store(tmp_path / "s") as store:
        assert len(store.jobs()) == 10  # the path after it is still read
