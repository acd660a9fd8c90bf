"""What ``hpcwatch_health_verdict`` would cost a scrape judged live, and what it costs read from the stored runs.

The exporter publishes the newest run of ``hpcwatch collect``'s health task (reports.health.latest_health)
instead of judging the window on every scrape (reports.health.node_health): this measures both on a twin store of
N nodes holding 15 minutes of samples at a 15 s scrape (in-process, wall clock, best of 3), the stored read
after RUNS health runs were stored.

    .venv/bin/python benchmarks/bench_health_scrape.py --nodes 32 --runs 200
"""

from __future__ import annotations

import argparse
import time

from hpcwatch.cli.twinserve import sized_cluster
from hpcwatch.records import Event
from hpcwatch.reports.health import DEFAULT_HEALTH_WINDOW_S, latest_health, node_health, verdict_event_attrs
from hpcwatch.store import Store
from hpcwatch.twin import Twin
from hpcwatch.vocab import EventKind

SCRAPE_S = 15.0


def _best_of(n: int, fn) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--runs", type=int, default=200, help="health runs stored before the stored read is timed")
    args = parser.parse_args()
    twin = Twin(sized_cluster(args.nodes), seed=1)
    store = Store(":memory:")
    for _ in range(int(DEFAULT_HEALTH_WINDOW_S / SCRAPE_S)):
        twin.advance(SCRAPE_S)
        store.add_sample_table(twin.sample_table())
    rows = store.query("SELECT count(*) FROM samples")[0][0]
    live = _best_of(3, lambda: node_health(store))
    attrs = verdict_event_attrs(node_health(store))
    for i in range(args.runs):
        store.add([Event(kind=EventKind.HEALTH_VERDICT, t=1.8e9 + 600.0 * i, source="bench", attrs=a) for a in attrs])
    stored = _best_of(3, lambda: latest_health(store))
    print(
        f"{args.nodes} nodes, {rows} sample rows: judged live {live:.2f} s; "
        f"stored ({args.runs} runs x {len(attrs)} events): {stored * 1000:.1f} ms"
    )


if __name__ == "__main__":
    main()
