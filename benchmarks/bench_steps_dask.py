"""``hpcwatch steps`` on a 1,024-rank twin trace set: one process against ``--dask local``, and a projection to N workers.

    .venv/bin/python benchmarks/bench_steps_dask.py [--ranks 1024] [--steps 10] [--workers 2] [--json OUT]

What is measured, all on this machine in the same run:

- ``twin_write_s``: ``hpcwatch twin traces --ranks R`` (whole process, as typed);
- ``set_s_single`` / ``set_s_dask_local``: ``hpcwatch steps D --json`` and ``hpcwatch steps D --json
  --dask local --workers W``, whole process as typed (wall clock, best of ``--repeat``), with the peak
  RSS of the process tree (sampled from /proc every 20 ms with psutil); the two ``--json`` outputs must
  be byte-identical, or the benchmark fails;
- ``per_rank_reduce_s``: in this process, ``reduce_trace_file`` (read + per-step anatomy + kernel and
  collective tables) over every rank of the set, divided by the ranks;
- ``cross_rank_s``: the cross-rank step on the reduced set (``reduced_report`` + the JSON document);
- ``per_task_overhead_s`` and ``cluster_start_s``: a LocalCluster of W workers started here, and a map
  of a task that does nothing over R items (Dask's own cost per task; "about 1 ms" in
  https://distributed.dask.org/en/latest/).

Projection (``projected``, seconds for the whole set on N one-thread workers, each on its own core,
traces on a shared file system at the read speed measured here):

    T(N) = fixed_s + R · per_rank_reduce_s / N + R · per_task_overhead_s + cross_rank_s

the reduce parallelises; the scheduler's per-task cost and the cross-rank step, both in the client
process, do not. ``fixed_s`` is measured: ``steps --dask local`` on two ranks of the set, whole process
(Dask's import, the cluster's start and stop, hpcwatch's import in each worker). It is a model, not a
measurement: a Slurm cluster adds the jobs' queueing time, workers sharing a file server read slower
than one process on a local disk, and ``projected[W]`` beside the measured ``set_s_dask_local`` says how
far the model is on this machine (``load_average``: a shared machine makes both noisy).
"""

from __future__ import annotations

import argparse
import json
import os
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
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcwatch", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_ENV
    )
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


def reduce_and_cross_s(folder: Path) -> tuple[float, float]:
    """(mean seconds of ``reduce_trace_file`` over every rank, seconds of the cross-rank step), in this process."""
    from hpcwatch.reports.steps import reduce_trace_file, reduced_report, steps_document

    paths = sorted(folder.glob("rank-*.json"))
    t0 = time.perf_counter()
    reductions = [reduce_trace_file(p)[0] for p in paths]
    per_rank = (time.perf_counter() - t0) / len(paths)
    t1 = time.perf_counter()
    report, clock, gpus = reduced_report(reductions)
    steps_document(report, breakdowns=[r.breakdown for r in reductions if r.breakdown], clock=clock, per_rank=gpus)
    return per_rank, time.perf_counter() - t1


def dask_costs(workers: int, tasks: int) -> tuple[float, float]:
    """(seconds to start and stop a LocalCluster of ``workers``, seconds per no-op task over ``tasks``)."""
    from distributed import Client, LocalCluster

    t0 = time.perf_counter()
    with (
        LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
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
    ap.add_argument("--json", type=Path, help="write the figures here (docs/scale.md reads them)")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]  # the machine may be shared: the figures are only as quiet as it was
    with tempfile.TemporaryDirectory(prefix="bench-steps-dask-") as tmp:
        folder = Path(tmp) / "traces"
        write_s, _, _ = timed(
            [
                "twin",
                "traces",
                "--out",
                str(folder),
                "--ranks",
                str(args.ranks),
                "--steps",
                str(args.steps),
                "--slow-rank",
                str(args.ranks // 2 + 5),
                "--json",
            ]
        )
        size = sum(p.stat().st_size for p in folder.glob("rank-*.json"))
        single = [timed(["steps", str(folder), "--json"]) for _ in range(args.repeat)]
        dask = [
            timed(["steps", str(folder), "--json", "--dask", "local", "--workers", str(args.workers)])
            for _ in range(args.repeat)
        ]
        outputs = {out for _, _, out in single + dask}
        assert len(outputs) == 1, "steps --dask local and one process gave different --json documents"
        straggler = json.loads(single[0][2])["stragglers"]
        reduce_s, cross_s = reduce_and_cross_s(folder)
        tiny = Path(tmp) / "two-ranks"
        tiny.mkdir()
        for name in ("rank-0.json", "rank-1.json"):
            (tiny / name).symlink_to(folder / name)
        # The fixed cost of a --dask run, as typed: Dask's import, the cluster's start and stop, hpcwatch's
        # import in each worker, on a set of two ranks.
        fixed_s = min(
            timed(["steps", str(tiny), "--json", "--dask", "local", "--workers", str(args.workers)])[0]
            for _ in range(args.repeat)
        )
    start_s, task_s = dask_costs(args.workers, args.ranks)
    dask_s = min(w for w, _, _ in dask)
    projected = {
        n: round(fixed_s + args.ranks * reduce_s / n + args.ranks * task_s + cross_s, 2) for n in PROJECTED_WORKERS
    }
    figures = {
        "ranks": args.ranks,
        "steps": args.steps,
        "bytes": size,
        "workers": args.workers,
        "cpus": os.cpu_count(),
        "twin_write_s": round(write_s, 2),
        "set_s_single": round(min(w for w, _, _ in single), 2),
        "set_s_dask_local": round(dask_s, 2),
        "peak_rss_bytes_single": max(r for _, r, _ in single),
        "peak_rss_bytes_dask_local": max(r for _, r, _ in dask),
        "identical": True,
        "straggler_found": [s["rank"] for s in straggler],
        "per_rank_reduce_s": round(reduce_s, 4),
        "cross_rank_s": round(cross_s, 3),
        "cluster_start_s": round(start_s, 2),
        "per_task_overhead_s": round(task_s, 5),
        "fixed_s": round(fixed_s, 2),
        "projected": projected,
        "projection": "T(N) = fixed_s + ranks*per_rank_reduce_s/N + ranks*per_task_overhead_s + cross_rank_s "
        "(fixed_s: steps --dask local on two ranks of the set, whole process)",
        "load_average": {"start": load0, "end": os.getloadavg()[0]},
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
