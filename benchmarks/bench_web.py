"""Cost of the web view at scale (issue 27: live at 1,024 nodes), whole process, beside the 2-node demo.

Run by hand from the repository root (it needs Debian's Chromium and Playwright, as the browser tests do):
``PYTHONPATH=src:. .venv/bin/python benchmarks/bench_web.py [--nodes 2 1024] [--cpu-s 60] [--viewers 200]
[--in-process] [--json FILE]``. Every size is measured in the same run, one after the other, so the ratio
of the largest to the smallest (the figure to report) is taken on one machine in one state; the load average
is printed with each, as other processes share the machine.

Per size, ``hpcwatch demo --nodes N`` is started as users start it, and after ``--warmup`` seconds:

- **cpu_cores**: CPU seconds of the whole process and its children (twin + store + server, and the security
  scan's process; ``/proc/PID/stat`` utime + stime) per wall second over ``--cpu-s``, with one SSE viewer at
  1 Hz; **cpu_cores_steady**: the same over ``--steady-s`` from ``--steady-after`` seconds after the start
  (default 600: the scan's window is full, the health window two-thirds), and **cpu_steady_by_process** (``hpcwatch``
  the server, ``hpcwatch.cli.demotwin`` the twin and its remediation loop, ``hpcwatch.web.scanprocess``,
  ``hpcwatch.web.pageprocess``), after the other figures, and **twin_and_server_cores_steady** the first two
  together (the goal's "twin + server within half a core"); **twin_cores**: the same
  twin and store writes alone, in this process (``time.process_time`` over 20 ticks), the part the server
  cannot save;
- **first_live_s** / **job_page_s**: ``GET /api/live`` and ``GET /job/ID`` of the largest running job
  (median of 3, one after the other); **job_page_first_s**: the first of those three (the first open reads the
  job's life; the next ones read on from what the server kept of it); **job_page_settled_s**: three more after
  the settled CPU figure, and **small_job_first_page_settled_s**: then the first page of each of the three
  smallest running jobs (the largest job is kept read between pages, ``web.pagewarm``; a small job's first page
  reads its life, in a store minutes old);
- **browser**: Debian's Chromium loads the page (**page ready**: from navigation start to the paint of the
  frame that draws the first live values, the page's own ``hpcwatch:ready`` mark; **page_ready_polled**: the
  figure before 2026-12-06, when Playwright saw the first tick applied by polling, which adds its polling and
  the round trip, queued behind whatever the page does next: 0.2-0.35 s at 1,024 nodes) and reports what each
  live tick costs the page (``state.applyMs``:
  JSON parse + merge + every DOM write of one tick, deltas included);
- **sse**: ``--viewers`` async SSE clients hold ``/api/stream`` for ``--hold`` seconds: ticks (``live`` or
  ``delta`` events) per second and bytes per second each.

``--in-process`` adds the older in-process figures (SVG drawing, one snapshot, ``GET /``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from hpcwatch.store import Store
from hpcwatch.twin import Twin
from hpcwatch.twin.live import LiveTwin
from hpcwatch.web.app import create_app
from hpcwatch.web.demo import cluster_with_nodes, seed_step_player
from hpcwatch.web.i18n import load_catalogue
from hpcwatch.web.live import LiveView
from hpcwatch.web.svg import render_schematic

CHROMIUM = "/usr/bin/chromium"
#: What the page marks once the frame drawing its first live values is painted (static/app.js markReady).
READY_MARK = "hpcwatch:ready"


def _median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def in_process(nodes: int, ticks: int) -> dict[str, float]:
    cluster = cluster_with_nodes(nodes)
    store = Store(":memory:")
    twin = Twin(cluster, seed=0)
    for _ in range(ticks):
        twin.advance(1.0)
        store.add_sample_table(twin.sample_table())  # as hpcwatch.twin.live.LiveTwin writes a tick
        store.add([*twin.jobs, *twin.finished_spans(), *twin.events()])
    t = load_catalogue("en")
    svg = render_schematic(cluster, t)
    live = LiveView(store, cluster, min_interval_s=0)
    out = {
        "svg_render_ms": _median_ms(lambda: render_schematic(cluster, t), 10),
        "svg_kib": len(svg) / 1024,
        "snapshot_ms": _median_ms(live.snapshot, 5),
    }
    app = create_app(store, cluster, step_jobs=seed_step_player(store, cluster))
    with TestClient(app) as client:
        client.get("/")
        out["get_page_ms"] = _median_ms(lambda: client.get("/"), 5)
        out["page_kib"] = len(client.get("/").content) / 1024
        out["snapshot_json_kib"] = len(client.get("/api/live").content) / 1024
    return {k: round(v, 1) for k, v in out.items()}


# Two real snapshots a few seconds apart, applied in turn (every value changes), each followed by a forced
# style and layout pass: what the tick costs before the browser can paint it.
STYLED_TICK_JS = """async () => {
  const a = await (await fetch('/api/live')).json();
  await new Promise((r) => setTimeout(r, 2500));
  const b = await (await fetch('/api/live')).json();
  const runs = [];
  for (let i = 0; i < 20; i++) {
    const t0 = performance.now();
    window.hpcwatch.applySnapshot(i % 2 ? a : b);
    document.body.getBoundingClientRect(); document.querySelector('svg.schematic').getBBox();
    runs.push(performance.now() - t0);
  }
  runs.sort((x, y) => x - y);
  return runs[10];
}"""


def browser(url: str, *, loads: int = 6, width: int = 1920) -> dict[str, float]:
    from playwright.sync_api import sync_playwright

    ready, polled, ticks, styled = [], [], [], []
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        for _ in range(loads):
            page = chromium.new_page(viewport={"width": width, "height": 1080})
            page.goto(url, wait_until="domcontentloaded", timeout=180_000)
            page.wait_for_function("() => Number(document.body.dataset.ticks || 0) >= 1", timeout=180_000)
            polled.append(page.evaluate("performance.now()"))  # ms since this navigation started
            page.wait_for_function(f"() => performance.getEntriesByName({READY_MARK!r}).length > 0", timeout=180_000)
            ready.append(page.evaluate(f"performance.getEntriesByName({READY_MARK!r})[0].startTime"))
            page.wait_for_function("() => window.hpcwatch.state.applyMs.length >= 10", timeout=180_000)
            ticks += page.evaluate("window.hpcwatch.state.applyMs")
            styled.append(page.evaluate(STYLED_TICK_JS))
            page.close()
        chromium.close()
    ticks.sort()
    return {
        "page_ready_ms_median": round(statistics.median(ready), 1),
        "page_ready_ms_max": round(max(ready), 1),
        "page_ready_polled_ms_median": round(statistics.median(polled), 1),
        "tick_apply_ms_median": round(statistics.median(ticks), 2),
        "tick_apply_ms_p95": round(ticks[int(0.95 * (len(ticks) - 1))], 2),
        "ticks_measured": len(ticks),
        "tick_with_style_layout_ms_median": round(statistics.median(styled), 2),
    }


async def _viewer(client: httpx.AsyncClient, url: str, hold_s: float, counts: list[tuple[int, int]]) -> None:
    events = received = 0
    deadline = time.monotonic() + hold_s
    try:
        async with client.stream("GET", url + "api/stream", timeout=hold_s + 60) as response:
            async for line in response.aiter_lines():
                received += len(line) + 1
                if line.startswith(("event: live", "event: delta")):
                    events += 1
                if time.monotonic() >= deadline:
                    break
    finally:
        counts.append((events, received))


async def viewers(url: str, n: int, hold_s: float) -> dict[str, float]:
    counts: list[tuple[int, int]] = []
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits) as client:
        await asyncio.gather(*(_viewer(client, url, hold_s, counts) for _ in range(n)))
    rates = sorted(c / hold_s for c, _ in counts)
    return {
        "viewers": n,
        "hold_s": hold_s,
        "ticks_hz_median": round(statistics.median(rates), 3),
        "ticks_hz_min": round(rates[0], 3),
        "kib_s_per_viewer_median": round(statistics.median(b / hold_s / 1024 for _, b in counts), 1),
    }


def _cpu_ticks(pid: int) -> int:
    """CPU ticks of ``pid`` and of its children (the demo's scan runs in a process of its own)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    waited = int(fields[13]) + int(fields[14])  # cutime, cstime: children that ended and were waited for
    return own + waited + sum(_cpu_ticks(child) for child in _children(pid))


def _children(pid: int) -> list[int]:
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        return [int(c) for task in tasks for c in (task / "children").read_text().split()]
    except OSError:  # gone meanwhile
        return []


def process_cores(pid: int, url: str, seconds: float) -> float:
    """CPU seconds per wall second of process ``pid`` over ``seconds``, one SSE viewer connected."""
    import os

    hz = os.sysconf("SC_CLK_TCK")
    counts: list[tuple[int, int]] = []

    async def measure() -> float:
        async with httpx.AsyncClient() as client:
            viewer = asyncio.create_task(_viewer(client, url, seconds + 5, counts))
            await asyncio.sleep(3)  # connected and past its full frame
            before, started = _cpu_ticks(pid), time.monotonic()
            await asyncio.sleep(seconds)
            used = (_cpu_ticks(pid) - before) / hz / (time.monotonic() - started)
            await viewer
            return used

    return round(asyncio.run(measure()), 3)


def _own_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _module_of(pid: int) -> str:
    """What a process of the demo runs: the module after ``-m`` (``hpcwatch`` for the server itself)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return argv[argv.index(b"-m") + 1].decode() if b"-m" in argv else str(pid)


def cores_by_process(pid: int, url: str, seconds: float) -> dict[str, float]:
    """``process_cores`` over ``seconds``, and the share of each process of the demo (the server, the twin's,
    the scan's, the job pages'), one SSE viewer connected."""
    import os

    hz = os.sysconf("SC_CLK_TCK")
    counts: list[tuple[int, int]] = []
    tree = [pid, *_children(pid)]

    async def measure() -> dict[str, float]:
        async with httpx.AsyncClient() as client:
            viewer = asyncio.create_task(_viewer(client, url, seconds + 5, counts))
            await asyncio.sleep(3)
            before, started = {p: _own_ticks(p) for p in tree}, time.monotonic()
            total_before = _cpu_ticks(pid)
            await asyncio.sleep(seconds)
            wall = time.monotonic() - started
            out = {"total": (_cpu_ticks(pid) - total_before) / hz / wall}
            out |= {_module_of(p): (_own_ticks(p) - t) / hz / wall for p, t in before.items()}
            await viewer
            return {k: round(v, 3) for k, v in out.items()}

    return asyncio.run(measure())


def twin_cores(nodes: int, ticks: int = 20) -> float:
    """CPU seconds per simulated second of the twin and its store writes alone, as the demo's ``LiveTwin``
    writes its ticks (its default scrape interval: a 1,024-node twin scrapes each node every 8 s)."""
    store = Store(":memory:")
    live = LiveTwin(store, cluster_with_nodes(nodes), seed=0)
    live.write_tick()
    for _ in range(3):  # warm: the first ticks start the jobs
        live.step()
    started = time.process_time()
    for _ in range(ticks):
        live.step()
    return round((time.process_time() - started) / ticks, 3)


def _median_s(fetch, runs: int = 3) -> float:
    return round(statistics.median(_times_s(fetch, runs)), 3)


def _times_s(fetch, runs: int) -> list[float]:
    """Seconds each of ``runs`` calls of ``fetch`` took, one after the other."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fetch()
        times.append(time.perf_counter() - start)
    return times


def start_demo(nodes: int, viewers: int, timeout_s: float = 300) -> tuple[subprocess.Popen, str]:
    """``hpcwatch demo --nodes N`` on a free port; a 1,024-node twin takes ~20 s to answer (more when loaded)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "hpcwatch", "demo", "--no-browser", "--port", str(port), "--nodes", str(nodes)),
            *("--max-streams", str(viewers + 8), "--max-streams-per-client", str(viewers + 8)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"hpcwatch demo exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            httpx.get(url + "healthz", timeout=2)
            return proc, url
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"hpcwatch demo --nodes {nodes} did not answer within {timeout_s:.0f} s")


def stop_demo(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def whole_process(nodes: int, args: argparse.Namespace) -> dict[str, object]:
    import os

    out: dict[str, object] = {"nodes": nodes, "gpus": nodes * 8, "load_avg_1m_before": os.getloadavg()[0]}
    out["twin_cores"] = twin_cores(nodes)
    started = time.monotonic()
    proc, url = start_demo(nodes, args.viewers)
    try:
        time.sleep(args.warmup)  # let the twin write some history first
        out["cpu_cores"] = process_cores(proc.pid, url, args.cpu_s)
        out["first_live_s"] = _median_s(lambda: httpx.get(url + "api/live", timeout=300).raise_for_status(), 1)
        out["live_kib"] = round(len(httpx.get(url + "api/live", timeout=300).content) / 1024, 1)
        queue = httpx.get(url + "api/live", timeout=300).json().get("queue") or {}
        running = [j for j in queue.get("jobs", []) if j.get("state") == "RUNNING"]
        if running:
            job = max(running, key=lambda j: j.get("gpus") or 0)
            out["job_page_gpus"] = job.get("gpus")
            pages = _times_s(lambda: httpx.get(url + "job/" + job["id"], timeout=300).raise_for_status(), 3)
            out["job_page_s"] = round(statistics.median(pages), 3)
            out["job_page_first_s"] = round(pages[0], 3)  # the first open reads the job's life; the next resume
        if Path(CHROMIUM).exists():
            out["browser"] = _attempt(lambda: browser(url, loads=args.loads))
        out["sse"] = _attempt(lambda: asyncio.run(viewers(url, args.viewers, args.hold)))
        if args.steady_after > 0:
            # The health window (15 min), the scan's (5 min) and the store's tiers fill as the demo ages: its CPU
            # in the first minute is not what it settles at (0.52 then 0.79 core at 1,024 nodes on 2026-12-06).
            time.sleep(max(0.0, started + args.steady_after - time.monotonic()))
            out["steady_after_s"] = round(time.monotonic() - started)
            steady = cores_by_process(proc.pid, url, args.steady_s)
            out["cpu_cores_steady"], out["cpu_steady_by_process"] = steady.pop("total"), steady
            # The goal names these two: the server (stream, snapshot, judge) and the twin's process.
            out["twin_and_server_cores_steady"] = round(
                steady.get("hpcwatch", 0.0) + steady.get("hpcwatch.cli.demotwin", 0.0), 3
            )
            out |= settled_job_pages(url)
        out["load_avg_1m_after"] = os.getloadavg()[0]
    finally:
        stop_demo(proc)
    return out


def settled_job_pages(url: str) -> dict[str, object]:
    """Once the demo has run for minutes: three ``GET /job/ID`` of the largest running job, one after the other
    (its first page was minutes ago, or never if it started since), and the first page of each of the three
    smallest running jobs (each reads the job's life; their cost is the store's size, not the job's)."""
    queue = httpx.get(url + "api/live", timeout=300).json().get("queue") or {}
    running = sorted(
        (j for j in queue.get("jobs", []) if j.get("state") == "RUNNING"),
        key=lambda j: (-(j.get("gpus") or 0), j["id"]),
    )
    if not running:
        return {}
    largest, smallest = running[0], running[-3:]

    def page(job: dict) -> Callable[[], object]:
        return lambda: httpx.get(url + "job/" + job["id"], timeout=300).raise_for_status()

    return {
        "job_page_settled_s": [round(t, 3) for t in _times_s(page(largest), 3)],
        "small_job_first_page_settled_s": [round(_times_s(page(j), 1)[0], 3) for j in smallest],
        "small_job_gpus": [j.get("gpus") for j in smallest],
    }


def _attempt(measure):
    """A part that fails (a timeout on a loaded machine) is reported as its error; the other parts still run."""
    try:
        return measure()
    except Exception as err:  # a benchmark reports what failed and carries on
        return {"error": f"{type(err).__name__}: {str(err)[:300]}"}


def _ratios(results: list[dict[str, object]]) -> dict[str, float]:
    small, large = results[0], results[-1]
    keys = ("cpu_cores", "cpu_cores_steady", "twin_cores", "first_live_s", "job_page_s", "job_page_first_s", "live_kib")
    out = {k: round(float(large[k]) / float(small[k]), 2) for k in keys if small.get(k) and large.get(k)}
    for part, key in (("browser", "page_ready_ms_median"), ("browser", "tick_apply_ms_median")):
        a, b = small.get(part), large.get(part)
        if isinstance(a, dict) and isinstance(b, dict) and a.get(key) and b.get(key):
            out[key] = round(b[key] / a[key], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 1024])
    parser.add_argument("--ticks", type=int, default=60, help="--in-process: simulated seconds in the store")
    parser.add_argument("--in-process", action="store_true")
    parser.add_argument("--viewers", type=int, default=200)
    parser.add_argument("--hold", type=float, default=30.0)
    parser.add_argument("--cpu-s", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=20.0)
    # Six: at 1,024 nodes the median of two loads moved by 0.5 s between runs of the same code (the busy demo's
    # first byte takes 0.1-1 s, and a page's first load is the slowest).
    parser.add_argument("--loads", type=int, default=6)
    parser.add_argument("--steady-after", type=float, default=600.0, help="s after start; 0: no steady figure")
    parser.add_argument("--steady-s", type=float, default=300.0, help="the steady CPU figure's window")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    for nodes in sorted(args.nodes):
        one = whole_process(nodes, args)
        if args.in_process:
            one["in_process"] = in_process(nodes, args.ticks)
        print(json.dumps(one), flush=True)
        results.append(one)
    doc = {"sizes": results, "ratio_largest_to_smallest": _ratios(results) if len(results) > 1 else {}}
    print("ratio:", json.dumps(doc["ratio_largest_to_smallest"]))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
