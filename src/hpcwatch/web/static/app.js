// The page's entry point: modes, cards, live values from the SSE stream, drag-to-pan,
// the walk-through guide. Live text is written with textContent only.

import { initAlerts } from "./alerts.js";
import { renderCard, updateCardLive } from "./card.js";
import { initDecider } from "./decider.js";
import { initFit } from "./fit.js";
import { showHistory } from "./history.js";
import { applyMonitor, highlightJob, initMonitor, readUrl, setConnection, writeUrl } from "./monitor.js";
import { jobLink } from "./job.js";
import { applyTiles, buildTileOf, initTiles } from "./tiles.js";
import { initPlayer } from "./player.js";
import { initSimulator } from "./sim.js";
import { boot, clear, eventItem, fmt, fmtRate, fmtTime, h, t } from "./util.js";

const state = { reading: "engineer", view: "schematic", snapshot: boot.live, opener: null, ticks: 0, applyMs: [],
  refusals: 0, retryTimer: null, version: boot.live?.v, cardPressed: false };
const body = document.body;
const card = document.getElementById("card");
const wrap = document.getElementById("schematic-wrap");

// Elements updated every tick, looked up once (a 128-GPU page has ~1,000 of them).
const refs = {
  ib: new Map([...document.querySelectorAll("[data-live^='ib:']")].map((n) => [n.dataset.live.slice(3), n])),
  band: new Map([...document.querySelectorAll(".band-live")].map((n) => [n.dataset.live, n])),
  collectors: [...document.querySelectorAll("[data-collector]")],
  vectors: [...document.querySelectorAll("g[data-vector]")],
  flags: new Map([...document.querySelectorAll("[data-flag]")].map((n) => [n.dataset.flag, n])),
  paths: new Map([...document.querySelectorAll("[data-path]")].map((n) => [n.dataset.path, n])),
};

// -- live values ---------------------------------------------------------------------------

// `changed`: what a delta changed, for tiles.js applyTiles (the tiles and nodes of its GPUs only are rewritten);
// none for a whole snapshot: everything is.
function applySnapshot(snap, changed = {}) {
  state.snapshot = snap;
  state.ticks += 1;
  body.dataset.ticks = String(state.ticks);
  applyMonitor(snap);                // first: the tiles' spoken names say the problems it marks
  applyTiles(snap, changed);
  updateEvents(snap);
  for (const [name, node] of refs.ib) {
    const v = snap.nodes?.[name];
    node.textContent = v ? `IB ↑${fmtRate(v.ib_tx_bytes_s)} ↓${fmtRate(v.ib_rx_bytes_s)}` : "";
  }
  updateBands(snap);
  updateCollectors(snap);
  updateVectors(snap);
  updateQueue(snap);
  document.getElementById("clock").textContent = t("status.sim_time", { time: fmtTime(snap.t) });
  updateCollect(snap.collect);
  if (!state.cardPressed) updateCardLive(card, snap);
  if (state.ticks === 1) markReady();
}

/** The page is ready when its first live values are on screen: `hpcwatch:ready` is marked once the frame that
 *  draws them is painted (a task queued from requestAnimationFrame runs after that frame), on the page's own
 *  clock. benchmarks/bench_web.py reads it; polling for the tick from outside the page adds the poller's delay. */
function markReady() {
  requestAnimationFrame(() => setTimeout(() => performance.mark("hpcwatch:ready")));
}

// Which collectors of `hpcwatch collect` answer (null: no daemon writes this store).
function updateCollect(collect) {
  const el = document.getElementById("collect-status");
  el.hidden = !collect;
  if (!collect) return;
  const up = collect.filter((c) => c.answering).map((c) => c.name);
  const down = collect.filter((c) => !c.answering).map((c) => c.name);
  el.textContent = t("status.collect", { up: up.join(", ") || "—", down: down.join(", ") || "—" });
  el.title = collect.filter((c) => c.last_error).map((c) => `${c.name}: ${c.last_error}`).join("\n");
}

function updateBands(snap) {
  const q = snap.queue;
  setBand("slurm", q ? `${t("live.running")} ${fmt(q.running)} · ${t("live.pending")} ${fmt(q.pending)}` : "");
  const tr = snap.training;
  setBand("stack", tr ? `${t("live.step")} ${fmt(tr.step)} · ${fmt(tr.step_time_s * 1000, 1)} ${t("unit.ms")}` : "");
  const nodes = Object.values(snap.nodes || {});
  const tx = nodes.reduce((a, v) => a + (v.ib_tx_bytes_s || 0), 0);
  setBand("fabric", nodes.length ? `↑ ${fmtRate(tx)}` : "");
  const st = snap.storage;
  setBand("storage", st ? `${t("live.read")} ${fmtRate(st.read_bytes_s)} · ${t("live.write")} ${fmtRate(st.write_bytes_s)}` : "");
}

function setBand(key, text) {
  const node = refs.band.get(key);
  if (node) node.textContent = text;
}

const COLLECTOR_MARKS = { answering: "✓", silent: "✕", not_configured: "–" };

function updateCollectors(snap) {
  for (const el of refs.collectors) {
    const c = snap.collectors?.[el.dataset.collector];
    const arriving = Boolean(c?.arriving);
    // answering / silent (seen before) / not_configured (never seen): reports/live.py decides.
    const state = c?.state ?? (arriving ? "answering" : "silent");
    el.dataset.arriving = String(arriving);
    el.dataset.state = state;
    el.querySelector(".collector-state").textContent = COLLECTOR_MARKS[state] ?? "?";
    el.setAttribute("aria-description", t(`collector_state.${state}`));
  }
}

function updateVectors(snap) {
  for (const el of refs.vectors) {
    const v = snap.vectors?.[el.dataset.vector];
    const live = Boolean(v && v.findings > 0);
    el.dataset.live = String(live);
    const flag = refs.flags.get(el.dataset.vector);
    if (flag) {
      // Only a live finding is written on the drawing: six labels of vectors without one covered the GPU tiles.
      flag.textContent = live ? `⚠ ${t("vector.live")}` : "";
      flag.dataset.live = String(live);
    }
    // Looked up once (refs): searching the drawing for each vector's path every tick was 4 ms a tick at 1,024 nodes.
    refs.paths.get(el.dataset.vector)?.setAttribute("data-live", String(live));
  }
}

/** The recent-events strip (reports/timeline.py, newest first, bounded): rebuilt only when it changed. */
function updateEvents(snap) {
  const list = document.getElementById("events-list");
  if (!list || !snap.events) return;
  const signature = JSON.stringify(snap.events);
  if (list.dataset.signature === signature) return;
  list.dataset.signature = signature;
  clear(list);
  if (!snap.events.length) list.append(h("li", { class: "muted" }, t("events.none")));
  for (const e of snap.events) list.append(eventItem(e));
}

function updateQueue(snap) {
  const q = snap.queue;
  if (!q) return;
  document.getElementById("queue-counts").textContent = t("queue.counts", { running: fmt(q.running), pending: fmt(q.pending) });
  const tbody = document.querySelector("#queue-table tbody");
  const signature = JSON.stringify(q.jobs);
  if (tbody.dataset.signature === signature) return;     // rebuilding 50 rows a tick cost more than the tiles
  tbody.dataset.signature = signature;
  clear(tbody);
  for (const j of q.jobs) {
    const job = h("button", { type: "button", class: "ghost job-link", "data-highlight-job": j.id,
      title: t("alerts.job_title", { job: j.id }) }, j.id);
    const state = (j.requeued ? t("queue.requeued") : j.state ?? "") + (j.restarts ? ` · ${t("queue.restarts", { n: fmt(j.restarts) })}` : "");
    tbody.append(h("tr", { "data-job": j.id, "data-requeued": String(Boolean(j.requeued)) }, [[job, " ", jobLink(j.id)], j.name ?? "", j.user ?? "", j.account ?? "", state, (j.nodes || []).join(", "), fmt(j.gpus)]
      .map((c) => h("td", {}, c))));
  }
}

// Keys of a delta whose change can move a tile's marks or state: the whole drawing is rewritten then. Not
// job_gpus: at 1,024 nodes nearly every tick starts or ends a job, and tiles.js repaints every tile only when
// that moved a job's colour.
const DRAWING_KEYS = ["problems", "alerts", "node_states"];

/** A delta (web/livedelta.py) merged into the snapshot it was computed from: entries' fields, null = gone. */
function mergeDelta(snap, delta) {
  const merged = { ...snap, ...delta.set, v: delta.v };
  for (const key of ["gpus", "nodes"]) {
    if (!delta[key]) continue;
    // Merged in place, entries too: nothing reads the previous snapshot's maps or entries again, and copying
    // them (8,192 GPUs, then each changed GPU's entry) was most of the merge's cost and of the garbage a tick
    // left. for...in rather than Object.entries: no array per GPU.
    const entries = snap[key] || {};
    const changes = delta[key];
    for (const name in changes) {
      const fields = changes[name];
      if (fields === null) { delete entries[name]; continue; }
      const entry = entries[name] ?? (entries[name] = {});
      for (const field in fields) {
        const value = fields[field];
        if (value === null) delete entry[field];
        else entry[field] = value;
      }
    }
    merged[key] = entries;
  }
  for (const key of ["job_gpus"]) {   // entries replaced whole (web/livedelta.py BY_ENTRY), in place too
    if (!delta[key]) continue;
    const entries = snap[key] || {};
    const changes = delta[key];
    for (const name in changes) {
      if (changes[name] === null) delete entries[name];
      else entries[name] = changes[name];
    }
    merged[key] = entries;
  }
  for (const [key, value] of Object.entries(delta.set || {})) if (value === null) delete merged[key];
  return merged;
}

let source = null;
/** A refused stream is asked again after 5 s, then 10, 20, 40, and every 60 s. Ours. */
const RETRY_FIRST_MS = 5000;
const RETRY_MAX_MS = 60000;
/** A stream that has said nothing for this long is taken for dead and opened anew: the server sends a version
 *  every tick (a full frame to a new connection), but a connection left half-open by a network change or a
 *  stalled proxy says nothing and EventSource never notices. 60 s: four times the slowest tick seen (a 128-node
 *  demo on a loaded machine). Ours; a test shortens it through window.HPCWATCH_SILENT_MS. */
const SILENT_MS = Number(window.HPCWATCH_SILENT_MS) || 60000;
let heardAt = performance.now();

/** A delta applies only on top of the version it was computed from; after a gap, reconnect: the server answers
 *  a new connection with a full snapshot. */
function applyDelta(delta) {
  if (delta.v === state.version) return;  // already held: a stream reopened with an older "since"
  if (state.version === undefined || delta.base !== state.version) {
    state.reconnects = (state.reconnects || 0) + 1;
    source?.close();
    connect();
    return;
  }
  state.version = delta.v;
  const whole = DRAWING_KEYS.some((key) => key in (delta.set || {}) || key in delta);
  const changed = { gpus: whole ? null : delta.gpus ?? {}, jobs: delta.job_gpus ?? {} };
  applySnapshot(mergeDelta(state.snapshot, delta), changed);
  state.deltas = (state.deltas || 0) + 1;
}

function connect() {
  // From the version the page holds (its boot document, or the last one applied): the server starts with the
  // delta from it rather than the whole snapshot, which the page would parse and draw again.
  const since = boot.resume && state.version !== undefined ? `?since=${boot.resume}.${state.version}` : "";
  source = new EventSource(boot.stream + since);
  heardAt = performance.now();
  // What one tick costs the page (parse + every write), kept for benchmarks/bench_web.py and the tests.
  const timed = (apply) => (event) => {
    const started = heardAt = performance.now();
    apply(JSON.parse(event.data));
    setConnection("live");           // one status: "Live" only if the data it brought is fresh too (monitor.js)
    state.applyMs = [...state.applyMs.slice(-59), performance.now() - started];
  };
  source.addEventListener("live", timed((snap) => { state.version = snap.v; applySnapshot(snap); }));
  source.addEventListener("delta", timed(applyDelta));
  source.addEventListener("problem", (event) => {
    heardAt = performance.now();
    setConnection("lost", t("error.generic", { error: JSON.parse(event.data).error }));
  });
  source.onerror = () => {
    // EventSource retries a dropped stream by itself, but gives up on a non-200 answer (503: the server's stream
    // cap is full); then the page asks again later, waiting longer each time, with a jitter so that a room of
    // refused viewers does not come back in one burst.
    if (source.readyState !== EventSource.CLOSED) { setConnection("lost"); return; }
    const wait = Math.min(RETRY_MAX_MS, RETRY_FIRST_MS * 2 ** Math.min(state.refusals, 4)) + Math.random() * 1000;
    state.refusals += 1;
    setConnection("lost", t("status.refused", { s: Math.round(wait / 1000) }));
    clearTimeout(state.retryTimer);
    state.retryTimer = setTimeout(connect, wait);
  };
  source.addEventListener("open", () => { state.refusals = 0; });
}

/** Every quarter of SILENT_MS: a stream open or opening that has been silent that long is closed and opened
 *  anew (a refused one, CLOSED, waits for its own retry). */
function watchSilence() {
  setInterval(() => {
    if (!source || source.readyState === EventSource.CLOSED || performance.now() - heardAt < SILENT_MS) return;
    state.silentReconnects = (state.silentReconnects || 0) + 1;
    source.close();
    connect();
  }, SILENT_MS / 4);
}

// -- cards ---------------------------------------------------------------------------------

function openCard(key, opener) {
  state.opener = opener ?? document.querySelector(`[data-el='${CSS.escape(key)}']`);
  document.querySelectorAll(".el[aria-expanded='true']").forEach((el) => el.setAttribute("aria-expanded", "false"));
  if (!renderCard(card, key, state.reading, state.snapshot, closeCard)) return;
  showHistory(card, key);
  state.opener?.setAttribute("aria-expanded", "true");
  document.querySelectorAll(".el.selected").forEach((el) => el.classList.remove("selected"));
  state.opener?.classList.add("selected");
  card.classList.add("open");
  card.scrollIntoView({ block: "nearest", behavior: "smooth" });
  saveUrl();
}

function closeCard() {
  if (!card.dataset.open) return;
  delete card.dataset.open;
  card.classList.remove("open");
  clear(card);
  card.append(h("h2", { id: "card-title", class: "card-empty-title" }, t("card.empty_title")),
    h("p", { class: "muted" }, t("card.empty")));
  document.querySelectorAll(".el.selected").forEach((el) => el.classList.remove("selected"));
  state.opener?.setAttribute("aria-expanded", "false");
  state.opener?.focus();
  saveUrl();
}

// The address carries the view, the reading, the open card and the highlighted job (monitor.js).
function saveUrl() {
  writeUrl({ mode: state.view, reading: state.reading, el: card.dataset.open, job: monitor.job });
}

function restoreUrl() {
  const wanted = readUrl();
  if (["schematic", "observer", "threats"].includes(wanted.mode)) setView(wanted.mode);
  if (["engineer", "decider"].includes(wanted.reading)) setReading(wanted.reading);
  if (wanted.job) highlightJob(wanted.job);
  if (wanted.el?.startsWith("gpu:")) buildTileOf(wanted.el.slice(4).split("/")[0]);   // its tile may be unbuilt
  const opener = wanted.el ? document.querySelector(`[data-el='${CSS.escape(wanted.el)}']`) : null;
  if (opener) openCard(wanted.el, opener);
}

function bindElements() {
  // One listener for every cell, those tiles.js builds later included.
  document.getElementById("schematic-wrap")?.addEventListener("click", (event) => {
    const cell = event.target.closest?.(".gpu-cell");
    if (cell && !dragging.moved) openCard(cell.dataset.el, cell.closest(".node-group")?.querySelector(".el"));
  });
  // A GPU button in a node's card opens that GPU's card (the way to a GPU of an aggregate tile by keyboard).
  card.addEventListener("click", (event) => {
    const button = event.target.closest?.("[data-open-gpu]");
    if (button) openCard(`gpu:${button.dataset.openGpu}`);
  });
  // The card's live part is rebuilt each tick: a rebuild between a button's press and its release lost the click
  // (pressed on the old button, released on its replacement: no click at all). A press in the card holds the
  // live part until the release, then, once the click is dispatched, draws the newest snapshot.
  card.addEventListener("pointerdown", () => { state.cardPressed = true; });
  const releaseCard = () => {
    if (!state.cardPressed) return;
    state.cardPressed = false;
    setTimeout(() => updateCardLive(card, state.snapshot));
  };
  document.addEventListener("pointerup", releaseCard);
  document.addEventListener("pointercancel", releaseCard);
  for (const el of document.querySelectorAll(".el")) {
    el.addEventListener("click", () => {
      if (!dragging.moved) openCard(el.dataset.el, el);
    });
    el.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") {
        event.preventDefault();
        openCard(el.dataset.el, el);
      }
    });
  }
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape") closeCard();
  });
}

// -- modes ---------------------------------------------------------------------------------

function setReading(reading) {
  state.reading = reading;
  body.classList.remove("reading-engineer", "reading-decider");
  body.classList.add(`reading-${reading}`);
  document.querySelectorAll("[data-reading]").forEach((b) => b.setAttribute("aria-pressed", String(b.dataset.reading === reading)));
  if (card.dataset.open && renderCard(card, card.dataset.open, reading, state.snapshot, closeCard)) {
    showHistory(card, card.dataset.open);
  }
  if (reading === "decider") {
    showTier();
    decider.show();
  }
  saveUrl();
}

// The Decider mode shows the assessment's tier: the one hpcwatch collect stored (task = "assess"), or,
// when no collector assesses, one made now; the link opens the full report (/assess).
function showTier() {
  const slot = document.querySelector("[data-assess-tier]");
  if (!slot) return;
  fetch("/api/assess/latest").then((r) => r.json())
    .then((latest) => latest && latest.tier ? latest : fetch("/api/assess").then((r) => r.json()))
    .then((doc) => { slot.textContent = doc.tier; })
    .catch(() => { slot.textContent = "?"; });
}

function setView(view) {
  state.view = view;
  body.classList.remove("view-schematic", "view-observer", "view-threats");
  body.classList.add(`view-${view}`);
  document.querySelectorAll("[data-view]").forEach((b) => b.setAttribute("aria-pressed", String(b.dataset.view === view)));
  saveUrl();
}

// The prose legend waits behind "?" (three lines of the first screen were legend); Escape hides it again.
function bindLegend() {
  const button = document.getElementById("legend-toggle");
  const help = document.getElementById("legend-help");
  const show = (open) => {
    help.hidden = !open;
    button.setAttribute("aria-expanded", String(open));
    button.setAttribute("aria-label", t(open ? "legend.help_close" : "legend.help"));
  };
  button.addEventListener("click", () => show(help.hidden));
  help.addEventListener("keydown", (event) => { if (event.key === "Escape") { show(false); button.focus(); } });
  button.addEventListener("keydown", (event) => { if (event.key === "Escape" && !help.hidden) { event.stopPropagation(); show(false); } });
}

function bindModes() {
  document.querySelectorAll("[data-reading]").forEach((b) => b.addEventListener("click", () => setReading(b.dataset.reading)));
  document.querySelectorAll("[data-view]").forEach((b) => b.addEventListener("click", () => setView(b.dataset.view)));
}

// -- drag to pan ---------------------------------------------------------------------------

const dragging = { active: false, moved: false, x: 0, left: 0 };

function bindPan() {
  wrap.addEventListener("pointerdown", (event) => {
    if (event.button !== 0 || wrap.scrollWidth <= wrap.clientWidth) return;
    Object.assign(dragging, { active: true, moved: false, x: event.clientX, left: wrap.scrollLeft });
  });
  wrap.addEventListener("pointermove", (event) => {
    if (!dragging.active) return;
    const dx = event.clientX - dragging.x;
    if (Math.abs(dx) > 4) {
      dragging.moved = true;
      wrap.classList.add("panning");
    }
    wrap.scrollLeft = dragging.left - dx;
  });
  const end = () => {
    dragging.active = false;
    wrap.classList.remove("panning");
    setTimeout(() => { dragging.moved = false; }, 0);
  };
  wrap.addEventListener("pointerup", end);
  wrap.addEventListener("pointerleave", end);
  // Keep a focused element in view when tabbing through a wide cluster.
  wrap.addEventListener("focusin", (event) => {
    const box = event.target.getBoundingClientRect?.();
    const frame = wrap.getBoundingClientRect();
    if (box && (box.left < frame.left || box.right > frame.right)) {
      wrap.scrollLeft += box.left - frame.left - frame.width / 3;
    }
  });
}

// -- the guide -----------------------------------------------------------------------------

const wait = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function bindGuide(player) {
  const walks = {
    async gpu_node() {
      setView("schematic");
      const gpu = document.querySelector("[data-gpu='node1/2']") ?? document.querySelector("[data-gpu]");
      gpu?.focus();
      openCard(gpu.dataset.el, gpu);
      await wait(2500);
      const node = document.querySelector(`[data-el='node:${gpu.dataset.gpu.split("/")[0]}']`);
      node?.focus();
      openCard(node.dataset.el, node);
    },
    async step() {
      document.getElementById("player").scrollIntoView({ behavior: "smooth" });
      await player.select("baseline");
      await player.play();
      await wait(5000);
      await player.select("straggler");
      await player.play();
    },
    vector3() {
      setView("threats");
      const vector = document.querySelector("g[data-vector='rdma_blind_spot']");
      vector?.focus();
      openCard(vector.dataset.el, vector);
    },
    weights() {
      const weights = document.querySelector("[data-el='weights']");
      weights?.focus();
      openCard("weights", weights);
    },
  };
  document.querySelectorAll("[data-try]").forEach((b) => b.addEventListener("click", () => walks[b.dataset.try]?.()));
}

// -- start ---------------------------------------------------------------------------------

const monitor = initMonitor({ openCard: (key) => openCard(key), onChange: () => saveUrl() });
initAlerts();
initTiles();
const fit = initFit();
bindElements();
bindModes();
bindLegend();
bindPan();
const player = initPlayer(document.getElementById("player"));
initSimulator(document.getElementById("sim"));
const decider = initDecider(document.getElementById("decider"));
bindGuide(player);
if (state.snapshot) applySnapshot(state.snapshot);
restoreUrl();
connect();
watchSilence();
window.hpcwatch = { openCard, closeCard, setView, setReading, applySnapshot, applyDelta, highlightJob, player, state, monitor, fit };
