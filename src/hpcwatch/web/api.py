"""The JSON API and the live stream: thin adapters over the store, the live view and the analyses.

Routes (all documented in ``/openapi.json``):

- ``GET /api/live``            the current snapshot (GPUs, nodes, queue, storage, collectors, vectors, problems,
                                 alerts (problems grouped, worst first), job_gpus, age_s, stale_after_s; each GPU's
                                 ``state``, node_states, events and node_events, the queue's ``requeued``:
                                 reports/live.py apply_states, reports/timeline.py)
- ``GET /api/stream``          the same snapshot pushed as Server-Sent Events, 1 Hz: ``event: live`` (whole, with
                                 its version ``v``) on connect and after a missed version, else ``event: delta``
                                 (what changed since ``base``: web/livedelta.py)
- ``GET /api/model``           the cluster model: nodes and GPU ids
- ``GET /api/steps/sources``   which jobs the step player can play ("with / without straggler")
- ``GET /api/steps``           one training step of one job, per rank and phase, from ``store.spans(job)``
- ``GET /api/findings``        findings of one vector (or all), titled in the request's language too
- ``GET /api/stragglersim``    efficiency against GPU count (hpcwatch.analysis.stragglersim)

What each route returns is filtered by the request's scope (``web/access.py`` guards the route;
``reports/scoped.py`` filters the result): a user reads their jobs, a decider pseudonyms.

Errors never take the server down: an ``HpcwatchError`` becomes a JSON error
response (app.py), a stream that fails sends ``event: problem`` and carries on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from hpcwatch.access.scope import FULL, Scope
from hpcwatch.errors import HpcwatchError, InputError
from hpcwatch.records import VECTORS
from hpcwatch.reports.assess import assessment_document, assessment_report, latest_assessment
from hpcwatch.reports.findings import recent_findings
from hpcwatch.reports.scoped import job_visible, scoped_findings, scoped_live, scoped_text
from hpcwatch.reports.steps import PLAYER_JOBS_LISTED, PLAYER_RANKS, player_jobs, player_step
from hpcwatch.vocab import EventKind
from hpcwatch.web.access import scope_of
from hpcwatch.web.live import LiveView, StreamFrames

__all__ = [
    "router",
    "STREAM_INTERVAL_S",
    "SIM_GPU_COUNTS",
    "StepSource",
    "StepDoc",
    "StragglerVerdict",
    "ORJSONResponse",
]

#: Live values are pushed once a second (the brief's 1 Hz).
STREAM_INTERVAL_S = 1.0
#: How often a viewer's stream looks for a new version, per tick (web/live.py: a missed version costs a full frame).
STREAM_LOOKS_PER_TICK = 4
#: GPU counts the simulator evaluates: 8 to 100k, roughly ×2 apart.
SIM_GPU_COUNTS: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 100_000)

router = APIRouter(prefix="/api")
log = logging.getLogger(__name__)


class ORJSONResponse(Response):
    """JSON via orjson (numpy scalars, non-string keys), without FastAPI's deprecated helper."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS, default=str)


class StepSource(BaseModel):
    key: str = Field(description="'baseline', 'straggler' or the job id")
    job: str = Field(description="Job id whose spans are played")
    label: str = Field(description="Text shown on the button, in the request's language")
    kind: str = Field(default="live", description="'example' (the recorded guided pair) or 'live' (a job of the store)")


class PhaseTiming(BaseModel):
    phase: str
    start_s: float = Field(description="Seconds from the start of the step (earliest span of any rank)")
    dur_s: float


class RankStep(BaseModel):
    rank: int
    node: str | None = None
    gpu: int | None = None
    phases: list[PhaseTiming]


class StragglerVerdict(BaseModel):
    rank: int
    node: str | None = None
    gpu: int | None = None
    phase: str = Field(description="The work phase in which it is slow")
    phase_s: float = Field(description="Its duration of that phase in this step")
    excess_s: float = Field(description="Median extra work per step over the median rank (recent steps)")
    score: float = Field(description="Relative score: the fastest rank's work / its work (1 = fastest)")
    others_wait_s: float = Field(description="Mean barrier wait of the other ranks in this step")


class StepDoc(BaseModel):
    job: str
    step: int
    steps: list[int] = Field(description="[first, last] step numbers with spans for this job")
    step_time_s: float = Field(description="The step's time: the slowest rank's (hpcwatch.analysis.steps)")
    ranks: list[RankStep]
    straggler: StragglerVerdict | None = Field(
        None,
        description="The straggler of the job's recent steps, "
        "decided by the server (hpcwatch.analysis.stragglers); null: none",
    )
    max_wait_s: float = Field(0.0, description="Longest barrier wait of this step, the straggler's excluded")
    reference_rank: int = Field(0, description="A rank that is not the straggler (the readout follows it)")
    ranks_total: int = Field(
        0,
        description="The step's ranks; `ranks` holds at most `?ranks=` of them: the straggler, the reference "
        "rank and those that worked longest",
    )


class SimPoint(BaseModel):
    gpus: int
    efficiency: float = Field(description="0..1")


class SimDoc(BaseModel):
    cv: float
    p_slow: float
    slow_factor: float
    points: list[SimPoint]


def _state(request: Request) -> Any:
    return request.app.state.hpcwatch


def live_doc(state: Any, scope: Scope) -> dict[str, Any]:
    """The live snapshot as ``scope`` may read it (``reports.scoped.scoped_live``)."""
    doc: dict[str, Any] = state.live.snapshot()
    return doc if scope.everything else scoped_live(doc, scope, state.owners.get())


_SCOPED_FRAMES: dict[Scope, tuple[dict[str, Any], bytes]] = {}
_MAX_SCOPED_FRAMES = 512


def scoped_frame(state: Any, scope: Scope) -> bytes:
    """The SSE frame of ``scope``'s view of the current snapshot, filtered and encoded once per snapshot
    and scope (ten tabs of one user cost one filtering a second, not ten)."""
    doc = state.live.snapshot()
    cached = _SCOPED_FRAMES.get(scope)
    if cached is not None and cached[0] is doc:  # the snapshot is kept alive by the entry: its id is not reused
        return cached[1]
    frame = b"event: live\ndata: " + orjson.dumps(scoped_live(doc, scope, state.owners.get()), default=str) + b"\n\n"
    if len(_SCOPED_FRAMES) >= _MAX_SCOPED_FRAMES:
        _SCOPED_FRAMES.clear()
    _SCOPED_FRAMES[scope] = (doc, frame)
    return frame


def assessment_doc(state: Any) -> dict[str, Any]:
    """``hpcwatch assess --json`` of the app's store and cluster (the Decider mode's tier, the report page)."""
    from hpcwatch.assess import AssessConfig

    return assessment_document(assessment_report(state.store, AssessConfig(cluster=state.cluster)))


@router.get("/assess", summary="ClusterMAX-style assessment: tier, categories, criteria", response_class=ORJSONResponse)
async def assess(request: Request) -> ORJSONResponse:
    return ORJSONResponse(await run_in_threadpool(scoped_assessment_doc, _state(request), scope_of(request)))


def scoped_assessment_doc(state: Any, scope: Scope) -> Any:
    """``assessment_doc`` with the jobs and people its evidence names hidden from ``scope``
    (``reports.scoped.scoped_text``: a decider reads pseudonyms)."""
    doc = assessment_doc(state)
    return doc if scope.everything else scoped_text(doc, scope, state.owners.get())


@router.get(
    "/assess/latest",
    summary='The newest stored assessment verdict (hpcwatch collect\'s task = "assess"), '
    "null when none: read, not recomputed",
    response_class=ORJSONResponse,
)
async def assess_latest(request: Request) -> ORJSONResponse:
    state, scope = _state(request), scope_of(request)
    latest = await run_in_threadpool(latest_assessment, state.store)
    doc = latest.to_dict() if latest is not None else None
    return ORJSONResponse(doc if scope.everything else scoped_text(doc, scope, state.owners.get()))


@router.get("/live", summary="Current live snapshot", response_class=ORJSONResponse)
async def live(request: Request) -> ORJSONResponse:
    """Latest values per GPU (``util_pct``, ``power_w``, ``mem_used_bytes``, ``temp_c``, ``job``, ``user``,
    ``account``), InfiniBand bytes/s per node, the Slurm queue (each job's ``restarts``: times Slurm requeued it),
    Lustre bytes/s per job, whether each
    collector's data is arriving, and findings per threat vector. Times are UTC seconds of the data."""
    scope = scope_of(request)
    doc = await run_in_threadpool(live_doc, _state(request), scope)
    return ORJSONResponse(doc)


@router.get(
    "/stream",
    summary="Live snapshot as Server-Sent Events, 1 Hz",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def stream(request: Request) -> StreamingResponse:
    """``event: live`` with the ``/api/live`` document (and its version ``v``) on connect, then every second
    ``event: delta`` (``v``, ``base``, the GPU and node fields that changed, ``set``: the other keys that changed;
    ``null``: gone), or ``event: live`` again when a version was missed; ``event: problem`` if the store fails.
    ``since``: the token of the version the viewer holds (the page's boot document carries it): the stream
    then starts with the delta from it, or with nothing until the next version."""
    return StreamingResponse(
        _events(request),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _events(request: Request) -> AsyncIterator[bytes]:
    state = _state(request)
    scope = scope_of(request)
    yield b"retry: 2000\n\n"
    # The version this viewer holds: the one its page booted from (web/app.py), else none yet.
    last = state.live.resumed_version(request.query_params.get("since")) if scope.everything else None
    last_scoped: bytes | None = None  # or, for a filtered scope, the frame it got last
    tick = state.stream_interval_s
    while not state.stopping.is_set():
        if await request.is_disconnected():
            break
        try:
            # Every viewer of the whole cluster: a new version once a tick, encoded once (web/live.py); each looks
            # 4 times a tick, so it sends every version (a delta) rather than missing one (then a full frame).
            # A filtered scope gets a full frame of its own, encoded once per snapshot and scope, when it changes.
            if scope.everything:
                frames = await next_frames(state.live, tick)
                frame = frames.for_viewer(last)
                last = frames.version
            else:
                scoped = await run_in_threadpool(scoped_frame, state, scope)
                frame, last_scoped = (scoped if scoped is not last_scoped else None), scoped
            if frame is not None:
                yield frame
        except HpcwatchError as err:
            yield b"event: problem\ndata: " + orjson.dumps({"error": str(err)}) + b"\n\n"
            last = last_scoped = None  # a full frame after the store answers again
            await asyncio.sleep(tick)
        except Exception as err:
            log.exception("live snapshot failed")
            yield b"event: problem\ndata: " + orjson.dumps({"error": type(err).__name__}) + b"\n\n"
            last = last_scoped = None
            await asyncio.sleep(tick)
        await asyncio.sleep(tick / STREAM_LOOKS_PER_TICK)


async def next_frames(live: LiveView, tick: float) -> StreamFrames:
    """The stream's newest frames (``LiveView.fresh_stream_frames``), computed in a thread by the one viewer
    sent to. A viewer that leaves before its thread ran (cancelled while waiting for one) hands the turn back:
    kept, it froze every viewer's stream on the last version (seen on a loaded machine, a closed page)."""
    frames = live.fresh_stream_frames(tick)
    if frames is not None:
        return frames
    try:
        return await run_in_threadpool(live.stream_frames, tick)
    except BaseException:
        live.drop_request()
        raise


@router.get("/model", summary="The cluster model")
async def model(request: Request) -> dict[str, Any]:
    cluster = _state(request).cluster
    return {
        "name": cluster.name,
        "nodes": [
            {
                "name": n.name,
                "gpus": [g.id for g in n.gpus],
                "hcas": n.hcas,
                "model": n.gpus[0].spec.name if n.gpus else None,
            }
            for n in cluster.nodes
        ],
        "fabric": {"kind": cluster.fabric.kind, "link": cluster.fabric.link.name},
        "storage": {"kind": cluster.storage.kind, "mount": cluster.storage.mount},
        "scheduler": {"kind": cluster.scheduler.kind, "version": cluster.scheduler.version},
        "stack": {"framework": cluster.stack.framework, "communication": cluster.stack.communication},
        "weights": {"path": cluster.weights.path},
    }


@router.get("/steps/sources", summary="Jobs the step player can play", response_model=list[StepSource])
async def step_sources(request: Request, lang: str = Query("en", pattern="^(en|fr)$")) -> list[StepSource]:
    scope = scope_of(request)
    return await run_in_threadpool(lambda: step_sources_for(_state(request), lang, scope))


def step_sources_for(state: Any, lang: str, scope: Scope = FULL) -> list[StepSource]:
    """The configured pair first (demo: the recorded steps without and with straggler, named for people),
    then the jobs of the store with spans, most recent first, each labelled with its id and Slurm name;
    only the jobs ``scope`` may open."""
    from hpcwatch.web.i18n import load_catalogue

    t = load_catalogue(lang)
    examples = [
        StepSource(key=key, job=job, label=t(f"player.{key}"), kind="example") for key, job in state.step_jobs.items()
    ]
    paired = set(state.step_jobs.values())
    live = [
        StepSource(key=job, job=job, label=_job_label(state.store, job))
        for job in player_jobs(state.store, limit=PLAYER_JOBS_LISTED + len(paired))
        if job not in paired
    ]
    shown = examples + live[:PLAYER_JOBS_LISTED]
    return shown if scope.everything else [s for s in shown if job_visible(state.store, s.job, scope)]


def _job_label(store: Any, job_id: str) -> str:
    """``4101 · llama-70b (alice)`` when the store knows the job, else its id."""
    record = store.job(job_id)
    if record is None or not (record.name or record.user):
        return job_id
    return f"{job_id} · {record.name or ''}{f' ({record.user})' if record.user else ''}".replace("·  (", "· (")


@router.get("/steps", summary="One training step per rank and phase", response_model=StepDoc)
async def steps(
    request: Request,
    job: str = Query(..., max_length=200),
    step: int | None = Query(None, ge=0),
    ranks: int = Query(PLAYER_RANKS, ge=0, le=1_000_000, description="Ranks drawn at most (0: all)"),
) -> StepDoc:
    """Phases of ``records.PHASES`` only; ``step`` defaults to the last complete step of the job. ``straggler``
    is the server's verdict (``hpcwatch.reports.steps.player_step``): the page only draws it. A job the
    principal may not open answers 404, as an unknown one does."""
    state, scope = _state(request), scope_of(request)
    if not await run_in_threadpool(job_visible, state.store, job, scope):
        raise HTTPException(status_code=404, detail="no such job")
    await run_in_threadpool(state.audit.opened, request, EventKind.ACCESS_JOB, job)
    return await run_in_threadpool(lambda: step_doc(state.store, job, step, ranks=ranks))


def step_doc(store: Any, job: str, step: int | None, *, ranks: int = PLAYER_RANKS) -> StepDoc:
    try:
        found = player_step(store, job, step, ranks_shown=ranks)
    except InputError as err:
        raise HTTPException(status_code=404, detail=str(err)) from err
    doc = dataclasses.asdict(found)
    doc["steps"] = list(found.steps)
    return StepDoc.model_validate(doc)


def alerts_doc(state: Any, *, since: float | None = None) -> dict[str, Any]:
    """``reports.alerting.alert_history`` over the app's store (its verdicts since ``since``, default the last
    ``LOOKBACK_S``) and its Alertmanager watch, if any."""
    from hpcwatch.reports.alerting import LOOKBACK_S, alert_history

    watch = state.alert_watch.snapshot() if state.alert_watch is not None else None
    return alert_history(state.store, watch=watch, since=since if since is not None else time.time() - LOOKBACK_S)


@router.get("/alerts", summary="Alerts firing and resolved (Alertmanager, the store's health verdicts)")
async def alerts(request: Request) -> ORJSONResponse:
    doc = await run_in_threadpool(alerts_doc, _state(request))
    return ORJSONResponse(doc)


@router.get("/findings", summary="Findings of one threat vector, or all", response_class=ORJSONResponse)
async def findings(
    request: Request, vector: str | None = Query(None), lang: str | None = Query(None, pattern="^(en|fr)$")
) -> ORJSONResponse:
    """Each finding as stored (``title`` is the detector's, in English) plus ``text``: its title in ``lang``
    (default: the request's language, as the page negotiates it) from the catalogue's template for its rule."""
    if vector is not None and vector not in VECTORS:
        raise HTTPException(status_code=422, detail=f"unknown vector {vector!r} (known: {', '.join(VECTORS)})")
    from hpcwatch.web.i18n import LANG_COOKIE, finding_text, negotiate

    lang = negotiate(
        forced=lang, cookie=request.cookies.get(LANG_COOKIE), accept_language=request.headers.get("accept-language")
    )
    state, scope = _state(request), scope_of(request)
    await run_in_threadpool(state.audit.opened, request, EventKind.ACCESS_FINDING, vector or "*")
    found = await run_in_threadpool(lambda: scoped_findings(recent_findings(state.store, vector), scope))
    return ORJSONResponse(
        [
            dataclasses.asdict(f)
            | {
                "evidence": dict(f.evidence),
                "lang": lang,
                "text": finding_text(f.rule, f.evidence, target=f.target, t=f.t, lang=lang) or f.title,
            }
            for f in found
        ]
    )


@router.get(
    "/stragglersim",
    summary="Straggler simulator: efficiency against GPU count",
    response_model=SimDoc,
    responses={503: {"description": "the simulator module is not installed in this build"}},
)
async def stragglersim(
    cv: float = Query(0.05, ge=0.0, le=1.0),
    p_slow: float = Query(0.001, ge=0.0, le=1.0),
    slow_factor: float = Query(2.0, ge=1.0, le=100.0),
) -> SimDoc:
    """Calls ``hpcwatch.analysis.stragglersim.efficiency_curve`` for 8 … 100,000 GPUs."""
    try:
        module = importlib.import_module("hpcwatch.analysis.stragglersim")
        curve = module.efficiency_curve
    except (ImportError, AttributeError) as err:
        raise HTTPException(status_code=503, detail=f"straggler simulator unavailable: {err}") from err
    result = await run_in_threadpool(lambda: curve(list(SIM_GPU_COUNTS), cv=cv, p_slow=p_slow, slow_factor=slow_factor))
    return SimDoc(cv=cv, p_slow=p_slow, slow_factor=slow_factor, points=_points(result))


def _points(result: Any) -> list[SimPoint]:
    """Accept the curve as a result dataclass with ``gpus``/``efficiency`` columns or as a list of points."""
    gpus = getattr(result, "gpus", None)
    eff = getattr(result, "efficiency", None)
    if gpus is not None and eff is not None:
        return [SimPoint(gpus=int(g), efficiency=float(e)) for g, e in zip(gpus, eff)]
    points = getattr(result, "points", result)
    out = []
    for p in points:
        if isinstance(p, dict):
            out.append(SimPoint(gpus=int(p["gpus"]), efficiency=float(p["efficiency"])))
        else:
            out.append(SimPoint(gpus=int(p.gpus), efficiency=float(p.efficiency)))
    return out
