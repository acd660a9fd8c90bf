"""Scrapes of ``hpcwatch exporter`` while the twin writes its store in real time: what a Prometheus waits.

Builds (or reuses) a store of ``--history`` seconds of the live twin at ``--nodes`` nodes, starts one exporter
process per ``--tree`` (a source tree, run as ``python -m hpcwatch exporter --db STORE`` with that tree first on
``PYTHONPATH``: this tree and a base checkout, in the same run), then writes a tick a second into the store and
every ``--every`` seconds scrapes each exporter in turn, in a shuffled order: each scrape's wall time
(HTTP request to the last byte, whole process), the collect time the exporter reports
(``hpcwatch_exporter_collect_seconds``, in process) and each exporter's CPU over the run.

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
from hpcwatch.store import Store
from hpcwatch.twin.live import LiveTwin


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tree: Path, store: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{tree}/src"}
    argv = [sys.executable, "-m", "hpcwatch", "exporter", "--db", str(store), "--port", str(port)]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _scrape(port: int) -> tuple[float, float]:
    """(wall seconds of one GET /metrics, the collect seconds the exporter reported)."""
    start = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3600) as answer:
        body = answer.read().decode()
    wall = time.perf_counter() - start
    collect = next(
        float(line.split()[1]) for line in body.splitlines() if line.startswith("hpcwatch_exporter_collect_seconds ")
    )
    return wall, collect


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
    args = parser.parse_args()
    trees = args.tree or [Path(__file__).resolve().parents[1]]
    shutil.rmtree(args.store, ignore_errors=True)
    store = Store(str(args.store))
    started = time.perf_counter()
    live = build_store(store, args.nodes, args.history)
    print(f"store: {args.nodes} nodes, {args.history} s in {time.perf_counter() - started:.0f} s", flush=True)
    ports = {tree: _free_port() for tree in trees}
    exporters = {tree: _start(tree, args.store, ports[tree]) for tree in trees}
    for tree, process in exporters.items():
        _wait_listening(ports[tree], process)
    cpu0 = {tree: _cpu_ticks(p.pid) for tree, p in exporters.items()}
    clock0 = time.monotonic()
    stop = threading.Event()
    ticker = _ticking(live, stop)
    times: dict[Path, list[tuple[float, float]]] = {tree: [] for tree in trees}
    rng = random.Random(1)
    try:
        for n in range(args.scrapes):
            if n:
                time.sleep(args.every)
            order = list(trees)
            rng.shuffle(order)
            for tree in order:
                times[tree].append(_scrape(ports[tree]))
            shown = {tree.name: f"{times[tree][-1][0]:.2f} s ({times[tree][-1][1]:.2f})" for tree in trees}
            print(f"scrape {n}: {shown} load {os.getloadavg()[0]:.2f}", flush=True)
        wall = time.monotonic() - clock0
        for tree, process in exporters.items():
            cpu = (_cpu_ticks(process.pid) - cpu0[tree]) / os.sysconf("SC_CLK_TCK")
            later = [w for w, _ in times[tree][1:]]
            print(
                f"{tree}: first scrape {times[tree][0][0]:.2f} s; the next {len(later)}: median "
                f"{statistics.median(later):.2f} s, max {max(later):.2f} s; CPU {cpu / wall:.3f} core",
                flush=True,
            )
    finally:
        stop.set()
        ticker.join()
        for process in exporters.values():
            process.terminate()
            process.wait()
        store.close()


if __name__ == "__main__":
    main()
