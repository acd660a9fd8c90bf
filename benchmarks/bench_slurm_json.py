"""Ingest a big ``sacct --json`` document as a user runs it: `hpcwatch ingest FILE --db D` on ~100 MB and
~1 GB, reporting the whole process's peak RSS and MB/s.

    .venv/bin/python benchmarks/bench_slurm_json.py [--sizes-mb 100 1000] [--one-line] [--workdir /tmp/bench-slurm]

The document repeats the real jobs of tests/data/slurm (``sacct.json``, ``sacct_requeued.json``: Slurm 22.05;
the Slurm-web ``slurmdb`` captures: 24.05 and 25.11) with distinct job ids, pretty-printed as sacct prints it
(``--one-line``: all on one line, the worst case for a reader that counts lines). Peak RSS is the child's
``ru_maxrss`` from ``os.wait4`` (Linux: KiB), start-up included. Goal (issue #22 item 17): < 500 MB at 1 GB.
The input is deleted afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "slurm"
SOURCES = [
    "sacct.json",
    "sacct_requeued.json",
    "slurmweb_24.05_v0041_slurmdb_job_gpus_multi_nodes.json",
    "slurmweb_25.11_v0044_slurmdb_job_completed.json",
    "slurmweb_25.11_v0044_slurmdb_job_gpus_multi_nodes.json",
]
HPCWATCH = [sys.executable, "-m", "hpcwatch"]


def _real_jobs() -> list[dict]:
    jobs = []
    for name in SOURCES:
        if (DATA / name).exists():
            jobs += json.loads((DATA / name).read_text())["jobs"]
    if not jobs:
        raise SystemExit("bench_slurm_json: no sacct JSON in tests/data/slurm")
    return jobs


def _renumbered(job: dict, job_id: int) -> dict:
    job = dict(job, job_id=job_id)
    if isinstance(job.get("array"), dict):  # not an array task, or it would keep its array id
        job["array"] = dict(job["array"], job_id=0, task_id=None)
    return job


def write_input(path: Path, size_mb: int, *, one_line: bool) -> int:
    """A sacct --json document of about ``size_mb`` MB; returns its size in bytes."""
    jobs, indent = _real_jobs(), None if one_line else 2
    sep = "," if one_line else ",\n"
    written, job_id = 0, 1_000_000
    with path.open("w") as out:
        head = '{"meta": {"plugin": {"type": "openapi/dbv0.0.38"}}, "errors": [], "jobs": ['
        out.write(head if one_line else head + "\n")
        first = True
        while written < size_mb * 1_000_000:
            for job in jobs:
                text = json.dumps(_renumbered(job, job_id), indent=indent)
                out.write(text if first else sep + text)
                written += len(text) + 2
                first, job_id = False, job_id + 1
        out.write("]}\n")
    return path.stat().st_size


def run_measured(args: list[str], work: Path) -> tuple[float, int, str]:
    """(wall s, peak RSS KiB, stdout) of one hpcwatch command, the child's own rusage (``os.wait4``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with (work / "stdout").open("w+") as out, (work / "stderr").open("w+") as err:
        t0 = time.perf_counter()
        child = subprocess.Popen(HPCWATCH + args, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - t0
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        if child.returncode != 0:
            raise SystemExit(f"hpcwatch {' '.join(args)} failed: {err.read()[-2000:]}")
        return wall, usage.ru_maxrss, out.read()


def bench_size(work: Path, size_mb: int, *, one_line: bool, keep: bool) -> None:
    src = work / f"sacct_{size_mb}mb{'_one_line' if one_line else ''}.json"
    size = src.stat().st_size if src.exists() else write_input(src, size_mb, one_line=one_line)
    db = work / f"store_{size_mb}"
    shutil.rmtree(db, ignore_errors=True)
    try:
        wall, rss_kib, out = run_measured(["ingest", str(src), "--db", str(db), "--json"], work)
        doc = json.loads(out)
        counts = {k: doc.get(k) for k in ("jobs", "events", "samples")}
        print(
            f"{size / 1e6:7.0f} MB{' one line' if one_line else ''}: ingest {wall:7.1f} s = "
            f"{size / 1e6 / wall:5.1f} MB/s, peak RSS {rss_kib / 1024:6.0f} MiB (whole process); {counts}",
            flush=True,
        )
    finally:
        shutil.rmtree(db, ignore_errors=True)
        if not keep:
            src.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--one-line", action="store_true", help="the whole document on one line")
    parser.add_argument("--keep", action="store_true", help="keep the generated inputs")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench-slurm"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(args.workdir).free
    if free < 3 * max(args.sizes_mb) * 1_000_000:
        raise SystemExit(f"bench_slurm_json: {free / 1e9:.1f} GB free in {args.workdir}, want 3x the largest input")
    print(f"cores {os.cpu_count()}; inputs repeat {len(_real_jobs())} real jobs of {DATA}")
    for size in args.sizes_mb:
        bench_size(args.workdir, size, one_line=args.one_line, keep=args.keep)


if __name__ == "__main__":
    main()
