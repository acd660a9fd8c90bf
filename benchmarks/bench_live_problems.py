"""What the live page's problems cost as the health window fills (issue 27 "Live at scale").

    PYTHONPATH=src:. .venv/bin/python benchmarks/bench_live_problems.py [--nodes 128] [--ticks 900] [--runs 3]
        [--between 10]
    PYTHONPATH=src:. .venv/bin/python benchmarks/bench_live_problems.py --demo 300 [--nodes 128]

In process (the default): the demo's live twin (``LiveTwin``, seed 0, an in-memory store) steps ``--ticks``
ticks (900: the health rules' 15-minute window full), then one judgement of the problems
(``web.live.ProblemJudge``: health rules, straggler, findings, state inputs) and one snapshot without them,
each the process CPU time, median of ``--runs``. A judge's first judgement reads the whole window
(``judgement_cpu_s``); ``next_judgement_cpu_s``: the same judge's next ones, the twin stepping ``--between``
ticks before each (what lands between two judgements in the demo: they start 5 s apart at least, and a
judgement that took d s is followed by the next 4d after it began), each reading only what landed since
(``reports.healthwindow``).

``--stream S [--warm W]``: whole process, the stream as a viewer gets it: the demo started, ``W`` seconds
left to it (the window filling), then one SSE viewer for ``S`` seconds: the events it got (``live``: a whole
snapshot, ``delta``: a change) and the longest and the median gap between two.

``--demo S``: whole process instead. ``hpcwatch demo --nodes N`` started as the browser tests start it, then
``GET /api/live`` every 10 s for S seconds: each answer's time and the snapshot's own ``query_ms``, then the
demo's CPU seconds over the S seconds. Run it beside ``stress-ng --cpu 2`` for the loaded figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
import urllib.request

from hpcwatch.store import Store
from hpcwatch.twin.live import LiveTwin
from hpcwatch.web.demo import cluster_with_nodes
from hpcwatch.web.live import LiveView, ProblemJudge


def _cpu_s(fn) -> float:
    started = time.process_time()
    fn()
    return time.process_time() - started


def in_process(nodes: int, ticks: int, runs: int, between: int) -> dict[str, object]:
    store = Store(":memory:")
    cluster = cluster_with_nodes(nodes)
    live = LiveTwin(store, cluster, seed=0, start=1.8e9)
    for _ in range(ticks):
        live.step()
    ((samples,),) = store.query("SELECT count(*) FROM samples")
    view = LiveView(store, cluster, min_interval_s=0)
    view.snapshot()  # the first judgement, made in the snapshot; the next ones are not due within the runs
    now = view.latest_t()
    assert now is not None
    judgements = [_cpu_s(lambda: ProblemJudge(store).current(now, None)) for _ in range(runs)]
    snapshots = [_cpu_s(view.snapshot) for _ in range(runs)]
    judge, nexts = ProblemJudge(store), []
    judge.current(now, None)
    for _ in range(runs):
        for _ in range(between):
            live.step()
        judge._next_at = None  # due now, and judged in this thread (as the first one is)
        nexts.append(_cpu_s(lambda: judge.current(now, None)))
    return {
        "nodes": nodes,
        "ticks": ticks,
        "samples": samples,
        "judgement_cpu_s": round(statistics.median(judgements), 2),
        "between_ticks": between,
        "next_judgement_cpu_s": round(statistics.median(nexts), 2),
        "snapshot_cpu_s": round(statistics.median(snapshots), 3),
    }


def _process_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def whole_process(nodes: int, seconds: float) -> dict[str, object]:
    from tests.integration.test_browser import _start_demo, _stop

    proc, url = _start_demo("--nodes", str(nodes))
    try:
        cpu0, t0, answers = _process_cpu_s(proc.pid), time.monotonic(), []
        while time.monotonic() - t0 < seconds:
            asked = time.monotonic()
            with urllib.request.urlopen(url + "api/live", timeout=300) as response:
                doc = json.loads(response.read())
            took = time.monotonic() - asked
            answers.append({"at_s": round(asked - t0), "answer_s": round(took, 2), "query_ms": doc.get("query_ms")})
            print(json.dumps(answers[-1]), flush=True)
            time.sleep(max(0.0, 10 - took))
        return {
            "nodes": nodes,
            "seconds": round(time.monotonic() - t0),
            "cpu_s": round(_process_cpu_s(proc.pid) - cpu0, 1),
        }
    finally:
        _stop(proc)


def stream(nodes: int, seconds: float, warm_s: float) -> dict[str, object]:
    from tests.integration.test_browser import _start_demo, _stop

    proc, url = _start_demo("--nodes", str(nodes))
    events: dict[str, int] = {}
    gaps: list[float] = []

    def read() -> None:
        with urllib.request.urlopen(url + "api/stream", timeout=seconds + 60) as response:
            last = time.monotonic()
            for line in response:
                if line.startswith(b"event: "):
                    kind = line[7:].strip().decode()
                    events[kind] = events.get(kind, 0) + 1
                    gaps.append(time.monotonic() - last)
                    last = time.monotonic()

    try:
        time.sleep(warm_s)
        threading.Thread(target=read, daemon=True).start()
        time.sleep(seconds)
        return {
            "nodes": nodes,
            "warm_s": warm_s,
            "seconds": seconds,
            "events": events,
            "max_gap_s": round(max(gaps), 1) if gaps else None,
            "median_gap_s": round(statistics.median(gaps), 2) if gaps else None,
        }
    finally:
        _stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--ticks", type=int, default=900)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--between", type=int, default=10, help="ticks between two judgements of one judge")
    parser.add_argument("--demo", type=float, metavar="S", help="whole process: the demo asked for S seconds")
    parser.add_argument("--stream", type=float, metavar="S", help="whole process: one SSE viewer for S seconds")
    parser.add_argument("--warm", type=float, default=200.0, help="seconds the demo runs before --stream reads")
    args = parser.parse_args()
    if args.stream:
        result = stream(args.nodes, args.stream, args.warm)
    elif args.demo:
        result = whole_process(args.nodes, args.demo)
    else:
        result = in_process(args.nodes, args.ticks, args.runs, args.between)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
