// The step player: one training step per GPU, phase by phase, from /api/steps (the store's
// spans), with a ring AllReduce / barrier detail. No timing lives here: all durations
// come from the server; the page only scales them to a few seconds of animation.

import { boot, clear, fmt, h, lang, s, t, tickets } from "./util.js";

const PHASES = boot.phases;
const ANIM_MS = 4500;
const W = 760;
const LABEL_W = 118;
const NOW_W = 120;
const ROW_H = 16;
const CAPTION_H = 22;
const ROW_GAP = 5;
// The live list is refreshed this often: jobs start and end, a minute late is soon enough (ours).
const LIVE_REFRESH_MS = 15000;
const reducedMotion = window.matchMedia("(prefers-reduced-motion: reduce)").matches;

export function initPlayer(root) {
  const sourceButtons = [...root.querySelectorAll("[data-source]")];
  const playButton = root.querySelector("#play");
  const playLabel = root.querySelector("#play-label");
  const readout = root.querySelector("#player-phase");
  const gantt = root.querySelector("#gantt");
  const ringBox = root.querySelector("#ring");
  const ringText = root.querySelector("#ring-text");
  const summary = root.querySelector("#player-summary");
  const tbody = root.querySelector("#step-table tbody");
  const liveSelect = root.querySelector("#player-live");
  let job = sourceButtons[0]?.dataset.job ?? (liveSelect?.value || null);
  let jobName = sourceButtons[0] ? exampleName(sourceButtons[0]) : job && t("stepsource.job_name", { job });
  let view = null;
  let frame = null;

  // Loads are ordered: each one takes a ticket, and only the latest ticket may draw. A slow response to an
  // earlier click (the first example, still loading when the straggler example was clicked) is dropped, so the
  // chart always shows the job its label names: the last click wins, not the last response.
  const ask = tickets();

  async function load() {
    if (!job) return null;
    const current = ask();
    const wanted = job;
    const name = jobName;
    summary.textContent = t("player.loading");
    try {
      const response = await fetch(`/api/steps?job=${encodeURIComponent(wanted)}`);
      const body = await response.json();
      if (!current()) return null;          // superseded while in flight
      if (!response.ok) throw new Error(body.detail || body.error || response.statusText);
      view = build(body, name);
      root.dataset.shown = wanted;
      return view;
    } catch (err) {
      if (current()) summary.textContent = t("player.error", { error: err.message });
      return null;
    } finally {
      root.dataset.settled = String(Number(root.dataset.settled ?? 0) + 1);   // loads answered, drawn or dropped
    }
  }

  function build(doc, name) {
    const ranks = doc.ranks.map((r) => ({ ...r, byPhase: Object.fromEntries(r.phases.map((p) => [p.phase, p])) }));
    const stats = describe(doc, ranks);
    const chart = drawGantt(gantt, doc, ranks, stats);
    const ring = drawRing(ringBox, ranks, stats);
    fillTable(tbody, ranks, stats);
    const drawn = doc.ranks_total > ranks.length   // a large job: the server chose the ranks worth drawing
      ? ` ${t("player.ranks_shown", { shown: fmt(ranks.length), total: fmt(doc.ranks_total), reference: doc.reference_rank })}` : "";
    summary.textContent = summaryText(doc, ranks, stats, name) + drawn;
    return { doc, ranks, stats, chart, ring };
  }

  function show(ms) {
    if (!view) return;
    const { doc, ranks, chart, ring, stats } = view;
    const x = LABEL_W + ms * chart.scale;
    chart.clip.setAttribute("width", String(Math.max(0, x - LABEL_W)));
    chart.head.setAttribute("x1", String(x));
    chart.head.setAttribute("x2", String(x));
    const phases = ranks.map((r) => phaseAt(r, ms / 1000));
    phases.forEach((p, i) => {
      chart.now[i].textContent = p ? (p === "barrier_wait" ? `‖ ${t("player.waiting")}` : t(`phase.${p}`)) : "";
    });
    const lead = phases[stats.reference] ?? phases[0];
    readout.textContent = t("player.phase_now", { time: fmt(ms, 1), phase: lead ? t(`phase.${lead}`) : "—" });
    updateRing(ring, ranks, phases, ms / 1000, stats, doc.ranks_total || ranks.length);
    if (ms >= doc.step_time_s * 1000) readout.textContent = "";   // the summary below says it all
  }

  let elapsedMs = 0;   // how far into the animation a pause stopped it

  async function play() {
    cancelAnimationFrame(frame);
    const resuming = root.dataset.state === "paused";
    playButton.disabled = true;
    const loaded = resuming ? view : await load();
    playButton.disabled = false;
    if (!loaded) return;
    const total = loaded.doc.step_time_s * 1000;
    root.dataset.state = "playing";
    if (reducedMotion) {
      show(total);
      root.dataset.state = "done";
      return;
    }
    playLabel.textContent = t("player.pause");
    const start = performance.now() - (resuming ? elapsedMs : 0);
    const tick = (now) => {
      elapsedMs = now - start;
      const f = Math.min(1, elapsedMs / ANIM_MS);
      show(f * total);
      if (f < 1) frame = requestAnimationFrame(tick);
      else {
        root.dataset.state = "done";
        playLabel.textContent = t("player.replay");
      }
    };
    frame = requestAnimationFrame(tick);
  }

  async function choose(nextJob, name) {
    cancelAnimationFrame(frame);
    job = nextJob;
    jobName = name;
    root.dataset.job = job ?? "";
    root.dataset.state = "loading";
    playLabel.textContent = t("player.play");
    const loaded = await load();
    if (loaded) { show(loaded.doc.step_time_s * 1000); root.dataset.state = "ready"; }
  }

  // The one button plays, pauses and resumes (issue 15: there was no pause).
  function toggle() {
    if (root.dataset.state !== "playing") return play();
    cancelAnimationFrame(frame);
    root.dataset.state = "paused";
    playLabel.textContent = t("player.play");
    return undefined;
  }

  for (const button of sourceButtons) {
    button.addEventListener("click", async () => {
      for (const b of sourceButtons) b.setAttribute("aria-pressed", String(b === button));
      if (liveSelect) liveSelect.value = "";
      await choose(button.dataset.job, exampleName(button));
    });
  }
  liveSelect?.addEventListener("change", async () => {
    if (!liveSelect.value) return;
    for (const b of sourceButtons) b.setAttribute("aria-pressed", "false");
    await choose(liveSelect.value, t("stepsource.job_name", { job: liveSelect.value }));
  });
  if (liveSelect) setInterval(() => refreshLive(liveSelect), LIVE_REFRESH_MS);
  playButton.addEventListener("click", toggle);

  root.dataset.job = job ?? "";
  const ready = load().then((loaded) => { if (loaded) { show(loaded.doc.step_time_s * 1000); root.dataset.state = "ready"; } });
  return {
    ready,
    async select(key) {
      const button = sourceButtons.find((b) => b.dataset.source === key);
      if (button) button.click();
    },
    play,
    /** Play live job `id` (as if picked in the list). */
    async pickLive(id) {
      await refreshLive(liveSelect);
      liveSelect.value = id;
      liveSelect.dispatchEvent(new Event("change"));
    },
  };
}

/** How the summary names an example: by what it shows, never by its internal job id. */
function exampleName(button) {
  return t("stepsource.example_job", { label: button.textContent.trim() });
}

/** Rebuild the live list from /api/steps/sources, keeping the choice (left alone while it is open). */
async function refreshLive(select) {
  if (!select || document.activeElement === select) return;
  try {
    const response = await fetch(`/api/steps/sources?lang=${encodeURIComponent(lang)}`);
    if (!response.ok) return;
    const live = (await response.json()).filter((src) => src.kind !== "example");
    const chosen = select.value;
    clear(select);
    select.append(h("option", { value: "" }, t(live.length ? "stepsource.live_choose" : "stepsource.live_none")),
      ...live.map((src) => h("option", { value: src.job }, src.label)));
    select.value = live.some((src) => src.job === chosen) ? chosen : "";
  } catch {
    // Offline for a moment: the current list stays; the next refresh tries again.
  }
}

/** Where the server's verdict sits in the drawn rows (the server decides; the page only marks it). */
function describe(doc, ranks) {
  const verdict = doc.straggler;
  const slowest = verdict ? ranks.findIndex((r) => r.rank === verdict.rank) : -1;
  const reference = Math.max(0, ranks.findIndex((r) => r.rank === doc.reference_rank));
  return { verdict, slowest, isStraggler: slowest >= 0, reference };
}

function rankName(r) {
  return r.node !== null && r.node !== undefined ? `${r.node}/GPU${r.gpu ?? "?"}` : `${t("player.rank")} ${r.rank}`;
}

function summaryText(doc, ranks, stats, jobName) {
  const ms = (x) => fmt(x * 1000, 1);
  if (!stats.isStraggler) {
    return t("player.summary_even", { step: doc.step, job: jobName ?? doc.job, time: ms(doc.step_time_s), wait: ms(doc.max_wait_s) });
  }
  const v = stats.verdict;
  return t("player.summary", { step: doc.step, job: jobName ?? doc.job, time: ms(doc.step_time_s),
    slowest: rankName(ranks[stats.slowest]), phase: t(`phase.${v.phase}`), duration: ms(v.phase_s),
    wait: ms(v.others_wait_s) });
}

function phaseAt(rank, sec) {
  for (const p of rank.phases) if (sec >= p.start_s && sec < p.start_s + p.dur_s) return p.phase;
  return null;
}

function drawGantt(box, doc, ranks, stats) {
  clear(box);
  const height = 24 + ranks.length * (ROW_H + ROW_GAP) + 24;
  const scale = (W - LABEL_W - NOW_W) / (doc.step_time_s * 1000);
  const svg = s("svg", { viewBox: `0 0 ${W} ${height}`, width: "100%", class: "gantt-svg", "aria-hidden": "true" });
  const clipRect = s("rect", { x: LABEL_W, y: 0, width: 0, height });
  svg.append(s("defs", {}, s("clipPath", { id: "reveal" }, clipRect)));
  const bars = s("g", { "clip-path": "url(#reveal)" });
  const now = [];
  ranks.forEach((r, i) => {
    const y = 18 + i * (ROW_H + ROW_GAP);
    const slow = stats.isStraggler && i === stats.slowest;
    svg.append(s("text", { x: LABEL_W - 8, y: y + 12, class: `row-label${slow ? " slow" : ""}`, "text-anchor": "end" },
      `${slow ? "▲ " : ""}${rankName(r)}`));
    svg.append(s("rect", { x: LABEL_W, y, width: W - LABEL_W - NOW_W, height: ROW_H, class: "row-bg" }));
    for (const p of r.phases) {
      if (p.dur_s <= 0) continue;
      bars.append(s("rect", { x: LABEL_W + p.start_s * 1000 * scale, y, width: Math.max(0.5, p.dur_s * 1000 * scale),
        height: ROW_H, class: `bar phase-${p.phase}` },
        s("title", {}, `${t(`phase.${p.phase}`)}: ${fmt(p.dur_s * 1000, 2)} ${t("unit.ms")}`)));
    }
    const label = s("text", { x: W - NOW_W + 8, y: y + 12, class: "now-label" });
    now.push(label);
    svg.append(label);
  });
  svg.append(bars);
  const axisY = 18 + ranks.length * (ROW_H + ROW_GAP) + 4;
  const stepMs = doc.step_time_s * 1000;
  const tick = niceTick(stepMs);
  for (let v = 0; v <= stepMs + 1e-9; v += tick) {
    const x = LABEL_W + v * scale;
    svg.append(s("line", { x1: x, x2: x, y1: 14, y2: axisY, class: "grid" }));
    svg.append(s("text", { x, y: axisY + 14, class: "axis", "text-anchor": "middle" }, `${fmt(v, 0)} ${t("unit.ms")}`));
  }
  const head = s("line", { x1: LABEL_W, x2: LABEL_W, y1: 10, y2: axisY, class: "playhead" });
  svg.append(head);
  box.append(svg);
  return { scale, clip: clipRect, head, now };
}

function niceTick(totalMs) {
  const raw = totalMs / 8;
  const pow = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((m) => m * pow).find((x) => x >= raw) ?? raw;
}

function drawRing(box, ranks, stats) {
  clear(box);
  const n = ranks.length;
  const size = 260;
  const c = size / 2;
  const radius = 96;
  const pos = ranks.map((_, i) => {
    const a = -Math.PI / 2 + (2 * Math.PI * i) / n;
    return [c + radius * Math.cos(a), c + radius * Math.sin(a)];
  });
  const svg = s("svg", { viewBox: `0 0 ${size} ${size + CAPTION_H}`, width: size, height: size + CAPTION_H,
    "aria-hidden": "true" });
  pos.forEach(([x, y], i) => {
    const [x2, y2] = pos[(i + 1) % n];
    svg.append(s("line", { x1: x, y1: y, x2, y2, class: "ring-edge" }));
  });
  const chunks = pos.map(([x, y]) => {
    const chunk = s("circle", { cx: x, cy: y, r: 4, class: "ring-chunk", visibility: "hidden" });
    svg.append(chunk);
    return chunk;
  });
  const dots = ranks.map((r, i) => {
    const [x, y] = pos[i];
    const g = s("g", { class: `ring-node${stats.isStraggler && i === stats.slowest ? " slow" : ""}` },
      s("circle", { cx: x, cy: y, r: 13 }),
      s("text", { x, y: y + 4, "text-anchor": "middle" }, String(r.rank)));
    svg.append(g);
    return g;
  });
  // Under the ring: across its middle a caption of "‖ 7 waiting" ran over the ranks' circles.
  const centre = s("text", { x: c, y: size + CAPTION_H - 6, "text-anchor": "middle", class: "ring-centre" }, "");
  svg.append(centre);
  box.append(svg);
  return { pos, chunks, dots, centre };
}

/** `total`: the job's ranks (the ring may draw fewer): a ring AllReduce over them makes 2 (total - 1) transfers. */
function updateRing(ring, ranks, phases, sec, stats, total) {
  const n = ranks.length;
  phases.forEach((p, i) => {
    ring.dots[i].setAttribute("class", `ring-node phase-${p ?? "none"}${stats.isStraggler && i === stats.slowest ? " slow" : ""}`);
  });
  const ref = ranks[stats.reference]?.byPhase.allreduce;
  const inAllreduce = ref && sec >= ref.start_s && sec < ref.start_s + ref.dur_s;
  if (!inAllreduce) {
    ring.chunks.forEach((c) => c.setAttribute("visibility", "hidden"));
    const waiting = phases.filter((p) => p === "barrier_wait").length;
    ring.centre.textContent = waiting ? `‖ ${waiting} ${t("player.waiting")}` : "";
    return;
  }
  const transfers = 2 * (total - 1);
  const progress = ((sec - ref.start_s) / ref.dur_s) * transfers;
  const k = Math.min(transfers, Math.floor(progress) + 1);
  const f = progress - Math.floor(progress);
  ring.centre.textContent = t("player.ring_step", { k, n: transfers });
  ring.chunks.forEach((chunk, i) => {
    const [x1, y1] = ring.pos[i];
    const [x2, y2] = ring.pos[(i + 1) % n];
    chunk.setAttribute("cx", String(x1 + (x2 - x1) * f));
    chunk.setAttribute("cy", String(y1 + (y2 - y1) * f));
    chunk.setAttribute("visibility", "visible");
  });
}

function fillTable(tbody, ranks, stats) {
  clear(tbody);
  for (const [i, r] of ranks.entries()) {
    const slow = stats.isStraggler && i === stats.slowest;
    tbody.append(h("tr", { class: slow ? "slow" : null },
      h("td", {}, String(r.rank)),
      h("td", {}, `${slow ? "▲ " : ""}${rankName(r)}`),
      PHASES.map((p) => {
        const dur = r.byPhase[p]?.dur_s;
        return h("td", { class: "num", "data-rank": r.rank, "data-phase": p, "data-ms": dur === undefined ? "" : dur * 1000 },
          dur === undefined ? "—" : fmt(dur * 1000, 2));
      })));
  }
}
