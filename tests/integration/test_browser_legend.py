"""Issue 27, point 10 in a real Chromium: the first screen is the drawing, not its legend.

The prose legend waits behind a "?" button (keyboard: Enter opens, Escape closes); every text of a GPU tile
(number, mark, utilisation, power, temperature) stays inside its tile, marks included; the Threats view writes
nothing over the tiles for vectors without a finding. Screenshots go to /tmp/hpcwatch-triage/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_browser import (  # noqa: F401 - fixtures are used by name
    browser,
    page,
    problem_page,
    problem_server,
    server,
)

pytestmark = pytest.mark.integration

SHOTS = Path("/tmp/hpcwatch-triage")

# Texts of each full GPU tile (its element and the values beside it) that reach past the tile's box.
CLIPPED_JS = """() => {
  const out = [];
  for (const el of document.querySelectorAll("g.el[data-gpu]")) {
    const box = el.querySelector(".gpu-box").getBoundingClientRect();
    const texts = [...el.querySelectorAll("text"), ...(el.nextElementSibling?.querySelectorAll("text") ?? [])];
    for (const text of texts) {
      if (!text.textContent.trim() || !text.getClientRects().length) continue;
      const r = text.getBoundingClientRect();
      if (r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5)
        out.push([el.dataset.gpu, text.textContent.trim()]);
    }
  }
  return out;
}"""


def test_the_legend_waits_behind_a_keyboard_question_mark(page):
    legend = page.locator("#legend-colours")
    assert not legend.is_visible()
    button = page.locator("#legend-toggle")
    assert button.get_attribute("aria-expanded") == "false" and button.get_attribute("aria-label")
    button.focus()
    page.keyboard.press("Enter")
    assert legend.is_visible() and "XID" in legend.text_content()
    assert button.get_attribute("aria-expanded") == "true"
    assert page.locator("#legend-help .view-only-schematic").is_visible()
    page.keyboard.press("Escape")
    assert not legend.is_visible() and button.get_attribute("aria-expanded") == "false"
    # The drawing starts higher than with the legend open.
    closed = page.evaluate("document.getElementById('schematic-wrap').getBoundingClientRect().top")
    page.keyboard.press("Enter")
    opened = page.evaluate("document.getElementById('schematic-wrap').getBoundingClientRect().top")
    assert closed < opened


def test_gpu_texts_stay_inside_their_tiles_with_marks(problem_page):
    pg = problem_page
    SHOTS.mkdir(exist_ok=True)
    pg.wait_for_selector("[data-gpu='node2/3'][data-problem='xid']", state="attached", timeout=90_000)
    pg.wait_for_selector("[data-gpu='node1/2'][data-problem='straggler']", state="attached", timeout=60_000)
    assert pg.evaluate(CLIPPED_JS) == []
    pg.locator("g[data-node-group='node2']").screenshot(path=str(SHOTS / "legend-node2-tiles.png"))


def test_threats_view_writes_nothing_over_the_tiles_without_findings(page):
    page.click("[data-view='threats']")
    live = page.evaluate("Object.values(window.hpcwatch.state.snapshot.vectors).filter(v => v.findings > 0).length")
    flags = page.eval_on_selector_all(".vector-flag", "els => els.map(e => e.textContent.trim()).filter(Boolean)")
    assert len(flags) == live  # a label only beside a vector that has a finding
    assert page.locator("g[data-vector]").count() == 6  # the numbered dots stay
    page.locator("#schematic-wrap").screenshot(path=str(SHOTS / "legend-threats.png"))
