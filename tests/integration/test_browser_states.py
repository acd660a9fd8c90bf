"""True states on the page (issue 27, point 1): a lost GPU shows no number, its drained node says so, the
requeued job reads requeued, and the recent-events strip lists the XID, the failure and the requeue.

One demo for the module (``problem_server``: a straggler and an XID 79 on node2 GPU 3, 30 s in), played faster
than the wall clock (``SPEED``).
"""

from __future__ import annotations

import pytest

from tests.integration.test_browser import (  # noqa: F401 - fixtures are used by name
    ARTIFACTS,
    _start_demo,
    _stop,
    _wait_ticks,
    browser,
    problem_page,
)

pytestmark = pytest.mark.integration
SPEED = 3
"""Simulated seconds a real second (``demo --speed``). The course is a real cluster's, each phase at its length in
the cluster's own time (the page's clock is the newest sample's): the XID comes 30 s in, the GPU leaves the scrape
20 s later and its last values age out of the latest 30 s after that, 80 s: 27 s here. node2 stays drained, and
its job requeued, until its reboot ends 220 s in: 73 s here, for the module's three tests (at 4, a loaded machine
left them 20 s to spare). A node is scraped once a tick (a real second), every SPEED s of its time:
dcgm-exporter's own default is 30 s."""
LOST_TIMEOUT_MS = 150_000


@pytest.fixture(scope="module")
def problem_server():
    """test_browser's problem demo (a straggler on node1 GPU 2, an XID 79 on node2 GPU 3) at ``SPEED``."""
    proc, url = _start_demo("--scenario", "straggler", "--scenario", "xid79", "--speed", str(SPEED))
    yield url
    _stop(proc)


def test_the_xid_node_is_drained_and_its_lost_gpu_shows_no_number(problem_page):
    pg = problem_page
    pg.wait_for_selector("[data-gpu='node2/0'][data-state='drained']", timeout=LOST_TIMEOUT_MS, state="attached")
    pg.wait_for_selector("[data-gpu='node2/3'][data-state='lost']", timeout=LOST_TIMEOUT_MS, state="attached")
    text = pg.locator("[data-live='util:node2/3']").text_content()
    assert text == "lost" and "%" not in text
    assert "W" not in (pg.locator("[data-live='pt:node2/3']").text_content() or "")
    assert pg.locator("[data-gpu='node1/0'][data-state]").count() == 0  # node1 is in service
    assert pg.locator("g[data-node='node2'] .node-title").text_content() == "node2 · drained"
    assert pg.locator("g[data-node='node1'] .node-title").text_content() == "node1"
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "states_lost_gpu.png"))


def test_the_events_strip_tells_xid_failure_and_requeue_newest_first(problem_page):
    pg = problem_page
    pg.wait_for_selector("#events-list li[data-what='requeue']", timeout=LOST_TIMEOUT_MS, state="attached")
    whats = pg.eval_on_selector_all("#events-list li", "els => els.map((e) => e.dataset.what)")
    assert {"xid", "failure", "requeue"} <= set(whats)
    times = pg.eval_on_selector_all(
        "#events-list li time", "els => els.map((e) => Date.parse(e.getAttribute('datetime')))"
    )
    assert times == sorted(times, reverse=True)
    assert "XID 79" in pg.locator("#events-list li[data-what='xid']").first.text_content()
    _wait_ticks(pg, 1)
    row = pg.locator("#queue-table tr[data-requeued='true']")
    assert row.count() >= 1 and "REQUEUED" in row.first.text_content()
    pg.locator("#events").screenshot(path=str(ARTIFACTS / "states_events.png"))


def test_the_node_card_has_its_timeline_and_the_job_page_its_failure_story(problem_page, problem_server):
    pg = problem_page
    pg.wait_for_selector("#events-list li[data-what='requeue']", timeout=LOST_TIMEOUT_MS, state="attached")
    pg.locator("[data-el='node:node2']").first.focus()
    pg.keyboard.press("Enter")
    pg.wait_for_selector("[data-timeline='node2'] li[data-what='xid']", state="attached")
    assert "drained" in pg.locator("#card-live [data-value='state']").first.text_content()
    nodes = pg.eval_on_selector_all("[data-timeline='node2'] li[data-node]", "els => els.map((e) => e.dataset.node)")
    assert nodes and set(nodes) == {"node2"}
    job = pg.eval_on_selector("#queue-table tr[data-requeued='true']", "el => el.dataset.job")
    pg.goto(f"{problem_server}job/{job}")
    whats = pg.eval_on_selector_all("#job-story li", "els => els.map((e) => e.dataset.what)")
    assert whats.index("failure") < whats.index("requeue") and "xid" in whats
    assert "%" in pg.locator("[data-value='compute-goodput']").text_content()
    pg.screenshot(path=str(ARTIFACTS / "states_job_story.png"), full_page=True)
