"""The page in a real Chromium (Debian's /usr/bin/chromium via Playwright) against a real server.

The server is ``hpcwatch demo`` itself (twin + in-memory store + uvicorn), started
on a free loopback port by a fixture and stopped by its PID. Screenshots of each
mode are kept in tests/integration/artifacts/ (git-ignored); timings (first paint,
update cost at 128 GPUs) are written to artifacts/timings.json and printed.
"""

from __future__ import annotations

import json
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from hpcwatch.web.i18n import load_catalogue
from tests.conftest import free_port

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).parent / "artifacts"
VIEWPORT = {"width": 1440, "height": 1000}
TIMINGS: dict[str, float] = {}
#: How long an action may wait for the page (actionable element, awaited function): twice Playwright's default, as
#: a loaded 2-core machine redrawing at every tick was seen to need more than 30 s.
ACTION_TIMEOUT_MS = 60_000

if not Path(CHROMIUM).exists():
    pytest.skip("Debian chromium is not installed", allow_module_level=True)
playwright_api = pytest.importorskip("playwright.sync_api")


#: Each demo's stderr, by its address: a file, not a pipe nobody reads (a full pipe would stop the server at its
#: next log line); a test that times out on a page quotes its end.
DEMO_LOGS: dict[str, Path] = {}


def _start_demo(*extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    ARTIFACTS.mkdir(exist_ok=True)
    DEMO_LOGS[url] = ARTIFACTS / f"demo-{port}.log"
    with DEMO_LOGS[url].open("wb") as log:
        proc = subprocess.Popen(
            # A module's tests may hold one demo past 10 min on a loaded machine (the 128-node group: 15 min seen);
            # the fixture stops it, the duration only ends one a crashed test run left behind.
            [
                sys.executable,
                "-m",
                "hpcwatch",
                "demo",
                "--no-browser",
                "--port",
                str(port),
                "--duration",
                "3600",
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    wait_answering(proc, url, "hpcwatch demo")
    return proc, url


def _last_words(proc: subprocess.Popen, url: str) -> str:
    """The end of a server's stderr: its log file (``_start_demo``) or its pipe."""
    if url in DEMO_LOGS:
        return DEMO_LOGS[url].read_bytes()[-2000:].decode(errors="replace")
    return proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""


#: A 128-node demo on a loaded 2-core machine (the twin's first ticks, the store) was seen past 60 s.
START_TIMEOUT_S = 180


def wait_answering(proc: subprocess.Popen, url: str, what: str) -> None:
    """Until ``url``'s /healthz answers; the server's last words if it exits first, killed past START_TIMEOUT_S."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited: {_last_words(proc, url)}")
        try:
            urllib.request.urlopen(url + "healthz", timeout=1)
            return
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{what} did not answer within {START_TIMEOUT_S} s")


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def server():
    proc, url = _start_demo()
    yield url
    _stop(proc)


@pytest.fixture(scope="module")
def browser():
    ARTIFACTS.mkdir(exist_ok=True)
    with playwright_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
    if TIMINGS:
        (ARTIFACTS / "timings.json").write_text(json.dumps(TIMINGS, indent=2))
        print("\nweb timings:", json.dumps(TIMINGS))


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport=VIEWPORT, locale="en-US")
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda err: errors.append(str(err)))
    pg.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    pg.goto(server)
    _wait_ticks(pg, 1)
    yield pg
    context.close()
    assert not errors, errors


def _ticks(pg) -> int:
    return int(pg.evaluate("Number(document.body.dataset.ticks || 0)"))


#: A stream tick while the whole suite shares 2 cores: a demo's first frames were seen past 60 s (the 128-node
#: demo's deltas computed beside it).
TICK_TIMEOUT_MS = 180_000


def _wait_ticks(pg, n: int) -> None:
    """Wait until n more SSE ticks have been applied (the boot snapshot counts as tick 1); past the timeout,
    fail with what the page holds: a page whose scripts never ran differs from a stream that never ticked."""
    target = _ticks(pg) + n
    _wait_page(pg, f"() => Number(document.body.dataset.ticks || 0) >= {target}", TICK_TIMEOUT_MS)


def _wait_page(pg, condition: str, timeout_ms: float) -> None:
    """``pg.wait_for_function(condition)``; past the timeout, fail with what the page holds and the demo's log."""
    try:
        pg.wait_for_function(condition, timeout=timeout_ms)
    except playwright_api.TimeoutError:
        origin = pg.evaluate("location.origin") + "/"
        log = DEMO_LOGS[origin].read_bytes()[-2000:].decode(errors="replace") if origin in DEMO_LOGS else "?"
        pytest.fail(
            f"not true within {timeout_ms / 1000:.0f} s: {condition}; the page: {_page_state(pg)}; "
            f"the server's log ends: {log!r}"
        )


def _page_state(pg) -> str:
    """The page's ticks, whether its entry script ran to the end, its stream's status, and each resource it
    fetched with its HTTP status (0: a failed or refused fetch)."""
    return json.dumps(
        pg.evaluate(
            """() => ({
              ready: document.readyState,
              ticks: document.body.dataset.ticks,
              script_ran: Boolean(window.hpcwatch),
              stream_state: window.hpcwatch && Object.fromEntries(["version", "deltas", "reconnects",
                "silentReconnects", "refusals"].map((k) => [k, window.hpcwatch.state[k]])),
              stream: document.getElementById("conn")?.parentElement?.textContent?.trim(),
              resources: performance.getEntriesByType("resource").map(
                (r) => `${new URL(r.name).pathname} ${r.responseStatus} ${Math.round(r.duration)} ms`),
            })"""
        )
    )


def _address(pg) -> str:
    """The address as the page holds it now. Playwright's page.url follows history.replaceState through an
    event that may land after the next line of the test has run (a CI run read the address before Escape)."""
    return pg.evaluate("window.location.href")


def _first_contentful_paint_ms(pg) -> float:
    """When the page first painted content, in ms since navigation started.

    The browser queues the paint entry to the performance timeline after the frame, so it may be missing when
    the load event has just fired on a loaded machine (a CI run read null): wait for the entry.
    """
    return pg.wait_for_function(
        "() => performance.getEntriesByType('paint').find(e => e.name === 'first-contentful-paint')?.startTime ?? null",
        timeout=ACTION_TIMEOUT_MS,
    ).json_value()


def _shot(pg, name: str, **kw) -> None:
    pg.screenshot(path=str(ARTIFACTS / f"{name}.png"), **kw)


def _shot_panel(pg, selector: str, name: str) -> None:
    """One panel, scrolled just below the sticky toolbar so nothing covers it."""
    pg.eval_on_selector(selector, "el => window.scrollTo(0, el.getBoundingClientRect().top + window.scrollY - 64)")
    box = pg.locator(selector).bounding_box()
    pg.screenshot(path=str(ARTIFACTS / f"{name}.png"), clip=box)


def test_keyboard_opens_gpu2_card_with_live_values_that_change(page):
    for _ in range(80):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.dataset?.gpu") == "node1/2":
            break
    else:
        pytest.fail("Tab never reached GPU node1/2")
    page.keyboard.press("Enter")
    assert "node1/2" in page.locator("#card-title").inner_text()
    power = page.locator("#card [data-value='power_w']")
    first = power.inner_text()
    assert first.endswith(" W") and first != "—"
    for _ in range(6):  # the twin's power moves every tick; allow a few identical ones
        _wait_ticks(page, 1)
        if power.inner_text() != first:
            break
    assert power.inner_text() != first
    assert page.locator("#card [data-value='user']").inner_text() not in ("", "—")
    _shot(page, "1-engineer-gpu-card")
    page.keyboard.press("Escape")
    assert page.locator("#card").get_attribute("data-open") is None
    assert page.evaluate("document.activeElement.dataset?.gpu") == "node1/2"  # focus returns


def test_hostile_names_are_shown_as_text_in_the_browser(page):
    """A job name that is HTML, pushed through the same code path as an SSE tick, stays text.

    Read back in the same task as the update, so a real tick cannot overwrite it in between."""
    seen = page.evaluate("""() => {
        const snap = structuredClone(window.hpcwatch.state.snapshot);
        snap.gpus['node1/2'] = {...snap.gpus['node1/2'], job: '4101', job_name: '<img src=x onerror=alert(1)>',
                                user: 'o"brien\\'s'};
        snap.queue.jobs.unshift({id: '<b>9</b>', name: '<img src=y onerror=alert(2)>', user: 'x', account: 'y',
                                 state: 'RUNNING', nodes: ['node1'], gpus: 1});
        window.hpcwatch.applySnapshot(snap);
        window.hpcwatch.openCard('gpu:node1/2');
        return {imgs: document.querySelectorAll('img, b').length,
                job: document.querySelector("#card [data-value='job']").textContent,
                user: document.querySelector("#card [data-value='user']").textContent,
                queue: document.getElementById('queue-table').textContent};
    }""")
    assert seen["imgs"] == 0
    assert "<img src=x onerror=alert(1)>" in seen["job"]
    assert seen["user"] == "o\"brien's"
    assert "<img src=y onerror=alert(2)>" in seen["queue"] and "<b>9</b>" in seen["queue"]


def test_node_card_lists_its_gpus_and_ib(page):
    page.locator("[data-el='node:node1']").focus()
    page.keyboard.press(" ")
    live = page.locator("#card-live")
    assert live.locator("tbody tr").count() == 8
    assert "GB/s" in live.locator("[data-value='ib_tx']").inner_text() or "MB/s" in live.inner_text()


def test_a_gpu_button_pressed_across_ticks_still_opens_its_card(page):
    """The node card's live part is rebuilt every tick: a press held while ticks land, then released, is one click
    on the button (it was lost when the press fell on the old button and the release on its replacement)."""
    page.locator("[data-el='node:node1']").focus()
    page.keyboard.press(" ")
    page.locator("#card [data-open-gpu='node1/2']").hover()  # once the card has stopped moving into view
    page.mouse.down()
    _wait_ticks(page, 2)
    page.mouse.up()
    page.wait_for_function("() => document.getElementById('card-title').textContent.includes('node1/2')")
    _wait_ticks(page, 1)  # and the live part follows the ticks again
    assert page.locator("#card [data-value='power_w']").inner_text().endswith(" W")


def test_observer_mode_shows_collectors_with_arrival_state(page):
    page.click("[data-view='observer']")
    _wait_ticks(page, 1)
    dcgm = page.locator("[data-collector='dcgm_exporter']")
    assert dcgm.is_visible() and dcgm.get_attribute("data-arriving") == "true"
    assert dcgm.locator(".collector-state").text_content() == "✓"
    _shot(page, "2-observer")


def test_threats_mode_opens_vector3_and_lights_nothing_without_findings(page):
    page.click("[data-view='threats']")
    vector = page.locator("g[data-vector='rdma_blind_spot']")
    vector.focus()
    page.keyboard.press("Enter")
    assert "RDMA" in page.locator("#card-title").inner_text()
    assert page.locator("#card-text, #card .card-text").inner_text().count("perfquery") >= 1
    live = page.evaluate("Object.values(window.hpcwatch.state.snapshot.vectors).filter(v => v.findings > 0).length")
    lit = page.locator("g[data-vector][data-live='true']").count()
    assert lit == live  # a vector lights up only with a finding in the store
    _shot(page, "3-threats-vector3")


def test_a_real_finding_lights_its_vector(browser):
    """The twin's RDMA attack, found by the detectors the demo runs, lights vector 3 and only the vectors
    that have findings."""
    proc, url = _start_demo("--scenario", "threat_rdma", "--scan-every", "2")
    try:
        context = browser.new_context(viewport=VIEWPORT)
        pg = context.new_page()
        pg.goto(url)
        pg.click("[data-view='threats']")
        pg.wait_for_selector("g[data-vector='rdma_blind_spot'][data-live='true']", timeout=60_000)
        flag = pg.locator("[data-flag='rdma_blind_spot']").text_content()  # drawn beside its element (svg.py)
        assert flag.startswith("⚠")
        with_findings = pg.evaluate(
            "Object.entries(window.hpcwatch.state.snapshot.vectors)"
            ".filter(([v, f]) => f.findings > 0 && v !== 'weights_access').map(([v]) => v)"
        )
        lit = pg.eval_on_selector_all("g[data-vector][data-live='true']", "els => els.map(e => e.dataset.vector)")
        assert "rdma_blind_spot" in with_findings and set(lit) == set(with_findings)
        pg.locator("g[data-vector='rdma_blind_spot']").focus()
        pg.keyboard.press("Enter")
        assert "finding" in pg.locator("#card [data-value='status']").inner_text()
        _shot(pg, "3b-threats-live-finding")
        # the finding is in the alert strip, and its node is lit in the default view too (issue 15)
        pg.click("[data-view='schematic']")
        pg.wait_for_selector(
            "#alerts-list [data-kind='finding'][data-open-el='vector:rdma_blind_spot']",
            state="attached",
            timeout=20_000,
        )
        target = pg.evaluate("window.hpcwatch.state.snapshot.problems.find(p => p.kind === 'finding').node")
        if pg.locator(f"g[data-node='{target}']").count():
            assert pg.locator(f"g[data-node='{target}']").get_attribute("data-problem") == "finding"
            _shot(pg, "15-7-finding-node-lit-schematic")
        context.close()
        _french_page_shows_the_finding_in_french(browser, url)
    finally:
        _stop(proc)


def _french_page_shows_the_finding_in_french(browser, url: str) -> None:
    """The same live finding on the French page: its title from the catalogue's template for its rule,
    its severity in French, and none of the detector's English title."""
    context = browser.new_context(viewport=VIEWPORT, locale="fr-FR")
    pg = context.new_page()
    pg.goto(url + "?lang=fr")
    pg.click("[data-view='threats']")
    pg.wait_for_selector("g[data-vector='rdma_blind_spot'][data-live='true']", timeout=60_000)
    pg.locator("g[data-vector='rdma_blind_spot']").focus()
    pg.keyboard.press("Enter")
    finding = pg.evaluate("window.hpcwatch.state.snapshot.vectors.rdma_blind_spot")
    status = pg.locator("#card [data-value='status']").inner_text()
    en, fr = load_catalogue("en").words, load_catalogue("fr").words
    assert finding["rule"].startswith("rdma.") and finding["text"]["fr"] != finding["title"]
    assert finding["text"]["fr"] in status and fr[f"severity.{finding['severity']}"] in status
    assert "constat" in status and finding["title"] not in status
    body = pg.locator("body").inner_text()
    english = [finding["title"], en[f"severity.{finding['severity']}"], " moved ", "over InfiniBand", "finding(s)"]
    left = [w for w in english if w in body]
    assert not left, (left, status)
    _shot(pg, "3c-threats-live-finding-fr")
    context.close()


def test_decider_mode_rewrites_cards_and_shows_passerelles(page):
    page.click("[data-reading='decider']")
    page.click("[data-el='weights']")
    text = page.locator("#card").inner_text()
    assert "Value" in text and "Ownership" in text and "What it is" not in text
    assert page.locator("#passerelles").is_visible()
    assert page.locator("[data-passerelle]").count() == 4
    _shot(page, "4-decider-weights", full_page=True)
    page.click("[data-view='threats']")
    page.click("g[data-vector='rdma_blind_spot']")
    text = page.locator("#card .card-text").inner_text()
    assert "Risk" in text and "Ownership" in text and "How it works" not in text


def _decider_done(pg) -> None:
    pg.wait_for_function("() => document.getElementById('decider').dataset.state === 'done'", timeout=ACTION_TIMEOUT_MS)


def test_decider_mode_shows_figures_per_account_and_charts_over_time(page):
    page.click("[data-reading='decider']")
    _decider_done(page)
    rows = page.locator("#decider-table tbody tr")
    assert rows.count() >= 1
    utilisation = [
        float(v)
        for v in page.eval_on_selector_all(
            "#decider-table td[data-figure='utilisation'][data-value]", "tds => tds.map(td => td.dataset.value)"
        )
    ]
    assert utilisation and all(0.0 <= u <= 1.0 for u in utilisation)
    # The demo configures no price: its cost is "—" with the reason, never a number.
    cost = page.locator("#decider-table td[data-figure='cost']").first
    assert cost.inner_text() == "—" and "price" in cost.get_attribute("title")
    page.select_option("#decider-window", "hour")
    _decider_done(page)
    page.wait_for_selector("#decider-charts [data-chart='utilisation'] .main-svg", timeout=ACTION_TIMEOUT_MS)
    _shot_panel(page, "#decider", "4b-decider-accounts")
    page.goto(page.url.split("?")[0] + "?lang=fr&reading=decider")
    _decider_done(page)
    text = page.locator("#decider").inner_text()
    en, fr = load_catalogue("en").words, load_catalogue("fr").words
    english = [v for k, v in en.items() if k.startswith("decider.") and v != fr[k] and "{" not in v]
    left = [v for v in english if re.search(rf"(?<!\w){re.escape(v)}(?!\w)", text)]
    assert not left and "Heures-GPU réservées" in text, left
    _shot_panel(page, "#decider", "4c-decider-accounts-fr")


def test_step_with_straggler_others_wait_the_stragglers_extra_time(page):
    page.click("[data-source='straggler']")
    page.wait_for_function("() => document.getElementById('player').dataset.state === 'ready'")
    page.click("#play")
    page.wait_for_function("() => document.getElementById('player').dataset.state === 'done'", timeout=20_000)
    _shot_panel(page, "#player", "5-step-player-straggler")
    page.click("#player details:nth-of-type(2) summary")
    cells = page.eval_on_selector_all(
        "#step-table td[data-phase]",
        "tds => tds.map(td => [Number(td.dataset.rank), td.dataset.phase, Number(td.dataset.ms)])",
    )
    table: dict[int, dict[str, float]] = {}
    for rank, phase, ms in cells:
        table.setdefault(rank, {})[phase] = ms
    slowest = max(table, key=lambda r: table[r]["backward"])
    others = [r for r in table if r != slowest]
    typical_backward = statistics.median(table[r]["backward"] for r in others)
    extra = table[slowest]["backward"] - typical_backward
    assert extra > 5  # the straggler really is slower (twice a ~20 ms backward)
    for r in others:
        assert table[r]["barrier_wait"] == pytest.approx(extra, rel=0.05), (r, table[r], extra)
    assert table[slowest]["barrier_wait"] == pytest.approx(0, abs=0.05)


def test_simulator_computes_on_the_server(page):
    page.click("#sim-form button[type=submit]")
    cell = page.locator("#sim-table td[data-gpus='1024']")
    cell.wait_for(timeout=20_000)
    efficiency = float(cell.get_attribute("data-efficiency"))
    assert 0 < efficiency < 1
    assert cell.inner_text().endswith("%")
    page.wait_for_selector("#sim-plot .main-svg", timeout=20_000)
    _shot_panel(page, "#sim", "6-simulator")
    # The last run asked wins, not the last answer: a run held until the next one is drawn is dropped.
    held = []
    page.route("**/api/stragglersim?*slow_factor=2*", lambda route: held.append(route))
    with page.expect_request(lambda r: "slow_factor=2" in r.url):
        page.click("#sim-form button[type=submit]")
    page.fill("#sim-form input[name=slow_factor]", "5")
    with page.expect_response(lambda r: "/api/stragglersim" in r.url and "slow_factor=5" in r.url):
        page.click("#sim-form button[type=submit]")
    page.wait_for_function("() => document.getElementById('sim').dataset.state === 'done'")
    slower = float(cell.get_attribute("data-efficiency"))
    assert slower < efficiency  # five times slower stragglers: less of the cluster's time is useful
    # (an answer may have been dropped already: the panel's own first run, answered after the first click's)
    dropped = "() => Number(document.getElementById('sim').dataset.dropped ?? 0)"
    before = page.evaluate(dropped)
    with page.expect_event("requestfinished", lambda r: "slow_factor=2" in r.url):
        held[0].continue_()
    page.wait_for_function(f"() => ({dropped})() === {before + 1}", timeout=10_000)
    assert float(cell.get_attribute("data-efficiency")) == slower


def test_switching_to_french_leaves_no_english(page):
    page.click("a[data-lang='fr']")
    page.wait_for_load_state()
    _wait_ticks(page, 1)
    assert page.evaluate("document.documentElement.lang") == "fr"
    page.click("[data-gpu='node1/2']")
    page.click("[data-source='straggler']")
    page.wait_for_function("() => document.getElementById('player').dataset.state === 'ready'")
    text = page.locator("body").inner_text()
    en, fr = load_catalogue("en").words, load_catalogue("fr").words
    english = [v for k, v in en.items() if v != fr[k] and len(v) > 3 and "{" not in v]
    # As a word: a product's name may hold an English one ("Alertmanager" holds "Alert") and stays as it is.
    left = [v for v in english if re.search(rf"(?<!\w){re.escape(v)}(?!\w)", text)]
    assert not left, left[:10]
    assert "Rétropropagation" in text
    _shot(page, "7-french")


def test_first_paint_and_update_cost_with_128_gpus(browser):
    proc, url = _start_demo("--nodes", "16")
    try:
        context = browser.new_context(viewport=VIEWPORT)
        pg = context.new_page()
        started = time.perf_counter()
        pg.goto(url)
        load_s = time.perf_counter() - started
        fcp = _first_contentful_paint_ms(pg)
        _wait_ticks(pg, 2)
        assert pg.locator("[data-gpu]").count() == 128
        cost = pg.evaluate("""() => {
            const snap = window.hpcwatch.state.snapshot, runs = [];
            for (let i = 0; i < 20; i++) { const t = performance.now(); window.hpcwatch.applySnapshot(snap);
                                           runs.push(performance.now() - t); }
            runs.sort((a, b) => a - b); return runs[10]; }""")
        assert pg.locator(".tile g.el[data-node]").count() == 16  # aggregate node tiles, fitted to the width
        pg.evaluate("window.hpcwatch.fit.zoom(2)")  # zoomed in, the schematic pans
        wide = pg.evaluate(
            "[document.getElementById('schematic-wrap').scrollWidth,"
            " document.getElementById('schematic-wrap').clientWidth]"
        )
        assert wide[0] > wide[1]
        wrap = pg.locator("#schematic-wrap").bounding_box()
        pg.mouse.move(wrap["x"] + 900, wrap["y"] + 300)
        pg.mouse.down()
        pg.mouse.move(wrap["x"] + 300, wrap["y"] + 300, steps=6)
        pg.mouse.up()
        assert pg.evaluate("document.getElementById('schematic-wrap').scrollLeft") > 300
        query_ms = pg.evaluate("window.hpcwatch.state.snapshot.query_ms")
        html_bytes = len(pg.content().encode())
        _shot(pg, "8-sixteen-nodes")
        context.close()
        # One more page load of the small reference cluster for comparison.
        TIMINGS.update(
            {
                "gpus": 128,
                "first_contentful_paint_ms": fcp,
                "page_load_s": round(load_s, 3),
                "apply_snapshot_ms_median": round(cost, 2),
                "server_snapshot_query_ms": query_ms,
                "html_bytes": html_bytes,
            }
        )
        # It painted; how fast is a figure (timings.json, benchmarks/bench_web.py), not a pass mark: a loaded
        # 2-core machine took 5.3 s where a quiet one takes well under 1 s.
        assert fcp < ACTION_TIMEOUT_MS
        assert cost < 100
    finally:
        _stop(proc)


def test_first_paint_reference_cluster(page):
    fcp = _first_contentful_paint_ms(page)
    TIMINGS["reference_first_contentful_paint_ms"] = fcp
    _shot(page, "0-engineer")
    assert fcp < ACTION_TIMEOUT_MS  # it painted (see above)


# -- the page as a monitor (issue 15): problems where you look, URL state, stale data ----------------


@pytest.fixture(scope="module")
def problem_server():
    """A demo with a straggler (node1 GPU 2) and an XID 79 (node2 GPU 3, 30 s in)."""
    proc, url = _start_demo("--scenario", "straggler", "--scenario", "xid79")
    yield url
    _stop(proc)


@pytest.fixture
def problem_page(browser, problem_server):
    context = browser.new_context(viewport=VIEWPORT, locale="en-US")
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda err: errors.append(str(err)))
    pg.goto(problem_server)
    _wait_ticks(pg, 1)
    yield pg
    context.close()
    assert not errors, errors


def test_straggler_is_marked_on_its_gpu_in_the_default_view(problem_page):
    pg = problem_page
    assert "view-schematic" in pg.locator("body").get_attribute("class")
    pg.wait_for_selector("[data-gpu='node1/2'][data-problem='straggler']", timeout=60_000)
    assert pg.locator("[data-mark='node1/2']").text_content() == "⚠ slow"
    assert pg.eval_on_selector_all("[data-gpu][data-problem='straggler']", "els => els.length") == 1
    stroke = pg.eval_on_selector("[data-gpu='node1/2'] .gpu-box", "el => getComputedStyle(el).stroke")
    assert stroke == "rgb(180, 83, 9)"  # --warn, not the healthy green line
    pg.locator("#schematic-wrap").screenshot(path=str(ARTIFACTS / "15-1-straggler-default-view.png"))


def test_xid_gpu_is_red_with_its_code(problem_page):
    pg = problem_page
    pg.wait_for_selector("[data-gpu='node2/3'][data-problem='xid']", timeout=90_000)
    assert pg.locator("[data-mark='node2/3']").text_content() == "✕ XID 79"
    fill = pg.eval_on_selector("[data-gpu='node2/3'] .gpu-box", "el => getComputedStyle(el).fill")
    assert fill == "rgb(254, 226, 226)"
    assert pg.locator("#alerts-toggle").get_attribute("data-severity") == "drain"  # worst first
    pg.locator("#schematic-wrap").screenshot(path=str(ARTIFACTS / "15-2-xid79-red.png"))


def test_alert_count_and_an_entry_opens_its_card_and_lights_its_job(problem_page):
    pg = problem_page
    pg.wait_for_function("() => Number(document.getElementById('alerts-toggle').dataset.count) > 0", timeout=60_000)
    count = int(pg.locator("#alerts-toggle").get_attribute("data-count"))
    assert str(count) in pg.locator("#alerts-toggle").text_content()
    pg.click("#alerts-toggle")
    assert pg.locator("#alerts-list").is_visible()
    assert pg.locator("#alerts-list li[data-group]").count() == count
    _shot(pg, "15-3-alert-strip-open")
    entry = pg.locator("#alerts-list [data-open-el='gpu:node1/2']")
    assert "Straggler" in entry.text_content() and "rank" in entry.text_content()
    entry.click()
    assert "node1/2" in pg.locator("#card-title").inner_text()
    address = _address(pg)
    assert "el=gpu%3Anode1%2F2" in address or "el=gpu:node1/2" in address
    job = pg.locator("#alerts-list [data-highlight-job]").first.get_attribute("data-highlight-job")
    assert not pg.locator("#alerts-list").is_visible()  # opening an entry closes the list
    pg.click("#alerts-toggle")
    pg.locator("#alerts-list [data-highlight-job]").first.click()
    assert "job-highlight" in pg.locator("body").get_attribute("class")
    # The lit GPUs and the job's, read at one moment: the XID 79 (30 s in) has Slurm requeue the job, which then
    # holds no GPU until node2 is back (a freed GPU no longer shows its ended job: reports.live, arg_max_null).
    lit, expected = pg.evaluate(
        """(job) => [
            [...document.querySelectorAll("[data-gpu][data-job-lit='true']")].map((e) => e.dataset.gpu),
            window.hpcwatch.state.snapshot.job_gpus[job] || [],
        ]""",
        job,
    )
    assert set(lit) == set(expected)
    assert not expected or "node1/2" in lit  # while the job runs, the straggler's GPU is one of its own
    assert f"job={job}" in _address(pg)
    _shot(pg, "15-4-job-highlight")
    pg.click("#job-clear")
    assert "job-highlight" not in pg.locator("body").get_attribute("class") and "job=" not in _address(pg)


def test_gpu_card_job_button_lights_the_jobs_gpus(page):
    page.locator("[data-gpu='node1/0']").click()
    button = page.locator("#card [data-highlight-job]").first
    job = button.get_attribute("data-highlight-job")
    button.click()
    lit = page.eval_on_selector_all("[data-gpu][data-job-lit='true']", "els => els.map(e => e.dataset.gpu)")
    assert "node1/0" in lit and set(lit) == set(page.evaluate(f"window.hpcwatch.state.snapshot.job_gpus[{job!r}]"))


def test_the_job_highlight_follows_a_delta_that_moves_the_jobs_gpus(page):
    """The highlight is redrawn only when the job or its GPU list changes (monitor.js drawJob): a delta that
    gives the job other GPUs must move it, one that does not touch the job must leave it."""
    job = page.evaluate("Object.keys(window.hpcwatch.state.snapshot.job_gpus)[0]")
    page.evaluate(f"window.hpcwatch.highlightJob({job!r})")
    lit = page.evaluate(
        """(job) => {
        const lit = () => [...document.querySelectorAll("[data-gpu][data-job-lit='true']")].map((e) => e.dataset.gpu);
        const s = window.hpcwatch.state;
        window.hpcwatch.applyDelta({ v: s.version + 1, base: s.version, job_gpus: { [job]: ["node2/7"] } });
        const moved = lit();
        window.hpcwatch.applyDelta({ v: s.version + 1, base: s.version, gpus: { "node1/0": { util_pct: 1 } } });
        return [moved, lit()];
    }""",
        job,
    )
    assert lit == [["node2/7"], ["node2/7"]]


def test_url_restores_mode_selection_and_job(page, server):
    job = page.evaluate("Object.keys(window.hpcwatch.state.snapshot.job_gpus)[0]")
    page.goto(f"{server}?mode=threats&el=gpu:node1/2&job={job}")
    _wait_ticks(page, 1)
    assert "view-threats" in page.locator("body").get_attribute("class")
    assert page.locator("[data-view='threats']").get_attribute("aria-pressed") == "true"
    assert "node1/2" in page.locator("#card-title").inner_text()
    assert page.locator("#job-chip").is_visible() and job in page.locator("#job-chip-text").text_content()
    _shot(page, "15-5-url-restored")
    page.click("[data-view='observer']")
    address = _address(page)
    assert "mode=observer" in address and f"job={job}" in address
    page.keyboard.press("Escape")
    assert "el=" not in _address(page)
    page.click("[data-view='schematic']")
    assert "mode=" not in _address(page)  # the default mode is not spelt out


def test_stale_data_is_greyed_with_its_age(browser, server):
    context = browser.new_context(viewport=VIEWPORT, locale="en-US")
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    pg = context.new_page()
    pg.route("**/api/stream*", lambda route: route.abort())  # the stream never answers: boot snapshot only
    pg.goto(server)
    pg.wait_for_function("() => Number(document.body.dataset.ticks || 0) >= 1")
    # ready (bench_web.py's page ready) once the boot snapshot's values are painted, without the stream
    pg.wait_for_function("() => performance.getEntriesByName('hpcwatch:ready').length > 0")
    assert "stale" not in pg.locator("body").get_attribute("class").split()
    # the newest sample 5 minutes old (a collector that stopped): grey at once, with its age
    pg.evaluate("window.hpcwatch.applySnapshot({...window.hpcwatch.state.snapshot, age_s: 300})")
    assert "stale" in pg.locator("body").get_attribute("class").split()
    assert pg.locator("#stale-age").text_content().startswith("data 5 min old")
    _shot(pg, "15-6-stale-greyed")
    # fresh data, then the stream goes silent past the (here lowered) threshold
    pg.evaluate("window.hpcwatch.applySnapshot({...window.hpcwatch.state.snapshot, age_s: 0, stale_after_s: 2})")
    assert "stale" not in pg.locator("body").get_attribute("class").split()
    pg.wait_for_function("() => document.body.classList.contains('stale')", timeout=5_000)
    assert pg.locator("#stale-age").is_visible()
    assert pg.evaluate("performance.getEntriesByName('hpcwatch:ready').length") == 1  # the first tick's, only
    context.close()


def test_a_refused_stream_says_so_and_is_asked_again_until_it_is_live(browser, server):
    """The server's stream cap answers 503 (``--max-streams``): EventSource gives up on it, the page must not."""
    context = browser.new_context(viewport=VIEWPORT, locale="en-US")
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    pg = context.new_page()
    refused: list[str] = []

    def cap_full_once(route):
        if not refused:
            refused.append(route.request.url)
            route.fulfill(status=503, body="too many live streams", headers={"Retry-After": "5"})
        else:
            route.continue_()

    pg.route("**/api/stream*", cap_full_once)
    pg.goto(server)
    pg.wait_for_function("() => document.getElementById('conn-text').textContent.includes('refused')")
    assert "asking again in" in pg.inner_text("#conn-text")
    pg.wait_for_function("() => document.getElementById('conn').dataset.state === 'live'", timeout=60_000)
    assert len(refused) == 1
    context.close()


def test_a_stream_that_stays_silent_is_opened_anew(browser, server):
    """A connection that never answers (half-open after a network change, a stalled proxy): EventSource would wait
    for ever; the page opens the stream anew after its silence limit (here lowered to 2 s) and goes live."""
    context = browser.new_context(viewport=VIEWPORT, locale="en-US")
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    context.add_init_script("window.HPCWATCH_SILENT_MS = 2000")
    pg = context.new_page()
    held: list[str] = []

    def hold_the_first(route):
        if not held:
            held.append(route.request.url)  # neither answered nor refused: the request hangs
        else:
            route.continue_()

    pg.route("**/api/stream*", hold_the_first)
    pg.goto(server)
    pg.wait_for_function("() => Number(document.body.dataset.ticks || 0) >= 2", timeout=60_000)
    assert len(held) == 1
    assert pg.evaluate("window.hpcwatch.state.silentReconnects") >= 1
    context.close()


def test_every_element_has_a_tooltip_and_gpu_tooltips_carry_power_and_temperature(page):
    missing = page.eval_on_selector_all(
        ".el", "els => els.filter(e => !e.querySelector(':scope > title')?.textContent.trim()).map(e => e.dataset.el)"
    )
    assert missing == []
    tip = page.locator("title[data-tip='gpu:node1/2']").text_content()
    assert " W" in tip and "°C" in tip and "job " in tip and tip.split("job ")[-1] != "—"
    legend = page.locator("#legend-colours")
    page.click("#legend-toggle")  # the prose legend waits behind "?" (issue 27 point 10)
    assert legend.is_visible() and "XID" in legend.text_content() and "70 %" in legend.text_content()
    page.click("[data-view='threats']")
    assert legend.is_visible()  # the marks' legend holds in every view
