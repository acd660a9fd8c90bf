// The straggler simulator panel: the server computes the curve (/api/stragglersim), the
// page draws it with plotly.js, which is loaded from the server only when first needed
// (4.8 MB: not on the path to first paint).

import { clear, fmt, h, t, tickets } from "./util.js";

let plotlyLoading = null;

export function loadPlotly() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!plotlyLoading) {
    plotlyLoading = new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = "/vendor/plotly.min.js";
      script.onload = () => resolve(window.Plotly);
      script.onerror = () => reject(new Error("plotly.min.js"));
      document.head.append(script);
    });
  }
  return plotlyLoading;
}

export function initSimulator(root) {
  const form = root.querySelector("#sim-form");
  const status = root.querySelector("#sim-status");
  const plot = root.querySelector("#sim-plot");
  const tbody = root.querySelector("#sim-table tbody");
  const ask = tickets(root); // the last run asked wins, not the last answer (a larger cluster answers later)

  async function run() {
    const params = new URLSearchParams(new FormData(form));
    const current = ask();
    status.textContent = t("sim.running");
    root.dataset.state = "running";
    try {
      const response = await fetch(`/api/stragglersim?${params}`);
      const body = await response.json();
      if (!current()) return;
      if (!response.ok) throw new Error(typeof body.detail === "string" ? body.detail : (body.error || response.statusText));
      fill(body.points);
      status.textContent = t("sim.done", { n: body.points.length });
      root.dataset.state = "done";
      await draw(body.points);
    } catch (err) {
      if (!current()) return;
      status.textContent = t("sim.unavailable", { error: err.message });
      root.dataset.state = "error";
    }
  }

  function fill(points) {
    clear(tbody);
    for (const p of points) {
      tbody.append(h("tr", {}, h("td", { class: "num" }, fmt(p.gpus)),
        h("td", { class: "num", "data-gpus": p.gpus, "data-efficiency": p.efficiency }, `${fmt(p.efficiency * 100, 1)} %`)));
    }
  }

  async function draw(points) {
    const Plotly = await loadPlotly();
    const trace = { x: points.map((p) => p.gpus), y: points.map((p) => p.efficiency * 100), mode: "lines+markers",
      line: { color: "#1d4ed8", width: 2.5 }, marker: { size: 7, symbol: "circle" },
      hovertemplate: `%{x:,} ${t("sim.gpus")}<br>%{y:.1f} %<extra></extra>` };
    const layout = {
      margin: { l: 56, r: 16, t: 12, b: 48 }, height: 300, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "#ffffff",
      font: { family: "Inter, system-ui, sans-serif", size: 12, color: "#1f2937" },
      xaxis: { type: "log", title: { text: t("sim.axis_x") }, gridcolor: "#e5e7eb", tickformat: ",d" },
      yaxis: { title: { text: t("sim.axis_y") }, range: [0, 100], gridcolor: "#e5e7eb" },
    };
    await Plotly.react(plot, [trace], layout, { displayModeBar: false, responsive: true });
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    run();
  });
  // Compute the default curve the first time the panel scrolls into view (plotly stays off the first paint).
  const observer = new IntersectionObserver((entries) => {
    if (entries.some((e) => e.isIntersecting)) {
      observer.disconnect();
      if (!root.dataset.state) run();
    }
  });
  observer.observe(plot);
  return { run };
}
