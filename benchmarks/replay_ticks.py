"""What one live tick costs the page (issue 27: < 16 ms at p95 at 1,024 nodes), on recorded traffic, offline.

    PYTHONPATH=src:. .venv/bin/python benchmarks/replay_ticks.py record DIR [--url URL] [--seconds 90]
    PYTHONPATH=src:. .venv/bin/python benchmarks/replay_ticks.py replay DIR [--rounds 3] [--ticks N]
        [--gap-ms 150] [--static DIR] [--profile FILE]

``record`` saves a running demo's page (``page.html``) and, from the version that page booted with, its SSE
stream (``events.jsonl``: one ``{"t", "event", "data"}`` a line), as the page itself receives them: a delta
first, then one a tick. ``replay`` loads that page in Debian's Chromium (1920 x 1080, as benchmarks/bench_web.py
does), its scripts and styles taken from this working tree (``--static``: from another folder, a copy from before
a change), with an ``EventSource`` stand-in that Python feeds the recorded events, one every ``--gap-ms``; no
server runs, so every round sees the same ticks. It prints the page's own ``state.applyMs`` (JSON parse + apply
of one event) per round and over all rounds: median, p95, max, and the slowest ticks; over all rounds, the same
of the style and layout pass each tick leaves (forced right after it; not part of applyMs). bench_web.py counts
the first ticks after each page load: ``--rounds 6 --ticks 10 --gap-ms 1000`` is closest to it. ``--profile
FILE`` saves Chromium's sampling profile of the first round's ticks there (DevTools opens it) and prints the
functions with the most time.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections import Counter
from pathlib import Path

import httpx

CHROMIUM = "/usr/bin/chromium"
STATIC = Path(__file__).resolve().parent.parent / "src" / "hpcwatch" / "web" / "static"
TYPES = {".js": "text/javascript", ".css": "text/css"}

# The page's EventSource, replaced: Python hands each recorded event to the newest one opened (app.js opens a
# new one after a gap, and counts it in state.reconnects). Each event answers the page's own applyMs of it, and
# the style and layout pass that follows it, forced at once as bench_web.py's STYLED_TICK_JS does.
FAKE_EVENT_SOURCE = """
(() => {
  const opened = [];
  class ReplayEventSource extends EventTarget {
    constructor(url) { super(); this.url = url; this.readyState = 1; opened.push(this); }
    close() { this.readyState = 2; }
  }
  Object.assign(ReplayEventSource, { CONNECTING: 0, OPEN: 1, CLOSED: 2 });
  window.EventSource = ReplayEventSource;
  window.__replay = (type, data) => {
    opened.at(-1).dispatchEvent(new MessageEvent(type, { data }));
    const started = performance.now();
    document.body.getBoundingClientRect();
    document.querySelector("svg.schematic")?.getBBox();
    const layout = performance.now() - started;
    const ms = window.hpcwatch.state.applyMs;
    return [ms[ms.length - 1], layout];
  };
})();
"""


# -- record ---------------------------------------------------------------------------------


def record(folder: Path, url: str, seconds: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    page = httpx.get(url, timeout=60).text
    (folder / "page.html").write_text(page)
    boot = json.loads(re.search(r'<script type="application/json" id="boot">(.*?)</script>', page, re.S).group(1))
    since = f"?since={boot['resume']}.{boot['live']['v']}"
    started = time.monotonic()
    with (folder / "events.jsonl").open("w") as out, httpx.stream("GET", f"{url}api/stream{since}", timeout=None) as r:
        event = None
        for line in r.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event in ("live", "delta"):
                at = round(time.monotonic() - started, 3)
                out.write(json.dumps({"t": at, "event": event, "data": line[5:].lstrip()}) + "\n")
            if time.monotonic() - started > seconds:
                break


# -- replay ---------------------------------------------------------------------------------


def serve(page, html: str, static: Path) -> None:
    """The recorded page, this tree's static files, and quiet answers for the other APIs."""

    def answer(route) -> None:
        path = route.request.url.split("://", 1)[1].split("/", 1)[1].split("?")[0]
        if path == "":
            route.fulfill(body=html, content_type="text/html")
        elif path.startswith("static/"):
            file = static / path.rsplit("/", 1)[1]
            route.fulfill(body=file.read_bytes(), content_type=TYPES.get(file.suffix, "application/octet-stream"))
        elif path == "api/alerts":
            route.fulfill(body='{"firing": [], "resolved": [], "source": null}', content_type="application/json")
        else:
            route.fulfill(status=404, body="{}", content_type="application/json")

    page.route("http://replay.test/**", answer)


def replay_round(
    chromium, html: str, static: Path, events: list[dict], gap_ms: int, profile: bool
) -> tuple[list[float], list[float], dict]:
    page = chromium.new_page(viewport={"width": 1920, "height": 1080})
    page.add_init_script(FAKE_EVENT_SOURCE)
    serve(page, html, static)
    page.goto("http://replay.test/", wait_until="load", timeout=120_000)
    page.wait_for_timeout(500)  # the tiles' IntersectionObserver reports
    ready = page.evaluate("performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd")
    cdp = None
    if profile:
        cdp = page.context.new_cdp_session(page)
        cdp.send("Profiler.enable")
        cdp.send("Profiler.setSamplingInterval", {"interval": 100})
        cdp.send("Profiler.start")
    costs, layouts = [], []
    for event in events:
        cost, layout = page.evaluate("([type, data]) => window.__replay(type, data)", [event["event"], event["data"]])
        costs.append(cost)
        layouts.append(layout)
        page.wait_for_timeout(gap_ms)  # the browser renders between ticks, as it does at 1 Hz
    info = {"reconnects": page.evaluate("window.hpcwatch.state.reconnects || 0"), "dom_content_loaded_ms": ready}
    if cdp:
        info["profile"] = cdp.send("Profiler.stop")["profile"]
    page.close()
    return costs, layouts, info


def where(frame: dict) -> str:
    """``function file:line`` of a profile's call frame."""
    return f"{frame['functionName'] or '(anonymous)'} {frame['url'].rsplit('/', 1)[-1]}:{frame['lineNumber'] + 1}"


def profile_times(profile: dict, top: int = 25) -> list[tuple[str, float, float]]:
    """The functions with the most time in a CPU profile: (name, self ms, total ms with its callees)."""
    nodes = {n["id"]: n for n in profile["nodes"]}
    parent = {child: n["id"] for n in profile["nodes"] for child in n.get("children", [])}
    name = {i: where(n["callFrame"]) for i, n in nodes.items()}
    own: Counter = Counter()
    total: Counter = Counter()
    deltas = profile["timeDeltas"]
    for sample, delta in zip(profile["samples"], deltas[1:] + [0]):
        own[name[sample]] += delta / 1000
        stack, node = set(), sample
        while node is not None:
            stack.add(name[node])
            node = parent.get(node)
        for function in stack:
            total[function] += delta / 1000
    return [(function, round(own[function], 1), round(ms, 1)) for function, ms in total.most_common(top)]


def summary(costs: list[float]) -> dict[str, float]:
    ordered = sorted(costs)
    return {
        "ticks": len(ordered),
        "median_ms": round(statistics.median(ordered), 2),
        "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))], 2),
        "max_ms": round(ordered[-1], 2),
    }


def replay(folder: Path, static: Path, rounds: int, ticks: int | None, gap_ms: int, profile: Path | None) -> None:
    from playwright.sync_api import sync_playwright

    html = (folder / "page.html").read_text()
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()][:ticks]
    every: list[float] = []
    every_layout: list[float] = []
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        for n in range(rounds):
            costs, layouts, info = replay_round(chromium, html, static, events, gap_ms, bool(profile) and n == 0)
            every += costs
            every_layout += layouts
            print(
                json.dumps(
                    {
                        "round": n,
                        **summary(costs),
                        "reconnects": info["reconnects"],
                        "dom_content_loaded_ms": round(info["dom_content_loaded_ms"], 1),
                    }
                )
            )
            if "profile" in info:
                profile.write_text(json.dumps(info["profile"]))
                print("  self ms   total ms  function")
                for function, own, total in profile_times(info["profile"], 40):
                    print(f"  {own:7.1f}  {total:9.1f}  {function}")
            slowest = sorted(zip(costs, events), key=lambda pair: -pair[0])[:5]
            print("  slowest:", [(round(c, 1), e["event"], len(e["data"])) for c, e in slowest])
        chromium.close()
    print(json.dumps({"all_rounds": summary(every), "style_layout_after": summary(every_layout)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("folder", type=Path)
    rec.add_argument("--url", default="http://127.0.0.1:8791/")
    rec.add_argument("--seconds", type=float, default=90)
    rep = sub.add_parser("replay")
    rep.add_argument("folder", type=Path)
    rep.add_argument("--rounds", type=int, default=3)
    rep.add_argument("--ticks", type=int, default=None, help="the first N recorded events (default: all)")
    rep.add_argument("--gap-ms", type=int, default=150, help="between two events: the page renders meanwhile")
    rep.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="FILE.cpuprofile",
        help="also save the first round's CPU profile there (DevTools opens it) and print its top functions",
    )
    rep.add_argument("--static", type=Path, default=STATIC, help="the page's scripts (default: this tree's)")
    args = parser.parse_args()
    if args.command == "record":
        record(args.folder, args.url, args.seconds)
    else:
        replay(args.folder, args.static, args.rounds, args.ticks, args.gap_ms, args.profile)


if __name__ == "__main__":
    main()
