"""The assessment as one self-contained HTML page: no request leaves it (plotly.js inlined from the
installed plotly wheel, no fonts, no images, no links fetched), one section per category, MFU and
goodput first. A view: it formats ``reports.assess.assessment_document``, it computes nothing.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import jinja2
import orjson

from hpcwatch.errors import ConfigError

__all__ = ["render_assessment_html", "plotly_js_text"]

#: Inside the plotly wheel (https://github.com/plotly/plotly.py, package_data/plotly.min.js), as web/app.py serves it.
_PLOTLY_JS = "package_data/plotly.min.js"
_STATUS_COLOUR = {"pass": "#2e7d32", "warn": "#f9a825", "fail": "#c62828", "unknown": "#757575"}

_TEMPLATE = jinja2.Environment(autoescape=True).from_string("""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
{% if not served %}<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">{% endif %}
<link rel="icon" href="data:,"><title>hpcwatch assessment: {{ doc.tier }}</title>
<style>
body{font-family:system-ui,sans-serif;margin:0;color:#222}header{background:#1d2733;color:#fff;padding:16px 24px}
.tier{font-size:2em;font-weight:700}nav a{color:#9cf;margin-right:14px}main{padding:16px 24px}
section.cat{display:none}section.cat:target{display:block}#overview{display:block}
section.cat:target ~ #overview{display:none}
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #ddd;padding:6px;text-align:left;vertical-align:top}
.s{font-weight:700;color:#fff;padding:2px 6px;border-radius:3px}
{% for k, c in colours.items() %}.s-{{ k }}{background:{{ c }}}{% endfor %}
.cards{display:flex;gap:16px;margin:12px 0}.card{border:1px solid #ccc;border-radius:6px;padding:12px;min-width:220px}
code{background:#f3f3f3;padding:1px 4px}
</style>
{% if served %}<script src="/vendor/plotly.min.js"></script>{% else %}<script>{{ plotly_js|safe }}</script>{% endif %}</head><body>
<header><div>hpcwatch assessment (ClusterMAX-style, from the cluster's own records)</div>
<div class="tier" id="tier">{{ doc.tier }}</div>
<nav><a href="#overview">overview</a>{% for c in doc.categories %}<a href="#cat-{{ loop.index }}">{{ c.name }}: {{ c.tier }}</a>{% endfor %}</nav></header>
<main>
{% for c in doc.categories %}
<section class="cat" id="cat-{{ loop.index }}"><h2>{{ c.name }}: {{ c.tier }}</h2>
<table><tr><th>criterion</th><th>status</th><th>evidence</th><th>records</th><th>see it</th><th>source</th></tr>
{% for r in c.criteria %}<tr data-criterion="{{ r.id }}"><td><b>{{ r.id }}</b><br>{{ r.title }}</td>
<td><span class="s s-{{ r.status }}">{{ r.status }}</span></td><td>{{ r.evidence }}</td>
<td>{{ r.records|join(', ') }}</td><td><code>{{ r.command }}</code></td><td>{{ r.source }}</td></tr>{% endfor %}
</table></section>
{% endfor %}
<section class="cat" id="overview"><h2>Overview</h2>
<div class="cards">
<div class="card"><h3>MFU</h3><div id="mfu">{{ headline.mfu }}</div></div>
<div class="card"><h3>Goodput</h3><div id="goodput">{{ headline.goodput }}</div></div>
<div class="card"><h3>Tier rule</h3><div>all pass: Platinum; warns: Gold; any unknown: Silver; one fail: Bronze;
two or more: Underperform. Overall: the lowest category. Unknown never counts as a pass.</div></div></div>
<div id="goodput-plot" style="height:260px"></div>
<div id="status-plot" style="height:320px"></div>
<h3>Not assessable from cluster data</h3><ul>{% for n in doc.not_assessable %}<li><b>{{ n.category }}</b>: {{ n.title }} ({{ n.why }})</li>{% endfor %}</ul>
</section></main>
{% if served %}<script type="application/json" id="figures">{{ figures|safe }}</script>
<script src="/static/assess.js"></script>{% else %}<script>
const FIG = {{ figures|safe }};
Plotly.newPlot("status-plot", FIG.status.data, FIG.status.layout, {staticPlot: true, displayModeBar: false});
Plotly.newPlot("goodput-plot", FIG.goodput.data, FIG.goodput.layout, {staticPlot: true, displayModeBar: false});
document.body.dataset.ready = "1";
</script>{% endif %}</body></html>
""")


def plotly_js_text() -> str:
    path = resources.files("plotly").joinpath(_PLOTLY_JS)
    if not path.is_file():
        raise ConfigError("plotly.min.js not found in the installed plotly package (pip install plotly)")
    return path.read_text(encoding="utf-8")


def _criterion(doc: dict[str, Any], criterion_id: str) -> dict[str, Any] | None:
    return next((r for c in doc["categories"] for r in c["criteria"] if r["id"] == criterion_id), None)


def _headline(doc: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key, cid in (("mfu", "mfu"), ("goodput", "goodput")):
        r = _criterion(doc, cid)
        out[key] = f"{r['status']}: {r['evidence']}" if r else "not assessed"
    return out


def _figures(doc: dict[str, Any]) -> dict[str, Any]:
    names = [c["name"] for c in doc["categories"]]
    status = {
        "data": [
            {
                "type": "bar",
                "name": s,
                "x": names,
                "marker": {"color": colour},
                "y": [sum(1 for r in c["criteria"] if r["status"] == s) for c in doc["categories"]],
            }
            for s, colour in _STATUS_COLOUR.items()
        ],
        "layout": {"barmode": "stack", "title": {"text": "criteria by status"}, "margin": {"t": 40}},
    }
    g = (_criterion(doc, "goodput") or {}).get("figures", {})
    goodput = {
        "data": [
            {
                "type": "bar",
                "orientation": "h",
                "y": ["measured", "simulator"],
                "x": [g.get("goodput_pct"), g.get("predicted_pct")],
            }
        ],
        "layout": {
            "title": {"text": "goodput % (measured vs failure simulator)"},
            "margin": {"t": 40},
            "xaxis": {"range": [0, 100]},
        },
    }
    return {"status": status, "goodput": goodput}


def _script_json(value: Any) -> str:
    # "</script>" inside data must not end the script element: JSON allows \u003c for "<".
    return orjson.dumps(value, default=str).decode().replace("<", "\\u003c")


def render_assessment_html(doc: dict[str, Any], *, served: bool = False) -> str:
    """The page for one ``assessment_document``. ``served``: the page ``/assess`` of the web app, under its
    Content-Security-Policy (``script-src 'self'``): plotly.js from ``/vendor/plotly.min.js``, the figures
    drawn by ``static/assess.js``. Otherwise (``hpcwatch assess --html``) one standalone offline file: its
    scripts inline, allowed by its own ``<meta>`` policy, since a file opened from disk has no origin to load from."""
    return _TEMPLATE.render(
        doc=doc,
        served=served,
        colours=_STATUS_COLOUR,
        plotly_js="" if served else plotly_js_text().replace("</script", "<\\/script"),
        figures=_script_json(_figures(doc)),
        headline=_headline(doc),
    )
