"""deploy/slurm/prolog and epilog, run as Slurm would run them: environment variables in, files out."""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "slurm"
PROLOG = DEPLOY / "prolog"
EPILOG = DEPLOY / "epilog"

pytestmark = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("flock") is None, reason="needs bash and flock(1) (util-linux)"
)


def run(script: Path, mapdir: Path | str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "CUDA_VISIBLE"))}
    clean.update(env, DCGM_HPC_JOB_MAPPING_DIR=str(mapdir), SLURMD_NODENAME="node1")
    return subprocess.run([str(script)], env=clean, capture_output=True, text=True, timeout=30)


def mapping(mapdir: Path) -> dict[str, list[str]]:
    return {p.name: p.read_text().split() for p in sorted(mapdir.iterdir())}


def test_prolog_writes_one_file_per_gpu_with_the_job_id(tmp_path):
    result = run(PROLOG, tmp_path / "map", SLURM_JOB_ID="9", SLURM_JOB_GPUS="0,1", CUDA_VISIBLE_DEVICES="5")
    assert result.returncode == 0
    assert mapping(tmp_path / "map") == {"0": ["9"], "1": ["9"]}  # SLURM_JOB_GPUS wins


def test_prolog_falls_back_to_cuda_visible_devices_and_expands_ranges(tmp_path):
    run(PROLOG, tmp_path, SLURM_JOB_ID="4", CUDA_VISIBLE_DEVICES="2-4,7")
    assert mapping(tmp_path) == {"2": ["4"], "3": ["4"], "4": ["4"], "7": ["4"]}


def test_mig_instance_names_pass_through_and_uuids_are_skipped(tmp_path):
    result = run(PROLOG, tmp_path, SLURM_JOB_ID="12", SLURM_JOB_GPUS="2.0,MIG-6f1c-aaaa,../etc")
    assert result.returncode == 0
    assert mapping(tmp_path) == {"2.0": ["12"]}
    assert "MIG-6f1c-aaaa" in result.stderr and "../etc" in result.stderr


def test_two_jobs_on_one_node_and_a_shared_gpu(tmp_path):
    run(PROLOG, tmp_path, SLURM_JOB_ID="7", SLURM_JOB_GPUS="0,1")
    run(PROLOG, tmp_path, SLURM_JOB_ID="8", SLURM_JOB_GPUS="1,2")
    assert mapping(tmp_path) == {"0": ["7"], "1": ["7", "8"], "2": ["8"]}
    run(EPILOG, tmp_path, SLURM_JOB_ID="7", SLURM_JOB_GPUS="0,1")
    assert mapping(tmp_path) == {"1": ["8"], "2": ["8"]}
    run(EPILOG, tmp_path, SLURM_JOB_ID="8", SLURM_JOB_GPUS="1,2")
    assert mapping(tmp_path) == {}


def test_prolog_twice_does_not_duplicate_the_line(tmp_path):
    for _ in range(2):
        run(PROLOG, tmp_path, SLURM_JOB_ID="3", SLURM_JOB_GPUS="0")
    assert mapping(tmp_path) == {"0": ["3"]}


def test_epilog_leaves_a_file_that_names_another_job(tmp_path):
    (tmp_path / "0").write_text("15\n")  # GPU 0 already went to job 15
    result = run(EPILOG, tmp_path, SLURM_JOB_ID="14", SLURM_JOB_GPUS="0")
    assert result.returncode == 0
    assert mapping(tmp_path) == {"0": ["15"]}


def test_epilog_without_gpu_variables_still_cleans_its_own_lines(tmp_path):
    run(PROLOG, tmp_path, SLURM_JOB_ID="21", SLURM_JOB_GPUS="3,4")
    run(EPILOG, tmp_path, SLURM_JOB_ID="21")
    assert mapping(tmp_path) == {}


def test_epilog_does_not_remove_a_job_whose_id_is_a_prefix(tmp_path):
    (tmp_path / "0").write_text("210\n")
    run(EPILOG, tmp_path, SLURM_JOB_ID="21")
    assert mapping(tmp_path) == {"0": ["210"]}


@pytest.mark.parametrize("script", [PROLOG, EPILOG], ids=["prolog", "epilog"])
def test_missing_variables_exit_zero_and_write_nothing(tmp_path, script):
    result = run(script, tmp_path / "map")
    assert result.returncode == 0
    assert "SLURM_JOB_ID" in result.stderr
    assert not (tmp_path / "map").exists()


def test_cpu_only_job_writes_nothing(tmp_path):
    result = run(PROLOG, tmp_path / "map", SLURM_JOB_ID="5")
    assert result.returncode == 0 and not (tmp_path / "map").exists()


@pytest.mark.parametrize("script", [PROLOG, EPILOG], ids=["prolog", "epilog"])
def test_unusable_directory_exits_zero_and_says_why(tmp_path, script):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run(script, blocker / "map", SLURM_JOB_ID="5", SLURM_JOB_GPUS="0")
    assert result.returncode == 0
    if script is PROLOG:
        assert "not a writable directory" in result.stderr


def test_no_temp_files_are_left_behind(tmp_path):
    run(PROLOG, tmp_path, SLURM_JOB_ID="1", SLURM_JOB_GPUS="0,1,2,3")
    run(EPILOG, tmp_path, SLURM_JOB_ID="1")
    assert list(tmp_path.iterdir()) == []


def test_concurrent_prologs_sharing_a_gpu_lose_no_line(tmp_path):
    jobs = [str(100 + i) for i in range(12)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(lambda j: run(PROLOG, tmp_path, SLURM_JOB_ID=j, SLURM_JOB_GPUS="0"), jobs))
    assert sorted(mapping(tmp_path)["0"]) == jobs
    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(lambda j: run(EPILOG, tmp_path, SLURM_JOB_ID=j, SLURM_JOB_GPUS="0"), jobs[:-1]))
    assert mapping(tmp_path) == {"0": [jobs[-1]]}
