"""``hpcwatch steps`` on a 1,024-rank twin trace set: one process against ``--dask local``, and a projection to N workers.

    .venv/bin/python benchmarks/bench_steps_dask.py [--ranks 1024] [--steps 10] [--workers 2] [--json OUT]

What is measured, all on this machine in the same run:

- ``twin_write_s``: ``hpcwatch twin traces --ranks R`` (whole process, as typed);
- ``set_s_single`` / ``set_s_dask_local``: ``hpcwatch steps D --json`` and ``hpcwatch steps D --json
  --dask local --workers W``, whole process as typed (wall clock, best of ``--repeat``), with the peak
  RSS of the process tree (sampled from /proc every 20 ms with psutil); the two ``--json`` outputs must
  be byte-identical, or the benchmark fails;
- ``per_rank_reduce_s``: in this process, the median of ``reduce_trace_file`` (read + per-step anatomy +
  kernel and collective tables) over ``--sample`` ranks;
- ``cross_rank_s``: the cross-rank step on the reduced set (``reduced_report`` + the JSON document);
- ``per_task_overhead_s`` and ``cluster_start_s``: a LocalCluster of W workers started here, and a map
  of a task that does nothing over R items (Dask's own cost per task; "about 1 ms" in
  https://distributed.dask.org/en/latest/).

Projection (``projected``, seconds for the whole set on N one-thread workers, each on its own core,
traces on a shared file system at the read speed measured here):

    T(N) = fixed_s + R · per_rank_reduce_s / N + R · per_task_overhead_s + cross_rank_s

the reduce parallelises; the scheduler's per-task cost and the cross-rank step, both in the client
process, do not. ``fixed_s`` is calibrated on the measured run: ``set_s_dask_local`` less its other
terms at N = W (cluster start, Dask's import in the client, hpcwatch's in each worker), never under
``cluster_start_s``. It is a model, not a measurement: a Slurm cluster adds the jobs' queueing time,
and workers sharing a file server read slower than one process on a local disk.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_ENV = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
#: Worker counts the projection is given for.
PROJECTED_WORKERS = (2, 8, 32, 128, 512, 1024)


def _tree_rss_bytes(pid: int) -> int:
    import psutil
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def timed(argv: list[str]) -> tuple[float, int, str]:
    """(wall seconds, peak RSS of the process tree in bytes, stdout) of ``hpcwatch ARGV``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "hpcwatch", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_ENV)
    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss_bytes(proc.pid))
            done.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"hpcwatch {' '.join(argv)} failed: {err.decode()[-2000:]}")
    return wall, peak[0], out.decode()


def per_rank_reduce_s(folder: Path, sample: int) -> tuple[float, list]:
    from hpcwatch.reports.steps import reduce_trace_file
    paths = sorted(folder.glob("rank-*.json"))
    chosen = paths[:: max(1, len(paths) // sample)][:sample]
    times = []
    for p in chosen:
        t0 = time.perf_counter()
        reduce_trace_file(p)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), paths


def cross_rank_s(paths: list[Path]) -> float:
    from hpcwatch.cli.steps import steps_document
    from hpcwatch.reports.steps import reduce_trace_file, reduced_report
    reductions = [reduce_trace_file(p)[0] for p in paths]
    t0 = time.perf_counter()
    report, clock, per_rank = reduced_report(reductions)
    steps_document(report, breakdowns=[r.breakdown for r in reductions if r.breakdown], clock=clock, per_rank=per_rank)
    return time.perf_counter() - t0


def dask_costs(workers: int, tasks: int) -> tuple[float, float]:
    """(seconds to start and stop a LocalCluster of ``workers``, seconds per no-op task over ``tasks``)."""
    from distributed import Client, LocalCluster
    t0 = time.perf_counter()
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(workers)
        started = time.perf_counter() - t0
        t1 = time.perf_counter()
        client.gather(client.map(_nothing, range(tasks), pure=False))
        per_task = (time.perf_counter() - t1) / tasks
    return started, per_task


def _nothing(x: int) -> int:
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--sample", type=int, default=64, help="ranks timed for the per-rank reduce")
    ap.add_argument("--json", type=Path, help="write the figures here (docs/scale.md reads them)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-steps-dask-") as tmp:
        folder = Path(tmp) / "traces"
        write_s, _, _ = timed(["twin", "traces", "--out", str(folder), "--ranks", str(args.ranks), "--steps",
                               str(args.steps), "--slow-rank", str(args.ranks // 2 + 5), "--json"])
        size = sum(p.stat().st_size for p in folder.glob("rank-*.json"))
        single = [timed(["steps", str(folder), "--json"]) for _ in range(args.repeat)]
        dask = [timed(["steps", str(folder), "--json", "--dask", "local", "--workers", str(args.workers)])
                for _ in range(args.repeat)]
        outputs = {out for _, _, out in single + dask}
        assert len(outputs) == 1, "steps --dask local and one process gave different --json documents"
        straggler = json.loads(single[0][2])["stragglers"]
        reduce_s, paths = per_rank_reduce_s(folder, args.sample)
        cross_s = cross_rank_s(paths)
    start_s, task_s = dask_costs(args.workers, args.ranks)
    dask_s = min(w for w, _, _ in dask)
    # What the measured run spent beyond the model's parallel and per-task terms: starting the cluster,
    # importing Dask in the client and hpcwatch in each worker, reading the directory, printing.
    fixed_s = max(dask_s - args.ranks * reduce_s / args.workers - args.ranks * task_s - cross_s, start_s)
    projected = {n: round(fixed_s + args.ranks * reduce_s / n + args.ranks * task_s + cross_s, 2)
                 for n in PROJECTED_WORKERS}
    figures = {
        "ranks": args.ranks, "steps": args.steps, "bytes": size, "workers": args.workers, "cpus": os.cpu_count(),
        "twin_write_s": round(write_s, 2),
        "set_s_single": round(min(w for w, _, _ in single), 2),
        "set_s_dask_local": round(dask_s, 2),
        "peak_rss_bytes_single": max(r for _, r, _ in single),
        "peak_rss_bytes_dask_local": max(r for _, r, _ in dask),
        "identical": True,
        "straggler_found": [s["rank"] for s in straggler],
        "per_rank_reduce_s": round(reduce_s, 4), "cross_rank_s": round(cross_s, 3),
        "cluster_start_s": round(start_s, 2), "per_task_overhead_s": round(task_s, 5), "fixed_s": round(fixed_s, 2),
        "projected": projected,
        "projection": "T(N) = fixed_s + ranks*per_rank_reduce_s/N + ranks*per_task_overhead_s + cross_rank_s "
                      "(fixed_s: the measured --dask local run less its other terms, at least cluster_start_s)",
        "load_average": os.getloadavg()[0],
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
