"""Ingest as a user runs it: `hpcwatch ingest FILE --db D` on 100 MB and 1 GB of dcgm-exporter text,
then readers (`hpcwatch jobs --db D --json`) while another ingest writes.

    .venv/bin/python benchmarks/bench_ingest.py [--sizes-mb 100 1000] [--readers 4] [--workdir /tmp/bench-ingest]

Every figure is the whole process (start-up included) unless it says in-process. Peak RSS is the
child's ru_maxrss (Linux: KiB). Goals (issue "One way in"): >= 100 MB/s of text into the store,
RSS < 500 MB whatever the file size; readers never fail while a writer commits.
The input is one real-shaped scrape of a 128-node cluster (the twin's dcgm-exporter text, as
dcgm-exporter writes it) repeated with a timestamp per line, so every copy is a new set of samples.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HPCWATCH = [sys.executable, "-m", "hpcwatch"]


def _scrape_lines() -> list[str]:
    from hpcwatch.cli.twinserve import sized_cluster
    from hpcwatch.twin import Twin
    from hpcwatch.twin.exposition import scrape_all

    twin = Twin(sized_cluster(128), seed=1)
    twin.advance(10.0)
    text = "".join(dcgm for _, dcgm, _ in scrape_all(twin, timestamp=False))
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def write_input(path: Path, size_mb: int) -> int:
    """A Prometheus text file of about ``size_mb`` MB; returns its size in bytes."""
    lines = _scrape_lines()
    if not lines:
        raise SystemExit("bench_ingest: the twin gave no dcgm-exporter lines")
    t_ms, written = 1_767_225_600_000, 0
    with path.open("w") as out:
        while written < size_mb * 1_000_000:
            block = "\n".join(f"{ln} {t_ms}" for ln in lines) + "\n"
            out.write(block)
            written += len(block)
            t_ms += 10_000
    return path.stat().st_size


def run_measured(args: list[str]) -> tuple[float, int, subprocess.CompletedProcess]:
    """(wall s, peak RSS KiB of the child, result) of one hpcwatch command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    done = subprocess.run(HPCWATCH + args, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if done.returncode != 0:
        raise SystemExit(f"hpcwatch {' '.join(args)} failed: {done.stderr.strip()}")
    return wall, max(peak, before), done


def bench_size(work: Path, size_mb: int) -> None:
    src = work / f"dcgm_{size_mb}mb.prom"
    size = src.stat().st_size if src.exists() else write_input(src, size_mb)
    db = work / f"store_{size_mb}"
    shutil.rmtree(db, ignore_errors=True)
    wall, rss_kib, _ = run_measured(["ingest", str(src), "--db", str(db), "--json"])
    again, _, _done = run_measured(["ingest", str(src), "--db", str(db), "--json"])
    print(
        f"{size / 1e6:8.0f} MB: ingest {wall:6.2f} s = {size / 1e6 / wall:6.1f} MB/s, peak RSS "
        f"{rss_kib / 1024:6.0f} MiB (whole process); re-ingest (already in the store) {again:5.2f} s"
    )


def bench_readers(work: Path, readers: int) -> None:
    """Readers in a loop while one ingest writes the 100 MB file into the same store."""
    src = work / "dcgm_100mb.prom"
    if not src.exists():
        write_input(src, 100)
    db = work / "store_concurrent"
    shutil.rmtree(db, ignore_errors=True)
    subprocess.run(
        HPCWATCH + ["ingest", "--db", str(db), str(Path(__file__).parents[1] / "tests/data/slurm/squeue.json")],
        check=True,
        capture_output=True,
    )
    latencies: list[float] = []
    failures: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            done = subprocess.run(HPCWATCH + ["jobs", "--db", str(db), "--json"], capture_output=True, text=True)
            latencies.append(time.perf_counter() - t0)
            if done.returncode != 0:
                failures.append(done.stderr.strip()[:200])

    threads = [threading.Thread(target=reader) for _ in range(readers)]
    for t in threads:
        t.start()
    wall, _, _ = run_measured(["ingest", str(src), "--db", str(db)])
    stop.set()
    for t in threads:
        t.join()
    q = statistics.quantiles(latencies, n=20) if len(latencies) >= 20 else [max(latencies)] * 19
    print(
        f"{readers} readers during a {wall:.1f} s ingest: {len(latencies)} `hpcwatch jobs` runs, "
        f"p50 {statistics.median(latencies):.2f} s, p95 {q[18]:.2f} s (whole process), {len(failures)} failed"
        + (f": {failures[0]}" if failures else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench-ingest"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    print(f"calibration: sum(range(10**7)) {_calibrate() * 1000:.0f} ms; cores {os.cpu_count()}")
    for size in args.sizes_mb:
        bench_size(args.workdir, size)
    bench_readers(args.workdir, args.readers)


def _calibrate() -> float:
    t0 = time.perf_counter()
    sum(range(10**7))
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
