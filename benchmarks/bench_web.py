"""Cost of the web view at scale (issue 15: 1,024 GPUs / 128 nodes at 1 Hz).

Run by hand from the repository root (it needs Debian's Chromium and Playwright, as the browser tests do):
``PYTHONPATH=src:. .venv/bin/python benchmarks/bench_web.py [--nodes 128] [--ticks 60] [--viewers 200]``; prints
numbers and writes them as JSON with ``--json FILE``.

Two parts:

- **in process**: the twin fills a store (``--ticks`` simulated seconds, as ``hpcwatch demo`` fills it), then
  the SVG drawing, one live snapshot (every query) and ``GET /`` are timed;
- **whole process**: ``hpcwatch demo --nodes N`` is started as users start it; Debian's Chromium loads the
  page (page ready = ``DOMContentLoaded`` and the first SSE tick applied, from navigation start) and reports
  what each live tick costs the page (``state.applyMs``: JSON parse + every DOM write of one tick); then
  ``--viewers`` SSE clients hold ``/api/stream`` open for ``--hold`` seconds and count their events.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from hpcwatch.store import Store
from hpcwatch.twin import Twin
from hpcwatch.web.app import create_app
from hpcwatch.web.demo import cluster_with_nodes, seed_step_player
from hpcwatch.web.i18n import load_catalogue
from hpcwatch.web.live import LiveView
from hpcwatch.web.svg import render_schematic

CHROMIUM = "/usr/bin/chromium"


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


def browser(url: str, *, loads: int = 3, width: int = 1920) -> dict[str, float]:
    from playwright.sync_api import sync_playwright

    ready, ticks, styled = [], [], []
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        for _ in range(loads):
            page = chromium.new_page(viewport={"width": width, "height": 1080})
            page.goto(url, wait_until="domcontentloaded")
            page.wait_for_function("Number(document.body.dataset.ticks || 0) >= 1")
            ready.append(page.evaluate("performance.now()"))  # ms since this navigation started
            page.wait_for_function("window.hpcwatch.state.applyMs.length >= 10", timeout=60_000)
            ticks += page.evaluate("window.hpcwatch.state.applyMs")
            styled.append(page.evaluate(STYLED_TICK_JS))
            page.close()
        chromium.close()
    ticks.sort()
    return {
        "page_ready_ms_median": round(statistics.median(ready), 1),
        "page_ready_ms_max": round(max(ready), 1),
        "tick_apply_ms_median": round(statistics.median(ticks), 2),
        "tick_apply_ms_p95": round(ticks[int(0.95 * (len(ticks) - 1))], 2),
        "ticks_measured": len(ticks),
        "tick_with_style_layout_ms_median": round(statistics.median(styled), 2),
    }


async def _viewer(client: httpx.AsyncClient, url: str, hold_s: float, counts: list[int]) -> None:
    events = 0
    deadline = time.monotonic() + hold_s
    try:
        async with client.stream("GET", url + "api/stream", timeout=hold_s + 30) as response:
            async for line in response.aiter_lines():
                if line.startswith("event: live"):
                    events += 1
                if time.monotonic() >= deadline:
                    break
    finally:
        counts.append(events)


async def viewers(url: str, n: int, hold_s: float) -> dict[str, float]:
    counts: list[int] = []
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits) as client:
        await asyncio.gather(*(_viewer(client, url, hold_s, counts) for _ in range(n)))
    rates = sorted(c / hold_s for c in counts)
    return {
        "viewers": n,
        "hold_s": hold_s,
        "events_hz_median": round(statistics.median(rates), 3),
        "events_hz_min": round(rates[0], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--ticks", type=int, default=60)
    parser.add_argument("--viewers", type=int, default=200)
    parser.add_argument("--hold", type=float, default=30.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = {"nodes": args.nodes, "gpus": args.nodes * 8, "in_process": in_process(args.nodes, args.ticks)}
    print("in process:", json.dumps(results["in_process"]))
    # The demo is started and stopped as the browser tests do it (one helper for both); run from the repo root.
    from tests.integration.test_browser import _start_demo, _stop

    proc, url = _start_demo("--nodes", str(args.nodes))
    try:
        time.sleep(20)  # let the twin write some history first
        if Path(CHROMIUM).exists():
            results["browser"] = browser(url)
            print("browser:", json.dumps(results["browser"]))
        results["sse"] = asyncio.run(viewers(url, args.viewers, args.hold))
        print("sse:", json.dumps(results["sse"]))
    finally:
        _stop(proc)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
