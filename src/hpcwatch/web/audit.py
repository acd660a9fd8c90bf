"""The audit trail, for the security role only (``web/access.py``): ``GET /api/audit`` (JSON) and
``GET /audit`` (the panel, FR/EN): who opened which job and which finding, who acted, who undid, who logged in;
a thin adapter over ``reports.audit.audit_trail``."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from starlette.concurrency import run_in_threadpool

from hpcwatch.reports.audit import audit_trail
from hpcwatch.web.i18n import LANG_COOKIE, load_catalogue, negotiate

__all__ = ["router", "DEFAULT_WINDOW_S"]

router = APIRouter()
DEFAULT_WINDOW_S = 86_400.0
_WINDOW = Query(DEFAULT_WINDOW_S, gt=0, le=366 * 86400, description="seconds before t1")
_T1 = Query(None, description="end of the window, UTC seconds (default: now)")


@router.get("/api/audit", summary="Audit trail: who opened which job and finding, who acted (security role)")
async def audit_api(request: Request, window_s: float = _WINDOW, t1: float | None = _T1) -> dict[str, Any]:
    end = time.time() if t1 is None else t1
    rows = await run_in_threadpool(lambda: audit_trail(request.app.state.hpcwatch.store, t0=end - window_s, t1=end))
    return {"t0": end - window_s, "t1": end, "entries": rows}


@router.get("/audit", response_class=HTMLResponse, include_in_schema=False)
async def audit_page(request: Request, window_s: float = _WINDOW, lang: str | None = Query(None)) -> HTMLResponse:
    from hpcwatch.web.jobpage import _ENV

    chosen = negotiate(
        forced=lang, cookie=request.cookies.get(LANG_COOKIE), accept_language=request.headers.get("accept-language")
    )
    end = time.time()
    rows = await run_in_threadpool(lambda: audit_trail(request.app.state.hpcwatch.store, t0=end - window_s, t1=end))
    html = _ENV.get_template("audit.html").render(
        t=load_catalogue(chosen), lang=chosen, rows=rows, hours=round(window_s / 3600, 1)
    )
    return HTMLResponse(html, headers={"Content-Language": chosen})
