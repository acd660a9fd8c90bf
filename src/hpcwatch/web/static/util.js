// Shared helpers: the catalogue (every word comes from it), DOM builders that only ever
// insert text with textContent, and number formatting in the page's language.

const catalogue = JSON.parse(document.getElementById("catalogue").textContent);
export const boot = JSON.parse(document.getElementById("boot").textContent);
export const lang = catalogue.lang;
export const cards = catalogue.cards;

// Each text cut once at its placeholders (split keeps the captured names at odd indexes): a 1,024-node tick fills
// a few hundred texts, and a regular expression with a callback each time cost more than the filling.
const PLACEHOLDER = /\{(\w+)\}/;
const cutTexts = new Map();

function partsOf(text) {
  let parts = cutTexts.get(text);
  if (!parts) cutTexts.set(text, (parts = text.split(PLACEHOLDER)));
  return parts;
}

/** The catalogue text of `key`, with {name} placeholders filled from `vars`. */
export function t(key, vars) {
  const text = catalogue.words[key];
  if (text === undefined) {
    console.error("hpcwatch: missing catalogue key", key);
    return key;
  }
  if (!vars) return text;
  const parts = partsOf(text);
  let out = parts[0];
  for (let i = 1; i < parts.length; i += 2) {
    const name = parts[i];
    out += (name in vars ? String(vars[name]) : `{${name}}`) + parts[i + 1];
  }
  return out;
}

/** Whether the catalogue has `key` (a rule the page may have no words for). */
export function has(key) {
  return catalogue.words[key] !== undefined;
}

/** An HTML element; string children become text nodes, never markup. */
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

const SVG_NS = "http://www.w3.org/2000/svg";

/** An SVG element, same rules as `h`. */
export function s(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

function setAttrs(node, attrs) {
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "text") node.textContent = String(value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

const numberFormats = new Map();
/** Texts already formatted, per number of decimals: a 1,024-node tick formats thousands of watts and degrees,
 *  mostly values seen before, and Intl's format was the tick's costliest call. Bounded; emptied when full. */
const FORMATTED_MAX = 8192;

/** A number with at most `digits` decimals, in the page's language. */
export function fmt(value, digits = 0) {
  if (value === null || value === undefined || Number.isNaN(value)) return t("live.none");
  const key = `${digits}`;
  if (!numberFormats.has(key)) {
    const format = new Intl.NumberFormat(lang, { maximumFractionDigits: digits, minimumFractionDigits: digits });
    numberFormats.set(key, { format, texts: new Map() });
  }
  const { format, texts } = numberFormats.get(key);
  if (value === 0) return format.format(value);   // a Map takes -0 for 0, which Intl writes "-0"
  let text = texts.get(value);
  if (text === undefined) {
    if (texts.size >= FORMATTED_MAX) texts.clear();
    text = format.format(value);
    texts.set(value, text);
  }
  return text;
}

/** Bytes per second in GB/s or MB/s (decimal units, as link rates are quoted). */
export function fmtRate(bytesPerS) {
  if (bytesPerS === null || bytesPerS === undefined) return t("live.none");
  if (bytesPerS >= 1e9) return `${fmt(bytesPerS / 1e9, 2)} ${t("unit.gb_s")}`;
  return `${fmt(bytesPerS / 1e6, 1)} ${t("unit.mb_s")}`;
}

// What toLocaleTimeString(lang, { timeZone: "UTC", hour12: false }) formats with, made once: that call builds a
// new formatter each time, 0.5 ms a tick at 1,024 nodes.
const timeFormat = new Intl.DateTimeFormat(lang,
  { timeZone: "UTC", hour12: false, hour: "numeric", minute: "numeric", second: "numeric" });

/** UTC time of day of a data timestamp (seconds). */
export function fmtTime(seconds) {
  if (!seconds) return t("live.none");
  return timeFormat.format(new Date(seconds * 1000)) + " UTC";
}

/**
 * Requests where the last one asked wins, not the last one answered: each call of the returned function takes a
 * ticket for a new request and returns `current()`, which says whether no later request was asked since. An
 * answer whose ticket is no longer current is to be dropped; with `counted`, each drop is counted in its
 * `data-dropped` (the browser tests wait on it).
 */
export function tickets(counted = null) {
  let last = 0;
  return () => {
    const mine = ++last;
    return () => {
      if (mine === last) return true;
      if (counted) counted.dataset.dropped = String(Number(counted.dataset.dropped ?? 0) + 1);
      return false;
    };
  };
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

/** One timeline entry as a list item: its time (UTC), what happened, where. Also the node card's timeline. */
export function eventItem(e) {
  const where = [e.node, e.gpu !== null && e.gpu !== undefined ? `GPU ${e.gpu}` : null, e.job ? t("events.job", { job: e.job }) : null]
    .filter(Boolean).join(" · ");
  // A finding is named by its vector's card title and its severity in the page's language (its title is the
  // detector's English).
  const d = e.detail ?? {};
  const vector = d.vector ? cards.vectors?.[d.vector]?.title ?? d.vector : "";
  const severity = d.severity ? t(`severity.${d.severity}`) : "";
  // What hpcwatch did (reports/acting.py): an action (or one that failed), its undo, a notice by its delivery state.
  const key = e.what === "notice" && has(`event.notice_${d.state}`) ? `event.notice_${d.state}`
    : e.what === "action" && d.ok === false ? "event.action_failed" : `event.${e.what}`;
  const words = t(key, { xid: d.xid ?? "", state: d.state ?? "", rule: d.rule ?? "", step: d.step ?? "", vector, severity,
    policy: d.policy ?? "", who: d.who ?? "", kind: d.kind ?? "", channel: d.channel ?? "", recipient: d.recipient ?? "" });
  return h("li", { "data-what": e.what, "data-node": e.node ?? "", "data-job": e.job ?? "" },
    [h("time", { datetime: new Date(e.t * 1000).toISOString() }, fmtTime(e.t)), " ", h("span", { class: "event-what" }, words), where ? ` — ${where}` : ""]);
}
