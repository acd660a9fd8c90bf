"""``hpcwatch steps DIR --dask slurm``: the per-rank reduce runs in Slurm jobs on node1 and node2 of the real Slurm
(dask-jobqueue's SLURMCluster submits them with sbatch), and the document is the one-process one, byte for byte.

While the command runs, the test polls ``squeue --json`` and records the worker jobs and their nodes;
with accounting on, ``sacct`` must list them afterwards too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import hpcwatch

pytestmark = pytest.mark.integration
pytest.importorskip("dask_jobqueue", reason="the dask extra is not installed")

_DATA = Path(__file__).parents[1] / "data" / "kineto"
#: dask-jobqueue names its jobs after the worker: ``dask-worker`` (its default job name).
_JOB_NAME = "dask-worker"


def _watch_jobs(slurm, seen: dict[str, str], stop: threading.Event) -> None:
    """Record job id -> node list of every running dask-worker job until ``stop`` is set."""
    while not stop.is_set():
        done = slurm.run("squeue", "--json", check=False)
        if done.returncode == 0:
            for job in json.loads(done.stdout).get("jobs", []):
                state = job["job_state"] if isinstance(job["job_state"], str) else job["job_state"][0]
                if job.get("name") == _JOB_NAME and state == "RUNNING":
                    seen[str(job["job_id"])] = job.get("nodes", "")
        stop.wait(0.3)


def test_steps_on_slurm_workers_gives_the_json_of_one_process(slurm, tmp_path):
    env = {**slurm.env, "PYTHONPATH": str(Path(hpcwatch.__file__).parents[1])}
    folder = _DATA / "gloo_straggler"
    cmd = [sys.executable, "-m", "hpcwatch", "steps", str(folder), "--json"]
    alone = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert alone.returncode == 0, alone.stderr
    seen: dict[str, str] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_jobs, args=(slurm, seen, stop), daemon=True)
    watcher.start()
    t0 = time.monotonic()
    try:
        on_slurm = subprocess.run(
            [
                *cmd,
                "--dask",
                "slurm",
                "--workers",
                "2",
                "--slurm-partition",
                "gpu",
                "--slurm-interface",
                "lo",
                "--slurm-memory",
                "1GiB",
                "--slurm-walltime",
                "00:10:00",
                "--slurm-python",
                sys.executable,
                "--slurm-local-dir",
                str(tmp_path / "scratch"),
                "--slurm-log-dir",
                str(tmp_path / "logs"),
                "--slurm-job-extra=--exclusive",
                "--dask-timeout",
                "120",
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=300,
        )
    finally:
        stop.set()
        watcher.join(timeout=10)
    elapsed_s = time.monotonic() - t0
    assert on_slurm.returncode == 0, on_slurm.stderr[-3000:]
    assert on_slurm.stdout == alone.stdout
    assert "ranks reduced on 2 workers" in on_slurm.stderr and "Slurm jobs" in on_slurm.stderr
    named = on_slurm.stderr.split("Slurm jobs", 1)[1].split()
    assert set(named) <= set(seen) and len(named) == 2, (named, seen)
    assert sorted(seen[j] for j in named) == ["node1", "node2"], seen  # --exclusive: one worker job per node
    if slurm.accounting == "dbd":  # the jobs are in the accounting too; dask-jobqueue scancels them at the end
        # (JobName is not compared: slurmdbd 22.05 records these cancelled batch jobs as "allocation")
        listed = slurm.run("sacct", "-n", "-X", "-P", "-o", "JobID,NodeList,State", "-j", ",".join(named)).stdout
        rows = {tuple(line.split("|")[:2]) for line in listed.split("\n") if line}
        assert rows == {(j, seen[j]) for j in named}, listed
    print(f"steps --dask slurm: {elapsed_s:.1f} s for {len(list(folder.glob('*.json.gz')))} ranks, jobs {seen}")
