"""The job page at scale (issue 27: ``GET /job/ID`` < 300 ms at 1,024 nodes), in process and whole request.

Run by hand from the repository root:
``PYTHONPATH=src:. .venv/bin/python benchmarks/bench_jobpage.py --nodes 128 [--ticks 30] [--store DIR]
[--runs 3] [--profile 25] [--json FILE]``.

The store is what ``hpcwatch demo --nodes N`` holds after ``--ticks`` seconds: the live twin's ticks written
as ``twin.live.LiveTwin.write_tick`` writes them (samples, perfquery, jobs, spans, events). With ``--store DIR``
it is written there once and reused by the next runs (a 1,024-node twin takes minutes to build), so before
and after are measured on the same rows. The job is the largest running one, as ``bench_web.py`` picks it.

- **overview_s**: ``reports.jobpage.job_overview`` alone, in this process (median of ``--runs``);
- **overview_peak_growth_mb**: how much the process's peak RSS grew during those overviews (a page's memory;
  0 when building the store in the same run held more);
- **overview_kept_s**: the next page of the job on a server, which keeps the job's settled stretches
  (``reports.jobstretches.KeptStretches``) from the page before: only the last minute or two is read again;
- **page_first_s**: the first ``GET /job/ID`` through the app (Starlette's test client, in this process: the
  request's whole path, routing, access, rendering, but no socket); **page_s** / **api_s**: the next
  ``GET /job/ID`` and ``GET /api/job/ID`` (median of ``--runs``): from the app's overview cache when the
  code has one (the store is not written meanwhile);
- ``--profile N``: cProfile of one ``job_overview``, the N costliest functions by cumulative time;
- ``--growing PAGES`` (``--every K``): instead, on a store the twin keeps writing (``--ticks`` seconds old at the
  first page), PAGES pages of its largest running job K twin seconds apart with one ``KeptStretches``, as a
  server serves them: ``first_page_s`` and ``next_pages_median_s``, in this process; with ``--child``, asked of
  a job pages' process as ``demo`` and ``serve`` ask them (``child_cpu_per_next_page_median_s``);
- ``--restart S``: instead, a server restarted: on a store the twin writes (``--ticks`` seconds old), the largest
  running job's first page asked of a job pages' process (it keeps the job's checkpoints on disk,
  ``reports.checkpointfiles``), the process stopped, S more twin seconds written (the server down), then the job's
  first page asked of a new process twice, alternately: with the checkpoint files the first process left
  (``restarted_first_page_s``) and without them (``cold_first_page_s``, as before they were kept);
- ``--demo S``: instead, ``hpcwatch demo --nodes N`` as ``bench_web.py`` starts it, and after S seconds three
  ``GET /job/ID`` of its largest running job, one after the other (the twin keeps writing meanwhile).

The load average is printed with every figure: the machine is shared.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import resource
import statistics
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from hpcwatch.errors import InputError
from hpcwatch.reports.jobpage import job_overview
from hpcwatch.reports.jobstretches import KeptStretches
from hpcwatch.store import Store
from hpcwatch.twin.live import LiveTwin
from hpcwatch.web.app import create_app
from hpcwatch.web.demo import cluster_with_nodes


def build_store(store: Store, nodes: int, ticks: int) -> LiveTwin:
    """``ticks`` seconds of the live twin at ``nodes`` nodes, written as the demo writes them; the twin, to write
    more."""
    live = LiveTwin(store, cluster_with_nodes(nodes), seed=0)
    live.write_tick()
    for _ in range(ticks):
        live.step()
    return live


def largest_running_job(store: Store) -> str:
    running = [j for j in store.jobs() if j.state == "RUNNING"]
    return max(running, key=lambda j: (j.gpus or 0, j.id)).id


def median_s(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times), 3)


def profile(fn, top: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def in_demo(nodes: int, wait_s: float) -> dict[str, object]:
    """Three ``GET /job/ID`` (seconds, load average before each) in a real demo process, ``wait_s`` after it
    answered."""
    import httpx

    from bench_web import start_demo, stop_demo

    proc, url = start_demo(nodes, 1)
    try:
        time.sleep(wait_s)
        queue = httpx.get(url + "api/live", timeout=300).json().get("queue") or {}
        job = max((j for j in queue.get("jobs", []) if j.get("state") == "RUNNING"), key=lambda j: j.get("gpus") or 0)
        pages = []
        for _ in range(3):
            load = os.getloadavg()[0]
            started = time.perf_counter()
            httpx.get(url + "job/" + job["id"], timeout=300).raise_for_status()
            pages.append((round(time.perf_counter() - started, 2), round(load, 2)))
        return {"nodes": nodes, "job": job["id"], "gpus": job.get("gpus"), "page_s_and_load": pages}
    finally:
        stop_demo(proc)


def _cpu_s(pages_process: Any) -> float:
    """The CPU seconds the job pages' child has used (0 without one)."""
    from bench_web import _cpu_ticks

    if pages_process is None or pages_process._child is None:
        return 0.0
    return _cpu_ticks(pages_process._child.pid) / os.sysconf("SC_CLK_TCK")


def growing(nodes: int, ticks: int, pages: int, every: int, *, child: bool = False) -> dict[str, object]:
    """A server's pages of a job whose store keeps growing, in this process: the twin written ``ticks`` seconds
    into a store on disk (as the demo's), then ``pages`` pages of its largest running job, ``every`` twin
    seconds apart, one ``KeptStretches`` between them (the first page reads the job's life, the next ones
    resume). No other thread runs: the demo's twin, snapshot and judge share the GIL with its pages.
    ``child``: the pages asked of a job pages' process over the same folder (``web.pageprocess``, as ``demo``
    and ``serve`` ask them; its rounds of running jobs off), with the child's CPU per page (its collection after
    the answer included: read 0.3 s after it)."""
    import shutil
    import tempfile

    from hpcwatch.web.pageprocess import PageProcess

    folder = tempfile.mkdtemp(prefix="hpcwatch-bench-jobpage-")
    pages_process = None
    try:
        store = Store(folder)
        live = build_store(store, nodes, ticks)
        job, kept, times, cpu = largest_running_job(store), KeptStretches(), [], []
        if child:
            pages_process = PageProcess(Path(folder), keep_read_jobs=0).start()
        for _ in range(pages):
            for _ in range(every):
                live.step()
            cpu_before = _cpu_s(pages_process)
            started = time.perf_counter()
            if pages_process is not None:
                pages_process.overview(job)
            else:
                job_overview(store, job, kept=kept)
            times.append(time.perf_counter() - started)
            if pages_process is not None:
                time.sleep(0.3)
                cpu.append(_cpu_s(pages_process) - cpu_before)
        store.close()
    finally:
        if pages_process is not None:
            pages_process.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "nodes": nodes,
        "child": child,
        **({"child_cpu_per_next_page_median_s": round(statistics.median(cpu[1:]), 3)} if len(cpu) > 1 else {}),
        "job_age_s": ticks,
        "job": job,
        "first_page_s": round(times[0], 3),
        "next_pages_median_s": round(statistics.median(times[1:]), 3) if len(times) > 1 else None,
        "next_pages_s": [round(t, 3) for t in times[1:]],
        "load_avg_1m": os.getloadavg()[0],
    }


def restarted(nodes: int, ticks: int, down_s: int, rounds: int) -> dict[str, object]:
    """A restarted server's first page of the largest running job, with and without the checkpoint files its
    job pages' process left before the restart (module doc, ``--restart``), each asked of a new job pages'
    process (its start not timed: the server starts it before its first page)."""
    import shutil
    import tempfile

    from hpcwatch.reports.checkpointfiles import FOLDER
    from hpcwatch.web.pageprocess import PageProcess

    folder = Path(tempfile.mkdtemp(prefix="hpcwatch-bench-jobpage-"))
    left = Path(tempfile.mkdtemp(prefix="hpcwatch-bench-checkpoints-")) / FOLDER  # the files before the restart
    try:
        store = Store(folder)
        live = build_store(store, nodes, ticks)
        job = largest_running_job(store)

        def first_page() -> float:
            pages_process = PageProcess(folder, keep_read_jobs=0).start()
            with contextlib.suppress(InputError):  # the child's imports and first store read: before the page
                pages_process.overview("no such job")
            try:
                started = time.perf_counter()
                pages_process.overview(job)
                return time.perf_counter() - started
            finally:
                pages_process.stop()

        before = first_page()  # leaves the files
        for _ in range(down_s):
            live.step()
        shutil.copytree(folder / FOLDER, left)
        restarted_s, cold_s = [], []
        for _ in range(rounds):
            shutil.rmtree(folder / FOLDER)
            cold_s.append(first_page())
            shutil.rmtree(folder / FOLDER)
            shutil.copytree(left, folder / FOLDER)
            restarted_s.append(first_page())
        store.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(left.parent, ignore_errors=True)
    return {
        "nodes": nodes,
        "job": job,
        "job_age_s": ticks + down_s,
        "down_s": down_s,
        "first_page_before_restart_s": round(before, 3),
        "cold_first_page_s": [round(t, 3) for t in cold_s],
        "restarted_first_page_s": [round(t, 3) for t in restarted_s],
        "load_avg_1m": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--ticks", type=int, default=30)
    parser.add_argument("--store", type=Path, help="build the store here once, reuse it after")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", type=int, default=0)
    parser.add_argument("--no-http", action="store_true", help="only the in-process figure")
    parser.add_argument("--demo", type=float, metavar="S", help="measure in a demo process, S s after start")
    parser.add_argument("--growing", type=int, metavar="PAGES", help="PAGES pages of a job whose store grows")
    parser.add_argument("--every", type=int, default=2, help="with --growing: twin seconds between pages")
    parser.add_argument("--child", action="store_true", help="with --growing: ask a job pages' process")
    parser.add_argument("--restart", type=int, metavar="S", help="a server restarted after S twin seconds down")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.demo is not None:
        print(json.dumps(in_demo(args.nodes, args.demo)), flush=True)
        return
    if args.restart is not None:
        print(json.dumps(restarted(args.nodes, args.ticks, args.restart, args.runs)), flush=True)
        return
    if args.growing is not None:
        print(json.dumps(growing(args.nodes, args.ticks, args.growing, args.every, child=args.child)), flush=True)
        return
    fresh = args.store is None or not (args.store / "manifest.json").exists()
    store = Store(args.store or ":memory:")
    out: dict[str, object] = {"nodes": args.nodes}
    if fresh:
        started = time.perf_counter()
        build_store(store, args.nodes, args.ticks)
        out["build_s"] = round(time.perf_counter() - started, 1)
    job = largest_running_job(store)
    record = store.job(job)
    out |= {
        "job": job,
        "job_gpus": record.gpus if record else None,
        "spans": store.query("SELECT count(*) FROM spans")[0][0],
    }
    out["samples"] = store.query("SELECT count(*) FROM samples")[0][0]
    out["load_avg_1m_before"] = os.getloadavg()[0]
    if args.profile:
        print(profile(lambda: job_overview(store, job), args.profile))
    before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out["overview_s"] = median_s(lambda: job_overview(store, job), args.runs)
    # The most this process ever held, less what it held before the overviews: what one page costs in memory
    # when nothing before it held more (a store built in this run may have: then 0). It grows with the job's age.
    out["overview_peak_growth_mb"] = round((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kb) / 1024)
    # The next page of the job, from what a server keeps of it (the job's settled stretches, one page before).
    kept = KeptStretches()
    job_overview(store, job, kept=kept)
    out["overview_kept_s"] = median_s(lambda: job_overview(store, job, kept=kept), args.runs)
    if not args.no_http:
        with TestClient(create_app(store, cluster_with_nodes(args.nodes))) as client:
            # The first request computes the overview; the next ones find it in the app's cache while
            # the store does not change (code without the cache computes it each time).
            out["page_first_s"] = median_s(lambda: client.get(f"/job/{job}").raise_for_status(), 1)
            out["page_s"] = median_s(lambda: client.get(f"/job/{job}").raise_for_status(), args.runs)
            out["api_s"] = median_s(lambda: client.get(f"/api/job/{job}").raise_for_status(), args.runs)
    out["load_avg_1m_after"] = os.getloadavg()[0]
    print(json.dumps(out), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    store.close()


if __name__ == "__main__":
    main()
