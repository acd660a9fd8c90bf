// The card under the schematic: static text from the catalogue's cards, live values from
// the latest snapshot. Everything is inserted as text (h() never parses markup).

import { jobLink } from "./job.js";
import { cards, clear, eventItem, fmt, fmtRate, fmtTime, h, lang, t } from "./util.js";

const ELEMENT_FIELDS = {
  engineer: ["what", "observe", "tools", "threats"],
  decider: ["value", "cost", "risk", "owner"],
};
const ICONS = { element: "▣", collector: "◉", vector: "⚠" };

/** ("gpu:node1/2") -> {section, cardKey, id, kind} */
export function parseKey(key) {
  const [head, ...rest] = key.split(":");
  const id = rest.join(":");
  if (head === "collector") return { section: "collectors", cardKey: id, id, kind: head };
  if (head === "vector") return { section: "vectors", cardKey: id, id, kind: head };
  return { section: "elements", cardKey: head, id, kind: head };
}

export function renderCard(container, key, reading, snapshot, onClose) {
  const info = parseKey(key);
  const card = cards[info.section]?.[info.cardKey];
  if (!card) return false;
  clear(container);
  container.dataset.open = key;
  const family = info.section === "elements" ? "element" : info.section === "collectors" ? "collector" : "vector";
  const title = info.id && info.section === "elements" ? `${card.title} ${info.id}` : card.title;
  const close = h("button", { type: "button", class: "close", "aria-label": t("card.close") },
    h("span", { "aria-hidden": "true" }, "✕"), ` ${t("card.close")}`);
  close.addEventListener("click", onClose);
  container.append(
    h("header", { class: "card-head" },
      h("span", { class: `kind kind-${family}` }, h("span", { "aria-hidden": "true" }, ICONS[family]), ` ${t(`card.kind_${family}`)}`),
      h("h2", { id: "card-title", tabindex: "-1" }, title),
      close),
    h("div", { class: "card-body" },
      h("dl", { class: "card-text" }, fieldsOf(info, card, reading).map(([label, text]) => [h("dt", {}, label), h("dd", {}, text)])),
      h("div", { class: "card-live" }, h("h3", {}, t("card.live")), h("div", { id: "card-live", "aria-live": "off" }))));
  updateCardLive(container, snapshot);
  return true;
}

function fieldsOf(info, card, reading) {
  let names;
  const decider = reading === "decider";
  if (info.section === "elements") names = ELEMENT_FIELDS[reading] || ELEMENT_FIELDS.engineer;
  else if (info.section === "vectors") names = decider ? ["target", "value", "cost", "risk", "owner"] : ["target", "how", "signals", "detection"];
  else names = decider ? ["watches", "value", "cost", "owner"] : ["watches", "tools", "what"];
  return names.map((name) => [t(`card.fields.${name}`), card[name]]);
}

/** Refresh the live part of the open card from a snapshot (called every SSE tick). */
export function updateCardLive(container, snap) {
  const key = container.dataset.open;
  const target = container.querySelector("#card-live");
  if (!key || !target || !snap) return;
  const info = parseKey(key);
  // The live part is rebuilt every tick: a button that had the focus gets it back, or a keyboard user inside
  // the card would be thrown out of it once a second.
  const active = target.contains(document.activeElement) ? document.activeElement : null;
  const again = active?.dataset?.openGpu ? `[data-open-gpu="${CSS.escape(active.dataset.openGpu)}"]`
    : active?.dataset?.highlightJob ? `[data-highlight-job="${CSS.escape(active.dataset.highlightJob)}"]` : null;
  clear(target);
  const builder = LIVE[info.kind] || LIVE[info.cardKey];
  target.append(builder ? builder(info, snap) : h("p", { class: "muted" }, t("card.no_data")));
  if (again) target.querySelector(again)?.focus({ preventScroll: true });
}

function dl(rows) {
  return h("dl", { class: "kv" }, rows.map(([label, value, attrs = {}]) => [h("dt", {}, label), h("dd", attrs, value)]));
}

function table(headers, rows, attrs = {}) {
  // Focusable and named: a table wider than the card scrolls, and a keyboard must be able to scroll it.
  return h("div", { class: "table-wrap", tabindex: "0", role: "region", "aria-label": t("aria.region_table") }, h("table", { class: "data compact", ...attrs },
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", { scope: "col" }, x)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c) => h("td", {}, c)))))));
}

function gpuValue(g, field) {
  if (!g || g[field] === undefined || g[field] === null) return t("live.none");
  switch (field) {
    case "util_pct": return `${fmt(g.util_pct, 0)} ${t("unit.pct")}`;
    case "power_w": return `${fmt(g.power_w, 1)} ${t("unit.w")}`;
    case "mem_used_bytes": return `${fmt(g.mem_used_bytes / 2 ** 30, 1)} ${t("unit.gib")}`;
    case "temp_c": return `${fmt(g.temp_c, 0)} ${t("unit.c")}`;
    default: return String(g[field]);
  }
}

/** The job as text and one button per job id (a GPU shared by "4101,4102" has two) that lights its GPUs. */
function jobButtons(ids, text) {
  return [text, " ", ids.split(",").filter(Boolean).map((id) => [h("button", { type: "button", class: "ghost job-link",
    "data-highlight-job": id, title: t("alerts.job_title", { job: id }) }, t("alerts.job", { job: id })), " ", jobLink(id)])];
}

const LIVE = {
  gpu(info, snap) {
    const g = snap.gpus?.[info.id];
    if (!g) return h("p", { class: "muted" }, t("card.no_data"));
    const job = g.job ? (g.job_name ? `${g.job} (${g.job_name})` : g.job) : t("live.none");
    return dl([
      [t("live.state"), t(`state.${g.state ?? "ok"}`), { "data-value": "state" }],
      [t("live.util"), gpuValue(g, "util_pct"), { "data-value": "util_pct" }],
      [t("live.power"), gpuValue(g, "power_w"), { "data-value": "power_w" }],
      [t("live.mem"), gpuValue(g, "mem_used_bytes"), { "data-value": "mem_used_bytes" }],
      [t("live.temp"), gpuValue(g, "temp_c"), { "data-value": "temp_c" }],
      [t("live.job"), g.job ? jobButtons(g.job, job) : job, { "data-value": "job" }],
      [t("live.user"), g.user ?? t("live.none"), { "data-value": "user" }],
      [t("live.account"), g.account ?? t("live.none"), { "data-value": "account" }],
    ]);
  },
  node(info, snap) {
    const ib = snap.nodes?.[info.id] || {};
    const gpus = Object.entries(snap.gpus || {}).filter(([id]) => id.startsWith(`${info.id}/`))
      .sort(([a], [b]) => Number(a.split("/")[1]) - Number(b.split("/")[1]));
    const events = snap.node_events?.[info.id] ?? [];
    const ns = snap.node_states?.[info.id];
    return h("div", {},
      dl([[t("live.state"), t(`state.${ns?.state ?? "ok"}`) + (ns?.reasons?.length ? ` (${ns.reasons.join(", ")})` : "")
            + (ns?.remediation ? ` · ${t(`remediation.${ns.remediation.stage}`)}` : ""), { "data-value": "state" }],
          [t("live.ib_tx"), fmtRate(ib.ib_tx_bytes_s), { "data-value": "ib_tx" }],
          [t("live.ib_rx"), fmtRate(ib.ib_rx_bytes_s), { "data-value": "ib_rx" }]]),
      h("h4", {}, t("events.node")),
      h("ol", { class: "events-list", "data-timeline": info.id, tabindex: "0" },
        events.length ? events.map(eventItem) : h("li", { class: "muted" }, t("events.none"))),
      h("h4", {}, t("live.gpus")),
      table([t("player.gpu"), t("live.util"), t("live.power"), t("live.mem"), t("live.temp"), t("live.job")],
        gpus.map(([id, g]) => [h("button", { type: "button", class: "ghost job-link", "data-open-gpu": id }, id),
          gpuValue(g, "util_pct"), gpuValue(g, "power_w"), gpuValue(g, "mem_used_bytes"),
          gpuValue(g, "temp_c"), g.job ?? t("live.none")])));
  },
  slurm(info, snap) {
    const q = snap.queue || { jobs: [] };
    return h("div", {},
      dl([[t("live.running"), fmt(q.running)], [t("live.pending"), fmt(q.pending)]]),
      table([t("queue.job"), t("queue.name"), t("queue.user"), t("queue.state"), t("queue.gpus")],
        q.jobs.slice(0, 12).map((j) => [j.id, j.name ?? "", j.user ?? "", j.state ?? "", fmt(j.gpus)])));
  },
  storage(info, snap) {
    const st = snap.storage || { jobs: [] };
    return h("div", {},
      dl([[t("live.read"), fmtRate(st.read_bytes_s)], [t("live.write"), fmtRate(st.write_bytes_s)]]),
      table([t("queue.job"), t("queue.user"), t("live.read"), t("live.write")],
        st.jobs.map((j) => [j.job, j.user ?? "", fmtRate(j.read_bytes_s), fmtRate(j.write_bytes_s)])));
  },
  fabric(info, snap) {
    const nodes = Object.entries(snap.nodes || {});
    return table([t("queue.nodes"), t("live.ib_tx"), t("live.ib_rx")],
      nodes.map(([name, v]) => [name, fmtRate(v.ib_tx_bytes_s), fmtRate(v.ib_rx_bytes_s)]));
  },
  stack(info, snap) {
    const tr = snap.training;
    const training = tr ? dl([[t("live.job"), tr.job], [t("live.step"), fmt(tr.step)],
      [t("live.step_time"), `${fmt(tr.step_time_s * 1000, 1)} ${t("unit.ms")}`]])
      : h("p", { class: "muted" }, t("card.no_data"));
    return h("div", {}, training, (snap.nccl || []).map(ncclJob));
  },
  weights(info, snap) {
    const w = snap.weights || {};
    const audit = snap.vectors?.weights_access || {};
    const lit = Object.entries(snap.vectors || {}).filter(([v, f]) => f.findings > 0 && v !== "weights_access");
    return h("div", {},
      dl([[t("live.checkpoints"), `${fmt(w.checkpoint_events ?? 0)} · ${fmtTime(w.last_checkpoint_t)}`],
          [t("live.weights_findings"), fmt(audit.findings ?? 0)]]),
      lit.length ? h("ul", { class: "alerts" }, lit.map(([v, f]) =>
        h("li", {}, h("span", { "aria-hidden": "true" }, "⚠ "), `${t(`vector.${v}`)}: ${findingTitle(f)}`))) : null);
  },
  collector(info, snap) {
    const c = snap.collectors?.[info.id];
    if (!c) return h("p", { class: "muted" }, t("card.no_data"));
    return dl([
      [t("card.status"), `${c.arriving ? "✓" : "✕"} ${t(`collector_state.${c.state ?? (c.arriving ? "answering" : "silent")}`)}`,
        { "data-value": "status", "data-state": c.state ?? "" }],
      [t("datasource.label"), sourceText(snap.source, info.id)],
      [t("collector.records_label"), t("collector.count", { count: fmt(c.count) })],
      [t("collector.last_label"), fmtTime(c.last_t)],
    ]);
  },
  vector(info, snap) {
    const f = snap.vectors?.[info.id];
    if (!f || !f.findings) return h("p", { class: "status-none", "data-value": "status" }, `✓ ${t("vector.none_long")}`);
    return h("p", { class: "status-alert", "data-value": "status" }, h("span", { "aria-hidden": "true" }, "⚠ "),
      t("vector.live_long", { count: fmt(f.findings), title: findingTitle(f), severity: severityWord(f.severity), target: f.target ?? "" }));
  },
};

/** Where a collector's data is read: Prometheus for the sample collectors under serve --prometheus, else the store. */
function sourceText(source, id) {
  if (!source) return t("live.none");
  const fromProm = source.samples === "prometheus" && !["ebpf_weights"].includes(id);
  return fromProm ? `Prometheus ${source.prometheus} · ${t("datasource.store", { path: source.store })}`
    : t("datasource.store", { path: source.store });
}

/** A finding's title in the page's language (the server fills the rule's catalogue template), else the detector's. */
// One job's NCCL view, as reports/nccl.nccl_card gave it: nothing is computed here.
function ncclJob(n) {
  const pairs = (o) => Object.entries(o || {}).map(([k, v]) => `${k} ×${fmt(v)}`).join(", ") || t("live.none");
  const versions = Object.entries(n.versions || {}).map(([v, hosts]) => `${v} (${hosts.join(", ")})`).join("; ");
  const env = Object.entries(n.env || {}).map(([k, v]) => `${k}=${v}`).join(", ");
  const rules = n.rules.length
    ? h("ul", { class: "nccl-rules" }, n.rules.map((r) => h("li", { "data-rule": r.rule, "data-verdict": r.verdict },
        `${t(`live.verdict_${r.verdict}`)} · ${r.rule}: ${r.title}`)))
    : h("p", { class: "muted", "data-rule": "none" }, t("live.nccl_no_rule"));
  return h("section", { class: "nccl-job", "data-nccl-job": n.job ?? "" },
    h("h4", {}, t("live.nccl_title", { job: n.job ?? t("live.none") })),
    dl([[t("live.nccl_version"), versions || t("live.none"), { "data-value": "nccl_version" }],
        [t("live.nccl_network"), pairs(n.networks), { "data-value": "nccl_network" }],
        [t("live.nccl_transports"), pairs(n.transports), { "data-value": "nccl_transports" }],
        [t("live.nccl_channels"), n.coll_channels.length ? n.coll_channels.map((c) => fmt(c)).join(", ") : t("live.none"),
          { "data-value": "nccl_channels" }],
        [t("live.nccl_env"), env || t("live.none"), { "data-value": "nccl_env" }],
        [t("live.nccl_forcing"), n.forcing.join(", ") || t("live.none"), { "data-value": "nccl_forcing" }]]),
    h("h5", {}, t("live.nccl_rules")), rules);
}

function findingTitle(f) {
  return f.text?.[lang] ?? f.title ?? "";
}

/** A severity (records.SEVERITIES) in the page's language. */
function severityWord(severity) {
  return severity ? t(`severity.${severity}`) : "";
}
