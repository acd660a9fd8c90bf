// Scale and fit: the schematic fits the panel's width (never below a scale that keeps its smallest text at
// 11 px: it pans instead), zooms by buttons or keys, jumps to a node by name, and fills a wall screen in
// kiosk mode (`?kiosk=1`: drawing and alert strip only, fitted to width and height).

import { t } from "./util.js";

/** Below this the 12 px tile text would drop under 11 px (WCAG has no minimum; 11 px is ours). */
export const MIN_FIT_SCALE = 0.92;
/** Above this a 2-node drawing on a 4K screen only gets blurry and tall. Ours. */
export const MAX_FIT_SCALE = 1.6;
const ZOOM_STEP = 1.25;
const ZOOM_MIN = 0.5;
const ZOOM_MAX = 4;

const body = document.body;
const wrap = document.getElementById("schematic-wrap");
const svg = wrap.querySelector("svg.schematic");
const [, , baseW, baseH] = (svg.getAttribute("viewBox") || "0 0 1160 600").split(/\s+/).map(Number);
const fit = { mode: "fit", scale: 1 };
let jumped = null;

function fittedScale() {
  const width = wrap.clientWidth - 2;
  let scale = width / baseW;
  if (body.classList.contains("kiosk")) {
    const top = wrap.getBoundingClientRect().top + window.scrollY;
    scale = Math.min(scale, (window.innerHeight - top - 8) / baseH);
  }
  return Math.max(MIN_FIT_SCALE, Math.min(MAX_FIT_SCALE, scale));
}

function apply() {
  const scale = fit.mode === "fit" ? fittedScale() : fit.scale;
  fit.scale = scale;
  svg.setAttribute("width", String(Math.round(baseW * scale)));
  svg.setAttribute("height", String(Math.round(baseH * scale)));
  wrap.dataset.scale = scale.toFixed(3);
  const readout = document.getElementById("zoom-readout");
  if (readout) readout.textContent = t("fit.scale", { pct: Math.round(scale * 100) });
  document.getElementById("zoom-fit")?.setAttribute("aria-pressed", String(fit.mode === "fit"));
  // A rescale moves every tile: the node jumped to stays in view while it keeps the focus (a scrollbar that
  // appears as its card opens narrows the panel, and the fit would otherwise carry the node off screen).
  if (jumped && document.activeElement === jumped) jumped.scrollIntoView({ block: "nearest", inline: "nearest" });
}

export function zoom(factor) {
  fit.mode = "zoom";
  fit.scale = Math.max(ZOOM_MIN, Math.min(ZOOM_MAX, fit.scale * factor));
  apply();
}

export function fitWidth() {
  fit.mode = "fit";
  apply();
}

/** Focus the node called `name` (or its first match), bring it into view and open its card. */
export function jumpTo(name) {
  const wanted = name.trim().toLowerCase();
  const nodes = [...document.querySelectorAll("g.el[data-node]")];
  const el = nodes.find((n) => n.dataset.node.toLowerCase() === wanted)
    ?? nodes.find((n) => n.dataset.node.toLowerCase().startsWith(wanted));
  const status = document.getElementById("jump-status");
  status.textContent = el ? "" : t("fit.jump_none", { name });
  if (!el) return false;
  // The card first: opening it scrolls the card into view; the node's own scroll comes last, so it wins.
  el.dispatchEvent(new MouseEvent("click", { bubbles: true }));
  el.scrollIntoView({ block: "center", inline: "center" });
  el.focus({ preventScroll: true });
  jumped = el;
  return true;
}

function setKiosk(on) {
  body.classList.toggle("kiosk", on);
  const q = new URLSearchParams(window.location.search);
  if (on) q.set("kiosk", "1"); else q.delete("kiosk");
  const search = q.toString();
  history.replaceState(null, "", `${window.location.pathname}${search ? `?${search}` : ""}${window.location.hash}`);
  apply();
}

export function initFit() {
  if (new URLSearchParams(window.location.search).get("kiosk") === "1") body.classList.add("kiosk");
  document.getElementById("zoom-in")?.addEventListener("click", () => zoom(ZOOM_STEP));
  document.getElementById("zoom-out")?.addEventListener("click", () => zoom(1 / ZOOM_STEP));
  document.getElementById("zoom-fit")?.addEventListener("click", fitWidth);
  document.getElementById("kiosk-toggle")?.addEventListener("click", () => setKiosk(!body.classList.contains("kiosk")));
  document.getElementById("jump-form")?.addEventListener("submit", (event) => {
    event.preventDefault();
    jumpTo(new FormData(event.target).get("node") ?? "");
  });
  wrap.addEventListener("keydown", (event) => {
    if (event.target !== wrap) return;
    if (event.key === "+" || event.key === "=") zoom(ZOOM_STEP);
    else if (event.key === "-") zoom(1 / ZOOM_STEP);
    else if (event.key === "0") fitWidth();
  });
  new ResizeObserver(() => { if (fit.mode === "fit") apply(); }).observe(wrap);
  apply();
  return Object.assign(fit, { zoom, fitWidth, jumpTo, setKiosk });
}
