// The card's "last minutes": sparklines of utilisation, power and temperature over a chosen range, from
// GET /api/history (reports/history.py over the store's or Prometheus' samples). Text only, no markup.

import { clear, fmt, h, s, t, tickets } from "./util.js";

const RANGES = [["m5", 300], ["m15", 900], ["h1", 3600]];
const FIELDS = [["util_pct", "live.util", "unit.pct", 0], ["power_w", "live.power", "unit.w", 0], ["temp_c", "live.temp", "unit.c", 0]];
const W = 240;
const H = 36;
/** Refresh while the card stays open: a new bucket every 5 s at the 5-minute range. */
const REFRESH_MS = 10_000;
let timer = null;

/** Add the history block to an open GPU or node card (`key` = "gpu:node1/2" or "node:node1"). */
export function showHistory(container, key) {
  clearInterval(timer);
  if (!/^(gpu|node):/.test(key)) return;
  const live = container.querySelector(".card-live");
  if (!live) return;
  const select = h("select", { id: "hist-range", name: "range" },
    RANGES.map(([k, sec]) => h("option", { value: String(sec) }, t(`hist.${k}`))));
  select.value = container.dataset.histRange ?? "300";
  const body = h("div", { class: "hist-body", "aria-live": "off" }, h("p", { class: "muted" }, t("hist.loading")));
  live.append(h("section", { class: "hist", "aria-labelledby": "hist-title" },
    h("h3", { id: "hist-title" }, t("hist.title")),
    h("label", { class: "hist-range" }, `${t("hist.range")} `, select), body));
  const ask = tickets(body);
  const load = () => fetchHistory(key, Number(select.value), body, ask());
  select.addEventListener("change", () => { container.dataset.histRange = select.value; load(); });
  load();
  timer = setInterval(() => (container.dataset.open === key ? load() : clearInterval(timer)), REFRESH_MS);
}

// The last request wins, not the last answer (`current`: util.js `tickets`): a refresh of the old range answered
// after the new range's would draw the old range under the new choice.
async function fetchHistory(key, rangeS, body, current) {
  try {
    const response = await fetch(`/api/history?el=${encodeURIComponent(key)}&range_s=${rangeS}`);
    const doc = await response.json();
    if (!current()) return;
    if (!response.ok) throw new Error(doc.detail ?? doc.error ?? response.status);
    draw(body, doc, rangeS);
  } catch (err) {
    if (!current()) return;
    clear(body);
    body.append(h("p", { class: "muted" }, t("error.generic", { error: String(err.message ?? err) })));
  }
}

function draw(body, doc, rangeS) {
  clear(body);
  const range = t(`hist.${RANGES.find(([, sec]) => sec === rangeS)?.[0] ?? "m5"}`);
  const rows = FIELDS.map(([field, label, unit, digits]) => {
    const values = doc.series?.find((x) => x.field === field)?.values ?? [];
    const known = values.filter((v) => v !== null);
    if (!known.length) return null;
    const show = (v) => `${fmt(v, digits)} ${t(unit)}`;
    const words = t("hist.spark", { what: t(label), first: show(known[0]), last: show(known.at(-1)), range,
      min: show(Math.min(...known)), max: show(Math.max(...known)) });
    return h("div", { class: "spark-row", "data-spark": field },
      h("span", { class: "spark-label" }, t(label)), spark(values, words), h("span", { class: "spark-now" }, show(known.at(-1))));
  }).filter(Boolean);
  if (!rows.length) body.append(h("p", { class: "muted" }, t("hist.none")));
  body.append(...rows);
}

// One polyline per run of known buckets (a gap in the scrapes is a gap in the line).
function spark(values, words) {
  const known = values.filter((v) => v !== null);
  const lo = Math.min(...known);
  const hi = Math.max(...known);
  const y = (v) => (hi === lo ? H / 2 : H - 3 - ((v - lo) / (hi - lo)) * (H - 6));
  const x = (i) => (values.length <= 1 ? W / 2 : (i / (values.length - 1)) * W);
  const svg = s("svg", { class: "spark", viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": words });
  let run = [];
  const flush = () => {
    if (run.length) svg.append(s("polyline", { points: run.join(" "), class: "spark-line" }));
    run = [];
  };
  values.forEach((v, i) => (v === null ? flush() : run.push(`${x(i).toFixed(1)},${y(v).toFixed(1)}`)));
  flush();
  return svg;
}
