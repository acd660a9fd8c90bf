"""The schematic: the cluster model drawn as SVG on the server.

Drawing on the server keeps one renderer for every size (2, 4 or 128 nodes come
from the same YAML code path) and lets the page paint before any script runs.
The browser only changes text and classes inside it as live values arrive, and,
past ``CELLS_IN_VIEW_FROM_NODES`` nodes, adds a tile's texts and cells where this
module would draw them (below; tests/unit/test_web_svg.py pins the places).

Layout, top to bottom (one band per layer of the model)::

    ┌ Slurm ──────────────────────────────────────────────── [slurm-exporter] ┐
    ┌ ML stack: PyTorch · NCCL ────────────────────── [profiler · NCCL] (1)(4)┐
    ┌ node1 ────────┐ ┌ node2 ────────┐     up to DETAIL_MAX_NODES nodes: side by side,
    │ GPU 0 … GPU 7 │ │ GPU 0 … GPU 7 │     one tile per GPU (util, power, temperature, job)
    └───────┬───────┘ └───────┬───────┘
    [node1 ▮▮▮▮▮▮▮▮] [node2 ▮▮▮▮▮▮▮▮] …    more: aggregate node tiles in a grid (≤ 16 a row),
    [node17 ▮▮▮▮▮▮▮] …                      one cell per GPU; the node's card opens to its GPUs
    ┌ InfiniBand NDR fabric ───────────────────────────────────────────── (3) ┐
    ┌ Weights ┐ ┌ Parallel storage (Lustre) ──────────────────────────── (2) ┐

Every clickable element is a ``<g>`` with ``data-el`` (its card key), ``tabindex``,
``role="button"`` and an ``aria-label``; GPUs also carry ``data-gpu="node1/2"``.
Text that changes (live values, marks) is drawn *beside* an element, in an
``aria-hidden`` sibling, never inside it: the element's visible text stays a part
of its spoken name (WCAG 2.5.3, axe ``label-content-name-mismatch``), and the page
puts the values into the name itself. GPU cells of aggregate tiles are not in the
tab order (1,024 stops would bury the page); their node's card lists them as buttons.
From ``CELLS_IN_VIEW_FROM_NODES`` nodes a tile is its box and its element alone,
with its cells' geometry (``data-cells``: the GPU indexes, ``data-cell-x/y/w/step``):
the page builds its name, live sum, mark, tooltip and cells, as drawn here, when the
tile first comes into view.
Collector badges carry ``data-collector``, threat badges ``data-vector``; CSS
shows them per mode. Only text from the model and the catalogue goes in, escaped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from html import escape

from hpcwatch.model.cluster import Cluster, Node
from hpcwatch.records import VECTOR_TABLE

__all__ = [
    "render_schematic",
    "SchematicLayout",
    "layout_for",
    "COLLECTOR_TARGETS",
    "VECTOR_TARGETS",
    "VECTOR_NUMBERS",
    "DETAIL_MAX_NODES",
    "MAX_TILE_COLS",
]

Translate = Callable[[str], str]

MARGIN = 24
NODE_W_MIN = 224
NODE_W_MAX = 560
NODE_GAP = 20
GPU_GAP = 6
GPU_H = 84
"""A GPU tile, top to bottom: its number, its problem mark (own line: the number stays visible), utilisation,
power, temperature (one per line: "672 W · 55°" overran a 60 px tile), the bar and the job stripe."""
GPU_W_MIN = 44
BAND_H = 46
MIN_WIDTH = 1160
WEIGHTS_W = 230
TAG_H = 22
CHAR_W = 6.9
"""Average advance of the 11.5 px tag font, to size a tag to its text."""
#: Up to this many nodes each GPU gets a full tile; beyond, nodes become aggregate tiles. Ours: 4 nodes of
#: 8 GPUs at 55 px a tile is the narrowest that keeps "✕ XID 79" and "650 W" on one line in a 1,160 px drawing.
DETAIL_MAX_NODES = 4
TILE_W = 100
TILE_H = 64
TILE_GAP = 10
#: At most this many node tiles a row: 16 × 110 px + margins = 1,798 px, one 1920 px screen at 100 %, so 128
#: nodes are 8 rows (~900 px in all) and fit a 1080 px wall screen without shrinking the 12 px text. Ours.
MAX_TILE_COLS = 16
#: Rows are kept about this many times narrower than the grid is wide (a landscape screen). Ours.
TILE_ASPECT = 2.5
#: From this many nodes a tile's GPU cells are not drawn here: the page builds them when the tile first comes
#: into view (static/tiles.js). At 1,024 nodes the 8,192 cells are 33,000 of the drawing's 42,000 elements, and
#: Chromium's style, layout and paint of them held the first paint ~0.7 s. Ours: 128 nodes (1,024 cells, 8
#: rows that one screen shows) still come whole.
CELLS_IN_VIEW_FROM_NODES = 256

#: Which element each collector badge sits on (the collectors of web/live.py's COLLECTORS).
COLLECTOR_TARGETS: dict[str, str] = {
    "slurm_exporter": "slurm",
    "dcgm_exporter": "gpu",
    "node_host": "node",
    "torch_nccl": "stack",
    "ib_tools": "fabric",
    "lustre_metrics": "storage",
    "ebpf_weights": "weights",
}
#: Which element each drawn threat vector targets (records.VECTOR_TABLE); all converge on the weights.
VECTOR_TARGETS: dict[str, str] = {v.id: v.target for v in VECTOR_TABLE if v.number is not None}
#: The number each drawn vector carries on its dot.
VECTOR_NUMBERS: dict[str, int] = {v.id: v.number for v in VECTOR_TABLE if v.number is not None}


@dataclass(frozen=True, slots=True)
class SchematicLayout:
    """Pixel geometry of one cluster's drawing."""

    width: int
    height: int
    node_w: int
    node_h: int
    gpu_cols: int
    gpu_w: float
    y_slurm: int
    y_stack: int
    y_nodes: int
    y_fabric: int
    y_storage: int
    aggregate: bool = False
    """Nodes drawn as aggregate tiles in a grid of ``node_cols`` a row (many nodes)."""
    node_cols: int = 0
    cells_in_view: bool = False
    """The tiles' GPU cells are left to the page, built when a tile comes into view (many nodes)."""

    def node_x(self, i: int) -> int:
        if self.aggregate:
            return MARGIN + (i % self.node_cols) * (self.node_w + TILE_GAP)
        return MARGIN + i * (self.node_w + NODE_GAP)

    def node_y(self, i: int) -> int:
        if self.aggregate:
            return self.y_nodes + (i // self.node_cols) * (self.node_h + TILE_GAP)
        return self.y_nodes

    @property
    def nodes_h(self) -> int:
        """Height of the whole node area (one row of boxes, or the grid of tiles)."""
        if not self.aggregate:
            return self.node_h
        rows = math.ceil(self.node_count / self.node_cols)
        return rows * (self.node_h + TILE_GAP) - TILE_GAP

    node_count: int = 0


def layout_for(cluster: Cluster) -> SchematicLayout:
    """Few nodes get wide boxes with a tile per GPU; many nodes get aggregate tiles in a grid."""
    n = len(cluster.nodes)
    if n > DETAIL_MAX_NODES:
        return _grid_layout(cluster)
    per_node = max((len(node.gpus) for node in cluster.nodes), default=0)
    fit = (MIN_WIDTH - 2 * MARGIN - (n - 1) * NODE_GAP) // max(1, n)
    node_w = int(min(NODE_W_MAX, max(NODE_W_MIN, fit)))
    cols = max(1, min(per_node, (node_w - 24 + GPU_GAP) // (GPU_W_MIN + GPU_GAP)))
    rows = max(1, math.ceil(per_node / cols))
    gpu_w = (node_w - 24 - (cols - 1) * GPU_GAP) / cols
    node_h = 48 + rows * (GPU_H + GPU_GAP) + 22
    width = max(MIN_WIDTH, 2 * MARGIN + n * node_w + (n - 1) * NODE_GAP)
    y_slurm = 18
    y_stack = y_slurm + BAND_H + 22
    y_nodes = y_stack + BAND_H + 30
    y_fabric = y_nodes + node_h + 46
    y_storage = y_fabric + BAND_H + 44
    return SchematicLayout(
        width=width,
        height=y_storage + 70 + MARGIN,
        node_w=node_w,
        node_h=node_h,
        gpu_cols=cols,
        gpu_w=gpu_w,
        y_slurm=y_slurm,
        y_stack=y_stack,
        y_nodes=y_nodes,
        y_fabric=y_fabric,
        y_storage=y_storage,
    )


def _grid_layout(cluster: Cluster) -> SchematicLayout:
    n = len(cluster.nodes)
    per_node = max((len(node.gpus) for node in cluster.nodes), default=0)
    cols = max(1, min(MAX_TILE_COLS, n, math.ceil(math.sqrt(TILE_ASPECT * n))))
    rows = math.ceil(n / cols)
    width = max(MIN_WIDTH, 2 * MARGIN + cols * TILE_W + (cols - 1) * TILE_GAP)
    y_slurm = 18
    y_stack = y_slurm + BAND_H + 22
    y_nodes = y_stack + BAND_H + 30
    y_fabric = y_nodes + rows * (TILE_H + TILE_GAP) - TILE_GAP + 46
    y_storage = y_fabric + BAND_H + 44
    cells = max(1, per_node)
    return SchematicLayout(
        width=width,
        height=y_storage + 70 + MARGIN,
        node_w=TILE_W,
        node_h=TILE_H,
        gpu_cols=cells,
        gpu_w=(TILE_W - 12 - (cells - 1) * 2) / cells,
        y_slurm=y_slurm,
        y_stack=y_stack,
        y_nodes=y_nodes,
        y_fabric=y_fabric,
        y_storage=y_storage,
        aggregate=True,
        node_cols=cols,
        node_count=n,
        cells_in_view=n >= CELLS_IN_VIEW_FROM_NODES,
    )


def render_schematic(cluster: Cluster, t: Translate) -> str:
    """The whole schematic as one ``<svg>`` string; ``t`` looks up catalogue text by key."""
    lay = layout_for(cluster)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="schematic" width="{lay.width}" height="{lay.height}" '
        f'viewBox="0 0 {lay.width} {lay.height}" role="group" aria-label="{_a(t("schematic.label"))}" '
        f'data-layout="{"grid" if lay.aggregate else "detail"}">',
        _defs(),
        _band(
            "slurm",
            "band-slurm",
            MARGIN,
            lay.y_slurm,
            lay.width - 2 * MARGIN,
            t("layer.slurm"),
            f"Slurm {cluster.scheduler.version} · {t('schematic.partitions')}: "
            f"{', '.join(cluster.scheduler.partitions)}",
            t,
        ),
        _band(
            "stack",
            "band-stack",
            MARGIN,
            lay.y_stack,
            lay.width - 2 * MARGIN,
            t("layer.stack"),
            f"{cluster.stack.framework} · {cluster.stack.communication}",
            t,
        ),
    ]
    parts += [_links(cluster, lay)]
    for i, node in enumerate(cluster.nodes):
        draw = _tile if lay.aggregate else _node
        parts.append(draw(node, lay.node_x(i), lay.node_y(i), lay, t))
    parts.append(
        _band(
            "fabric",
            "band-fabric",
            MARGIN,
            lay.y_fabric,
            lay.width - 2 * MARGIN,
            t("layer.fabric"),
            f"{cluster.fabric.link.name} · {cluster.fabric.topology}",
            t,
        )
    )
    parts.append(_weights(cluster, lay, t))
    x_storage = MARGIN + WEIGHTS_W + 20
    parts.append(
        _band(
            "storage",
            "band-storage",
            x_storage,
            lay.y_storage,
            lay.width - MARGIN - x_storage,
            t("layer.storage"),
            f"{cluster.storage.kind} {cluster.storage.mount} · {cluster.storage.osts} OST · {cluster.storage.mdts} MDT",
            t,
            height=58,
        )
    )
    parts.append(_threats(cluster, lay, t))
    parts.append(_collectors(cluster, lay, t))
    parts.append("</svg>")
    return "".join(parts)


def _a(text: str) -> str:
    return escape(text, quote=True)


def _defs() -> str:
    return (
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0 0 L10 5 L0 10 z" class="arrowhead"/></marker>'
        '<pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
        '<line x1="0" y1="0" x2="0" y2="6" class="hatch-line"/></pattern></defs>'
    )


def _open_el(key: str, label: str, extra: str = "", *, tip: bool = True) -> str:
    # <title>: the tooltip a pointer gets (SVG has no title attribute); the page adds live values to a GPU's.
    # Texts inside an element are separated by a space text node: a screen reader and axe join adjacent <text>s
    # without one ("Slurm schedulerSlurm 22.05"), which no longer matches the element's spoken name.
    title = f'<title data-tip="{_a(key)}">{_a(label)}</title>' if tip else ""
    return (
        f'<g class="el" data-el="{_a(key)}" tabindex="0" role="button" aria-label="{_a(label)}" '
        f'aria-controls="card"{extra}>{title}'
    )


def _band(
    key: str, cls: str, x: int, y: int, w: int, title: str, detail: str, t: Translate, *, height: int = BAND_H
) -> str:
    label = f"{title} — {detail}. {t('schematic.open_card')}"
    return (
        f'{_open_el(key, label)}<rect class="shape {cls}" x="{x}" y="{y}" width="{w}" height="{height}" rx="8"/>'
        f'<text class="band-title" x="{x + 14}" y="{y + 20}">{_a(title)}</text> '  # the space: see _open_el
        f'<text class="band-detail" x="{x + 14}" y="{y + 37}">{_a(detail)}</text></g>'
        f'<text class="live band-live" data-live="{key}" x="{x + w - 14}" y="{y + 28}" '
        f'text-anchor="end" aria-hidden="true"></text>'
    )


def _links(cluster: Cluster, lay: SchematicLayout) -> str:
    """One line per node down to the fabric: the NDR rails (a grid of tiles gets one trunk for all)."""
    y0, y1 = lay.y_nodes + lay.nodes_h, lay.y_fabric
    out = ['<g class="links" aria-hidden="true">']
    if lay.aggregate:
        cx = lay.width // 2
        hcas = sum(node.hcas for node in cluster.nodes)
        out.append(
            f'<line class="rail" x1="{cx}" y1="{y0}" x2="{cx}" y2="{y1}"/>'
            f'<text class="rail-label" x="{cx + 6}" y="{(y0 + y1) // 2 + 4}">{hcas}× '
            f"{_a(cluster.fabric.link.key.upper())}</text></g>"
        )
        return "".join(out)
    for i, node in enumerate(cluster.nodes):
        cx = lay.node_x(i) + lay.node_w // 2
        out.append(
            f'<line class="rail" x1="{cx}" y1="{y0}" x2="{cx}" y2="{y1}"/>'
            f'<text class="rail-label" x="{cx + 6}" y="{(y0 + y1) // 2 + 4}">{node.hcas}× '
            f"{_a(cluster.fabric.link.key.upper())}</text>"
        )
    out.append("</g>")
    return "".join(out)


def _node(node: Node, x: int, y: int, lay: SchematicLayout, t: Translate) -> str:
    w = lay.node_w
    model = node.gpus[0].spec.name if node.gpus else "—"
    detail = f"{len(node.gpus)}× {_short(model)} · {node.hcas}× HCA"
    label = t("aria.node").format(node=node.name, detail=detail, gpus=len(node.gpus), model=model)
    out = [
        f'<g class="node-group" data-node-group="{_a(node.name)}">',
        _open_el(f"node:{node.name}", label, f' data-node="{_a(node.name)}"'),
        f'<rect class="shape node-box" x="{x}" y="{y}" width="{w}" height="{lay.node_h}" rx="10"/>',
        f'<text class="node-title" x="{x + 12}" y="{y + 20}">{_a(node.name)}</text> ',
        f'<text class="node-detail" x="{x + 12}" y="{y + 36}">{_a(detail)}</text></g>',
        f'<text class="live node-ib" data-live="ib:{_a(node.name)}" x="{x + 12}" y="{y + lay.node_h - 9}" '
        f'aria-hidden="true"></text>',
    ]
    for gpu in node.gpus:
        col, row = gpu.index % lay.gpu_cols, gpu.index // lay.gpu_cols
        gx = x + 12 + col * (lay.gpu_w + GPU_GAP)
        gy = y + 46 + row * (GPU_H + GPU_GAP)
        out.append(_gpu(gpu.id, gpu.index, node.name, model, round(gx, 1), gy, round(lay.gpu_w, 1), t))
    out.append("</g>")
    return "".join(out)


def _tile(node: Node, x: int, y: int, lay: SchematicLayout, t: Translate) -> str:
    """An aggregate node tile: name, a live summary line, one small cell per GPU (clickable, not a tab stop)."""
    model = node.gpus[0].spec.name if node.gpus else "—"
    label = t("aria.tile").format(node=node.name, gpus=len(node.gpus), model=model)
    name = _a(node.name)
    cw, cell_y, step = round(lay.gpu_w, 2), y + 38, lay.gpu_w + 2
    element = _open_el(f"node:{node.name}", label, f' data-node="{name}"', tip=not lay.cells_in_view)
    box = f'<rect class="shape node-box" x="{x}" y="{y}" width="{lay.node_w}" height="{lay.node_h}" rx="7"/>'
    if lay.cells_in_view:
        # Many nodes: the cells' geometry, for the page to build them the same way when the tile comes into view
        # (static/tiles.js buildTile), and its texts too, from the box's geometry: at 1,024 nodes Chromium's style
        # and layout of the tiles' 4,000 texts held the page's first paint ~0.15 s, for the ~150 tiles one screen
        # shows (benchmarks/RESULTS.md). The element keeps its spoken name, its role and its tab stop.
        cells = (
            f' data-cells="{" ".join(str(gpu.index) for gpu in node.gpus)}" data-cell-x="{x + 6}"'
            f' data-cell-y="{cell_y}" data-cell-w="{cw}" data-cell-step="{round(step, 2)}"'
        )
        return f'<g class="node-group tile" data-node-group="{name}"{cells}>{element}{box}</g></g>'
    out = [
        f'<g class="node-group tile" data-node-group="{name}">',
        element,
        box,
        f'<text class="node-title tile-title" x="{x + 7}" y="{y + 16}">{name}</text></g>',
        f'<text class="live tile-sum" data-live="sum:{name}" x="{x + 7}" y="{y + 32}" aria-hidden="true"></text>',
        # the worst problem of its GPUs, as a glyph: a cell is too small for text, the tile's corner is not
        f'<text class="tile-mark" data-tile-mark="{name}" x="{x + lay.node_w - 7}" y="{y + 16}" text-anchor="end" '
        f'aria-hidden="true"></text>',
    ]
    for gpu in node.gpus:
        cx = round(x + 6 + gpu.index * step, 2)
        gid = _a(gpu.id)
        out.append(
            f'<g class="gpu-cell" data-el="gpu:{gid}" data-gpu="{gid}" aria-hidden="true">'
            f'<title data-tip="gpu:{gid}">GPU {gpu.index} · {name}</title>'
            f'<rect class="gpu-box" x="{cx}" y="{cell_y}" width="{cw}" height="17" rx="2"/>'
            f'<rect class="gpu-job" data-jobbar="{gid}" x="{cx}" y="{cell_y + 19}" width="{cw}" height="3"/></g>'
        )
    out.append("</g>")
    return "".join(out)


def _short(model: str) -> str:
    """``NVIDIA H100 80GB HBM3`` → ``H100``: the node header has room for one word."""
    words = [w for w in model.split() if w.upper() not in {"NVIDIA", "AMD", "INSTINCT"}]
    return words[0] if words else model


def _gpu(gid: str, index: int, node: str, model: str, x: float, y: int, w: float, t: Translate) -> str:
    """A GPU tile: name inside the element; utilisation, power · temperature, bar and job stripe beside it."""
    label = t("aria.gpu").format(node=node, index=index, model=model)
    cx = round(x + w / 2, 1)
    g = _a(gid)
    return (
        f"{_open_el(f'gpu:{gid}', label, f' data-gpu={chr(34)}{g}{chr(34)}')}"
        f'<rect class="shape gpu-box" x="{x}" y="{y}" width="{w}" height="{GPU_H}" rx="6"/>'
        f'<text class="gpu-name" x="{cx}" y="{y + 14}" text-anchor="middle">GPU {index}</text></g>'
        f'<g class="gpu-vals" aria-hidden="true">'
        f'<text class="gpu-mark" data-mark="{g}" x="{cx}" y="{y + 28}" text-anchor="middle"></text>'
        f'<text class="live gpu-util" data-live="util:{g}" x="{cx}" y="{y + 45}" text-anchor="middle">–</text>'
        f'<text class="live gpu-pt" data-live="pt:{g}" x="{cx}" y="{y + 58}" text-anchor="middle"></text>'
        f'<text class="live gpu-pt" data-live="temp:{g}" x="{cx}" y="{y + 70}" text-anchor="middle"></text>'
        f'<rect class="gpu-bar-bg" x="{x + 6}" y="{y + GPU_H - 11}" width="{round(w - 12, 1)}" height="5" rx="2.5"/>'
        f'<rect class="gpu-bar" data-bar="{g}" x="{x + 6}" y="{y + GPU_H - 11}" width="0" height="5" rx="2.5"/>'
        f'<rect class="gpu-job" data-jobbar="{g}" x="{x + 6}" y="{y + GPU_H - 5}" width="{round(w - 12, 1)}" '
        f'height="3" rx="1.5"/></g>'
    )


def _weights(cluster: Cluster, lay: SchematicLayout, t: Translate) -> str:
    x, y, w, h = MARGIN, lay.y_storage, WEIGHTS_W, 58
    label = f"{t('layer.weights')} — {cluster.weights.path}. {t('schematic.open_card')}"
    return (
        f"{_open_el('weights', label)}"
        f'<rect class="shape band-weights" x="{x}" y="{y}" width="{w}" height="{h}" rx="8"/>'
        f'<path class="weights-icon" d="M{x + 16} {y + 18} h18 l6 6 v22 h-24 z" aria-hidden="true"/>'
        f'<text class="band-title" x="{x + 50}" y="{y + 30}">{_a(t("layer.weights"))}</text> '
        f'<text class="band-detail" x="{x + 50}" y="{y + 47}">{_a(cluster.weights.path)}</text></g>'
    )


def _boxes(cluster: Cluster, lay: SchematicLayout) -> dict[str, tuple[float, float, float, float]]:
    """(x, y, w, h) of what each badge attaches to; bands are cut to the first screen so badges stay in view."""
    right = lay.width - MARGIN
    x_storage = MARGIN + WEIGHTS_W + 20
    gpu_y = lay.y_nodes + 46
    if lay.aggregate:  # badges sit in the gaps around the whole grid, not on one 100 px tile
        node = gpu = (MARGIN, lay.y_nodes - 12, right - MARGIN, lay.nodes_h + 24)
    else:
        node, gpu = (MARGIN, lay.y_nodes, lay.node_w, lay.node_h), (MARGIN + 12, gpu_y, lay.node_w - 24, GPU_H)
    return {
        "slurm": (MARGIN, lay.y_slurm, right - MARGIN, BAND_H),
        "stack": (MARGIN, lay.y_stack, right - MARGIN, BAND_H),
        "node": node,
        "gpu": gpu,
        "fabric": (MARGIN, lay.y_fabric, right - MARGIN, BAND_H),
        "storage": (x_storage, lay.y_storage, right - x_storage, 58),
        "weights": (MARGIN, lay.y_storage, WEIGHTS_W, 58),
    }


def _tag_width(text: str) -> int:
    return int(len(text) * CHAR_W) + 34


def _collectors(cluster: Cluster, lay: SchematicLayout, t: Translate) -> str:
    """Each collector as a tag straddling the top edge of what it watches (dcgm: the bottom of node1)."""
    boxes = _boxes(cluster, lay)
    out = ['<g class="collectors">']
    for cid, target in COLLECTOR_TARGETS.items():
        bx, by, bw, bh = boxes[target]
        name = t(f"collector.{cid}")
        w = _tag_width(name)
        x = bx + bw - w - 14
        y = (
            by + bh if target == "gpu" and lay.aggregate else lay.y_nodes + lay.node_h if target == "gpu" else by
        ) - TAG_H / 2
        label = t("aria.collector").format(name=name)
        out.append(
            f"{_open_el(f'collector:{cid}', label, f' data-collector={chr(34)}{cid}{chr(34)}')}"
            f'<rect class="shape collector-pill" x="{x:.0f}" y="{y:.0f}" width="{w}" height="{TAG_H}" '
            f'rx="11"/><text class="collector-state" data-state="{cid}" x="{x + 11:.0f}" y="{y + 15:.0f}">?'
            f'</text><text class="collector-name" x="{x + 25:.0f}" y="{y + 15:.0f}">{_a(name)}</text></g>'
        )
    out.append("</g>")
    return "".join(out)


def _threats(cluster: Cluster, lay: SchematicLayout, t: Translate) -> str:
    """Each vector as a numbered dot on the bottom edge of its target, with a path to the weights."""
    boxes = _boxes(cluster, lay)
    gx = MARGIN + 12 + lay.gpu_w / 2
    spots = {  # (x, y) of the dot
        "supply_chain": lambda b: (b[0] + b[2] * 0.45, b[1] + b[3]),
        "data_poisoning": lambda b: (b[0] + b[2] * 0.55, b[1] + b[3]),
        "rdma_blind_spot": lambda b: (b[0] + b[2] * 0.62, b[1] + b[3]),
        "gradient_injection": lambda b: (gx + 2 * (lay.gpu_w + GPU_GAP), b[1] - 6),
        "gpu_memory_remanence": lambda b: (gx + 4 * (lay.gpu_w + GPU_GAP) if lay.gpu_cols > 4 else gx, b[1] + b[3] + 8),
        "container_escape": lambda b: (b[0] + b[2] * 0.5, b[1]),
    }
    wx, wy = MARGIN + WEIGHTS_W * 0.5, lay.y_storage
    paths, dots = [], []
    for vid, target in VECTOR_TARGETS.items():
        number = VECTOR_NUMBERS[vid]
        x, y = spots[vid](boxes[target])
        x, y = round(x), round(y)
        label = t("aria.vector").format(number=number, name=t(f"vector.{vid}"))
        paths.append(
            f'<path class="threat-path" data-path="{vid}" d="M{x} {y} C {x} {(y + wy) / 2:.0f} {wx:.0f} '
            f'{wy - 60} {wx:.0f} {wy - 3}" marker-end="url(#arrow)" aria-hidden="true"/>'
        )
        dots.append(
            f"{_open_el(f'vector:{vid}', label, f' data-vector={chr(34)}{vid}{chr(34)}')}"
            f'<circle class="shape vector-dot" cx="{x}" cy="{y}" r="13"/>'
            f'<text class="vector-num" x="{x}" y="{y + 5}" text-anchor="middle">{number}</text></g>'
            f'<text class="vector-flag" data-flag="{vid}" x="{x + 18}" y="{y + 5}" aria-hidden="true"></text>'
        )
    return f'<g class="threats">{"".join(paths)}{"".join(dots)}</g>'
