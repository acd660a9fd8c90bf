"""Scrapes of ``hpcwatch exporter`` while the twin writes its store in real time: what a Prometheus waits.

Builds (or reuses) a store of ``--history`` seconds of the live twin at ``--nodes`` nodes, starts one exporter
process per ``--tree`` (a source tree, run as ``python -m hpcwatch exporter --db STORE`` with that tree first on
``PYTHONPATH``: this tree and a base checkout, in the same run), then writes a tick a second into the store and
every ``--every`` seconds scrapes each exporter in turn, in a shuffled order: each scrape's wall time
(HTTP request to the last byte, whole process), the collect time the exporter reports
(``hpcwatch_exporter_collect_seconds``, in process), the lines it served and each exporter's CPU over the run.
``--ended-within`` (repeatable) starts one exporter of each tree per window given (``inf``: every job);
``--old-jobs N`` records N jobs that ended in the 90 days before the store's first sample, as a store months old
holds (their records only: the samples of their time would take days to write). ``--restart``: after the
scrapes, each exporter is stopped and started again, and scraped until it serves the per-job figures (the
time from its start, whole process: what Prometheus misses after an upgrade).

    .venv/bin/python benchmarks/bench_exporter.py --nodes 1024 --history 600 --scrapes 8 --every 15 \\
        --tree /work/main --tree /tmp/base
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from bench_jobpage import build_store
from bench_web import _cpu_ticks
from hpcwatch.records import Job
from hpcwatch.store import Store
from hpcwatch.twin.live import LiveTwin


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tree: Path, window: str | None, store: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{tree}/src"}
    argv = [sys.executable, "-m", "hpcwatch", "exporter", "--db", str(store), "--port", str(port)]
    argv += ["--ended-within", window] if window is not None else []
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _scrape(port: int) -> tuple[float, float, int]:
    """(wall seconds of one GET /metrics, the collect seconds the exporter reported, the lines it served)."""
    start = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3600) as answer:
        body = answer.read().decode()
    wall = time.perf_counter() - start
    collect = next(
        float(line.split()[1]) for line in body.splitlines() if line.startswith("hpcwatch_exporter_collect_seconds ")
    )
    return wall, collect, body.count("\n")


def _wait_listening(port: int, process: subprocess.Popen) -> None:
    while process.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"exporter exited: {process.stderr.read().decode() if process.stderr else ''}")


def _ticking(live: LiveTwin, stop: threading.Event) -> threading.Thread:
    def tick() -> None:
        due = time.monotonic()
        while not stop.is_set():
            due += 1.0
            live.step()
            stop.wait(max(0.0, due - time.monotonic()))

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    return thread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--history", type=int, default=600, help="seconds of the twin in the store before scraping")
    parser.add_argument("--scrapes", type=int, default=8)
    parser.add_argument("--every", type=float, default=15.0, help="seconds between rounds of scrapes")
    parser.add_argument("--tree", type=Path, action="append", help="a source tree to run an exporter of (repeatable)")
    parser.add_argument("--store", type=Path, default=Path("/tmp/hpcwatch-bench-exporter"))
    parser.add_argument("--ended-within", action="append", help="seconds: an exporter of each tree with it")
    parser.add_argument("--old-jobs", type=int, default=0, help="jobs ended in the 90 days before the store")
    parser.add_argument("--restart", action="store_true", help="then restart each exporter, time its figures")
    args = parser.parse_args()
    windows = args.ended_within or [None]
    trees = [(tree, w) for tree in args.tree or [Path(__file__).resolve().parents[1]] for w in windows]
    shutil.rmtree(args.store, ignore_errors=True)
    store = Store(str(args.store))
    started = time.perf_counter()
    live = build_store(store, args.nodes, args.history)
    print(f"store: {args.nodes} nodes, {args.history} s in {time.perf_counter() - started:.0f} s", flush=True)
    if args.old_jobs:
        store.add(_old_jobs(store, args.old_jobs))
    ports = {tree: _free_port() for tree in trees}
    exporters = {tree: _start(*tree, args.store, ports[tree]) for tree in trees}
    for tree, process in exporters.items():
        _wait_listening(ports[tree], process)
    cpu0 = {tree: _cpu_ticks(p.pid) for tree, p in exporters.items()}
    clock0 = time.monotonic()
    stop = threading.Event()
    ticker = _ticking(live, stop)
    times: dict[tuple[Path, str | None], list[tuple[float, float, int]]] = {tree: [] for tree in trees}
    rng = random.Random(1)
    try:
        for n in range(args.scrapes):
            if n:
                time.sleep(args.every)
            order = list(trees)
            rng.shuffle(order)
            for tree in order:
                times[tree].append(_scrape(ports[tree]))
            shown = {_name(tree): "{:.2f} s ({:.2f}), {} lines".format(*times[tree][-1]) for tree in trees}
            print(f"scrape {n}: {shown} load {os.getloadavg()[0]:.2f}", flush=True)
        wall = time.monotonic() - clock0
        for tree, process in exporters.items():
            cpu = (_cpu_ticks(process.pid) - cpu0[tree]) / os.sysconf("SC_CLK_TCK")
            later = [w for w, _, _ in times[tree][1:]]
            print(
                f"{_name(tree)}: first scrape {times[tree][0][0]:.2f} s; the next {len(later)}: median "
                f"{statistics.median(later):.2f} s, max {max(later):.2f} s; CPU {cpu / wall:.3f} core",
                flush=True,
            )
        if args.restart:
            for tree in trees:
                exporters[tree].terminate()
                exporters[tree].wait()
                exporters[tree] = _start(*tree, args.store, ports[tree])
                print(f"{_name(tree)} restarted: {_until_computed(ports[tree], exporters[tree])}", flush=True)
    finally:
        stop.set()
        ticker.join()
        for process in exporters.values():
            process.terminate()
            process.wait()
        store.close()


def _until_computed(port: int, process: subprocess.Popen) -> str:
    """Scrape a process just started until it serves the per-job figures: the seconds from its start."""
    started = time.perf_counter()
    _wait_listening(port, process)
    listening = time.perf_counter() - started
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3600) as answer:
            if 'part="jobs"' in answer.read().decode():
                break
        time.sleep(0.5)
    return f"listening after {listening:.1f} s, per-job figures after {time.perf_counter() - started:.1f} s"


def _old_jobs(store: Store, n: int) -> list[Job]:
    """``n`` jobs of 8 GPUs and an hour, one after another on the cluster's nodes in turn, ended in the 90 days
    before the store's first sample."""
    first = store.time_range()[0] or 0.0
    nodes = sorted({node for job in store.jobs() for node in job.nodes})
    every = 90 * 86_400.0 / n
    return [
        Job(
            id=f"old{k}", user=f"user{k % 50}", account=f"acct{k % 7}", partition="gpu", gpus=8,
            nodes=(nodes[k % len(nodes)],), gpus_by_node={nodes[k % len(nodes)]: tuple(range(8))},
            start=first - 90 * 86_400.0 + k * every, end=first - 90 * 86_400.0 + k * every + 3_600.0,
            state="COMPLETED",
        )
        for k in range(n)
    ]  # fmt: skip


def _name(tree: tuple[Path, str | None]) -> str:
    return str(tree[0]) + (f" --ended-within {tree[1]}" if tree[1] is not None else "")


if __name__ == "__main__":
    main()
