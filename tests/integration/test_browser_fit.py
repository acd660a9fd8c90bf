"""Scale, fit, richer tiles and accessibility of the page in a real Chromium (issue 15, items 3, 4 and 9).

Reuses test_browser.py's fixtures (the demo server, Chromium) and adds a 128-node demo. axe-core comes from
the npm registry into the git-ignored .test-deps/ (scripts/test installs it); it is injected into the page by
the test only; the product never loads it. Screenshots go to tests/integration/artifacts/fit-*.png.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.integration.test_browser import (  # noqa: F401 - fixtures are used by name
    ACTION_TIMEOUT_MS,
    ARTIFACTS,
    _address,
    _start_demo,
    _stop,
    _wait_page,
    _wait_ticks,
    browser,
    page,
    problem_page,
    problem_server,
    server,
)

pytestmark = pytest.mark.integration

AXE_JS = Path(__file__).parents[2] / ".test-deps" / "node_modules" / "axe-core" / "axe.min.js"
#: Widths the issue names: a laptop, a 1080p wall screen, a phone (iPhone 12-15: 390 × 844 CSS px).
WIDTHS = {1440: 1000, 1920: 1080, 390: 844}
#: Smallest text we accept on the drawing, rendered (font size × the drawing's scale). Ours: 11 px is the
#: smallest size the page uses anywhere (the legends), so no part of the drawing is smaller than its captions.
MIN_TEXT_PX = 11.0
VIEWS = ("schematic", "observer", "threats")


@pytest.fixture(scope="module")
def big_server():
    """``hpcwatch demo --nodes 128``: 1,024 GPUs."""
    proc, url = _start_demo("--nodes", "128")
    yield url
    _stop(proc)


def _open(browser, url: str, width: int, *, query: str = ""):
    context = browser.new_context(viewport={"width": width, "height": WIDTHS[width]}, locale="en-US")
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda err: errors.append(str(err)))
    pg.goto(url + query)
    _wait_ticks(pg, 1)
    pg.errors = errors
    return context, pg


def _scale(pg) -> float:
    return float(pg.get_attribute("#schematic-wrap", "data-scale"))


def _settled_scale(pg) -> float:
    """The drawing's scale once layout has settled: a scroll bar that appears re-fits it through the page's
    ResizeObserver, which runs before the next frame, so two frames without change are enough."""
    return float(
        pg.evaluate(
            """async () => {
              const frame = () => new Promise((done) => requestAnimationFrame(() => done()));
              const read = () => document.getElementById("schematic-wrap").dataset.scale;
              let before;
              do { before = read(); await frame(); await frame(); } while (read() !== before);
              return before;
            }"""
        )
    )


# -- geometry measured in the page -------------------------------------------------------------------------

SMALLEST_TEXT_JS = """(selector) => {
  let min = Infinity, where = null;
  for (const el of document.querySelectorAll(selector)) {
    if (!el.textContent.trim() || !el.getClientRects().length) continue;
    const px = parseFloat(getComputedStyle(el).fontSize) * (el.getScreenCTM ? el.getScreenCTM().a : 1);
    if (px < min) { min = px; where = el.textContent.trim(); }
  }
  return [min, where];
}"""

OVERLAPS_JS = """(selector) => {
  const boxes = [...document.querySelectorAll(selector)].map((el) => [el, el.getBoundingClientRect()]);
  const hits = [];
  boxes.sort((a, b) => a[1].left - b[1].left);
  for (let i = 0; i < boxes.length; i++) {
    for (let j = i + 1; j < boxes.length && boxes[j][1].left < boxes[i][1].right; j++) {
      const a = boxes[i][1], b = boxes[j][1];
      if (a.right > b.left + 0.5 && b.right > a.left + 0.5 && a.bottom > b.top + 0.5 && b.bottom > a.top + 0.5)
        hits.push([boxes[i][0].textContent.trim().slice(0, 30), boxes[j][0].textContent.trim().slice(0, 30)]);
    }
  }
  return hits;
}"""

# Every node tile's texts (name, summary) stay inside the tile's box.
TEXT_INSIDE_TILES_JS = """() => {
  const out = [];
  for (const group of document.querySelectorAll('.tile')) {
    const box = group.querySelector('.node-box').getBoundingClientRect();
    for (const text of group.querySelectorAll('text')) {
      const r = text.getBoundingClientRect();
      if (!text.textContent.trim()) continue;
      if (r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5)
        out.push(text.textContent.trim());
    }
  }
  return out;
}"""


def _scroll(pg) -> tuple[int, int]:
    return tuple(
        pg.evaluate(
            "[document.getElementById('schematic-wrap').scrollWidth,"
            " document.getElementById('schematic-wrap').clientWidth]"
        )
    )


@pytest.mark.parametrize("width", list(WIDTHS))
def test_128_nodes_are_legible_without_overlap(browser, big_server, width):
    context, pg = _open(browser, big_server, width)
    try:
        assert pg.locator(".tile g.el[data-node]").count() == 128
        assert pg.locator("[data-gpu]").count() == 1024
        smallest, where = pg.evaluate(SMALLEST_TEXT_JS, "#schematic-wrap text")
        assert smallest >= MIN_TEXT_PX, (smallest, where)
        assert pg.evaluate(OVERLAPS_JS, ".tile .node-box") == []
        assert pg.evaluate(TEXT_INSIDE_TILES_JS) == []
        assert pg.evaluate(OVERLAPS_JS, ".topbar > *") == []  # the header does not overlap itself
        scroll_w, client_w = _scroll(pg)
        if width == 1920:  # fits the screen's width: nothing to pan, the drawing fills it (not 60 %)
            assert scroll_w <= client_w + 1
            svg_w = pg.evaluate("document.querySelector('svg.schematic').getBoundingClientRect().width")
            assert svg_w > 0.9 * width
        else:  # narrower: the text keeps its size and the drawing pans
            assert scroll_w > client_w
        pg.screenshot(path=str(ARTIFACTS / f"fit-128-nodes-{width}.png"))
        assert not pg.errors, pg.errors
    finally:
        context.close()


def test_phone_header_and_gantt_labels_are_readable(browser, server):
    context, pg = _open(browser, server, 390)
    try:
        assert pg.evaluate(OVERLAPS_JS, ".topbar > *") == []
        assert pg.evaluate(OVERLAPS_JS, ".brand > *") == []
        pg.wait_for_function("() => document.querySelectorAll('#gantt .row-label').length > 0", timeout=20_000)
        smallest, where = pg.evaluate(SMALLEST_TEXT_JS, "#gantt .row-label")
        assert smallest >= 10.5, (smallest, where)  # was 3 px: the 760 px chart pans instead of shrinking
        scroll_w = pg.evaluate("document.documentElement.scrollWidth")
        assert scroll_w <= 390 + 1  # the page itself never scrolls sideways
        pg.screenshot(path=str(ARTIFACTS / "fit-phone-390.png"), full_page=False)
        pg.locator("#player").scroll_into_view_if_needed()
        pg.screenshot(path=str(ARTIFACTS / "fit-phone-390-player.png"))
    finally:
        context.close()


def test_zoom_buttons_and_fit(browser, big_server):
    context, pg = _open(browser, big_server, 1920)
    try:
        fitted = _settled_scale(pg)
        pg.click("#zoom-in")
        assert _scale(pg) == pytest.approx(fitted * 1.25, rel=1e-3)
        assert pg.get_attribute("#zoom-fit", "aria-pressed") == "false"
        assert _scroll(pg)[0] > _scroll(pg)[1]  # zoomed in: it pans
        pg.click("#zoom-out")
        pg.click("#zoom-out")
        assert _scale(pg) < fitted
        pg.click("#zoom-fit")
        assert _settled_scale(pg) == pytest.approx(fitted, rel=1e-3)
        assert "Zoom" in pg.inner_text("#zoom-readout")
    finally:
        context.close()


def test_jump_to_node_focuses_it_and_opens_its_card_with_its_gpus(browser, big_server):
    context, pg = _open(browser, big_server, 1440)
    try:
        _settled_scale(pg)  # a jump before the drawing is fitted lands where the fit then moves it away from
        pg.fill("#jump-form input[name=node]", "node97")
        pg.press("#jump-form input[name=node]", "Enter")
        assert pg.evaluate("document.activeElement.dataset.node") == "node97"
        # In view once the page has settled: a smooth scroll, or a tick that redraws the panels above the drawing,
        # can move it for a moment (a loaded machine, full suite: read at y = -81 px mid-way).
        pg.wait_for_function(
            """() => { const r = document.querySelector("g.el[data-node='node97']").getBoundingClientRect();
                       return r.left >= 0 && r.right <= window.innerWidth && r.top >= 0 && r.top <= window.innerHeight; }""",
            timeout=ACTION_TIMEOUT_MS,
        )
        assert "node97" in pg.inner_text("#card-title")
        gpus = pg.locator("#card [data-open-gpu]")
        assert gpus.count() == 8  # the aggregate tile opens to its GPUs
        gpus.nth(2).click()
        assert "node97/2" in pg.inner_text("#card-title")
        assert pg.inner_text("#card [data-value='power_w']").endswith(" W")
        pg.fill("#jump-form input[name=node]", "nosuchnode")
        pg.press("#jump-form input[name=node]", "Enter")
        assert "nosuchnode" in pg.inner_text("#jump-status")
    finally:
        context.close()


def test_kiosk_mode_fills_a_wall_screen_with_the_drawing(browser, big_server):
    context, pg = _open(browser, big_server, 1920, query="?kiosk=1")
    try:
        assert "kiosk" in pg.locator("body").get_attribute("class")
        assert not pg.locator(".toolbar").is_visible() and not pg.locator("#player").is_visible()
        assert pg.locator("#alerts-toggle").is_visible()  # problems still show on the wall
        svg = pg.locator("svg.schematic").bounding_box()
        assert svg["y"] + svg["height"] <= WIDTHS[1920] + 1  # the whole cluster on one screen
        assert svg["width"] > 0.8 * 1920
        smallest, where = pg.evaluate(SMALLEST_TEXT_JS, "#schematic-wrap text")
        assert smallest >= MIN_TEXT_PX, (smallest, where)
        pg.screenshot(path=str(ARTIFACTS / "fit-kiosk-128-nodes-1920.png"))
        pg.click("#kiosk-toggle")
        assert "kiosk" not in pg.locator("body").get_attribute("class")
        assert "kiosk" not in _address(pg)
    finally:
        context.close()


# -- richer tiles ------------------------------------------------------------------------------------------


def test_gpu_tile_shows_power_temperature_job_colour_and_speaks_its_values(page):
    pt = page.text_content("[data-live='pt:node1/2']")
    assert re.fullmatch(r"\d[\d,]* W", pt), pt  # temperature on its own line (issue 27 point 10)
    assert re.fullmatch(r"\d+ °C", page.text_content("[data-live='temp:node1/2']"))
    tile = page.locator("g.el[data-gpu='node1/2']")
    assert tile.get_attribute("data-jobc") in {str(i) for i in range(12)}
    label = tile.get_attribute("aria-label")
    assert re.match(r"GPU 2 of node1, \d+ % busy, \d[\d,]* W, \d+ °C, job \d+", label), label
    colour = page.evaluate("getComputedStyle(document.querySelector(\"[data-jobbar='node1/2']\")).fill")
    assert colour not in ("none", "transparent", "rgba(0, 0, 0, 0)")
    assert page.locator("#legend-jobs .chip").count() >= 1
    first = label
    for _ in range(6):  # the spoken name follows the live values
        _wait_ticks(page, 1)
        if tile.get_attribute("aria-label") != first:
            break
    else:
        pytest.fail("the GPU's spoken name never changed with its values")


#: Each drawn GPU's job (its first) and colour index, and the legend's chips in order.
JOB_COLOURS_JS = """() => ({
  tiles: [...document.querySelectorAll('[data-gpu][data-jobc]')].map((el) =>
    [(window.hpcwatch.state.snapshot.gpus[el.dataset.gpu]?.job ?? '').split(',')[0], el.dataset.jobc]),
  legend: [...document.querySelectorAll('#legend-jobs .chip')].map((el) => [el.textContent.trim(), el.dataset.jobc]),
})"""


def test_the_first_twelve_jobs_each_have_their_own_colour_at_128_nodes(browser, big_server):
    context, pg = _open(browser, big_server, 1440)
    try:
        drawn = pg.evaluate(JOB_COLOURS_JS)
        legend = dict(drawn["legend"])
        assert len(legend) >= 5, drawn["legend"]  # enough jobs that 8 hashed colours would have collided
        assert len(set(legend.values())) == len(legend), drawn["legend"]  # the legend's jobs: no colour twice
        for job, colour in drawn["tiles"]:  # each tile in its job's colour, as the legend shows it
            assert legend.get(job, colour) == colour, (job, colour, legend.get(job))
    finally:
        context.close()


def test_gpu_card_shows_sparklines_over_a_chosen_time_range(page):
    page.click("g.el[data-gpu='node1/2']")
    line = page.locator("#card .spark-row[data-spark='util_pct'] polyline")
    line.first.wait_for(timeout=20_000)
    label = page.get_attribute("#card .spark-row[data-spark='power_w'] svg", "aria-label")
    assert re.search(r"Power: .* W → .* W over 5 min \(min .* W, max .* W\)", label), label
    # The last choice wins, not the last answer: the hour asked first is answered after the 15 minutes.
    held = []
    asked_hour = lambda url: "/api/history" in url and "range_s=3600" in url  # noqa: E731
    page.route(asked_hour, lambda route: held.append(route))
    with page.expect_request(lambda r: asked_hour(r.url)):
        page.select_option("#hist-range", "3600")
    with page.expect_response(lambda r: "/api/history" in r.url and "range_s=900" in r.url):
        page.select_option("#hist-range", "900")
    spoken = "() => document.querySelector(\"#card .spark-row[data-spark='util_pct'] svg\")?.getAttribute('aria-label')"
    page.wait_for_function(f"() => ({spoken})()?.includes('15 min')")
    dropped = "() => Number(document.querySelector('#card .hist-body')?.dataset.dropped ?? 0)"
    before = page.evaluate(dropped)  # a refresh answered after the change of range was dropped too
    with page.expect_event("requestfinished", lambda r: asked_hour(r.url)):
        held[0].continue_()
    page.wait_for_function(f"() => ({dropped})() === {before + 1}", timeout=10_000)
    assert "15 min" in page.evaluate(spoken)
    page.unroute(asked_hour)
    _shot_card(page, "fit-gpu-card-sparklines")


def _shot_card(pg, name: str) -> None:
    pg.locator("#card").screenshot(path=str(ARTIFACTS / f"{name}.png"))


def test_straggler_tile_says_so_in_its_spoken_name(problem_page):
    pg = problem_page
    pg.wait_for_function(
        "() => document.querySelector(\"g.el[data-gpu='node1/2']\").dataset.problem === 'straggler'", timeout=40_000
    )
    _wait_ticks(pg, 1)
    assert "slow" in pg.get_attribute("g.el[data-gpu='node1/2']", "aria-label")


def test_play_button_pauses_and_resumes(page):
    page.wait_for_function("() => document.getElementById('player').dataset.state === 'ready'", timeout=20_000)
    page.click("#play")
    page.wait_for_function("() => document.getElementById('player').dataset.state === 'playing'")
    page.click("#play")
    assert page.get_attribute("#player", "data-state") == "paused"
    head = page.get_attribute("#gantt line.playhead", "x1")
    page.wait_for_timeout(400)
    assert page.get_attribute("#gantt line.playhead", "x1") == head  # paused: the playhead stays
    page.click("#play")
    page.wait_for_function("() => document.getElementById('player').dataset.state === 'done'", timeout=20_000)


def test_ring_caption_stays_clear_of_the_ranks(page):
    page.wait_for_function("() => document.querySelectorAll('#ring .ring-node').length > 0", timeout=20_000)
    page.evaluate("document.querySelector('#ring .ring-centre').textContent = '‖ 7 waiting at the barrier, long text'")
    hits = page.evaluate(OVERLAPS_JS, "#ring .ring-node, #ring .ring-centre")
    assert not [h for h in hits if "waiting" in "".join(h)], hits


def test_timings_table_shows_its_barrier_column_at_1440(page):
    page.locator("#player details.detail >> nth=1").evaluate("d => d.open = true")
    page.wait_for_function("() => document.querySelectorAll('#step-table tbody tr').length > 0", timeout=20_000)
    wrap = page.locator("#step-table").evaluate("t => [t.parentElement.scrollWidth, t.parentElement.clientWidth]")
    assert wrap[0] <= wrap[1] + 1, wrap


# -- axe-core ----------------------------------------------------------------------------------------------


def _axe(pg) -> list[dict]:
    if not AXE_JS.exists():
        pytest.skip(f"axe-core is not installed at {AXE_JS}: run scripts/test (npm install axe-core)")
    if not pg.evaluate("Boolean(window.axe)"):
        # Not add_script_tag: it inserts an inline <script>, which the app's CSP (script-src 'self') refuses.
        # Evaluated through the DevTools protocol, axe runs on the page as served, its CSP still on.
        pg.evaluate(AXE_JS.read_text(encoding="utf-8") + "\n;undefined")
    result = pg.evaluate("axe.run(document, { resultTypes: ['violations'] })")
    return [
        {
            "id": v["id"],
            "impact": v["impact"],
            "nodes": len(v["nodes"]),
            "first": v["nodes"][0]["target"] if v["nodes"] else None,
            "html": v["nodes"][0]["html"][:300] if v["nodes"] else None,  # what a failure shows, to fix it
        }
        for v in result["violations"]
        if v["impact"] in ("serious", "critical")
    ]


def _axe_every_view(pg, name: str) -> dict[str, list[dict]]:
    found = {}
    for view in VIEWS:
        pg.click(f"[data-view='{view}']")
        found[view] = _axe(pg)
    pg.click("[data-reading='decider']")
    found["decider"] = _axe(pg)
    pg.click("[data-reading='engineer']")
    (ARTIFACTS / f"axe-{name}.json").write_text(json.dumps(found, indent=1))
    return {k: v for k, v in found.items() if v}


@pytest.mark.parametrize("width", list(WIDTHS))
def test_axe_finds_no_serious_violation_on_the_reference_cluster(browser, server, width):
    context, pg = _open(browser, server, width)
    try:
        pg.click("g.el[data-gpu='node1/2']")  # with a card open too
        assert _axe_every_view(pg, f"reference-{width}") == {}
    finally:
        context.close()


@pytest.mark.parametrize("width", [1920, 390])
def test_axe_finds_no_serious_violation_at_128_nodes(browser, big_server, width):
    """Every view at 1920; on the phone the default view only (one axe pass over 1,024 tiles costs ~10 s of a
    core, and what a view changes, colours and labels, is checked at 1920 and on the phone's reference cluster)."""
    context, pg = _open(browser, big_server, width)
    try:
        # axe on a page still laying out judged tiles off the screen as if their names had lost their text
        # (label-content-name-mismatch on 112 of 128, seen on a loaded machine): it looks once the page settled.
        pg.keyboard.press("Escape")
        pg.locator("g.el[data-node='node5']").focus()
        pg.keyboard.press("Enter")  # a node card with its GPU buttons
        _wait_ticks(pg, 2)
        _settled_scale(pg)
        if width == 1920:
            assert _axe_every_view(pg, f"128-nodes-{width}") == {}
        else:
            found = _axe(pg)
            assert found == [], json.dumps(found)  # the whole of it, html included: pytest's diff cuts it
    finally:
        context.close()


def test_axe_finds_no_serious_violation_in_kiosk_mode(browser, big_server):
    context, pg = _open(browser, big_server, 1920, query="?kiosk=1")
    try:
        assert _axe(pg) == []
    finally:
        context.close()


def test_axe_finds_no_serious_violation_with_problems_listed(problem_page):
    pg = problem_page
    pg.wait_for_function("() => Number(document.getElementById('alerts-toggle').dataset.count) > 0", timeout=60_000)
    pg.click("#alerts-toggle")
    assert _axe(pg) == []


# -- issue 27: live at scale (deltas), the phone ------------------------------------------------------------

# Every GPU tile's number against the page's merged snapshot: what the deltas built is what the tiles say.
#: The GPU tiles on screen that differ from the page's snapshot: a drawn GPU's number, an aggregate cell's level
#: (its colour: high, mid, low, none). At 64 nodes and more a tile off screen is written only when it scrolls in
#: (tiles.js), so only tiles on screen are read; a page with none on screen says so.
TILES_MATCH_SNAPSHOT_JS = """() => {
  const gpus = window.hpcwatch.state.snapshot.gpus || {};
  const wrap = document.getElementById("schematic-wrap").getBoundingClientRect();
  const onScreen = (el) => {
    const r = el.getBoundingClientRect();
    return r.bottom > Math.max(0, wrap.top) && r.top < Math.min(innerHeight, wrap.bottom)
      && r.right > Math.max(0, wrap.left) && r.left < Math.min(innerWidth, wrap.right);
  };
  const level = (u) => (u === undefined || u === null ? "none" : u >= 70 ? "high" : u >= 20 ? "mid" : "low");
  const wrong = [];
  let read = 0;
  for (const cell of document.querySelectorAll("[data-gpu]")) {
    if (!onScreen(cell) || cell.dataset.state) continue;  // lost/drained: words, no number
    read += 1;
    const id = cell.dataset.gpu;
    const util = gpus[id]?.util_pct;
    if ((cell.dataset.level || "none") !== level(util)) wrong.push([id, cell.dataset.level, util]);
    const text = document.querySelector(`[data-live='util:${CSS.escape(id)}']`);
    if (!text) continue;
    const shown = text.textContent.replace(/[^0-9]/g, "");
    if (shown !== (util === undefined || util === null ? "" : String(Math.round(util)))) wrong.push([id, shown, util]);
  }
  // An aggregate tile's sum ("97 % · 5.6 kW") follows its GPUs' newest power, which moves at every scrape.
  for (const sum of document.querySelectorAll("[data-live^='sum:']")) {
    const node = sum.dataset.live.slice(4);
    // Where its tile is: a sum never written yet is empty text, whose box sits at the drawing's origin.
    if (!onScreen(document.querySelector(`g[data-node='${CSS.escape(node)}']`))) continue;
    const cells = [...document.querySelectorAll(`[data-gpu^='${CSS.escape(node)}/']`)];   // the page's order
    const mine = cells.map((cell) => gpus[cell.dataset.gpu]).filter(Boolean);
    if (!mine.length) continue;
    const mean = mine.reduce((a, g) => a + (g.util_pct ?? 0), 0) / mine.length;
    const kw = mine.reduce((a, g) => a + (g.power_w ?? 0), 0) / 1000;
    const digits = (n) => new Intl.NumberFormat("en-US", { maximumFractionDigits: n, minimumFractionDigits: n });
    const want = `${digits(0).format(mean)} % · ${digits(1).format(kw)} kW`;   // as util.js fmt rounds
    if (!sum.textContent.endsWith(want)) wrong.push([node, sum.textContent, want]);
  }
  return read ? wrong : [["no GPU tile on screen"]];
}"""


#: ``CHECK`` (a function) run three frames later: a tile scrolled in is written by the page's
#: IntersectionObserver, whose callback comes after the next frame's layout; no tick is waited for.
AFTER_FRAMES_JS = """async () => {
  const frame = () => new Promise((done) => requestAnimationFrame(() => done()));
  await frame(); await frame(); await frame();
  return (CHECK)();
}"""


#: On a loaded 2-core machine a 128-node demo's ticks came every 15 s (4 versions in 60 s at load 14): each
#: wait below is for one tick.
TICK_WAIT_MS = 180_000


def test_the_stream_sends_deltas_and_the_tiles_follow_them_at_128_nodes(browser, big_server):
    context, pg = _open(browser, big_server, 1440)
    try:
        _wait_page(pg, "() => (window.hpcwatch.state.deltas || 0) >= 1", TICK_WAIT_MS)
        assert pg.evaluate(TILES_MATCH_SNAPSHOT_JS) == []
        # A delta on top of a version the page does not hold is not applied: the page reconnects and the
        # server answers with a full snapshot, after which deltas flow again.
        # Read, applied and read again in one script: a tick between two evaluations changed the version (CI).
        version, after = pg.evaluate(
            """() => {
              const before = window.hpcwatch.state.version;
              window.hpcwatch.applyDelta({v: -1, base: -2, set: {}});
              return [before, window.hpcwatch.state.version];
            }"""
        )
        assert after == version  # the stray delta changed nothing
        _wait_page(
            pg,
            f"() => window.hpcwatch.state.reconnects === 1 && window.hpcwatch.state.version > {version}",
            TICK_WAIT_MS,
        )
        deltas = pg.evaluate("window.hpcwatch.state.deltas")
        _wait_page(pg, f"() => window.hpcwatch.state.deltas > {deltas}", TICK_WAIT_MS)
        assert pg.evaluate(TILES_MATCH_SNAPSHOT_JS) == []
        # The last node's tile, off screen while the deltas came, shows the newest numbers once scrolled in.
        last = pg.locator(".tile g[data-node]").last
        last.scroll_into_view_if_needed()
        assert pg.evaluate(AFTER_FRAMES_JS.replace("CHECK", TILES_MATCH_SNAPSHOT_JS)) == []
        assert not pg.errors, pg.errors
    finally:
        context.close()


def test_a_phone_sees_the_problem_and_the_first_tiles_on_its_first_screen(browser, big_server):
    context, pg = _open(browser, big_server, 390)
    try:
        _settled_scale(pg)
        where = pg.evaluate(
            """() => {
              const box = (s) => document.querySelector(s).getBoundingClientRect();
              return { problem: box('#alerts-toggle').bottom, tile: box('.tile g.el[data-node]').bottom,
                       width: document.documentElement.scrollWidth };
            }"""
        )
        assert where["problem"] <= 100, where  # the problems' button in the header's first rows
        assert where["tile"] <= 844, where  # a whole first node tile on the first screen (was at y ≈ 830)
        assert where["width"] <= 390, where
        assert pg.evaluate(OVERLAPS_JS, ".topbar > *") == []
        pg.screenshot(path=str(ARTIFACTS / "fit-phone-128-first-screen.png"))
        pg.click("#legend-toggle")  # the job colours wait behind "?" with the rest of the legend
        assert pg.locator("#legend-jobs").is_visible()
        assert not pg.errors, pg.errors
    finally:
        context.close()


def test_the_job_page_lays_out_within_a_phone_at_128_nodes(browser, big_server):
    import urllib.request

    with urllib.request.urlopen(big_server + "api/live", timeout=120) as response:
        jobs = json.loads(response.read())["queue"]["jobs"]
    job = max((j for j in jobs if j.get("state") == "RUNNING"), key=lambda j: j.get("gpus") or 0)
    context = browser.new_context(viewport={"width": 390, "height": 844}, locale="en-US")
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    try:
        pg = context.new_page()
        pg.goto(big_server + "job/" + job["id"], timeout=120_000)
        assert pg.locator("#job-summary").is_visible()
        assert pg.evaluate("document.documentElement.scrollWidth") <= 390  # was 676
        pg.screenshot(path=str(ARTIFACTS / "fit-phone-128-job-page.png"))
    finally:
        context.close()
