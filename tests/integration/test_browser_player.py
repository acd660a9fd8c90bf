"""Issue 27, point 7 in a real Chromium: the step player's loads are ordered, the last click wins.

The first example's steps are held back by the browser (a Playwright route) until after "With straggler" was
clicked and drawn; when the late response arrives, the chart must still show the straggler's step.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

import pytest

from tests.integration.test_browser import (  # noqa: F401 - fixtures are used by name
    ACTION_TIMEOUT_MS,
    VIEWPORT,
    _wait_ticks,
    browser,
    server,
)

pytestmark = pytest.mark.integration

#: The twin's straggler takes twice as long for its backward (DESIGN §6); the baseline's ranks are even.
BACKWARD_JS = """() => {
  const ms = [...document.querySelectorAll("#step-table td[data-phase='backward']")].map((td) => Number(td.dataset.ms));
  ms.sort((a, b) => a - b);
  return ms.length ? ms[ms.length - 1] / ms[Math.floor(ms.length / 2)] : 0;
}"""


def test_a_late_response_to_an_earlier_click_does_not_replace_the_last_choice(browser, server):
    with urllib.request.urlopen(server + "api/steps/sources") as answer:
        sources = {s["key"]: s["job"] for s in json.load(answer) if s["kind"] == "example"}
    baseline, straggler = sources["baseline"], sources["straggler"]
    context = browser.new_context(viewport=VIEWPORT, locale="en-US")
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    pg = context.new_page()
    held = []

    def steps(route):
        job = urllib.parse.parse_qs(urllib.parse.urlparse(route.request.url).query).get("job", [""])[0]
        if job == baseline:
            held.append(route)  # answered later, after the straggler's
        else:
            route.continue_()

    pg.route("**/api/steps?*", steps)
    try:
        pg.goto(server)
        _wait_ticks(pg, 1)
        assert held, "the page did not start loading the first example"
        pg.click("[data-source='straggler']")
        player = "document.getElementById('player')"
        pg.wait_for_function(f"{player}.dataset.state === 'ready' && {player}.dataset.job === {straggler!r}")
        assert pg.evaluate(BACKWARD_JS) > 1.5  # the straggler's step: one rank's backward is twice the others'
        settled = int(pg.evaluate(f"Number({player}.dataset.settled || 0)"))
        with pg.expect_response(lambda r: "api/steps?" in r.url and urllib.parse.quote(baseline, safe="") in r.url):
            for route in held:
                route.continue_()
        pg.wait_for_function(f"Number({player}.dataset.settled || 0) > {settled}")  # the late answer was read
        assert pg.get_attribute("#player", "data-shown") == straggler
        assert pg.evaluate(BACKWARD_JS) > 1.5
        summary = pg.locator("#player-summary").inner_text()
        assert "straggler" in summary.lower(), summary
    finally:
        context.close()
