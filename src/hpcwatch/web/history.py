"""``GET /api/history``: the last minutes of a GPU or a node, for the card's sparklines and time range.

A thin adapter over ``hpcwatch.reports.history.element_history``; the samples come from the
app's samples source (the store, or the PromQL backend of ``serve --prometheus``: both
answer ``samples()`` with the same table), ending at the live snapshot's "now".
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from starlette.concurrency import run_in_threadpool

from hpcwatch.reports.history import DEFAULT_POINTS, HISTORY_RANGES_S, element_history

__all__ = ["router", "history_doc"]

router = APIRouter(prefix="/api")


def _source(state: Any) -> Any:
    """What answers ``samples()``: a PromQL backend when the app has one (``serve --prometheus``), else the store."""
    return state.prometheus if state.prometheus is not None else state.store


def history_doc(state: Any, el: str, range_s: float) -> dict[str, Any]:
    kind, _, ident = el.partition(":")
    if kind == "gpu" and "/" in ident:
        host, gpu = ident.rsplit("/", 1)
    elif kind == "node" and ident:
        host, gpu = ident, None
    else:
        raise HTTPException(400, f"el must be gpu:NODE/INDEX or node:NODE, got {el!r}")
    if host not in {n.name for n in state.cluster.nodes}:
        raise HTTPException(404, f"no node {host!r} in the cluster model")
    now = state.live.snapshot()["t"]
    if now is None:
        return {"el": el, "t0": None, "t1": None, "step_s": None, "series": []}
    doc = dataclasses.asdict(
        element_history(_source(state), host=host, gpu=gpu, t1=now, range_s=range_s, points=DEFAULT_POINTS)
    )
    return {"el": el, **doc}


@router.get("/history", summary="Last minutes of a GPU or node (utilisation, power, temperature)")
async def history(
    request: Request,
    el: str = Query(..., description="gpu:node1/2 or node:node1"),
    range_s: float = Query(HISTORY_RANGES_S[0], gt=0, le=86400, description="seconds before the newest sample"),
) -> dict[str, Any]:
    """``series``: one per field (``util_pct``, ``power_w``, ``temp_c``), ``values`` one per bucket of
    ``step_s`` seconds from ``t0`` (None: no sample in it); a node's power is the sum of its GPUs'."""
    return await run_in_threadpool(history_doc, request.app.state.hpcwatch, el, range_s)
