"""Issue 27, point 3 in a real Chromium: alerts that triage at 128 nodes.

A 128-node twin run of 660 simulated seconds (long enough for the ``idle_allocated`` rule's 10 minutes) with an
XID 79, ingested into a store and served by ``hpcwatch serve --db``: the store holds one XID and ~130 GPUs idle
while allocated. The page must list them as two groups, the XID first, the GPUs in natural order, with
readable titles; Escape closes the list, and the open list never covers "Go to node" (the same titles at two
nodes: test_browser_monitor.py). Screenshots go to tests/integration/artifacts/.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.conftest import free_port
from tests.integration.test_browser import (  # noqa: F401 - fixtures are used by name
    ACTION_TIMEOUT_MS,
    ARTIFACTS,
    VIEWPORT,
    _stop,
    _wait_ticks,
    browser,
    wait_answering,
)
from tests.integration.test_browser_fit import _axe

pytestmark = pytest.mark.integration

SHOTS = ARTIFACTS
NODES = 128
#: Simulated seconds: the idle_allocated rule needs 600 s of idleness (analysis/health.py HealthConfig.idle_min_s).
RUN_S = 660


def _hpcwatch(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "hpcwatch", *args], check=True, stdout=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def triage_server(tmp_path_factory):
    """``twin run --nodes 128 --scenario xid79`` → ``ingest`` → ``serve --db`` with the 128-node model."""
    from importlib import resources

    root = tmp_path_factory.mktemp("triage")
    out, db, model = root / "twin", root / "store", root / "cluster.yaml"
    _hpcwatch(
        "twin",
        "run",
        "--out",
        str(out),
        "--nodes",
        str(NODES),
        "--duration",
        str(RUN_S),
        "--step",
        "30",
        "--scenario",
        "xid79",
    )
    _hpcwatch("ingest", str(out), "--db", str(db))
    doc = yaml.safe_load(resources.files("hpcwatch.model").joinpath("reference.yaml").read_text())
    doc["nodes"] = [dict(doc["nodes"][0], count=NODES)]
    model.write_text(yaml.safe_dump(doc))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcwatch", "serve", "--db", str(db), "--model", str(model), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/"
    wait_answering(proc, url, "hpcwatch serve")
    yield url
    _stop(proc)


@pytest.fixture
def triage_page(browser, triage_server):
    SHOTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport=VIEWPORT, locale="en-US")
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda err: errors.append(str(err)))
    pg.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    pg.goto(triage_server)
    _wait_ticks(pg, 1)
    pg.wait_for_function("() => Number(document.getElementById('alerts-toggle').dataset.count) > 0", timeout=60_000)
    yield pg
    context.close()
    assert not errors, errors


def _natural(name: str) -> tuple:
    import re

    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name) if p)


def test_128_nodes_list_one_group_per_rule_worst_first_in_natural_order(triage_page):
    pg = triage_page
    pg.click("#alerts-toggle")
    items = pg.locator("#alerts-list > li[data-group]")
    assert items.count() == int(pg.locator("#alerts-toggle").get_attribute("data-count"))
    groups = pg.evaluate("window.hpcwatch.state.snapshot.alerts")
    idle = next(g for g in groups if g["rule"] == "idle_allocated")
    assert idle["count"] >= 100  # the twin's idle allocated GPUs, as one group
    assert items.count() == len(groups) < 10  # not one entry per GPU
    # The worst first: the XID (drain) above the idle GPUs (warn), and named first on the page.
    assert items.first.get_attribute("data-mark") == "xid"
    assert "XID 79" in pg.locator("#alerts-worst").text_content()
    # Readable titles, never the rule's id.
    text = pg.locator("#alerts-list").inner_text()
    assert "idle_allocated" not in text and "rule " not in text
    idle_item = pg.locator("#alerts-list > li[data-mark='idle']")
    assert f"{idle['gpus']} GPUs idle while allocated" in idle_item.inner_text()
    # Its GPUs, in natural order (node2 before node10).
    idle_item.locator(".alert-show").click()
    shown = idle_item.locator(".alert-member").all_text_contents()
    assert len(shown) >= 10
    nodes = [name.split("/")[0] for name in shown]
    assert nodes == sorted(nodes, key=_natural), nodes
    pg.screenshot(path=str(SHOTS / "triage-128-open.png"))
    assert _axe(pg) == []  # the open list with its GPUs' buttons
    # A member opens its GPU's card (through its node: an aggregate tile's GPU has its own card).
    first = idle_item.locator(".alert-member").first
    el = first.get_attribute("data-open-el")
    first.click()
    assert el.split(":", 1)[1] in pg.locator("#card-title").inner_text()
    assert not pg.locator("#alerts-list").is_visible()


def test_a_filter_shows_one_kind_of_problem_and_all_again(triage_page):
    pg = triage_page
    pg.click("#alerts-toggle")
    groups = pg.evaluate("window.hpcwatch.state.snapshot.alerts")
    xids = sum(g["count"] for g in groups if g["mark"] == "xid")
    xid_filter = pg.locator(".alert-filter[data-filter='xid']")
    assert f"XID ({xids})" in xid_filter.inner_text()
    xid_filter.click()
    assert xid_filter.get_attribute("aria-pressed") == "true"
    visible = pg.locator("#alerts-list > li[data-group]:visible")
    assert visible.count() == sum(1 for g in groups if g["mark"] == "xid") >= 1
    assert all(m == "xid" for m in visible.evaluate_all("els => els.map(e => e.dataset.mark)"))
    assert not pg.locator("#alerts-list > li[data-mark='idle']").is_visible()  # 100+ idle GPUs out of the way
    assert _axe(pg) == []
    pg.locator(".alert-filter[data-filter='']").click()
    assert pg.locator("#alerts-list > li[data-group]:visible").count() == len(groups)


def test_escape_closes_the_list_and_it_never_covers_go_to_node(triage_page):
    pg = triage_page
    pg.click("#alerts-toggle")
    assert pg.locator("#alerts-list").is_visible()
    pg.keyboard.press("Escape")
    assert not pg.locator("#alerts-list").is_visible()
    assert pg.locator("#alerts-toggle").get_attribute("aria-expanded") == "false"
    assert pg.evaluate("document.activeElement.id") == "alerts-toggle"  # focus back where it was
    # Open again, expand the big group, then use "Go to node" with the list still open.
    pg.click("#alerts-toggle")
    pg.locator("#alerts-list > li[data-mark='idle'] .alert-show").click()
    pg.fill("#jump-form input[name='node']", "node100")
    pg.click("#jump-form button[type='submit']", timeout=5_000)  # fails if the list intercepts the click
    assert "node100" in pg.locator("#card-title").inner_text()
    pg.screenshot(path=str(SHOTS / "triage-128-jump.png"))


def test_128_node_tiles_carry_the_glyph_of_their_worst_gpu(triage_page):
    """Point 5 at scale: a tile's cells are too small for words, so the tile's corner shows the glyph."""
    pg = triage_page
    assert pg.locator("[data-tile-mark='node2']").text_content().startswith("✕")  # the XID wins over idle GPUs
    idle_tiles = pg.locator(".tile-mark[data-mark-kind='idle']")
    assert idle_tiles.count() >= 10 and idle_tiles.first.text_content().startswith("◌")
    styles = pg.evaluate(
        """() => ["xid", "idle"].map((kind) => { const box = document.querySelector(
             `.gpu-cell[data-problem='${kind}'] .gpu-box`); const s = getComputedStyle(box);
             return [s.fill, s.stroke, s.strokeDasharray]; })"""
    )
    assert styles[0] != styles[1] and styles[0][2] != styles[1][2], styles  # apart in grey too: the dashes
    pg.locator("#schematic-wrap").screenshot(path=str(SHOTS / "triage-128-tiles.png"))


def test_on_a_phone_the_worst_problem_and_the_list_fit_the_screen(browser, triage_server):
    context = browser.new_context(viewport={"width": 390, "height": 844}, locale="en-US")
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    pg = context.new_page()
    try:
        pg.goto(triage_server)
        pg.wait_for_function("() => Number(document.getElementById('alerts-toggle').dataset.count) > 0", timeout=60_000)
        right = pg.evaluate("document.getElementById('alerts-worst').getBoundingClientRect().right")
        assert right <= 390, right
        pg.click("#alerts-toggle")
        box = pg.evaluate("(() => { const r = document.getElementById('alerts-list').getBoundingClientRect();"
                          " return [r.left, r.right, r.top]; })()")  # fmt: skip
        assert box[0] >= 0 and box[1] <= 390 and box[2] < 844, box  # on the first screen
        pg.screenshot(path=str(SHOTS / "triage-128-phone.png"))
    finally:
        context.close()
