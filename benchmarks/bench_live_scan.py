"""What one live security scan costs once its window is full (issue 27 "Live at scale": the demo's scan process).

    PYTHONPATH=src:. .venv/bin/python benchmarks/bench_live_scan.py [--nodes 1024] [--ticks 320] [--between 13]
        [--runs 3]

In process. The demo's live twin (``LiveTwin``, seed 0, an in-memory store) steps ``--ticks`` ticks (320: the
scan's 300 s window full), a ``security.scan.LiveScan`` reads them once, then, ``--runs`` times: the twin steps
``--between`` ticks (what arrives between two scans at the demo's pace) and the scan is timed in two parts, its
read of the new rows (``read_s``: the query, the rows cut into series, their grouping, what leaves the window)
and the detectors over the window (``detect_s``); then the twin steps ``--between`` ticks again and one whole
scan is timed as the demo's scan process runs it (``scan_s``: ``web.scanprocess._unpaused``, the garbage
collector held off during the scan). Process CPU seconds, median of the runs; ``held`` is the samples the window
holds.

The demo runs the scan at most a quarter of the time and at most every 10 s (``web.scanprocess``): a scan that
costs more than 10 s x 0.25 / 0.75 = 3.3 s of its process runs as often as its cost allows, so its CPU share
stays at the cap and a cheaper scan is a fresher one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

from hpcwatch.security.scan import LiveScan
from hpcwatch.store import Store
from hpcwatch.twin.live import LiveTwin
from hpcwatch.web.demo import cluster_with_nodes
from hpcwatch.web.scanprocess import _unpaused


def _cpu_s(fn) -> float:
    started = time.process_time()
    fn()
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--ticks", type=int, default=320)
    parser.add_argument("--between", type=int, default=13)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    store = Store(":memory:")
    live = LiveTwin(store, cluster_with_nodes(args.nodes), seed=0)
    for _ in range(args.ticks):
        live.step()
    scan = LiveScan()
    scan(store)
    reads, detections, scans = [], [], []
    for _ in range(args.runs):
        for _ in range(args.between):
            live.step()
        reads.append(_cpu_s(lambda: scan._read_new(store)))
        detections.append(_cpu_s(lambda: scan(store)))  # nothing new to read: the detectors alone
        for _ in range(args.between):
            live.step()
        scans.append(_cpu_s(lambda: _unpaused(scan, store)))
    out = {
        "nodes": args.nodes,
        "ticks": args.ticks,
        "between": args.between,
        "held": scan.held,
        "read_s": round(statistics.median(reads), 2),
        "detect_s": round(statistics.median(detections), 2),
        "scan_s": round(statistics.median(scans), 2),
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "load_avg_1m": os.getloadavg()[0],
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
