// The alerts panel: what fires and what resolved (GET /api/alerts, reports/alerting.py), asked every
// ASK_EVERY_MS; Alertmanager down is said, with since when, and the panel keeps its last lists.

import { clear, fmtTime, h, t } from "./util.js";

const ASK_EVERY_MS = 15000;

function alertItem(a, resolved) {
  const where = a.node ? ` — ${a.node}` : "";
  const when = resolved ? t("am.resolved_at", { t: fmtTime(a.resolved_at) }) : t("am.since", { t: fmtTime(a.starts_at) });
  const name = a.severity ? `${a.name} (${a.severity})` : a.name;
  return h("li", { "data-alert": a.name, "data-node": a.node ?? "", "data-origin": a.origin },
    [h("span", { class: "event-what" }, name), where, ` · ${when}`, a.summary ? ` · ${a.summary}` : ""]);
}

function drawList(id, alerts, resolved, none) {
  const list = document.getElementById(id);
  const signature = JSON.stringify(alerts);
  if (list.dataset.signature === signature) return;
  list.dataset.signature = signature;
  clear(list);
  if (!alerts.length) list.append(h("li", { class: "muted" }, t(none)));
  for (const a of alerts) list.append(alertItem(a, resolved));
}

function draw(doc) {
  document.getElementById("am-source").textContent = doc.source ? t("am.source", { source: doc.source }) : t("am.source_store");
  const down = document.getElementById("am-down");
  down.hidden = !doc.down_since;
  down.textContent = doc.down_since ? t("am.unreachable", { t: fmtTime(doc.down_since), error: doc.error ?? "" }) : "";
  drawList("am-firing", doc.firing ?? [], false, "am.none_firing");
  drawList("am-resolved", doc.resolved ?? [], true, "am.none_resolved");
}

async function ask() {
  try {
    const response = await fetch("/api/alerts", { headers: { Accept: "application/json" } });
    if (response.ok) draw(await response.json());
  } catch {
    // the page's own server is away: the stream's status says so; the panel keeps its lists
  }
}

export function initAlerts() {
  if (!document.getElementById("am-alerts")) return;
  ask();
  setInterval(ask, ASK_EVERY_MS);
}
