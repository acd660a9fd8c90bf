"""Issue 27, point 9 in a real Chromium: one coherent status, and dimmed text that stays readable.

The live stream of ``hpcwatch demo`` keeps arriving, but every snapshot it brings says its newest sample is 65 h
old (an init script rewrites ``age_s`` in the page's EventSource, as a collector that stopped two days ago
would leave it): the page must not say "Live" beside "data 65 h old". Dimmed text is measured (its fill
against the shape under it, through every opacity above it) and axe-core is run on the stale page.
Screenshots go to /tmp/hpcwatch-triage/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_browser import (  # noqa: F401 - fixtures are used by name
    ACTION_TIMEOUT_MS,
    VIEWPORT,
    _wait_ticks,
    browser,
    server,
)
from tests.integration.test_browser_fit import _axe

pytestmark = pytest.mark.integration

SHOTS = Path("/tmp/hpcwatch-triage")
AGE_S = 65 * 3600
#: WCAG 2.2 SC 1.4.3, normal text: https://www.w3.org/TR/WCAG22/#contrast-minimum
MIN_CONTRAST = 4.5

OLD_STREAM_JS = f"""(() => {{
  const Native = window.EventSource;
  window.EventSource = class extends Native {{
    addEventListener(type, listener, options) {{
      if (type !== "live") return super.addEventListener(type, listener, options);
      return super.addEventListener(type, (event) => {{
        const doc = JSON.parse(event.data);
        doc.age_s = {AGE_S};
        listener({{ data: JSON.stringify(doc) }});
      }}, options);
    }}
  }};
}})();"""

# The lowest contrast of any visible text of the drawing: its fill (alpha: fill-opacity × every ancestor's
# opacity) against the first filled shape under its centre, over the drawing's background; a CSS filter on
# the way is reported as such (it changes colours in ways this cannot follow).
CONTRAST_JS = """() => {
  const rgba = (c) => { const m = c.match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
    const v = m[1].split(/[ ,\\/]+/).filter(Boolean).map(Number); return [v[0], v[1], v[2], v[3] ?? 1]; };
  const lum = ([r, g, b]) => { const f = (x) => { x /= 255; return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  const over = (top, a, under) => top.map((x, i) => x * a + under[i] * (1 - a));
  const alpha = (el, own) => { let a = own; for (let n = el; n && n !== document.body; n = n.parentElement) {
    const s = getComputedStyle(n); a *= Number(s.opacity); if (s.filter !== "none") return [a, s.filter]; } return [a, null]; };
  const base = rgba(getComputedStyle(document.getElementById("schematic-wrap")).backgroundColor) || [250, 251, 253, 1];
  let worst = { ratio: Infinity };
  for (const text of document.querySelectorAll("#schematic-wrap svg text")) {
    if (!text.textContent.trim() || !text.getClientRects().length) continue;
    const style = getComputedStyle(text);
    if (style.visibility === "hidden" || style.display === "none") continue;
    const fill = rgba(style.fill); if (!fill) continue;
    const [a, filter] = alpha(text, fill[3] * Number(style.fillOpacity));
    if (filter) return { ratio: 0, text: text.textContent.trim(), filter };
    const box = text.getBoundingClientRect();
    const under = document.elementsFromPoint(box.left + box.width / 2, box.top + box.height / 2)
      .find((el) => el !== text && el instanceof SVGGeometryElement && !(el instanceof SVGTextElement)
        && rgba(getComputedStyle(el).fill) && rgba(getComputedStyle(el).fill)[3] > 0);
    let bg = base.slice(0, 3);
    if (under) { const s = getComputedStyle(under); const f = rgba(s.fill);
      bg = over(f.slice(0, 3), f[3] * Number(s.fillOpacity) * alpha(under, 1)[0], bg); }
    const fg = over(fill.slice(0, 3), a, bg);
    const [l1, l2] = [lum(fg), lum(bg)].sort((x, y) => y - x);
    const ratio = (l1 + 0.05) / (l2 + 0.05);
    if (ratio < worst.ratio) worst = { ratio, text: text.textContent.trim(), cls: text.getAttribute("class") };
  }
  return worst;
}"""


@pytest.fixture
def old_data_page(browser, server):
    SHOTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport=VIEWPORT, locale="en-US")
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    context.add_init_script(OLD_STREAM_JS)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda err: errors.append(str(err)))
    pg.goto(server)
    _wait_ticks(pg, 2)  # the boot snapshot, then one from the stream
    yield pg
    context.close()
    assert not errors, errors


def test_connected_but_old_data_is_never_called_live(old_data_page):
    pg = old_data_page
    assert "stale" in pg.locator("body").get_attribute("class").split()
    status = pg.locator(".status").inner_text()
    assert "65 h" in status and "Live" not in status, status
    assert pg.get_attribute("#conn", "data-state") == "stale"
    assert pg.locator("#conn").text_content() != "●"  # the state is a shape too, not only a colour
    pg.locator(".topbar").screenshot(path=str(SHOTS / "status-stale.png"))


def test_fresh_connected_data_is_live(browser, server):
    context = browser.new_context(viewport=VIEWPORT, locale="en-US")
    pg = context.new_page()
    try:
        pg.goto(server)
        _wait_ticks(pg, 2)
        assert pg.locator("#conn-text").text_content() == "Live"
        assert pg.locator("#stale-age").is_hidden()
    finally:
        context.close()


def test_dimmed_text_keeps_its_contrast_and_axe_stays_clean(old_data_page):
    pg = old_data_page
    worst = pg.evaluate(CONTRAST_JS)
    assert worst["ratio"] >= MIN_CONTRAST, worst
    assert _axe(pg) == []
    # a highlighted job dims the other GPUs: their text keeps its contrast too
    job = pg.evaluate("Object.keys(window.hpcwatch.state.snapshot.job_gpus)[0]")
    pg.evaluate(f"window.hpcwatch.highlightJob({job!r})")
    worst = pg.evaluate(CONTRAST_JS)
    assert worst["ratio"] >= MIN_CONTRAST, worst
    pg.locator("#schematic-wrap").screenshot(path=str(SHOTS / "status-stale-dimmed.png"))
