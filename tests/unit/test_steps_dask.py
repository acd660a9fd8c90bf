"""``hpcwatch steps DIR --dask local``: the same ``--json`` document as one process, byte for byte.

Real sets: HTA's 2 ranks of a 128-rank NCCL job and our real 4-rank gloo run; twin sets: the
gpu_straggler scenario's kernel-level traces. Each run starts a LocalCluster of 2 worker processes
(~2-3 s), so the sets are few and small; benchmarks/bench_steps_dask.py runs 1,024 ranks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import hpcwatch

pytest.importorskip("distributed", reason="the dask extra is not installed")

_ENV = dict(os.environ, PYTHONPATH=str(Path(hpcwatch.__file__).parents[1]))


def _steps(*argv: str) -> subprocess.CompletedProcess:
    """``hpcwatch steps ARGV`` as typed, in a fresh process (the Dask workers are processes too)."""
    return subprocess.run(
        [sys.executable, "-m", "hpcwatch", "steps", *argv], capture_output=True, text=True, env=_ENV, timeout=240
    )


@pytest.fixture(scope="module")
def twin_straggler_set(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("twin")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcwatch",
            "twin",
            "run",
            "--out",
            str(out / "run"),
            "--duration",
            "60",
            "--scenario",
            "gpu_straggler",
            "--traces",
            str(out / "traces"),
            "--json",
        ],
        capture_output=True,
        text=True,
        env=_ENV,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    return out / "traces"


@pytest.mark.parametrize("which", ["hta_sampled_2ranks", "gloo_straggler", "twin_gpu_straggler"])
def test_dask_local_gives_the_json_of_one_process(which, data_dir, request):
    folder = request.getfixturevalue("twin_straggler_set") if which.startswith("twin") else data_dir / "kineto" / which
    alone = _steps(str(folder), "--json")
    on_dask = _steps(str(folder), "--json", "--dask", "local", "--workers", "2")
    assert alone.returncode == 0 and on_dask.returncode == 0, on_dask.stderr
    assert on_dask.stdout == alone.stdout
    assert "ranks reduced on 2 workers" in on_dask.stderr
    import orjson

    assert orjson.loads(on_dask.stdout)["whatif"]["dp_size"] > 1  # the what-if is part of what is identical
    if which.startswith("twin"):  # the scenario's straggler is found through the reduced tables
        assert [s["evidence"] for s in orjson.loads(on_dask.stdout)["stragglers"]] == [["gpu_compute", "late_arrival"]]


def test_a_broken_rank_on_a_worker_is_the_one_line_error_of_one_process(tmp_path, data_dir):
    (tmp_path / "rank-0.json").write_bytes((data_dir / "kineto" / "hta_sampled_2ranks" / "rank-0.json.gz").read_bytes())
    (tmp_path / "rank-1.json").write_text('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1}')  # cut short
    alone = _steps(str(tmp_path / "rank-1.json"), "--json")
    on_dask = _steps(str(tmp_path / "rank-1.json"), "--json", "--dask", "local", "--workers", "1")
    assert alone.returncode == on_dask.returncode == 2
    assert on_dask.stderr.strip().splitlines()[-1] == alone.stderr.strip().splitlines()[-1]
    assert on_dask.stderr.strip().splitlines()[-1].startswith(f"hpcwatch: {tmp_path / 'rank-1.json'}")


_PROBE = """
import sys
sys.argv = ["hpcwatch", "steps", *sys.argv[1:]]
from hpcwatch.cli import main
try:
    main()
except SystemExit:
    pass
print("LOADED:", ",".join(m for m in ("dask", "distributed", "dask_jobqueue", "hpcwatch.distributed") if m in sys.modules))
"""


def test_steps_without_dask_imports_nothing_of_dask(data_dir):
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(data_dir / "kineto" / "hta_sampled_2ranks"), "--json"],
        capture_output=True,
        text=True,
        env=_ENV,
        timeout=120,
        check=True,
    )
    assert done.stdout.rstrip().endswith("LOADED:"), done.stdout[-200:]


@pytest.mark.parametrize(
    "argv, says",
    [
        # --workers alone: it sizes a Dask cluster
        (["--workers", "2"], "--workers goes with --dask"),
        # neither local, slurm nor a scheduler address
        (["--dask", "yarn"], "--dask must be local, slurm or tcp://HOST:PORT, got 'yarn'"),
        # no worker to start
        (["--dask", "local", "--workers", "0"], "--workers must be >= 1, got 0"),
    ],
)
def test_bad_dask_options_are_one_line_errors(run_cli, data_dir, argv, says):
    code, _, err = run_cli(["steps", str(data_dir / "kineto" / "hta_sampled_2ranks"), *argv])
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1


def test_dask_refuses_the_hook_s_files(run_cli, data_dir):
    code, _, err = run_cli(["steps", str(data_dir / "kineto" / "gloo_straggler" / "hook"), "--dask", "local"])
    assert code == 2 and "--dask reduces Kineto traces" in err


def test_dask_on_a_running_scheduler_gives_the_json_of_one_process(data_dir):
    from distributed import LocalCluster

    folder = str(data_dir / "kineto" / "hta_sampled_2ranks")
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        on_dask = _steps(folder, "--json", "--dask", cluster.scheduler_address)
    alone = _steps(folder, "--json")
    assert on_dask.returncode == 0, on_dask.stderr
    assert on_dask.stdout == alone.stdout and "reduced on 1 workers" in on_dask.stderr
