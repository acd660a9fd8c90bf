// The served assessment page (/assess): draws its two figures from the JSON the server put in
// <script type="application/json" id="figures"> (no inline script: the app's CSP is script-src 'self').
const FIG = JSON.parse(document.getElementById("figures").textContent);
const opts = { staticPlot: true, displayModeBar: false };
Plotly.newPlot("status-plot", FIG.status.data, FIG.status.layout, opts);
Plotly.newPlot("goodput-plot", FIG.goodput.data, FIG.goodput.layout, opts);
document.body.dataset.ready = "1";
