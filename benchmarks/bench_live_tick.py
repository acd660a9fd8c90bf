"""CPU of one live tick of ``hpcwatch demo`` by part (issue 27 "Live at scale"), in process.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_live_tick.py [--nodes 128 1024] [--ticks 20]

Per size, the demo's live twin (``LiveTwin``, seed 0, an in-memory store) steps ``--ticks`` ticks after a
warm-up of 3, and the security scanner (``LiveScan``, 300 s window) runs every 10th tick, as ``demo``'s
defaults do at 1 Hz. Each part's process CPU time is summed and divided by the ticks: the twin's
``advance``, ``sample_table``, the store writes (the sample table's commit and compaction, then jobs, spans
and events), and the scanner (its cost amortised over the 10 ticks between two scans). The snapshot and the
web server are not run. Prints one JSON line per size.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from hpcwatch.security.scan import LiveScan
from hpcwatch.store import Store
from hpcwatch.twin.live import LiveTwin
from hpcwatch.web.demo import cluster_with_nodes

SCAN_EVERY_TICKS = 10
WARM_TICKS = 3


def _timed(spent: dict[str, float], part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, adding the process CPU time each call takes to ``spent[part]``."""

    def run(*args: Any, **kwargs: Any) -> Any:
        started = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[part] += time.process_time() - started

    return run


def per_tick(nodes: int, ticks: int) -> dict[str, Any]:
    """CPU ms per tick of each part at ``nodes`` nodes (the scanner's amortised over the ticks between scans)."""
    store = Store(":memory:")
    live = LiveTwin(store, cluster_with_nodes(nodes), seed=0, start=1.8e9)
    scan = LiveScan()
    for _ in range(WARM_TICKS):
        live.step()
    scan(store)  # the first scan reads the warm-up; the measured ones read ten ticks each, as in the demo
    spent: dict[str, float] = defaultdict(float)
    twin = live.twin
    twin.advance = _timed(spent, "advance", twin.advance)  # type: ignore[method-assign]
    twin.sample_table = _timed(spent, "sample_table", twin.sample_table)  # type: ignore[method-assign]
    store.add_sample_table = _timed(spent, "store_samples", store.add_sample_table)  # type: ignore[method-assign]
    store.add = _timed(spent, "store_records", store.add)  # type: ignore[method-assign]
    started = time.process_time()
    for tick in range(1, ticks + 1):
        live.step()
        if tick % SCAN_EVERY_TICKS == 0:
            _timed(spent, "scan", scan)(store)
    total = time.process_time() - started
    out = {part: round(1000 * s / ticks, 1) for part, s in sorted(spent.items())}
    return {"nodes": nodes, "ticks": ticks, "ms_per_tick": out, "total_ms_per_tick": round(1000 * total / ticks, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--ticks", type=int, default=20, help="a multiple of 10: whole scan periods")
    args = parser.parse_args()
    for nodes in args.nodes:
        print(json.dumps({**per_tick(nodes, args.ticks), "load": round(os.getloadavg()[0], 2)}), flush=True)


if __name__ == "__main__":
    main()
