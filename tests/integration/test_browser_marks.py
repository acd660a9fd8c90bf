"""Issue 27, point 5 in a real Chromium: one visual language for the problem marks.

A straggler, an idle allocated GPU, an XID, a drained GPU and a lost one each get a mark of their own: a glyph
and a word under the GPU's number (which stays visible) and a frame of their own, so they differ without
colour; stale data is dimmed without taking the marks' colours. The twin's straggler and XID 79 come from the
demo (``problem_server``); the three other kinds are put on other GPUs of the same page through
``applySnapshot`` (their ``mark`` is decided by reports/triage.py, unit-tested in test_live_triage.py).
Screenshots go to /tmp/hpcwatch-triage/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_browser import (  # noqa: F401 - fixtures are used by name
    browser,
    problem_page,
    problem_server,
)

pytestmark = pytest.mark.integration

SHOTS = Path("/tmp/hpcwatch-triage")
KINDS = {"straggler": "node1/2", "xid": "node2/3", "idle": "node1/5", "drain": "node2/0", "lost": "node2/6"}

ADD_KINDS_JS = """(extra) => {
  const snap = window.hpcwatch.state.snapshot;
  const made = extra.map(([mark, gpu, rule, severity]) => ({ kind: "health", severity, el: `gpu:${gpu}`,
    node: gpu.split("/")[0], gpu: gpu.split("/")[1], job: null, rule, mark, title: rule, evidence: {} }));
  window.hpcwatch.applySnapshot({ ...snap, problems: [...snap.problems, ...made] });
}"""

LOOK_JS = """(gpu) => {
  const box = getComputedStyle(document.querySelector(`[data-gpu='${gpu}'] .gpu-box`));
  const name = document.querySelector(`g.el[data-gpu='${gpu}'] .gpu-name`);
  const mark = document.querySelector(`[data-mark='${gpu}']`);
  const n = name.getBoundingClientRect(), m = mark.getBoundingClientRect();
  return { fill: box.fill, stroke: box.stroke, dash: box.strokeDasharray, mark: mark.textContent,
    markFill: getComputedStyle(mark).fill, name: name.textContent, nameShown: getComputedStyle(name).display !== "none"
      && n.width > 0, overlap: n.bottom > m.top + 0.5 && m.bottom > n.top + 0.5 && m.width > 0 };
}"""


def _looks(pg) -> dict[str, dict]:
    return {kind: pg.evaluate(LOOK_JS, gpu) for kind, gpu in KINDS.items()}


def test_each_problem_kind_has_its_own_mark_and_the_gpu_number_stays(problem_page):
    pg = problem_page
    SHOTS.mkdir(exist_ok=True)
    pg.wait_for_selector("[data-gpu='node1/2'][data-problem='straggler']", state="attached", timeout=60_000)
    pg.wait_for_selector("[data-gpu='node2/3'][data-problem='xid']", state="attached", timeout=90_000)
    extra = [["idle", KINDS["idle"], "idle_allocated", "warn"], ["drain", KINDS["drain"], "ecc_dbe", "drain"],
             ["lost", KINDS["lost"], "gpu_missing", "drain"]]  # fmt: skip
    pg.evaluate(ADD_KINDS_JS, extra)
    looks = _looks(pg)
    for kind, look in looks.items():
        assert pg.get_attribute(f"g.el[data-gpu='{KINDS[kind]}']", "data-problem") == kind
        assert look["nameShown"] and look["name"] == f"GPU {KINDS[kind].split('/')[1]}", (kind, look)
        assert not look["overlap"], (kind, look)  # the mark has its own line
    glyphs = {look["mark"].split()[0] for look in looks.values()}
    assert len(glyphs) == len(KINDS), looks  # shapes, not colour alone
    frames = {(look["fill"], look["stroke"], look["dash"]) for look in looks.values()}
    assert len(frames) == len(KINDS), looks
    # in grey (no colour at all) the frames still differ: by dash pattern or by fill pattern
    patterns = {(look["dash"], look["fill"].startswith("url")) for look in looks.values()}
    assert len(patterns) >= 4, patterns
    assert looks["xid"]["mark"] == "✕ XID 79" and looks["straggler"]["mark"] == "⚠ slow"
    pg.locator(".schematic-panel").screenshot(path=str(SHOTS / "marks-five-kinds.png"))
    # Stale: the values are dimmed, the marks keep their colours.
    before = _looks(pg)
    pg.evaluate(
        "window.hpcwatch.applySnapshot({...window.hpcwatch.state.snapshot, age_s: 300,"
        " problems: window.hpcwatch.state.snapshot.problems})"
    )
    assert "stale" in pg.locator("body").get_attribute("class").split()
    after = _looks(pg)
    for kind in KINDS:
        assert (after[kind]["fill"], after[kind]["stroke"], after[kind]["markFill"]) == (
            before[kind]["fill"],
            before[kind]["stroke"],
            before[kind]["markFill"],
        ), kind
    assert pg.evaluate("getComputedStyle(document.querySelector('svg.schematic')).filter") == "none"
    pg.locator(".schematic-panel").screenshot(path=str(SHOTS / "marks-stale.png"))
