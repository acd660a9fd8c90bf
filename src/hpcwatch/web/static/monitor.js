// The page as a monitor: the alert strip, the marks the server's `problems` put on the drawing,
// the job highlight, mode and selection in the URL, and stale data greyed with its age.
// The server decides what is a problem (reports/live.py); this module only draws it, with textContent.

import { jobLink } from "./job.js";
import { MARK_ORDER, gpuProblems, onCellsBuilt } from "./tiles.js";
import { cards, clear, fmt, h, has, t } from "./util.js";

const body = document.body;
const marks = new Map([...document.querySelectorAll("[data-mark]")].map((n) => [n.dataset.mark, n]));
const gpuEls = new Map([...document.querySelectorAll("[data-gpu]")].map((n) => [n.dataset.gpu, n]));
const nodeEls = new Map([...document.querySelectorAll("g[data-node]")].map((n) => [n.dataset.node, n]));
const toggle = document.getElementById("alerts-toggle");
const list = document.getElementById("alerts-list");
const worst = document.getElementById("alerts-worst");
const monitor = { job: null, snapshot: null, receivedAt: 0, openCard: null, onChange: null };

// -- the alert strip ---------------------------------------------------------------------
// The server groups and ranks the problems (reports/triage.py: `alerts`, worst first); a group of one says what
// is wrong where, a group of many says how many and lists them in natural order (node2 before node10).

const MEMBERS_SHOWN = 24;

function where(p) {
  if (p.el.startsWith("gpu:")) return `${p.node}/GPU${p.gpu}`;
  return p.node ?? p.el;
}

function verdictWord(severity) {
  if (has(`verdict.${severity}`)) return t(`verdict.${severity}`);
  return has(`severity.${severity}`) ? t(`severity.${severity}`) : severity ?? "";
}

/** A health rule's readable title: the catalogue's words, else the check's own English title. */
function ruleTitle(p, form, n) {
  const key = `health_rule.${p.rule}.${form}`;
  return has(key) ? t(key, { n: fmt(n) }) : null;
}

function problemText(p) {
  if (p.kind === "straggler") {
    return t("alerts.straggler", { where: where(p), rank: p.evidence.rank, phase: t(`phase.${p.evidence.phase}`),
      ms: fmt(p.evidence.excess_ms, 1) });
  }
  if (p.kind === "finding") {
    const vector = cards.vectors?.[p.evidence.vector]?.title ?? p.evidence.vector;
    return t("alerts.finding", { vector, n: fmt(p.evidence.findings), target: p.node ?? t("live.none") });
  }
  const verdict = verdictWord(p.severity);
  if (p.rule === "xid") return t("alerts.xid", { code: p.evidence.xid, where: where(p), verdict });
  return t("alerts.health", { where: where(p), title: ruleTitle(p, "one", 1) ?? p.title, verdict });
}

function groupText(g) {
  if (g.count === 1) return problemText(g.first);
  const n = g.gpus || g.nodes || g.count;
  const verdict = verdictWord(g.severity);
  if (g.rule === "xid") return t("alerts.xid_group", { code: g.first.evidence.xid, n: fmt(n), verdict });
  const title = ruleTitle(g.first, "many", n);
  if (title) return t("alerts.group", { title, verdict });
  return t("alerts.other_group", { title: problemText(g.first), n: fmt(g.count - 1), verdict });
}

function openProblem(el) {
  setListOpen(false);                      // the list would push away the card it just opened
  monitor.openCard?.(el);
}

function jobButtons(jobs) {
  return jobs.slice(0, 3).map((job) => [h("button", { type: "button", class: "ghost alert-job", "data-highlight-job": job,
    title: t("alerts.job_title", { job }) }, t("alerts.job", { job })), jobLink(job)]);
}

function groupItem(g) {
  const attrs = { type: "button", class: "alert-open", "data-kind": g.kind, "data-severity": g.severity ?? "",
    "data-mark": g.mark, "data-count": String(g.count) };
  if (g.count === 1) {
    const open = h("button", { ...attrs, "data-open-el": g.first.el }, h("span", { class: "alert-glyph", "aria-hidden": "true" },
      t(`glyph.${g.mark}`)), " ", groupText(g));
    open.addEventListener("click", () => openProblem(g.first.el));
    return h("li", { "data-severity": g.severity ?? "", "data-mark": g.mark, "data-group": g.key }, open, jobButtons(g.jobs));
  }
  const members = h("div", { class: "alert-members", hidden: true, id: `members-${g.key.replace(/[^\w-]/g, "_")}` },
    g.members.slice(0, MEMBERS_SHOWN).map((m) => {
      const b = h("button", { type: "button", class: "ghost alert-member", "data-open-el": m.el }, where(m));
      b.addEventListener("click", () => openProblem(m.el));
      return b;
    }),
    g.count > MEMBERS_SHOWN ? h("span", { class: "muted" }, t("alerts.more", { n: fmt(g.count - MEMBERS_SHOWN) })) : null);
  const label = h("span", { class: "alert-title" }, groupText(g));
  const show = h("button", { type: "button", class: "ghost alert-show", "aria-expanded": "false", "aria-controls": members.id },
    t("alerts.show", { n: fmt(g.count) }));
  show.addEventListener("click", () => {
    members.hidden = !members.hidden;
    show.setAttribute("aria-expanded", String(!members.hidden));
    show.textContent = members.hidden ? t("alerts.show", { n: fmt(g.count) }) : t("alerts.hide");
  });
  const { type, ...headAttrs } = attrs;
  const head = h("div", { ...headAttrs, class: "alert-group-head" }, h("span", { class: "alert-glyph", "aria-hidden": "true" },
    t(`glyph.${g.mark}`)), " ", label, show);
  return h("li", { "data-severity": g.severity ?? "", "data-mark": g.mark, "data-group": g.key }, head, members);
}

function drawAlerts(groups) {
  const n = groups.length;
  toggle.textContent = n === 0 ? t("alerts.none") : n === 1 ? t("alerts.count_one") : t("alerts.count", { n: fmt(n) });
  toggle.dataset.count = String(n);
  toggle.dataset.severity = groups[0]?.severity ?? "ok";
  // The worst problem, first on the page: one click from its card.
  worst.hidden = n === 0;
  worst.textContent = n ? t("alerts.worst", { what: groupText(groups[0]) }) : "";
  worst.dataset.openEl = n ? groups[0].first.el : "";
  worst.dataset.severity = groups[0]?.severity ?? "ok";
  // A delta that did not change the alerts keeps the snapshot's list (app.js mergeDelta): no signature to make.
  if (groups === drawAlerts.last) return;
  drawAlerts.last = groups;
  const signature = JSON.stringify(groups.map((g) => [g.key, g.count, g.members.map((m) => m.el), g.jobs, g.first.evidence]));
  if (list.dataset.signature === signature) return;   // keep focus inside an open list between ticks
  list.dataset.signature = signature;
  clear(list);
  const kinds = MARK_ORDER.filter((kind) => groups.some((g) => g.mark === kind));
  if (!kinds.includes(alertFilter.kind)) alertFilter.kind = null;   // the kind it showed has gone
  if (kinds.length > 1) list.append(filterBar(groups, kinds));
  for (const g of groups) list.append(groupItem(g));
  applyFilter();
  if (n === 0) setListOpen(false);
}

// -- filters: one kind of problem at a time (at 128 nodes, 133 idle GPUs must not hide the one XID) ------------

const alertFilter = { kind: null };

/** The bar atop the list: "All (n)" and each kind present with its number of problems, one pressed. */
function filterBar(groups, kinds) {
  const problems = (kind) => groups.filter((g) => kind === null || g.mark === kind).reduce((a, g) => a + g.count, 0);
  const button = (kind) => {
    const label = kind === null ? t("alerts.filter_all", { n: fmt(problems(null)) })
      : t("alerts.filter_kind", { kind: t(`alerts.kind.${kind}`), n: fmt(problems(kind)) });
    const b = h("button", { type: "button", class: "ghost alert-filter", "data-filter": kind ?? "",
      "aria-pressed": String(alertFilter.kind === kind) }, kind === null ? label : [h("span", { "aria-hidden": "true" },
      t(`glyph.${kind}`)), " ", label]);
    b.addEventListener("click", () => { alertFilter.kind = kind; applyFilter(); });
    return b;
  };
  return h("li", { class: "alert-filters" },
    h("div", { class: "alert-filter-bar", role: "group", "aria-label": t("alerts.filter_label") }, button(null), kinds.map(button)));
}

function applyFilter() {
  for (const li of list.querySelectorAll(":scope > li[data-group]")) {
    li.hidden = alertFilter.kind !== null && li.dataset.mark !== alertFilter.kind;
  }
  for (const b of list.querySelectorAll(".alert-filter")) {
    b.setAttribute("aria-pressed", String((b.dataset.filter || null) === alertFilter.kind));
  }
}

function setListOpen(open) {
  list.hidden = !open;
  toggle.setAttribute("aria-expanded", String(open));
}

// -- marks on the drawing ----------------------------------------------------------------

// One mark per kind of problem (reports/triage.py `mark`): straggler, idle allocated, XID, drained, lost, other
// warnings; each its own glyph, frame and colour (tiles.js MARK_ORDER decides which of two wins). The GPU's
// number stays visible above its mark.
function drawMarks(problems) {
  if (problems === drawMarks.source) return;   // a delta that did not change them keeps the list
  drawMarks.source = problems;
  const signature = JSON.stringify(problems.map((p) => [p.el, p.mark, p.severity, p.evidence.xid, p.node]));
  if (drawMarks.last === signature) return;
  drawMarks.last = signature;
  for (const el of gpuEls.values()) delete el.dataset.problem;
  gpuProblems.clear();
  for (const el of nodeEls.values()) delete el.dataset.problem;
  for (const m of marks.values()) m.textContent = "";
  const rank = (mark) => { const i = MARK_ORDER.indexOf(mark); return i < 0 ? MARK_ORDER.length : i; };
  const worst = new Map();
  for (const p of problems) {
    if (!p.el.startsWith("gpu:")) continue;
    const id = p.el.slice(4);
    if (!worst.has(id) || rank(p.mark) < rank(worst.get(id).mark)) worst.set(id, p);
  }
  for (const [id, p] of worst) {
    gpuProblems.set(id, p.mark);
    const el = gpuEls.get(id);
    if (el) el.dataset.problem = p.mark;
    const mark = marks.get(id);
    if (mark) mark.textContent = p.mark === "xid" ? t("mark.xid", { code: p.evidence.xid }) : t(`mark.${p.mark}`);
  }
  for (const p of [...problems].reverse()) {          // worst last, so it wins
    const node = nodeEls.get(p.el.startsWith("node:") ? p.el.slice(5) : p.node ?? "");
    if (node && (p.kind === "finding" || p.el.startsWith("node:"))) node.dataset.problem = p.kind === "finding" ? "finding" : p.mark;
  }
}

// -- the job highlight -------------------------------------------------------------------

// The job and its GPU list last drawn: a tick that changes neither (a delta keeps an unchanged job's list,
// web/livedelta.py BY_ENTRY) does not walk every GPU again (8,192 at 1,024 nodes).
let drawnJob = null;

function drawJob(snap) {
  const gpus = monitor.job ? snap?.job_gpus?.[monitor.job] : undefined;
  if (drawnJob && drawnJob.job === monitor.job && drawnJob.gpus === gpus) return;
  const lit = new Set(gpus ?? []);
  drawnJob = { job: monitor.job, gpus, lit };
  body.classList.toggle("job-highlight", Boolean(monitor.job));
  for (const [id, el] of gpuEls) {
    const value = String(lit.has(id));
    if (el.dataset.jobLit !== value) el.dataset.jobLit = value;   // no style recalculation when nothing changed
  }
  const chip = document.getElementById("job-chip");
  chip.hidden = !monitor.job;
  document.getElementById("job-chip-text").textContent = monitor.job ? t("alerts.highlight", { job: monitor.job }) : "";
}

// A cell the page built once its tile came into view (tiles.js) takes the marks and the highlight drawn so far.
onCellsBuilt((cells) => {
  for (const el of cells) {
    const id = el.dataset.gpu;
    gpuEls.set(id, el);
    const problem = gpuProblems.get(id);
    if (problem) el.dataset.problem = problem;
    if (drawnJob) el.dataset.jobLit = String(drawnJob.lit.has(id));
  }
});

export function highlightJob(job) {
  monitor.job = job || null;
  drawJob(monitor.snapshot);
  monitor.onChange?.();
}

// -- stale data --------------------------------------------------------------------------

function fmtAge(seconds) {
  if (seconds < 120) return t("stale.s", { n: fmt(seconds, 0) });
  if (seconds < 7200) return t("stale.min", { n: fmt(seconds / 60, 0) });
  return t("stale.h", { n: fmt(seconds / 3600, 0) });
}

// One status for the connection and the data's age, so "Live" never sits beside "data 65 h old":
//   live   connected, data fresh                 ● status.live
//   stale  connected, newest data too old        ◐ status.stale · stale.age
//   lost   stream down (with the data's age)     ○ status.lost · stale.age
const status = { conn: "wait", text: null };
const CONN_GLYPHS = { wait: "◌", live: "●", stale: "◐", lost: "○" };

/** The stream's state (app.js): `live` on every event, `lost` on an error, with an optional message. */
export function setConnection(conn, text = null) {
  status.conn = conn;
  status.text = text;
  checkStale();
}

function checkStale() {
  const snap = monitor.snapshot;
  const hasData = snap && snap.t !== null && snap.t !== undefined;
  const sinceReceived = (performance.now() - monitor.receivedAt) / 1000;
  const age = hasData ? (snap.age_s ?? 0) + sinceReceived : 0;
  const limit = snap?.stale_after_s ?? 45;
  const stale = hasData && (age > limit || sinceReceived > limit);
  body.classList.toggle("stale", stale);
  const label = document.getElementById("stale-age");
  label.hidden = !stale;
  label.textContent = stale ? t("stale.age", { age: fmtAge(age) }) : "";
  const shown = status.conn === "live" && stale ? "stale" : status.conn;
  const dot = document.getElementById("conn");
  dot.className = `conn conn-${shown}`;
  dot.dataset.state = shown;
  dot.textContent = CONN_GLYPHS[shown];
  const words = { wait: t("status.connecting"), live: t("status.live"), stale: t("status.stale"), lost: t("status.lost") };
  document.getElementById("conn-text").textContent = status.text ?? words[shown];
}

// -- the URL -----------------------------------------------------------------------------

/** Mode, open element and highlighted job from the address (`?mode=threats&el=gpu:node1/2&job=4101`). */
export function readUrl() {
  const q = new URLSearchParams(window.location.search);
  return { mode: q.get("mode"), reading: q.get("reading"), el: q.get("el"), job: q.get("job") };
}

/** Write the page's state into the address without a new history entry (the other parameters stay). */
export function writeUrl({ mode, reading, el, job }) {
  const q = new URLSearchParams(window.location.search);
  const set = (name, value, fallback) => (value && value !== fallback ? q.set(name, value) : q.delete(name));
  set("mode", mode, "schematic");
  set("reading", reading, "engineer");
  set("el", el);
  set("job", job);
  const search = q.toString();
  history.replaceState(null, "", `${window.location.pathname}${search ? `?${search}` : ""}${window.location.hash}`);
}

// -- wiring ------------------------------------------------------------------------------

/** Called with every snapshot (boot and SSE). */
export function applyMonitor(snap) {
  monitor.snapshot = snap;
  monitor.receivedAt = performance.now();
  const problems = snap.problems ?? [];
  drawAlerts(snap.alerts ?? []);
  drawMarks(problems);
  drawJob(snap);
  checkStale();
}

export function initMonitor({ openCard, onChange }) {
  monitor.openCard = openCard;
  monitor.onChange = onChange;
  toggle.addEventListener("click", () => setListOpen(list.hidden && toggle.dataset.count !== "0"));
  worst.addEventListener("click", () => { if (worst.dataset.openEl) openProblem(worst.dataset.openEl); });
  // Escape closes an open list first (registered before the card's Escape, which then does not run).
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape" || list.hidden) return;
    event.stopImmediatePropagation();
    setListOpen(false);
    toggle.focus();
  });
  document.getElementById("job-clear").addEventListener("click", () => highlightJob(null));
  // A job button anywhere (alert strip, GPU card, queue) lights that job's GPUs.
  document.addEventListener("click", (event) => {
    const button = event.target.closest?.("[data-highlight-job]");
    if (button) highlightJob(button.dataset.highlightJob);
  });
  setInterval(checkStale, 1000);
  return monitor;
}
