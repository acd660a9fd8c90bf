// The Decider mode's figures: per account, a small table (the window's totals) and charts over time
// (/api/decider, computed by the server: reports/decider.py). A figure the store cannot give arrives as
// null and is shown as "—" with the reason in the page's language; plotly.js loads only when first drawn.

import { clear, fmt, h, lang, t, tickets } from "./util.js";
import { loadPlotly } from "./sim.js";

// The window choices: the manager's week by day, a day by the hour, the last hour in five-minute buckets (a demo's life).
const WINDOWS = { week: [7 * 86400, null], day: [86400, null], hour: [3600, 300] };

// An amount with the decimals its size needs: a demo's few minutes are 0.04 GPU-hours, not "0.0".
const amount = (v) => fmt(v, Math.abs(v) >= 10 ? 1 : Math.abs(v) >= 0.1 ? 2 : 3);
const percent = (digits) => (v) => `${fmt(v * 100, digits)} %`;
// Each column: the figure and how it is written.
const FIGURES = [
  ["gpu_hours_allocated", amount],
  ["gpu_hours_busy", amount],
  ["utilisation", percent(0)],
  ["goodput", percent(0)],
  ["mfu", percent(1)],
  ["cost", amount],
  ["energy_kwh", amount],
];
// Each chart: the figure and whether it is a share (shown in %) or an amount (shown per hour of its bucket, so
// the window's partial first and last buckets do not read as a drop).
const CHARTED = [["utilisation", "share"], ["goodput", "share"], ["mfu", "share"], ["gpu_hours_allocated", "rate"], ["cost", "rate"]];

export function initDecider(root) {
  const select = root.querySelector("#decider-window");
  const status = root.querySelector("#decider-status");
  const tbody = root.querySelector("#decider-table tbody");
  const charts = root.querySelector("#decider-charts");
  const ask = tickets(); // the last choice wins, not the last answer

  async function show() {
    const [windowS, bucketS] = WINDOWS[select.value] ?? WINDOWS.week;
    const params = new URLSearchParams({ window_s: windowS });
    if (bucketS) params.set("bucket_s", bucketS);
    const current = ask();
    status.textContent = t("decider.loading");
    root.dataset.state = "loading";
    try {
      const response = await fetch(`/api/decider?${params}`);
      const doc = await response.json();
      if (!response.ok) throw new Error(typeof doc.detail === "string" ? doc.detail : response.statusText);
      if (!current()) return;
      fill(doc);
      status.textContent = doc.accounts.length ? t("decider.accounts", { n: doc.accounts.length }) : t("decider.none");
      await draw(doc);
      root.dataset.state = "done";
    } catch (err) {
      if (!current()) return;
      status.textContent = t("decider.unavailable");
      root.dataset.state = "error";
    }
  }

  function cell(figures, name, write) {
    const value = figures[name];
    if (value === null || value === undefined) {
      return h("td", { class: "num muted", "data-figure": name, title: t(`decider.why.${name}`) }, t("live.none"));
    }
    return h("td", { class: "num", "data-figure": name, "data-value": value }, write(value));
  }

  function fill(doc) {
    clear(tbody);
    for (const a of doc.accounts) {
      tbody.append(h("tr", { "data-account": a.account ?? "" },
        h("th", { scope: "row" }, a.account ?? t("decider.no_account")),
        h("td", { class: "num" }, fmt(a.total.jobs)),
        FIGURES.map(([name, write]) => cell(a.total, name, write))));
    }
    root.querySelector("#decider-currency").textContent = doc.currency ? `(${doc.currency})` : "";
    const tier = doc.tiers?.length ? doc.tiers[doc.tiers.length - 1].tier : null;
    root.querySelector("#decider-tiers").textContent = tier
      ? t("decider.tier_trend", { n: doc.tiers.length, tier }) : t("decider.why.tiers");
  }

  function chartOf(doc, name, kind) {
    const x = doc.edges.slice(1).map((e) => new Date(e * 1000).toISOString());
    const scale = (b) => (kind === "share" ? 100 : 3600 / (b.t1 - b.t0));
    return doc.accounts
      .filter((a) => a.buckets.some((b) => b[name] !== null))
      .map((a) => ({ x, y: a.buckets.map((b) => (b[name] === null ? null : b[name] * scale(b))), mode: "lines+markers",
        name: a.account ?? t("decider.no_account"), connectgaps: false, line: { width: 2 }, marker: { size: 5 },
        hovertemplate: `%{x|%d/%m %H:%M} · %{y:.1f}<extra>${a.account ?? ""}</extra>` }));
  }

  async function draw(doc) {
    clear(charts);
    const series = CHARTED.map(([name, kind]) => [name, chartOf(doc, name, kind)]);
    if (doc.tiers?.length) series.push(["tier", [{ x: doc.tiers.map((p) => new Date(p.t * 1000).toISOString()),
      y: doc.tiers.map((p) => p.tier_number), text: doc.tiers.map((p) => p.tier), mode: "lines+markers",
      line: { shape: "hv", width: 2 }, hovertemplate: "%{x|%d/%m %H:%M} · %{text}<extra></extra>" }]]);
    const shown = series.filter(([, traces]) => traces.length);
    if (!shown.length) return;
    const Plotly = await loadPlotly();
    for (const [name, traces] of shown) {
      const slot = h("div", { class: "decider-chart", "data-chart": name, role: "img", "aria-label": t(`decider.chart.${name}`) });
      charts.append(h("figure", {}, h("figcaption", {}, t(`decider.chart.${name}`)), slot));
      const layout = {
        margin: { l: 40, r: 8, t: 4, b: 28 }, height: 140, showlegend: name === "utilisation" && traces.length > 1,
        paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "#ffffff", legend: { orientation: "h", y: -0.35 },
        font: { family: "Inter, system-ui, sans-serif", size: 11, color: "#1f2937" },
        // Day/month numbers only: plotly's bundled month names are English whatever the page's language.
        xaxis: { type: "date", tickformat: "%d/%m %H:%M", gridcolor: "#e5e7eb", nticks: 4 },
        yaxis: { gridcolor: "#e5e7eb", rangemode: "tozero", fixedrange: true },
        separators: lang === "fr" ? ", " : ".,",
      };
      if (name === "tier") {
        const named = new Map(doc.tiers.map((p) => [p.tier_number, p.tier]));
        Object.assign(layout.yaxis, { tickvals: [...named.keys()], ticktext: [...named.values()] });
      }
      await Plotly.react(slot, traces, layout, { displayModeBar: false, responsive: true, staticPlot: false });
    }
  }

  select.addEventListener("change", show);
  return { show };
}
