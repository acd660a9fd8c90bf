// GPU tiles and aggregate node tiles: utilisation, power, temperature and job colour, their tooltips and
// the spoken names that carry the values ("GPU 2 of node1, 97 % busy, 650 W, 45 °C, job 4101").
// Every write is skipped when the value did not change: 1,024 GPUs at 1 Hz must cost < 16 ms a tick.

import { clear, fmt, fmtTime, h, t } from "./util.js";

/** Job colours: Okabe & Ito's eight, distinguishable with the common colour-vision deficiencies
 *  (https://jfly.uni-koeln.de/color/), then four of Paul Tol's "muted" scheme that differ from them
 *  (https://personal.sron.nl/~pault/): the legend lists up to twelve jobs, each with its own colour. */
export const JOB_COLOURS = 12;

const refs = { tiles: [], nodes: [], full: [] };

/** GPU id -> the mark of its worst problem (monitor.js drawMarks): a tile's corner glyph reads it, and a cell
 *  built later takes it. */
export const gpuProblems = new Map();

/** Look every live element up once: a 128-node page has ~5,000 of them. */
export function initTiles() {
  const byId = (selector, attr, cut = 0) =>
    new Map([...document.querySelectorAll(selector)].map((n) => [n.getAttribute(attr).slice(cut), n]));
  const util = byId("[data-live^='util:']", "data-live", 5);
  const pt = byId("[data-live^='pt:']", "data-live", 3);
  const temp = byId("[data-live^='temp:']", "data-live", 5);
  const bars = byId("[data-bar]", "data-bar");
  const jobbars = byId("[data-jobbar]", "data-jobbar");
  const tips = byId("title[data-tip^='gpu:']", "data-tip", 4);
  refs.tiles = [...document.querySelectorAll("[data-gpu]")].map((el) => {
    const id = el.dataset.gpu;
    const [node, index] = id.split("/");
    const bar = bars.get(id);
    return { id, node, index, el, full: el.classList.contains("el"), util: util.get(id), pt: pt.get(id), temp: temp.get(id), bar, job: jobbars.get(id), tip: tips.get(id),
      barMax: Number(bar?.previousElementSibling?.getAttribute("width") ?? 34), last: {} };
  });
  // The GPUs of tiles whose cells the page builds once in view (web/svg.py CELLS_IN_VIEW_FROM_NODES): no element yet.
  for (const group of document.querySelectorAll(".tile[data-cells]")) {
    const node = group.dataset.nodeGroup;
    for (const index of group.dataset.cells.split(" ")) {
      refs.tiles.push({ id: `${node}/${index}`, node, index, el: null, full: false, last: {} });
    }
  }
  const byGpu = new Map(refs.tiles.map((tile) => [tile.id, tile]));
  refs.byGpu = byGpu;
  document.getElementById("schematic-wrap")?.addEventListener("pointerover", (event) => {
    const tile = byGpu.get(event.target.closest?.(".gpu-cell")?.dataset.gpu);
    if (tile && latest) setText(tile.tip, t("tip.gpu", gpuWords(tile, latest.gpus?.[tile.id])), tile.last, "tip");
  });
  const sums = byId("[data-live^='sum:']", "data-live", 4);
  const tileMarks = byId("[data-tile-mark]", "data-tile-mark");
  // Each node's GPUs grouped in one pass: filtering all GPUs once a node was 900 ms of a 1,024-node page's load.
  const gpusOf = new Map();
  for (const tile of refs.tiles) {
    if (gpusOf.has(tile.node)) gpusOf.get(tile.node).push(tile);
    else gpusOf.set(tile.node, [tile]);
  }
  refs.nodes = [...document.querySelectorAll(".tile g[data-node]")].map((el) => ({
    name: el.dataset.node, el, sum: sums.get(el.dataset.node), mark: tileMarks.get(el.dataset.node),
    tip: el.querySelector(":scope > title"), last: {}, group: el.closest(".tile"),
    gpus: gpusOf.get(el.dataset.node) ?? [] }));
  refs.byNode = new Map(refs.nodes.map((node) => [node.name, node]));
  refs.drawnGpus = refs.tiles.filter((tile) => !refs.byNode.has(tile.node));   // the GPUs of drawn nodes
  refs.full = [...document.querySelectorAll(".node-group:not(.tile) > g[data-node]")].map((el) => ({
    name: el.dataset.node, el, title: el.querySelector(".node-title"), label: el.getAttribute("aria-label") ?? "",
    last: {} }));
  watchOnScreen();
}

// -- tiles off screen ----------------------------------------------------------------------
// At 1,024 nodes every tick moves all 8,192 GPU cells, and writing them all cost ~150 ms a tick in the page.
// An aggregate tile off screen is skipped and written when it scrolls in (from the newest snapshot), so a
// tick costs what the screen shows; a tick looks at the tiles on screen only, not at each GPU a delta moved
// (4,000 of them at times). A page with fewer tiles than this writes them all (and its tests read every tile).
// Drawn nodes (up to 4, refs.full) are always written. Ours.
const WATCH_FROM_TILES = 64;
const onScreen = new Set();   // the aggregate tiles (refs.nodes) in or near the viewport

function watchOnScreen() {
  if (refs.nodes.length < WATCH_FROM_TILES || !("IntersectionObserver" in window)) {
    for (const node of refs.nodes) {
      buildTile(node);
      onScreen.add(node);
    }
    return;
  }
  const byEl = new Map(refs.nodes.map((node) => [node.el, node]));
  const observer = new IntersectionObserver((entries) => {
    for (const entry of entries) {
      const node = byEl.get(entry.target);
      if (entry.isIntersecting) {
        onScreen.add(node);
        buildTile(node);
        // Written whether or not a tick moved it meanwhile: unchanged values are not written again (tile.last).
        if (latest) writeNode(node, latest);
      } else {
        onScreen.delete(node);
      }
    }
  }, { rootMargin: "200px" });   // written just before they show
  // Off screen until the observer's first report (it reports every tile at the next frame): the snapshot the
  // page boots with then writes only the tiles in view, not all 8,192 cells before the first paint.
  for (const node of refs.nodes) observer.observe(node.el);
}

// -- tiles built in view --------------------------------------------------------------------
// Past a few hundred nodes the server draws a tile as its box and its element alone, with its cells' geometry
// (web/svg.py _tile); its name, live sum, mark, tooltip and GPU cells are built here, as svg.py draws them, when
// the tile first comes into view. Not drawing 8,192 cells and 4,000 texts up front is what brings a 1,024-node
// page's first paint under a second.
const SVG_NS = "http://www.w3.org/2000/svg";
const cellHooks = [];

/** `hook(cells)` runs on each batch of cells built (monitor.js: their problem mark and job highlight). */
export function onCellsBuilt(hook) {
  cellHooks.push(hook);
}

function svgEl(name, attrs) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, value);
  return el;
}

/** Builds `node`'s tile if the server left it to the page; true when it built it. */
function buildTile(node) {
  const group = node.group;
  if (!group?.dataset.cells) return false;
  buildTexts(node);
  buildCells(node);
  delete group.dataset.cells;
  return true;
}

/** The tile's tooltip and name inside its element, its live sum and problem mark beside it (web/svg.py _tile). */
function buildTexts(node) {
  const box = node.el.querySelector(".node-box");
  const [x, y, w] = ["x", "y", "width"].map((attr) => Number(box.getAttribute(attr)));
  node.tip = svgEl("title", { "data-tip": `node:${node.name}` });
  node.tip.textContent = node.el.getAttribute("aria-label") ?? node.name;
  const name = svgEl("text", { class: "node-title tile-title", x: String(x + 7), y: String(y + 16) });
  name.textContent = node.name;
  node.el.prepend(node.tip);
  node.el.append(name);
  node.sum = svgEl("text", { class: "live tile-sum", "data-live": `sum:${node.name}`, x: String(x + 7), y: String(y + 32), "aria-hidden": "true" });
  node.mark = svgEl("text", { class: "tile-mark", "data-tile-mark": node.name, x: String(x + w - 7), y: String(y + 16), "text-anchor": "end", "aria-hidden": "true" });
  node.el.after(node.sum, node.mark);
}

/** The tile's GPU cells, after its texts. */
function buildCells(node) {
  const group = node.group;
  const { cellX, cellY, cellW, cellStep } = group.dataset;
  const cells = group.dataset.cells.split(" ").map((index) => {
    const id = `${node.name}/${index}`;
    const x = String(Math.round((Number(cellX) + Number(index) * Number(cellStep)) * 100) / 100);
    const cell = svgEl("g", { class: "gpu-cell", "data-el": `gpu:${id}`, "data-gpu": id, "aria-hidden": "true" });
    const tip = svgEl("title", { "data-tip": `gpu:${id}` });
    tip.textContent = `GPU ${index} · ${node.name}`;
    const job = svgEl("rect", { class: "gpu-job", "data-jobbar": id, x, y: String(Number(cellY) + 19), width: cellW, height: "3" });
    cell.append(tip, svgEl("rect", { class: "gpu-box", x, y: cellY, width: cellW, height: "17", rx: "2" }), job);
    Object.assign(refs.byGpu.get(id) ?? {}, { el: cell, job, tip });
    return cell;
  });
  group.append(...cells);
  for (const hook of cellHooks) hook(cells);
}

/** Node `name`'s tile, built now if it was not (a GPU card opened from the URL). */
export function buildTileOf(name) {
  const node = refs.byNode?.get(name);
  if (node && buildTile(node) && latest) writeNode(node, latest);
}

function writeNode(node, snap) {
  for (const tile of node.gpus) applyGpu(tile, snap.gpus?.[tile.id]);
  applyNode(node, snap);
}

/** A drawn node (up to 4 nodes) says its state after its name: "node2 · drained"; its spoken name says it too,
 *  as it starts with the visible title (WCAG 2.5.3, axe's label-content-name-mismatch). */
function applyFullNode(node, snap) {
  const state = snap.node_states?.[node.name]?.state;
  const shown = state && state !== "ok" ? state : null;
  const testing = remediation(snap, node.name);
  const title = [node.name, shown ? t(`state.${shown}`) : null, testing ? t(`remediation.${testing}`) : null].filter(Boolean).join(" · ");
  set(node.el, "data-state", shown, node.last);
  set(node.el, "data-remediation", testing, node.last);
  setText(node.title, title, node.last, "title");
  const rest = node.label.startsWith(node.name) ? node.label.slice(node.name.length) : `, ${node.label}`;
  set(node.el, "aria-label", `${title}${rest}`, node.last);
}

/** Where hpcwatch act's testing of a node stands (reports/acting.py remediation_states), or null. */
function remediation(snap, name) {
  return snap.node_states?.[name]?.remediation?.stage ?? null;
}

/** A job id's preferred colour index (FNV-1a: the same in every tab and every session). */
export function jobColour(job) {
  let hash = 0x811c9dc5;
  for (let i = 0; i < job.length; i += 1) hash = Math.imul(hash ^ job.charCodeAt(i), 16777619) >>> 0;
  return hash % JOB_COLOURS;
}

const jobOrder = new Intl.Collator("en", { numeric: true });
const DECIMAL = /^(0|[1-9][0-9]*)$/;

/** "9" before "10". Two plain numbers (Slurm's job ids) are compared by length, then digit by digit: what the
 *  numeric collator decides for them, three times faster (a 1,024-node demo runs some 4,300 jobs). */
function byJobId(a, b) {
  if (DECIMAL.test(a) && DECIMAL.test(b)) return a.length - b.length || (a < b ? -1 : a > b ? 1 : 0);
  return jobOrder.compare(a, b);
}

/** The jobs on the drawing, sorted by id → their colour indexes: each takes its preferred colour, or the next one
 *  that no earlier job took. Hashing alone gave two of five jobs one colour more often than not; this way up to
 *  JOB_COLOURS jobs never share one, and the same jobs get the same colours in every tab. Once every colour is
 *  taken, a job keeps its preferred one (the probe comes back to it), so the map stops there and colourOf
 *  hashes the rest. */
export function jobColours(sorted) {
  const colours = new Map();
  const taken = new Set();
  for (const job of sorted) {
    if (taken.size === JOB_COLOURS) break;
    let colour = jobColour(job);
    for (let probe = 0; probe < JOB_COLOURS && taken.has(colour); probe += 1) colour = (colour + 1) % JOB_COLOURS;
    taken.add(colour);
    colours.set(job, colour);
  }
  return colours;
}

// The jobs of the last snapshot, kept sorted between ticks: at 1,024 nodes a tick starts or ends a job or two of
// some 4,000, and sorting them all again, then repainting every tile, was a third of the tick. Only a colour that
// moved (a job among the first ones ended) repaints every tile.
const palette = { jobs: new Set(), sorted: [], colours: new Map() };

/** Brings the palette to `snap`'s jobs; true when a job's colour moved. `jobs`: the job_gpus entries a delta
 *  changed (null: gone), or null for a whole snapshot, whose jobs are compared with the palette's. */
function paletteFor(snap, jobs) {
  const [added, gone] = jobs ? jobsChanged(jobs) : jobsDiffer(snap.job_gpus ?? {});
  if (!added.length && !gone.length) return false;   // the same jobs, some on other GPUs
  for (const job of gone) palette.jobs.delete(job);
  for (const job of added) palette.jobs.add(job);
  palette.sorted = added.length > 64 ? [...palette.jobs].sort(byJobId)   // a whole snapshot's: sorted anew
    : insertSorted(withoutAll(palette.sorted, gone), added);
  const colours = jobColours(palette.sorted);
  const moved = !sameColours(colours, palette.colours);
  palette.colours = colours;
  return moved;
}

/** [added, gone]: the jobs a delta started and ended. */
function jobsChanged(jobs) {
  const added = [];
  const gone = [];
  for (const job in jobs) {
    if (jobs[job] === null) {
      if (palette.jobs.has(job)) gone.push(job);
    } else if (!palette.jobs.has(job)) {
      added.push(job);
    }
  }
  return [added, gone];
}

/** [added, gone]: the jobs of `current` (job id → GPUs) that the palette lacks, and those it has that `current`
 *  lacks. */
function jobsDiffer(current) {
  const added = [];
  let kept = 0;
  for (const job in current) {
    if (palette.jobs.has(job)) kept += 1;
    else added.push(job);
  }
  const gone = kept < palette.jobs.size ? [...palette.jobs].filter((job) => !Object.hasOwn(current, job)) : [];
  return [added, gone];
}

function withoutAll(sorted, gone) {
  if (!gone.length) return sorted;
  const dropped = new Set(gone);
  return sorted.filter((job) => !dropped.has(job));
}

/** `sorted` with `added` put in their places (a binary search each: a tick adds a few jobs). */
function insertSorted(sorted, added) {
  const out = [...sorted];
  for (const job of added) {
    let low = 0;
    let high = out.length;
    while (low < high) {
      const mid = (low + high) >>> 1;
      if (byJobId(out[mid], job) <= 0) low = mid + 1;
      else high = mid;
    }
    out.splice(low, 0, job);
  }
  return out;
}

function sameColours(a, b) {
  if (a.size !== b.size) return false;
  for (const [job, colour] of a) if (b.get(job) !== colour) return false;
  return true;
}

const colourOf = (job) => palette.colours.get(job) ?? jobColour(job);

const set = (node, name, value, last) => {
  if (last[name] === value) return;
  last[name] = value;
  if (value === null) node.removeAttribute(name);
  else node.setAttribute(name, value);
};
const setText = (node, value, last, key) => {
  if (!node || last[key] === value) return;
  last[key] = value;
  node.textContent = value;
};

const val = (v, digits, unit) => (v === undefined || v === null ? t("live.none") : `${fmt(v, digits)} ${t(unit)}`);

function level(util) {
  if (util === undefined || util === null) return "none";
  return util >= 70 ? "high" : util >= 20 ? "mid" : "low";
}

function firstJob(g) {
  const job = g?.job;
  if (!job) return null;
  return job.includes(",") ? job.split(",").find(Boolean) ?? null : job;   // one job: no array to split into
}

/** What the mark on a GPU says (straggler, XID), for its spoken name; empty without a problem. */
function problemWords(el) {
  const kind = el.dataset.problem;
  if (!kind) return "";
  const mark = document.querySelector(`[data-mark='${CSS.escape(el.dataset.gpu)}']`)?.textContent;
  return t("aria.problem", { what: mark || t(`mark.${kind}`) });
}

function applyGpu(tile, g) {
  if (!tile.el) return;   // a cell not built yet: written when its tile comes into view
  const util = g?.util_pct;
  const job = firstJob(g);
  // The true state (reports/live.py apply_states): a lost GPU shows no number, a drained or down node's GPUs say so.
  const state = g?.state && g.state !== "ok" ? g.state : null;
  const lost = state === "lost";
  set(tile.el, "data-state", state, tile.last);
  set(tile.el, "data-level", level(util), tile.last);
  set(tile.el, "data-jobc", job === null ? null : String(colourOf(job)), tile.last);
  // A cell of an aggregate tile has no numbers: its texts are not even made (a thousand a tick at 1,024 nodes).
  if (tile.util) setText(tile.util, lost ? t("state.lost") : util === undefined || util === null ? "–" : `${fmt(util, 0)}${t("unit.pct")}`, tile.last, "u");
  if (tile.pt) setText(tile.pt, lost ? t("state.lost_since", { t: fmtTime(g.last_seen) }) : state ? t(`state.${state}`) : g ? `${fmt(g.power_w, 0)} ${t("unit.w")}` : "", tile.last, "pt");
  if (tile.temp) setText(tile.temp, g && !lost ? `${fmt(g.temp_c, 0)} ${t("unit.c")}` : "", tile.last, "temp");
  if (tile.bar) set(tile.bar, "width", String(util ? (tile.barMax * Math.min(100, util)) / 100 : 0), tile.last);
  // A full tile's tooltip and spoken name follow every tick; a cell of an aggregate tile writes its tooltip
  // only when a pointer reaches it (1,024 text writes a tick were a third of the tick's cost).
  if (!tile.full) return;
  const words = gpuWords(tile, g);
  setText(tile.tip, t("tip.gpu", words), tile.last, "tip");
  set(tile.el, "aria-label", t("aria.gpu_live", { ...words, problem: problemWords(tile.el) }), tile.last);
}

function gpuWords(tile, g) {
  const state = g?.state && g.state !== "ok" ? g.state : null;
  return { index: tile.index, node: tile.node, gpu: tile.node,
    util: state === "lost" ? t("state.lost") : (state ? `${t(`state.${state}`)}, ` : "") + val(g?.util_pct, 0, "unit.pct"),
    power: val(g?.power_w, 0, "unit.w"), temp: val(g?.temp_c, 0, "unit.c"), job: g?.job ?? t("live.none") };
}

/** A tile's GPUs summed in one pass (a tile is rewritten each tick one of its GPUs moves). */
function nodeSums(node, snap) {
  let count = 0;
  let util = 0;
  let power = 0;
  let hottest = -Infinity;
  const jobs = new Set();
  for (const tile of node.gpus) {
    const g = snap.gpus?.[tile.id];
    if (!g) continue;
    count += 1;
    util += g.util_pct ?? 0;
    power += g.power_w ?? 0;
    hottest = Math.max(hottest, g.temp_c ?? -Infinity);
    const job = firstJob(g);
    if (job) jobs.add(job);
  }
  if (!count) return { mean: null, power: null, hottest: null, jobs: [] };
  return { mean: util / count, power, hottest, jobs: [...jobs] };
}

function applyNode(node, snap) {
  const { mean, power, hottest, jobs } = nodeSums(node, snap);
  const kw = power === null ? t("live.none") : `${fmt(power / 1000, 1)} kW`;
  const nodeState = snap.node_states?.[node.name]?.state;
  const shown = nodeState && nodeState !== "ok" ? nodeState : null;
  set(node.el, "data-state", shown, node.last);
  const testing = remediation(snap, node.name);
  set(node.el, "data-remediation", testing, node.last);
  const sum = mean === null ? "" : `${fmt(mean, 0)} ${t("unit.pct")} · ${kw}`;
  const words = [testing ? t(`remediation.${testing}`) : null, shown ? t(`state.${shown}`) : null, sum || null];
  setText(node.sum, words.filter(Boolean).join(" · "), node.last, "sum");
  const found = node.gpus.map((g) => gpuProblems.get(g.id)).filter(Boolean);
  const problem = MARK_ORDER.find((m) => found.includes(m));   // the worst of its GPUs' marks
  set(node.el, "data-gpu-problem", problem ?? null, node.last);
  if (node.mark) {
    setText(node.mark, problem ? `${t(`glyph.${problem}`)}${found.length > 1 ? ` ${fmt(found.length)}` : ""}` : "", node.last, "mark");
    set(node.mark, "data-mark-kind", problem ?? null, node.last);
  }
  const named = [node.name, shown ? t(`state.${shown}`) : null, testing ? t(`remediation.${testing}`) : null].filter(Boolean).join(" · ");
  const label = t("aria.tile_live", { node: named,
    gpus: node.gpus.length, util: val(mean, 0, "unit.pct"),
    power: kw, temp: val(Number.isFinite(hottest) ? hottest : null, 0, "unit.c"), job: jobs.join(", ") || t("live.none"),
    problem: problem ? t("aria.problem", { what: t(`mark.${problem}`, { code: "" }).trim() }) : "" });
  set(node.el, "aria-label", label, node.last);
  // Its tooltip says what its spoken name says: a title that kept the static words (model name) was text of the
  // tile that its live name no longer held (axe's label-content-name-mismatch, seen at 128 nodes on a loaded page).
  setText(node.tip, label, node.last, "tip");
}

/** The drawing's marks, worst first (reports/triage.py MARKS): a GPU or tile with two shows the first. */
export const MARK_ORDER = ["xid", "lost", "drain", "straggler", "idle", "warn", "finding"];

let latest = null;

/** Called with every snapshot, after the monitor marked problems (so names can say them). For a delta, what it
 *  changed: `gpus`, its GPUs by id (only they and their nodes are rewritten: at 1,024 nodes most tiles did not
 *  move; null: every tile), and `jobs`, its job_gpus entries (null: a whole snapshot, whose jobs are compared). */
export function applyTiles(snap, { gpus = null, jobs = null } = {}) {
  latest = snap;
  let changed = gpus;
  if (paletteFor(snap, jobs)) changed = null;   // a job's colour moved: every tile of it is repainted
  const drawnMoved = new Set();
  for (const tile of refs.drawnGpus) {
    if (changed && !(tile.id in changed)) continue;
    drawnMoved.add(tile.node);
    applyGpu(tile, snap.gpus?.[tile.id]);
  }
  for (const node of refs.full) if (!changed || drawnMoved.has(node.name)) applyFullNode(node, snap);
  for (const node of onScreen) if (writeGpus(node, snap, changed)) applyNode(node, snap);
  drawJobLegend();
}

/** Writes the GPUs of `node` that moved; true when one did (or when everything is rewritten). */
function writeGpus(node, snap, changed) {
  let moved = !changed;
  for (const tile of node.gpus) {
    if (changed && !(tile.id in changed)) continue;
    moved = true;
    applyGpu(tile, snap.gpus?.[tile.id]);
  }
  return moved;
}

/** The legend's jobs: the first twelve by id (their colours follow from them alone, jobColours). */
const LEGEND_JOBS = 12;

// The legend of job colours: the jobs on the drawing now, each with its swatch.
function drawJobLegend() {
  const legend = document.getElementById("legend-jobs");
  if (!legend) return;
  const jobs = palette.sorted.slice(0, LEGEND_JOBS);
  const signature = jobs.join(" ");
  if (legend.dataset.signature === signature) return;
  legend.dataset.signature = signature;
  clear(legend);
  legend.append(t("legend_jobs.label"), " ");
  if (!jobs.length) legend.append(t("legend_jobs.none"));
  for (const job of jobs) {
    legend.append(h("span", { class: "chip", "data-jobc": String(colourOf(job)) },
      h("span", { class: "swatch job-swatch", "aria-hidden": "true" }), job), " ");
  }
}
