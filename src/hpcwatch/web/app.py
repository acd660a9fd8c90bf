"""The web app: one page (schematic, cards, modes, step player, simulator) over a store.

``create_app(store, cluster)`` is all a caller needs; ``hpcwatch demo`` passes a
store the twin fills live, ``hpcwatch serve`` an existing store. The page is
rendered on the server (Jinja2, the SVG from ``svg.py``) so it paints before
any script runs; small ES modules in ``static/`` then subscribe to
``/api/stream`` and change text in place. Nothing is fetched from outside the
machine: plotly.js is served from the installed ``plotly`` package, and the
Swagger UI (which loads from a CDN) is switched off; ``/openapi.json`` stays.
Every route is guarded by ``web/access.py`` (its permissions in ``ROUTE_NEEDS``); the one seam identity
plugs into is ``web.access.current_principal``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import orjson
from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool

from hpcwatch.access.deployment import Access
from hpcwatch.access.policy import Policy
from hpcwatch.access.principal import principal_of
from hpcwatch.access.scope import Scope
from hpcwatch.errors import BackendError, ConfigError, HpcwatchError, InputError, StoreError
from hpcwatch.httpguard import DEFAULT_LIMITS, SECURITY_HEADERS, Limits
from hpcwatch.model.cluster import Cluster
from hpcwatch.promql import safe_url
from hpcwatch.records import PHASES
from hpcwatch.reports.jobpage import OverviewCache
from hpcwatch.reports.live import STALE_AFTER_S
from hpcwatch.reports.livesamples import PromSamples
from hpcwatch.reports.scoped import scoped_live
from hpcwatch.store import Store
from hpcwatch.web import api, audit, decider, history, jobpage
from hpcwatch.web.access import Audit, OwnersCache, check_routes, guard, scope_of
from hpcwatch.web.assets import AssetFiles, asset_version, module_graph
from hpcwatch.web.guard import Guard, GuardSettings
from hpcwatch.web.i18n import LANG_COOKIE, LANGUAGES, load_catalogue, negotiate
from hpcwatch.web.live import PROBLEMS_INTERVAL_S, LiveView
from hpcwatch.web.svg import render_schematic

__all__ = ["create_app", "AppState", "script_json", "PLOTLY_JS"]

log = logging.getLogger(__name__)

#: Inside the plotly wheel: https://github.com/plotly/plotly.py (package_data/plotly.min.js).
PLOTLY_JS = "package_data/plotly.min.js"


@dataclass(slots=True, kw_only=True)
class AppState:
    """What every route reads; one per app."""

    store: Store
    cluster: Cluster
    live: LiveView
    step_jobs: Mapping[str, str] = field(default_factory=dict)
    """Step player sources, e.g. ``{"baseline": job, "straggler": job}``; empty: every job with spans."""
    stream_interval_s: float = api.STREAM_INTERVAL_S
    stopping: threading.Event = field(default_factory=threading.Event)
    """Set (from any thread) to end every open SSE stream within a tick: server shutdown."""
    svg_cache: dict[str, str] = field(default_factory=dict)
    """The schematic's SVG per language, drawn once (``schematic_svg``)."""
    svg_lock: threading.Lock = field(default_factory=threading.Lock)
    prometheus: Any | None = None
    """``hpcwatch serve --prometheus``: the ``PrometheusBackend`` samples are read from (None: the store)."""
    prometheus_label: str | None = None
    """That Prometheus as the page names it (its URL without credentials)."""
    guard: GuardSettings = field(default_factory=GuardSettings)
    """Headers, Host allow-list, body and stream caps (web/guard.py); ``serve_app`` sets the hosts."""
    gpu_hour_price: float | None = None
    """The price of a GPU-hour the job page's cost is computed at (None: no cost shown)."""
    currency: str = ""
    alert_watch: Any | None = None
    """``hpcwatch serve --alertmanager``: the ``alertmanager.AlertWatch`` the alerts panel reads (None: the
    store's health verdicts only)."""
    access: Access = field(default_factory=Access)
    """The roles policy, its pseudonym key and coordinators (``access.deployment``): each request's scope."""
    owners: OwnersCache | None = None
    audit: Audit | None = None
    overviews: OverviewCache = field(default_factory=OverviewCache)
    """The job pages' overviews while the store does not change (``reports.jobpage.OverviewCache``)."""
    pages: Any | None = None
    """A ``web.pageprocess.PageProcess`` the job pages' overviews are computed in (None: in this process)."""


def create_app(
    store: Store,
    cluster: Cluster,
    *,
    step_jobs: Mapping[str, str] | None = None,
    stream_interval_s: float = api.STREAM_INTERVAL_S,
    prometheus: Any | None = None,
    limits: Limits = DEFAULT_LIMITS,
    gpu_hour_price: float | None = None,
    currency: str = "",
    alert_watch: Any | None = None,
    identity: Any | None = None,
    secure_cookies: bool = False,
    policy: Policy | None = None,
    pages: Any | None = None,
    problems_every_s: float = PROBLEMS_INTERVAL_S,
) -> FastAPI:
    """The app over ``store``; with ``prometheus`` (a ``PrometheusBackend``) the live samples and the job
    page's samples are read from it, and Slurm, steps, events and findings still from the store.
    Every response carries hpcwatch.httpguard's security headers; ``limits`` caps bodies and SSE streams.
    With ``identity`` (an ``access.identity.Identity``, from ``--auth``) every request needs a login, a token
    or a trusted proxy's header (web/auth.py); ``secure_cookies`` when the server speaks TLS.
    Every route is guarded (``web/access.py``): ``policy`` (default: the built-in roles) filters what each
    principal sees; with no authentication configured every request is ``LOCAL`` and sees everything.
    Identity sets ``request.state.principal``; a test overrides ``web.access.current_principal``.
    ``pages``: a started ``web.pageprocess.PageProcess`` over the store's folder, which the job pages'
    overviews are computed in (the caller stops it); None: in this process. ``problems_every_s``: the problems
    are judged at most this often (``web.live.ProblemJudge``; the demo: each node's scrape period)."""
    app = FastAPI(
        dependencies=[Depends(guard)],
        title="hpcwatch",
        version="0.1.0",
        docs_url=None,
        redoc_url=None,
        description="Live view of an AI training cluster: schematic, cards, steps, threats.",
    )
    step_jobs = dict(step_jobs or {})
    samples = None if prometheus is None else PromSamples(prometheus, store)
    live = LiveView(store, cluster, exclude_jobs=step_jobs.values(), samples=samples, problems_every_s=problems_every_s)
    app.state.hpcwatch = AppState(
        store=store,
        cluster=cluster,
        live=live,
        step_jobs=step_jobs,
        stream_interval_s=stream_interval_s,
        prometheus=prometheus,
        prometheus_label=None if prometheus is None else f"Prometheus {safe_url(prometheus.config.url)}",
        guard=GuardSettings(limits=limits, stream_paths=frozenset({"/api/stream"})),
        gpu_hour_price=gpu_hour_price,
        currency=currency,
        alert_watch=alert_watch,
        access=Access.of(policy, store_path=store.config.path),
        owners=OwnersCache(store),
        audit=Audit(store),
        pages=pages,
    )
    if identity is not None:
        from hpcwatch.web.auth import install_auth

        install_auth(app, identity, secure=secure_cookies)
    app.add_middleware(Guard, settings=app.state.hpcwatch.guard)  # added last: outermost, before who is asking
    app.include_router(api.router)
    app.include_router(jobpage.router)
    app.include_router(history.router)
    app.include_router(decider.router)
    app.include_router(audit.router)
    app.mount("/static", AssetFiles(), name="static")
    _add_pages(app)
    _add_error_handlers(app)
    check_routes(app)
    return app


def _add_pages(app: FastAPI) -> None:
    env = Environment(loader=PackageLoader("hpcwatch.web", "templates"), autoescape=select_autoescape(["html"]))
    template = env.get_template("index.html")

    @app.get("/", response_class=HTMLResponse, summary="The page", include_in_schema=False)
    async def index(request: Request, lang: str | None = Query(None)) -> HTMLResponse:
        state: AppState = request.app.state.hpcwatch
        chosen = negotiate(
            forced=lang, cookie=request.cookies.get(LANG_COOKIE), accept_language=request.headers.get("accept-language")
        )
        who = principal_of(request)
        account = who.name if who.via != "local" else ""  # --auth: who is logged in, a link to logout
        scope = scope_of(request)
        html = await run_in_threadpool(lambda: _render(template, state, chosen, scope, account))
        response = HTMLResponse(html, headers={"Content-Language": chosen, "Vary": "Accept-Language, Cookie"})
        if lang in LANGUAGES:
            response.set_cookie(LANG_COOKIE, lang, max_age=365 * 86400, samesite="lax", httponly=True)
        return response

    @app.get("/healthz", summary="Liveness: the store answers")
    async def healthz(request: Request) -> dict[str, Any]:
        state: AppState = request.app.state.hpcwatch
        latest = await run_in_threadpool(state.live.latest_t)
        return {
            "ok": True,
            "latest_sample_t": latest,
            "nodes": len(state.cluster.nodes),
            "gpus": len(state.cluster.gpus),
        }

    @app.get("/assess", response_class=HTMLResponse, include_in_schema=False)
    async def assess_page(request: Request) -> HTMLResponse:
        from hpcwatch.web.assess_html import render_assessment_html

        doc = await run_in_threadpool(api.scoped_assessment_doc, request.app.state.hpcwatch, scope_of(request))
        return HTMLResponse(render_assessment_html(doc, served=True))

    @app.get("/vendor/plotly.min.js", include_in_schema=False)
    async def plotly_js() -> Response:
        path = resources.files("plotly").joinpath(PLOTLY_JS)
        if not path.is_file():
            return JSONResponse({"error": "plotly.min.js not found in the installed plotly package"}, 404)
        return FileResponse(str(path), media_type="text/javascript", headers={"Cache-Control": "public, max-age=86400"})


def schematic_svg(state: AppState, lang: str) -> str:
    """The cluster's schematic in ``lang``, drawn by the first caller (others wait for it, not draw it again:
    3.3 MB and seconds of work at 1,024 nodes)."""
    with state.svg_lock:
        if lang not in state.svg_cache:
            state.svg_cache[lang] = render_schematic(state.cluster, load_catalogue(lang))
        return state.svg_cache[lang]


def warm(app: FastAPI) -> None:
    """What the first page load would otherwise wait for, done before it comes: the schematic in every
    language, the job page's template and the first live snapshot (its first judgement of the problems
    included). A server calls it in a thread of its own once it listens (``web.demo.serve_app``); a failure
    is logged, and the first request meets it again."""
    state: AppState = app.state.hpcwatch
    try:
        for lang in LANGUAGES:
            schematic_svg(state, lang)
        jobpage.warm()
        state.live.snapshot()
    except Exception:
        log.exception("warming the page up failed")


def _render(template: Any, state: AppState, lang: str, scope: Scope, account: str = "") -> str:
    t = load_catalogue(lang)
    svg = schematic_svg(state, lang)
    resume: str | None = None
    if scope.everything:
        # The stream's own document and its version: the page's stream starts after it (api.stream's since).
        snapshot, resume = state.live.stream_boot(), state.live.epoch
    else:
        snapshot = state.live.snapshot()
        if state.owners is not None:
            snapshot = scoped_live(snapshot, scope, state.owners.get())
    sources = api.step_sources_for(state, lang, scope)
    boot = {
        "stream": "/api/stream",
        "resume": resume,
        "live": snapshot,
        "step_sources": [s.model_dump() for s in sources],
        "phases": list(PHASES),
        "gpus": [g.id for g in state.cluster.gpus],
    }
    return template.render(
        t=t,
        lang=lang,
        languages=LANGUAGES,
        cluster=state.cluster,
        gpu_count=len(state.cluster.gpus),
        svg=Markup(svg),
        cards=t.cards,
        snapshot=snapshot,
        step_sources=sources,
        phases=PHASES,
        static=f"/static/{asset_version()}",
        modules=module_graph(),
        root="",
        stale_after_s=STALE_AFTER_S,
        data_source=_source_text(state, t),
        catalogue_json=script_json(t.page_document()),
        boot_json=script_json(boot),
        account=account,
    )


def _source_text(state: AppState, t: Any) -> str:
    """Where the page's data comes from, in its language."""
    path = str(state.store.config.path)
    if state.prometheus is not None:
        return t("datasource.prometheus").format(url=safe_url(state.prometheus.config.url), path=path)
    return t("datasource.demo") if path == ":memory:" else t("datasource.store").format(path=path)


def script_json(document: Any) -> Markup:
    """JSON safe inside ``<script type="application/json">``: no ``<``, ``>`` or ``&`` can end the element."""
    text = orjson.dumps(document, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return Markup(text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _add_error_handlers(app: FastAPI) -> None:
    # A PromQL backend that does not answer is a bad gateway (RFC 9110 §15.6.3), not our crash.
    statuses = ((InputError, 400), (ConfigError, 400), (StoreError, 503), (BackendError, 502))

    @app.exception_handler(HpcwatchError)
    async def hpcwatch_error(request: Request, err: HpcwatchError) -> JSONResponse:
        status = next((code for kind, code in statuses if isinstance(err, kind)), 500)
        return JSONResponse({"error": str(err), "type": type(err).__name__}, status_code=status)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, err: Exception) -> JSONResponse:
        log.exception("unexpected error on %s", request.url.path)
        # Answered outside the guard's middleware (Starlette's outermost layer): its headers added here.
        return JSONResponse(
            {"error": "internal error", "type": type(err).__name__}, status_code=500, headers=dict(SECURITY_HEADERS)
        )
