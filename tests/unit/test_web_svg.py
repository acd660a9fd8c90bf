"""The schematic renderer, the catalogues and the element cards (no server needed)."""

from __future__ import annotations

import re
import string
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

import hpcwatch.web
from hpcwatch.analysis.health_rules import HEALTH_RULE_IDS
from hpcwatch.errors import ConfigError
from hpcwatch.model import parse_cluster, reference_cluster
from hpcwatch.model.cards import SECTIONS, load_cards, parse_cards
from hpcwatch.records import VECTORS
from hpcwatch.web.i18n import load_catalogue, negotiate
from hpcwatch.web.svg import (
    CELLS_IN_VIEW_FROM_NODES,
    COLLECTOR_TARGETS,
    DETAIL_MAX_NODES,
    MAX_TILE_COLS,
    VECTOR_TARGETS,
    layout_for,
    render_schematic,
)

WEB = Path(hpcwatch.web.__file__).parent


def _cluster(nodes: int, prefix: str = "node"):
    text = f"name: test\nnodes:\n  - prefix: {prefix!r}\n    count: {nodes}\n    gpu: h100-sxm\n    gpus_per_node: 8\n"
    return parse_cluster(text)


@pytest.mark.parametrize("nodes", [2, 4, 16])
def test_schematic_draws_any_size_as_valid_svg(nodes):
    cluster = _cluster(nodes)
    svg = render_schematic(cluster, load_catalogue("en"))
    root = ET.fromstring(svg)  # well-formed XML
    gpus = [e.get("data-gpu") for e in root.iter() if e.get("data-gpu")]
    assert len(gpus) == nodes * 8 and len(set(gpus)) == nodes * 8
    assert f"node{nodes}/7" in gpus


def test_small_clusters_get_a_tile_per_gpu_and_large_ones_aggregate_node_tiles():
    small = layout_for(reference_cluster())
    assert small.width == 1160 and small.gpu_cols == 8 and not small.aggregate  # two wide nodes, one GPU row
    assert not layout_for(_cluster(DETAIL_MAX_NODES)).aggregate
    assert layout_for(_cluster(DETAIL_MAX_NODES + 1)).aggregate


def _cells_drawn(root: ET.Element) -> dict[str, tuple[str, str, str]]:
    """GPU id -> the x, y and width of its cell's box, as the server drew it."""
    out = {}
    for g in root.iter("{http://www.w3.org/2000/svg}g"):
        if g.get("class") == "gpu-cell":
            box = next(r for r in g if r.get("class") == "gpu-box")
            out[g.get("data-gpu", "")] = (box.get("x", ""), box.get("y", ""), box.get("width", ""))
    return out


def _cells_left_to_the_page(root: ET.Element) -> dict[str, tuple[str, str, str]]:
    """GPU id -> the x, y and width static/tiles.js buildCells gives its cell from the tile's attributes."""
    out = {}
    for g in root.iter("{http://www.w3.org/2000/svg}g"):
        if g.get("data-cells") is not None:
            x0, step = float(g.get("data-cell-x", "")), float(g.get("data-cell-step", ""))
            for index in g.get("data-cells", "").split(" "):
                x = round((x0 + int(index) * step) * 100) / 100
                out[f"{g.get('data-node-group')}/{index}"] = (
                    f"{x:g}",
                    g.get("data-cell-y", ""),
                    g.get("data-cell-w", ""),
                )
    return out


def test_past_a_few_hundred_nodes_the_page_builds_the_cells_where_the_server_would_draw_them():
    few, many = _cluster(CELLS_IN_VIEW_FROM_NODES - 1), _cluster(CELLS_IN_VIEW_FROM_NODES)
    drawn = ET.fromstring(render_schematic(few, load_catalogue("en")))
    assert len(_cells_drawn(drawn)) == 8 * (CELLS_IN_VIEW_FROM_NODES - 1) and not _cells_left_to_the_page(drawn)
    svg = render_schematic(many, load_catalogue("en"))
    left = ET.fromstring(svg)
    assert not _cells_drawn(left) and len(_cells_left_to_the_page(left)) == 8 * CELLS_IN_VIEW_FROM_NODES
    # the same geometry: the first 255 nodes' cells where the smaller drawing has them (same grid columns)
    same = {gid: cell for gid, cell in _cells_left_to_the_page(left).items() if gid in _cells_drawn(drawn)}
    assert layout_for(few).node_cols == layout_for(many).node_cols
    assert same == {gid: (f"{float(x):g}", y, w) for gid, (x, y, w) in _cells_drawn(drawn).items()}
    assert len(svg) < len(render_schematic(few, load_catalogue("en"))) / 2


#: Where static/tiles.js buildTexts puts a tile's texts, from its box's x, y and width: class -> (x, y, anchor).
TEXTS_BUILT_BY_THE_PAGE = {
    "node-title tile-title": (lambda x, w: x + 7, 16, None),
    "live tile-sum": (lambda x, w: x + 7, 32, None),
    "tile-mark": (lambda x, w: x + w - 7, 16, "end"),
}


def test_past_a_few_hundred_nodes_the_page_builds_the_tiles_texts_where_the_server_would_draw_them():
    few, many = _cluster(CELLS_IN_VIEW_FROM_NODES - 1), _cluster(CELLS_IN_VIEW_FROM_NODES)
    svg_ns = "{http://www.w3.org/2000/svg}"
    for tile in (g for g in ET.fromstring(render_schematic(few, load_catalogue("en"))).iter() if _is_tile(g)):
        el = tile.find(f"{svg_ns}g")
        box = el.find(f"{svg_ns}rect")
        x, y, w = (float(box.get(a, "")) for a in ("x", "y", "width"))
        texts = {t.get("class"): t for t in tile.iter(f"{svg_ns}text")}
        assert texts.keys() == TEXTS_BUILT_BY_THE_PAGE.keys()
        for cls, (x_of, dy, anchor) in TEXTS_BUILT_BY_THE_PAGE.items():
            got = texts[cls]
            assert (float(got.get("x", "")), float(got.get("y", "")), got.get("text-anchor")) == (
                x_of(x, w),
                y + dy,
                anchor,
            )
        assert texts["node-title tile-title"].text == el.get("data-node")
        assert el.find(f"{svg_ns}title").text == el.get("aria-label")  # the page's tooltip: the spoken name
    left = [g for g in ET.fromstring(render_schematic(many, load_catalogue("en"))).iter() if _is_tile(g)]
    assert len(left) == CELLS_IN_VIEW_FROM_NODES
    for tile in left:
        assert not [e for e in tile.iter() if e.tag in (f"{svg_ns}text", f"{svg_ns}title")]
        el = tile.find(f"{svg_ns}g")  # the element itself is whole: its name, role and tab stop
        assert (
            el.get("role") == "button"
            and el.get("tabindex") == "0"
            and el.get("aria-label", "").startswith(el.get("data-node", "") + ":")
        )
        assert el.find(f"{svg_ns}rect").get("class") == "shape node-box"


def _is_tile(g: ET.Element) -> bool:
    return "tile" in (g.get("class") or "").split()


@pytest.mark.parametrize("nodes", [5, 16, 37, 128])
def test_node_tiles_never_overlap_and_stay_inside_the_drawing(nodes):
    lay = layout_for(_cluster(nodes))
    boxes = [(lay.node_x(i), lay.node_y(i)) for i in range(nodes)]
    assert len(set(boxes)) == nodes
    for x, y in boxes:
        assert x + lay.node_w <= lay.width - 24 and lay.y_nodes <= y and y + lay.node_h < lay.y_fabric
    rows = {}
    for x, y in boxes:
        rows.setdefault(y, []).append(x)
    for xs in rows.values():  # neighbours in a row are a tile and a gap apart
        xs.sort()
        assert all(b - a >= lay.node_w for a, b in zip(xs, xs[1:]))


def test_128_nodes_fit_one_1920_screen_at_full_size():
    lay = layout_for(_cluster(128))
    assert lay.node_cols == MAX_TILE_COLS and lay.width <= 1834  # 1920 px less the page's margins
    assert lay.height <= 1080 - 100  # a wall screen less the header


def test_live_text_is_beside_elements_not_inside_them():
    """An element's spoken name must contain its visible text (axe label-content-name-mismatch), so values that
    change every second are drawn in aria-hidden siblings, never inside the element."""
    root = ET.fromstring(render_schematic(reference_cluster(), load_catalogue("en")))
    for el in root.iter():
        if "el" in (el.get("class") or "").split():
            assert not [x for x in el.iter() if "live" in (x.get("class") or "").split()], el.get("data-el")
    tile = next(e for e in root.iter() if e.get("data-gpu") == "node1/2")
    assert "".join(tile.itertext()).replace(tile.find("{*}title").text, "").strip() == "GPU 2"
    assert tile.get("aria-label").startswith("GPU 2 of node1")


def test_model_text_is_escaped_in_the_svg():
    svg = render_schematic(_cluster(1, prefix='<b>"x'), load_catalogue("en"))
    assert "<b>" not in svg and "&lt;b&gt;&quot;x1" in svg
    ET.fromstring(svg)


def test_badges_cover_every_collector_and_vector():
    assert len(COLLECTOR_TARGETS) == 7
    assert set(VECTOR_TARGETS) == set(VECTORS) - {"weights_access"}


def test_drawing_128_gpus_is_fast():
    cluster = _cluster(16)
    t = load_catalogue("en")
    start = time.process_time()
    svg = render_schematic(cluster, t)
    elapsed = time.process_time() - start
    assert elapsed < 0.5, elapsed  # measured ~5 ms; generous for a busy CI machine
    assert svg.count('data-gpu="') == 128


# -- catalogues ---------------------------------------------------------------------------------


def _keys_used() -> set[str]:
    """Every catalogue key the template and the scripts look up literally."""
    keys = set()
    template = (WEB / "templates" / "index.html").read_text()
    keys |= set(re.findall(r"t\('([a-z_.0-9]+)'\)", template))
    for js in (WEB / "static").glob("*.js"):
        keys |= set(re.findall(r"\bt\(\"([a-z_.0-9]+)\"", js.read_text()))
    svg_source = (WEB / "svg.py").read_text()
    keys |= set(re.findall(r"t\(\"([a-z_.0-9]+)\"\)", svg_source))
    return keys


def test_every_key_used_by_the_page_is_in_both_catalogues():
    used = _keys_used()
    assert len(used) > 60
    for lang in ("en", "fr"):
        missing = used - set(load_catalogue(lang).words)
        assert not missing, f"{lang}: {sorted(missing)}"


def test_catalogues_have_the_same_keys():
    en, fr = (yaml.safe_load((WEB / f"{lang}.yaml").read_text()) for lang in ("en", "fr"))

    def flat(tree, prefix=""):
        for k, v in tree.items():
            yield from (flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"])

    assert set(flat(en)) == set(flat(fr))


def test_scripts_hold_no_catalogue_text():
    """All words reach the page through t(key): no interface sentence is copied into a script."""
    sentences = [v for v in load_catalogue("en").words.values() if len(v.split()) >= 2]
    sentences += [v for v in load_catalogue("fr").words.values() if len(v.split()) >= 2]
    for js in (WEB / "static").glob("*.js"):
        source = js.read_text()
        leaked = [v for v in sentences if v in source]
        assert not leaked, f"{js.name}: {leaked[:3]}"


# The alert list words a problem by health_rule.<id>.one and a group by .many (static/monitor.js ruleTitle); a rule
# without them falls back to the check's English title, so a French page would show English (issue #27).
_GROUP_UNITS = {"en": ("GPUs", "nodes"), "fr": ("GPU", "nœuds")}


def _rule_title_faults(words: Mapping[str, str], lang: str) -> list[str]:
    """What keeps a health rule from a readable title in ``words``: a missing form, a ``many`` that does not count
    ``{n}`` GPUs or nodes, a placeholder the page does not fill (it passes only ``n``)."""
    faults = []
    for rule in HEALTH_RULE_IDS:
        one, many = words.get(f"health_rule.{rule}.one"), words.get(f"health_rule.{rule}.many")
        if not one or not many:
            faults.append(f"{rule}: one or many missing")
            continue
        if _placeholders(one) or _placeholders(many) != {"n"}:
            faults.append(f"{rule}: one takes no placeholder and many only {{n}}")
        if not any(unit in many.split() for unit in _GROUP_UNITS[lang]):
            faults.append(f"{rule}: many names no unit ({' or '.join(_GROUP_UNITS[lang])})")
    return faults


def _placeholders(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}


@pytest.mark.parametrize("lang", ["en", "fr"])
def test_every_health_rule_has_a_title_for_one_problem_and_for_a_group(lang):
    assert _rule_title_faults(load_catalogue(lang).words, lang) == []


@pytest.mark.parametrize(
    ("drop", "change", "fault"),
    [
        ("health_rule.disk_space.many", {}, "disk_space: one or many missing"),
        ("", {"health_rule.oom_kill.many": "nodes where a process was killed"}, "oom_kill: one takes no placeholder"),
        ("", {"health_rule.xgmi_errors.many": "{n} with XGMI link errors"}, "xgmi_errors: many names no unit"),
    ],
)
def test_a_rule_without_its_title_is_named(drop, change, fault):
    words = {k: v for k, v in load_catalogue("en").words.items() if k != drop} | change
    assert [f for f in _rule_title_faults(words, "en") if f.startswith(fault)]


def test_negotiate_prefers_forced_then_cookie_then_header():
    assert negotiate(forced="fr", cookie="en", accept_language="en") == "fr"
    assert negotiate(forced="de", cookie="en", accept_language="fr") == "en"
    assert negotiate(forced=None, cookie=None, accept_language="fr-CA;q=0.8, en;q=0.9") == "en"
    assert negotiate(forced=None, cookie=None, accept_language="fr;q=abc, en;q=0.1") == "en"


# -- cards --------------------------------------------------------------------------------------


def test_cards_exist_for_every_element_collector_vector_in_both_languages():
    cards = load_cards()
    for lang in ("en", "fr"):
        doc = cards.for_lang(lang)
        assert set(doc["elements"]) == {"gpu", "node", "fabric", "storage", "slurm", "stack", "weights"}
        assert set(doc["collectors"]) == set(COLLECTOR_TARGETS)
        assert set(doc["vectors"]) == set(VECTOR_TARGETS)
        assert set(doc["passerelles"]) == {"business", "organisation", "human", "domain"}
    assert cards.card("elements", "gpu", "fr")["what"] != cards.card("elements", "gpu", "en")["what"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # a card without its French half
        (
            "elements: {gpu: {en: {title: a, what: b, observe: c, tools: d, threats: e, value: f, cost: g, risk: h, "
            "owner: i}}}",
            "elements.gpu.fr: missing",
        ),
        # a section missing entirely
        ("collectors: {}", "elements: missing or empty"),
    ],
)
def test_cards_loader_names_what_is_missing(text, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_cards(text)


def test_cards_loader_rejects_a_missing_field():
    doc = yaml.safe_load((Path(hpcwatch.model.cards.__file__).parent / "cards.yaml").read_text())
    del doc["vectors"]["rdma_blind_spot"]["fr"]["signals"]
    with pytest.raises(ConfigError, match=r"vectors.rdma_blind_spot.fr: missing field\(s\) signals"):
        parse_cards(yaml.safe_dump(doc, allow_unicode=True))
    assert set(SECTIONS["vectors"]) >= {"how", "signals", "detection"}
