"""``GET /api/decider``: the Decider mode's figures per account over time (``reports.decider``), as the
request's scope may read them (``reports.scoped.scoped_decider``: a decider reads account pseudonyms).

A thin adapter: the window and bucket come from the query, the price and currency from the app
(``serve --gpu-hour-price``); the store's own clock ends the window.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from hpcwatch.access.scope import Scope
from hpcwatch.errors import InputError
from hpcwatch.reports.decider import DAY_S, DEFAULT_WINDOW_S, MIN_BUCKET_S, decider_dict, decider_report
from hpcwatch.reports.scoped import scoped_decider
from hpcwatch.web.access import scope_of

__all__ = ["router", "decider_doc", "MAX_WINDOW_S"]

router = APIRouter(prefix="/api")

#: The longest window a request may ask for: a year of daily buckets is within ``reports.decider.MAX_BUCKETS``.
MAX_WINDOW_S = 366 * DAY_S


def decider_doc(state: Any, scope: Scope, *, window_s: float, bucket_s: float | None) -> dict[str, Any]:
    """The report's JSON for ``scope``; a store with nothing in it yet answers no account and says why (the
    page of a demo that just started is not an error)."""
    try:
        report = decider_report(
            state.store,
            window_s=window_s,
            bucket_s=bucket_s,
            price_per_gpu_hour=state.gpu_hour_price,
            currency=state.currency,
        )
    except InputError as err:
        return {"accounts": [], "tiers": [], "edges": [], "missing": {"accounts": str(err)}}
    return decider_dict(scoped_decider(report, scope))


@router.get("/decider", summary="Per account over time: GPU-hours, utilisation, goodput, MFU, cost, energy, tier")
async def decider(
    request: Request,
    window_s: float = Query(DEFAULT_WINDOW_S, gt=0, le=MAX_WINDOW_S, description="seconds before the newest sample"),
    bucket_s: float | None = Query(
        None, ge=MIN_BUCKET_S, description="bucket length in seconds (default: an hour up to 2 days, else a day)"
    ),
) -> dict[str, Any]:
    """``accounts``: each with ``total`` (the window) and ``buckets`` (aligned on ``edges``); every figure is
    None with its reason in ``missing`` when the store cannot give it. ``tiers``: each stored assessment."""
    return await run_in_threadpool(
        lambda: decider_doc(request.app.state.hpcwatch, scope_of(request), window_s=window_s, bucket_s=bucket_s)
    )
