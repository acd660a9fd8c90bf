"""Cost of the web view at 16 nodes / 128 GPUs: SVG drawing, page rendering, one live snapshot.

Run by hand: ``.venv/bin/python benchmarks/bench_web.py [--nodes 16] [--ticks 120]``; prints numbers.
The store is filled by the twin (``--ticks`` simulated seconds), as ``hpcwatch demo`` fills it.
"""

from __future__ import annotations

import argparse
import statistics
import time

from fastapi.testclient import TestClient

from hpcwatch.store import Store
from hpcwatch.twin import Twin
from hpcwatch.web.app import create_app
from hpcwatch.web.demo import cluster_with_nodes, seed_step_player
from hpcwatch.web.i18n import load_catalogue
from hpcwatch.web.live import LiveView
from hpcwatch.web.svg import render_schematic


def _median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--ticks", type=int, default=120)
    args = parser.parse_args()
    cluster = cluster_with_nodes(args.nodes)
    store = Store(":memory:")
    twin = Twin(cluster, seed=0)
    fill = time.perf_counter()
    for _ in range(args.ticks):
        twin.advance(1.0)
        store.add_sample_table(twin.sample_table())     # as hpcwatch.twin.live.LiveTwin writes a tick
        store.add([*twin.jobs, *twin.finished_spans(), *twin.events()])
    fill_s = time.perf_counter() - fill
    (rows,), = store.query("SELECT count(*) FROM samples")
    t = load_catalogue("en")
    print(f"cluster: {len(cluster.nodes)} nodes, {len(cluster.gpus)} GPUs; store: {rows} samples "
          f"({args.ticks} ticks, filled in {fill_s:.1f} s)")
    print(f"svg render: {_median_ms(lambda: render_schematic(cluster, t), 10):.1f} ms, "
          f"{len(render_schematic(cluster, t)) / 1024:.0f} KiB")
    live = LiveView(store, cluster, min_interval_s=0)
    print(f"live snapshot (all queries): {_median_ms(live.snapshot, 10):.1f} ms")
    for part in ("_gpus", "_nodes", "_storage", "_collectors", "_training", "_vectors"):
        now = live._now()
        jobs = live._jobs()
        call = {"_gpus": lambda: live._gpus(now, jobs), "_nodes": lambda: live._nodes(now),
                "_storage": lambda: live._storage(now, jobs), "_collectors": lambda: live._collectors(now),
                "_training": live._training, "_vectors": live._vectors}[part]
        print(f"  {part}: {_median_ms(call, 5):.1f} ms")
    app = create_app(store, cluster, step_jobs=seed_step_player(store, cluster))
    with TestClient(app) as client:
        client.get("/")
        print(f"GET / (server render): {_median_ms(lambda: client.get('/'), 5):.1f} ms, "
              f"{len(client.get('/').content) / 1024:.0f} KiB")
        print(f"GET /api/live: {_median_ms(lambda: client.get('/api/live'), 5):.1f} ms")


if __name__ == "__main__":
    main()
