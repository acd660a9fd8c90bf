"""Store benchmark, run by hand: ``PYTHONPATH=src python benchmarks/bench_store.py [--rows N] [--live-commits N]``.

Prints, each phase in its own process (so peak RSS is that phase's):

1. ingest: rows/s committed for ``--rows`` samples through ``add_sample_table`` in 64k chunks inside one
   transaction, and the process' peak RSS (with the baseline after imports);
2. read: latency of ``store.samples(metric)`` on that store;
3. readers: ``--readers`` processes querying in a loop while one writer commits every 0.5 s: their
   query latency p50/p95 and the failed queries;
4. live: ``--live-commits`` commits of 1 Hz live data (one part per table each) written back to back,
   then the part count and the read latency (a simulated hour by default);
5. beside a compactor: one process commits ``--big-commits`` parts of 100k rows (its compactions merge
   tiers of up to a few 100k rows) while a second commits 2,000 rows every 50 ms; the second's commit
   latency p50/p95/max is what a compaction makes other writers wait.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main"]

CHUNK_ROWS = 64 * 1024
METRICS = [f"DCGM_FI_DEV_METRIC_{i}" for i in range(20)]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _chunk(start: int, rows: int):
    import numpy as np
    import pyarrow as pa

    from hpcwatch.schemas import SAMPLE_SCHEMA

    i = np.arange(start, start + rows)
    metric = pa.array(METRICS).take(pa.array(i % len(METRICS)))
    host = pa.array([f"node{n}" for n in range(16)]).take(pa.array((i // 20) % 16))
    gpu = pa.array([str(g) for g in range(8)]).take(pa.array((i // 320) % 8))
    labels = pa.array(['{"gpu":"0","Hostname":"node0","modelName":"NVIDIA H100 80GB HBM3"}'] * rows)
    return pa.table(
        [metric, pa.array(i / 10.0), pa.array(np.sin(i) * 100.0), host, gpu, pa.nulls(rows, pa.string()), labels],
        schema=SAMPLE_SCHEMA,
    )


def _ingest(path: str, rows: int) -> dict:
    from hpcwatch.store import SourceMark, Store

    base = _rss_mb()
    store = Store(path)
    started = time.perf_counter()
    with store.transaction(source=SourceMark(key="bench", path="bench", format="synthetic")) as tx:
        for start in range(0, rows, CHUNK_ROWS):
            tx.add_sample_table(_chunk(start, min(CHUNK_ROWS, rows - start)))
    elapsed = time.perf_counter() - started
    store.close()
    return {
        "rows": rows,
        "seconds": round(elapsed, 2),
        "rows_per_s": round(rows / elapsed),
        "rss_baseline_mb": round(base),
        "rss_peak_mb": round(_rss_mb()),
    }


def _read(path: str, repeats: int = 10) -> dict:
    from hpcwatch.store import Store

    with Store(path) as store:
        started = time.perf_counter()
        store.query("SELECT count(*) FROM samples")
        first_s = time.perf_counter() - started
        latencies, rows = [], 0
        for i in range(repeats):
            started = time.perf_counter()
            rows = store.samples(METRICS[i % len(METRICS)]).num_rows
            latencies.append(time.perf_counter() - started)
        started = time.perf_counter()
        ((count,),) = store.query("SELECT count(*) FROM samples")
        count_s = time.perf_counter() - started
        return {
            "samples_metric_rows": rows,
            "samples_metric_ms_p50": _ms(statistics.median(latencies)),
            "samples_metric_ms_max": _ms(max(latencies)),
            "count_rows": count,
            "count_ms": _ms(count_s),
            "parts": store.part_counts()["samples"],
            "first_query_ms": _ms(first_s),
        }


def _reader(path: str, seconds: float) -> dict:
    from hpcwatch.store import Store

    store, latencies, failed = Store(path), [], 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        try:
            store.samples(METRICS[len(latencies) % len(METRICS)], t0=0.0)
            store.query("SELECT count(*), max(t) FROM samples")
        except Exception:  # the benchmark counts them; the tests assert there are none
            failed += 1
        latencies.append(time.perf_counter() - started)
    store.close()
    return {"latencies": latencies, "failed": failed}


def _writer(path: str, seconds: float) -> dict:
    from hpcwatch.store import Store

    store, commits, start = Store(path), 0, 10**7
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        store.add_sample_table(_chunk(start + commits * 2000, 2000))
        commits += 1
        time.sleep(0.5)
    store.close()
    return {"commits": commits}


def _live(path: str, commits: int) -> dict:
    from hpcwatch.records import Event, Job
    from hpcwatch.store import Store

    store, commit_s = Store(path), []
    for c in range(commits):  # one second of a 16-node twin: 2560 samples, a few events, the jobs seen again
        started = time.perf_counter()
        with store.transaction() as tx:
            tx.add_sample_table(_chunk(c * 2560, 2560))
            tx.add([Event(kind="heartbeat", t=float(c), source="twin"), Job(id=str(c % 7), state="RUNNING")])
        commit_s.append(time.perf_counter() - started)
    store.close()
    result = {
        "commits": commits,
        "commit_ms_p50": _ms(statistics.median(commit_s)),
        "commit_ms_p95": _ms(_quantile(commit_s, 0.95)),
        "commit_ms_max": _ms(max(commit_s)),
    }
    return result | {"after": _read(path)}


def _big_writer(path: str, commits: int) -> dict:
    from hpcwatch.store import Store

    store, started = Store(path), time.perf_counter()
    for c in range(commits):
        store.add_sample_table(_chunk(c * 100_000, 100_000))
    store.close()
    return {"commits": commits, "s": round(time.perf_counter() - started, 2)}


def _small_writer(path: str, stop_file: str) -> dict:
    from hpcwatch.store import Store

    store, latencies, start = Store(path), [], 10**8
    while not os.path.exists(stop_file):
        began = time.perf_counter()
        store.add_sample_table(_chunk(start + len(latencies) * 2000, 2000))
        latencies.append(time.perf_counter() - began)
        time.sleep(0.05)
    store.close()
    return {"latencies": latencies}


def _beside_compactor(path: str, big_commits: int) -> dict:
    from hpcwatch.store import Store

    Store(path).close()
    stop = Path(path).parent / "stop-small-writer"
    small = subprocess.Popen(
        [sys.executable, __file__, "--phase", "small_writer", path, str(stop)], stdout=subprocess.PIPE, text=True
    )
    time.sleep(1.0)  # its imports
    big = _phase("big_writer", path, big_commits)
    stop.touch()
    latencies = json.loads(small.communicate()[0])["latencies"]
    return {
        "big_writer": big,
        "small_commits": len(latencies),
        "small_commit_ms_p50": _ms(statistics.median(latencies)),
        "small_commit_ms_p95": _ms(_quantile(latencies, 0.95)),
        "small_commit_ms_max": _ms(max(latencies)),
    }


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _phase(name: str, *args: object) -> dict:
    """Run one phase in a fresh interpreter, so its peak RSS is its own."""
    done = subprocess.run(
        [sys.executable, __file__, "--phase", name, *map(str, args)], check=True, capture_output=True, text=True
    )
    return json.loads(done.stdout)


def _concurrent(path: str, readers: int, seconds: float) -> dict:
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--phase", "reader", path, str(seconds)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(readers)
    ]
    writer = _phase("writer", path, seconds)
    reports = [json.loads(p.communicate()[0]) for p in procs]
    latencies = [x for r in reports for x in r["latencies"]]
    return {
        "readers": readers,
        "writer_commits": writer["commits"],
        "queries": len(latencies),
        "failed": sum(r["failed"] for r in reports),
        "query_ms_p50": _ms(statistics.median(latencies)),
        "query_ms_p95": _ms(_quantile(latencies, 0.95)),
    }


PHASES = {
    "ingest": lambda p, n: _ingest(p, int(n)),
    "read": lambda p: _read(p),
    "reader": lambda p, s: _reader(p, float(s)),
    "writer": lambda p, s: _writer(p, float(s)),
    "live": lambda p, n: _live(p, int(n)),
    "big_writer": lambda p, n: _big_writer(p, int(n)),
    "small_writer": lambda p, stop: _small_writer(p, stop),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--reader-seconds", type=float, default=10.0)
    parser.add_argument("--live-commits", type=int, default=3600)
    parser.add_argument("--big-commits", type=int, default=64)
    parser.add_argument("--only", nargs="+", help="phases to run (default: all)")
    parser.add_argument("--dir", default=None, help="where the stores go (default: a temporary folder)")
    parser.add_argument("--phase", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(PHASES[args.phase[0]](*args.phase[1:])))
        return
    print(f"cpus: {os.cpu_count()}", flush=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        big, live = str(Path(folder) / "big"), str(Path(folder) / "live")
        phases = {
            "ingest": lambda: _phase("ingest", big, args.rows),
            "read": lambda: _phase("read", big),
            "readers": lambda: _concurrent(big, args.readers, args.reader_seconds),
            "live": lambda: _phase("live", live, args.live_commits),
            "beside_compactor": lambda: _beside_compactor(str(Path(folder) / "two"), args.big_commits),
        }
        for name, run in phases.items():
            if args.only and name not in args.only:
                continue
            print(f"{name}: {json.dumps(run())}", flush=True)


if __name__ == "__main__":
    main()
