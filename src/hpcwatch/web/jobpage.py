"""The job page: ``GET /job/{id}`` (HTML, FR/EN) and ``GET /api/job/{id}`` (JSON), one job's whole report,
with the notices and actions about it and the alerts on its nodes while it ran.

Both format ``reports.jobpage.job_overview`` and nothing else: the per-GPU table, IB and Lustre bytes,
the recent steps and their straggler, goodput, the job's findings and its series over its life are computed
there. The page is rendered on the server (Jinja2, autoescaped; the charts are SVG from ``web.charts``), so
it reads without a script and prints as it is.
Under ``hpcwatch serve --prometheus`` the samples of the report come from Prometheus, the rest from
the store, and the page says so.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool

from hpcwatch.errors import InputError
from hpcwatch.records import PHASES
from hpcwatch.reports.jobpage import SHOWN_ROWS, JobOverview, job_overview, overview_dict, rows_to_show
from hpcwatch.reports.jobs import MAX_JOB_ID_CHARS, check_job_id
from hpcwatch.reports.scoped import job_visible, scoped_overview
from hpcwatch.vocab import EventKind
from hpcwatch.web.access import scope_of
from hpcwatch.web.charts import render_charts
from hpcwatch.web.i18n import LANG_COOKIE, LANGUAGES, Catalogue, load_catalogue, negotiate

__all__ = ["router", "job_url", "fmt_number", "fmt_bytes", "fmt_duration", "fmt_value", "advice_values"]

router = APIRouter()


def job_url(job_id: str) -> str:
    """The page of one job (ids such as ``namespace/pod`` keep their slash: the route takes a path)."""
    return f"/job/{job_id}"


def fmt_number(value: float | None, digits: int = 0, *, lang: str) -> str:
    """``value`` with ``digits`` decimals and the language's decimal mark; an em dash for None."""
    if value is None:
        return "—"
    text = f"{value:,.{digits}f}"
    if lang == "fr":  # French: thin space for thousands, comma for decimals
        text = text.replace(",", "\u202f").replace(".", ",")
    return text


def fmt_bytes(n: float | None, *, lang: str) -> str:
    """Decimal units, as link and disk rates are quoted."""
    if n is None:
        return "—"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000:
            return f"{fmt_number(n, 0 if unit == 'B' else 1, lang=lang)} {unit}"
        n /= 1000
    return f"{fmt_number(n, 1, lang=lang)} PB"


def fmt_duration(seconds: float | None, *, lang: str) -> str:
    if seconds is None:
        return "—"
    if seconds < 120:
        return f"{fmt_number(seconds, 1, lang=lang)} s"
    if seconds < 7200:
        return f"{fmt_number(seconds / 60, 1, lang=lang)} min"
    return f"{fmt_number(seconds / 3600, 2, lang=lang)} h"


def fmt_value(value: float | None, unit: str, *, lang: str) -> str:
    """A chart's value with its unit (``reports.jobseries.Series.unit``): bytes in decimal units, a step
    time under a second in ms, power past 10 kW in kW."""
    if value is None:
        return "—"
    if unit == "B/s":
        return f"{fmt_bytes(value, lang=lang)}/s"
    if unit == "s":
        return f"{fmt_number(value * 1000, 1, lang=lang)} ms" if value < 1 else f"{fmt_number(value, 2, lang=lang)} s"
    if unit == "W" and value >= 10_000:
        return f"{fmt_number(value / 1000, 1, lang=lang)} kW"
    return f"{fmt_number(value, 0, lang=lang)} {unit}"


def advice_values(values: dict[str, str], *, lang: str) -> dict[str, str]:
    """An advice note's values (numbers as the report wrote them, "3.2 MB", "45") with the language's
    decimal mark; the report's English lines keep theirs."""
    if lang != "fr":
        return values
    return {k: _DECIMAL_POINT.sub(",", v) for k, v in values.items()}


_DECIMAL_POINT = re.compile(r"(?<=\d)\.(?=\d)")


def _when(t: float | None) -> str:
    return "—" if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("hpcwatch.web", "templates"), autoescape=select_autoescape(["html"]))
    env.globals.update(when=_when, phases=PHASES)
    return env


_ENV = _environment()


def warm() -> None:
    """What the first job page would otherwise wait for: its template compiled (~80 ms) and the reports it
    imports on first use (``web.app.warm`` calls this once the server listens)."""
    import hpcwatch.reports.alerting  # noqa: F401  (alerts_of)

    _ENV.get_template("job.html")


def _samples_for(state: Any, overview_job: str) -> Any:
    """None (the store's samples), or the same columns from the app's Prometheus since the job started."""
    if state.prometheus is None:
        return None
    from hpcwatch.reports.jobs import prometheus_samples

    record = state.store.job(overview_job)
    return prometheus_samples(state.prometheus, t0=record.start if record is not None else None, store=state.store)


def overview_of(state: Any, job_id: str) -> JobOverview:
    """The report the page and the API format, with samples from where the app reads them (from the store:
    through the app's cache of overviews, which a commit to the store empties; in the app's page process when
    it has one)."""
    price, currency = state.gpu_hour_price, state.currency
    if state.prometheus is None:
        pages = state.pages
        # A page of a store that did not change since is this process's (no answer to carry across).
        compute = None if pages is None else lambda: pages.overview(job_id, price_per_gpu_hour=price, currency=currency)
        return state.overviews.overview(
            state.store, job_id, price_per_gpu_hour=price, currency=currency, compute=compute
        )
    return job_overview(
        state.store, job_id, samples=_samples_for(state, job_id), price_per_gpu_hour=price, currency=currency
    )


def alerts_of(state: Any, overview: JobOverview) -> list[dict[str, Any]]:
    """``reports.alerting.job_alerts``: the alerts on the job's nodes while it ran (the app's Alertmanager
    watch and the store's verdicts)."""
    from hpcwatch.reports.alerting import job_alerts
    from hpcwatch.web.api import alerts_doc

    j = overview.job
    if j is None:
        return []
    t0 = j.start if j.start is not None else j.observed_start
    if t0 is None:
        return []
    # From an hour before it started: a verdict that already fired when the job landed on the node.
    return job_alerts(alerts_doc(state, since=t0 - 3600.0), j.nodes, t0=t0, t1=j.end)


def visible_overview(request: Request, job_id: str) -> JobOverview:
    """``overview_of`` for a job the request's principal may open (``reports.scoped``), its opening
    audited; an InputError, as for an unknown job, for one it may not (no probing of ids)."""
    state, scope = request.app.state.hpcwatch, scope_of(request)
    if not job_visible(state.store, job_id, scope):
        raise InputError(f"{job_id}: no such job")
    state.audit.opened(request, EventKind.ACCESS_JOB, job_id)
    return scoped_overview(overview_of(state, job_id), scope)


def render_job_page(
    overview: JobOverview,
    t: Catalogue,
    *,
    source: str | None,
    alerts: list[dict[str, Any]] | None = None,
    every_row: bool = False,
) -> str:
    """The page; ``every_row``: every GPU and rank in the tables, not those to look at first (``?rows=all``)."""
    lang = t.lang
    charts = (
        ""
        if overview.series is None
        else render_charts(overview.series, t, value=lambda v, unit: fmt_value(v, unit, lang=lang))
    )
    return _ENV.get_template("job.html").render(
        o=overview,
        charts=Markup(charts),  # built by web.charts, every value in it escaped there
        alerts=alerts or [],
        j=overview.job,
        shown=rows_to_show(overview, None if every_row else SHOWN_ROWS),
        t=t,
        lang=lang,
        languages=LANGUAGES,
        source=source,
        num=lambda v, d=0: fmt_number(v, d, lang=lang),
        size=lambda v: fmt_bytes(v, lang=lang),
        dur=lambda v: fmt_duration(v, lang=lang),
        pct=lambda v: "—" if v is None else f"{fmt_number(v, 0, lang=lang)} %",
        ms=lambda v: fmt_number(None if v is None else v * 1000, 2, lang=lang),
        advice=lambda values: advice_values(values, lang=lang),
    )


def _shown_id(job_id: str) -> str:
    """The id as the not-found page names it: whole when it can be an id, else its start (never 60 KB back)."""
    return job_id if len(job_id) <= MAX_JOB_ID_CHARS else job_id[:40] + "…"


def _not_found(t: Catalogue, job_id: str, why: str) -> str:
    return _ENV.get_template("job.html").render(
        o=None, j=None, t=t, lang=t.lang, languages=LANGUAGES, source=None, job_id=job_id, why=why
    )


@router.get("/job/{job_id:path}", response_class=HTMLResponse, include_in_schema=False)
async def job_page(
    request: Request, job_id: str, lang: str | None = Query(None), rows: str | None = Query(None)
) -> HTMLResponse:
    state = request.app.state.hpcwatch
    chosen = negotiate(
        forced=lang, cookie=request.cookies.get(LANG_COOKIE), accept_language=request.headers.get("accept-language")
    )
    t = load_catalogue(chosen)
    headers = {"Content-Language": chosen, "Vary": "Accept-Language, Cookie"}
    try:
        check_job_id(job_id)  # before the thread pool: a 60 KB id is refused without asking the store
        overview = await run_in_threadpool(visible_overview, request, job_id)
    except InputError as err:
        return HTMLResponse(_not_found(t, _shown_id(job_id), str(err)), status_code=404, headers=headers)
    alerts = await run_in_threadpool(alerts_of, state, overview)
    # In the pool too: 1,536 GPU rows take ~50 ms to render, which the event loop would take from every stream.
    html = await run_in_threadpool(
        render_job_page, overview, t, source=state.prometheus_label, alerts=alerts, every_row=rows == "all"
    )
    return HTMLResponse(html, headers=headers)


@router.get(
    "/api/job/{job_id:path}", summary="One job's page: report per GPU, IB, Lustre, steps, goodput, findings, series"
)
async def job_api(request: Request, job_id: str) -> dict[str, Any]:
    """``job`` is ``hpcwatch job ID --json``, ``goodput`` ``hpcwatch goodput``'s report, ``steps`` the last
    steps (median per phase and rank, straggler), ``findings`` the findings that concern the job, ``series``
    the charts over its life (``reports.jobseries.series_dict``: at most 120 buckets, null for a gap),
    ``missing`` the parts the store cannot answer and why. 400 when the store knows nothing of the job, or when the id is
    longer than any (``reports.jobs.MAX_JOB_ID_CHARS``; the error names its length, not its text)."""
    check_job_id(job_id)
    state = request.app.state.hpcwatch
    overview = await run_in_threadpool(visible_overview, request, job_id)
    return {**overview_dict(overview), "alerts": await run_in_threadpool(alerts_of, state, overview)}
