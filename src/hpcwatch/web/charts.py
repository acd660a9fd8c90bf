"""The job page's charts over the job's life: ``reports.jobseries.JobSeries`` drawn as inline SVG on the server.

No script draws them (the page's Content-Security-Policy allows none inline, and a chart library would be
one more thing to vendor): each series is one small ``<svg role="img">`` whose ``aria-label`` and
``<title>`` say the figures (points, window, min, max, last), so a screen reader hears what the eye sees.
Colours and strokes come from ``static/job.css`` by class. Only numbers and catalogue words go in, escaped.

One chart::

    max ┤      ╭──╮  ╭─────╮                      y: 0 to the series' maximum (100 for %), unit on the axis
        │ ╭────╯  ╰──╯     ╰─╮   ·                a gap: buckets where nothing reported
      0 ┼─┴──────────────────┴──────────
        10-04 08:00    Time (UTC)    10-04 20:00
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from html import escape

from hpcwatch.reports.jobseries import JobSeries, Series
from hpcwatch.web.i18n import Catalogue

__all__ = ["render_charts", "render_chart", "CHART_W", "CHART_H"]

CHART_W, CHART_H = 360, 150
LEFT, RIGHT, TOP, BOTTOM = 64, 10, 12, 34
"""Room for the y labels ("716.8 kW"), the x labels and the axis title under them."""

ValueText = Callable[[float | None, str], str]
"""A value and its unit as the page's language writes them ("98 %", "1,2 GB/s")."""


def render_charts(found: JobSeries, t: Catalogue, *, value: ValueText) -> str:
    """Every series of ``found``, one ``<figure>`` each, in its order."""
    return "\n".join(render_chart(found, s, t, value=value) for s in found.series)


def render_chart(found: JobSeries, s: Series, t: Catalogue, *, value: ValueText) -> str:
    start, end = _clock(found.t0), _clock(found.t1)
    title = t(f"jobpage.chart.{s.key}")
    label = t("jobpage.series_label").format(
        title=title,
        how=t(f"jobpage.how.{s.aggregation}"),
        points=s.points,
        buckets=found.buckets,
        start=start,
        end=end,
        low=value(s.low, s.unit),
        high=value(s.high, s.unit),
        last=value(next((v for v in reversed(s.values) if v is not None), None), s.unit),
    )
    top = _top(s)
    plot_w, plot_h = CHART_W - LEFT - RIGHT, CHART_H - TOP - BOTTOM
    base = TOP + plot_h
    svg = [
        f'<svg class="chart" role="img" aria-label="{escape(label)}" viewBox="0 0 {CHART_W} {CHART_H}" '
        f'width="{CHART_W}" height="{CHART_H}" data-series="{escape(s.key)}">',
        f"<title>{escape(label)}</title>",
        f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{base}"/>',
        f'<line class="axis" x1="{LEFT}" y1="{base}" x2="{LEFT + plot_w}" y2="{base}"/>',
        f'<line class="grid" x1="{LEFT}" y1="{TOP}" x2="{LEFT + plot_w}" y2="{TOP}"/>',
        _text(LEFT - 4, TOP + 4, value(top, s.unit), "end", "ylabel"),
        _text(LEFT - 4, base, value(0.0, s.unit), "end", "ylabel"),
        _text(LEFT, base + 14, start, "start", "xlabel"),
        _text(LEFT + plot_w, base + 14, end, "end", "xlabel"),
        _text(LEFT + plot_w / 2, base + 28, t("jobpage.series_time"), "middle", "xtitle"),
        f'<text class="ytitle" x="12" y="{TOP + plot_h / 2:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 12 {TOP + plot_h / 2:.1f})">{escape(s.unit)}</text>',
        *_marks(s.values, top, plot_w, plot_h),
        "</svg>",
    ]
    caption = t("jobpage.series_min_max").format(low=value(s.low, s.unit), high=value(s.high, s.unit))
    return (
        f'<figure class="chart-fig" data-series="{escape(s.key)}"><figcaption><strong>{escape(title)}</strong> '
        f'<span class="muted">{escape(caption)}</span></figcaption>{"".join(svg)}</figure>'
    )


def _top(s: Series) -> float:
    """The y axis' top: 100 for a percentage (utilisation reads against full), else the series' maximum
    (1 when it is 0: a flat line at the bottom, not a division by zero)."""
    high = s.high if s.high is not None and s.high > 0 else 0.0
    if s.unit == "%" and high <= 100:
        return 100.0
    return high or 1.0


def _marks(values: tuple[float | None, ...], top: float, plot_w: float, plot_h: float) -> list[str]:
    """A polyline per run of buckets that reported, a dot for a lone one: a gap stays a gap."""
    step = plot_w / max(len(values), 1)
    out: list[str] = []
    run: list[str] = []
    for i, v in enumerate((*values, None)):
        if v is not None:
            run.append(f"{LEFT + (i + 0.5) * step:.1f},{TOP + plot_h * (1 - v / top):.1f}")
            continue
        if len(run) == 1:
            x, y = run[0].split(",")
            out.append(f'<circle class="line-dot" cx="{x}" cy="{y}" r="2"/>')
        elif run:
            out.append(f'<polyline class="line" points="{" ".join(run)}"/>')
        run = []
    return out


def _text(x: float, y: float, text: str, anchor: str, cls: str) -> str:
    return f'<text class="{cls}" x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}">{escape(text)}</text>'


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%m-%d %H:%M")
