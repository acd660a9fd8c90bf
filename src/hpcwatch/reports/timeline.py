"""What happened, newest first: the live page's recent-events strip, a node card's and a job page's timeline.

One entry per thing an on-call person acts on, from the store's events and findings (event kinds are
``vocab.EventKind``'s):

===========  =========================================================================
``what``     from
===========  =========================================================================
``xid``      an ``xid`` event (kernel log, nvidia-smi): node, GPU, code; or the first sample of a new
             non-zero value of dcgm-exporter's ``DCGM_FI_DEV_XID_ERRORS`` (the last XID of a GPU)
``failure``  a ``failure`` event: the job stopped (cause, step)
``requeue``  a ``job_end`` event of state REQUEUED (``sacct -D``): Slurm requeued the job
``job_end``  any other ``job_end`` event (COMPLETED, FAILED, CANCELLED...)
``restore``  a ``checkpoint_restore`` event: the job read its checkpoint (step)
``drain``    the first ``health_verdict`` event of a node's run of verdict ``drain`` (``hpcwatch collect``,
             ``hpcwatch demo``), or a health check that drains now (``reports.live.problems``, timed by its
             evidence's first sight)
``down``     a Slurm node state DOWN/DRAIN (``slurm_node_up`` = 0) in the newest Slurm answer
``finding``  a stored security finding
``action``   an ``act_action`` event: a step ``hpcwatch act`` took (policy, step, target, who)
``undone``   the ``act_undo`` that reversed one (who, when)
``notice``   a delivery of ``hpcwatch notify`` sent, owed or failing (kind, channel, recipient, state)
===========  =========================================================================

The last three are ``reports.acting.acting_timeline``'s (wall-clock times, as they were written).

Times are the events' own (UTC s, the collector's clock). Lists are bounded (``MAX_EVENTS``): the strip goes to
every viewer every second.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from hpcwatch import vocab
from hpcwatch.records import Event, Finding, Job
from hpcwatch.reports.acting import acting_timeline
from hpcwatch.store import Store, queries
from hpcwatch.vocab import EventKind

if TYPE_CHECKING:
    from hpcwatch.reports.jobstretches import KeptStretches

__all__ = [
    "TimelineKind",
    "TIMELINE_KINDS",
    "TIMELINE_EVENT_KINDS",
    "MAX_EVENTS",
    "MAX_NODE_EVENTS",
    "event_entry",
    "finding_entry",
    "timeline",
    "node_timelines",
    "job_timeline",
    "job_xid_onsets",
]

TimelineKind = Literal[
    "xid", "failure", "requeue", "job_end", "restore", "drain", "down", "finding", "action", "undone", "notice"
]
TIMELINE_KINDS: tuple[TimelineKind, ...] = (
    "xid",
    "failure",
    "requeue",
    "job_end",
    "restore",
    "drain",
    "down",
    "finding",
    "action",
    "undone",
    "notice",
)
#: The store's event kinds a timeline reads.
TIMELINE_EVENT_KINDS: tuple[str, ...] = (
    EventKind.XID,
    EventKind.GPU_XID,
    EventKind.FAILURE,
    EventKind.JOB_END,
    EventKind.CHECKPOINT_RESTORE,
    EventKind.HEALTH_VERDICT,
)
#: Entries of the page's strip (ours: what fits a screen's strip; older ones are in the node and job cards).
MAX_EVENTS = 30
#: Entries of one node's timeline in the snapshot (ours: a card's height).
MAX_NODE_EVENTS = 10
#: The live strip looks this far back for XIDs in dcgm-exporter's samples (ours: the health window's 15 min).
XID_SAMPLES_WINDOW_S = 900.0


def event_entry(e: Event) -> dict[str, Any] | None:
    """One stored event as a timeline entry (``t``, ``what``, ``node``, ``gpu``, ``job``, ``detail``), or
    None for an event a timeline does not show (a health verdict that does not drain)."""
    a = e.attrs
    node = a.get("node")
    nodes = a.get("nodes")
    if node is None and isinstance(nodes, list) and len(nodes) == 1:
        node = nodes[0]
    what: TimelineKind
    detail: dict[str, Any] = {}
    if e.kind in (EventKind.XID, EventKind.GPU_XID):
        what, detail = "xid", {"xid": a.get("xid")}
    elif e.kind == EventKind.FAILURE:
        what, detail = "failure", {"cause": a.get("cause"), "step": a.get("step")}
    elif e.kind == EventKind.JOB_END:
        state = str(a.get("state") or "")
        what, detail = ("requeue" if state == "REQUEUED" else "job_end"), {"state": state or None}
    elif e.kind == EventKind.CHECKPOINT_RESTORE:
        what, detail = "restore", {"step": a.get("step")}
    elif e.kind == EventKind.HEALTH_VERDICT and a.get("verdict") == "drain":
        what, detail = "drain", {"rule": a.get("rule")}
    else:
        return None
    job = a.get("job")
    return {
        "t": e.t,
        "what": what,
        "node": None if node is None else str(node),
        "gpu": None if a.get("gpu") is None else str(a.get("gpu")),
        "job": None if job is None else str(job),
        "detail": {k: v for k, v in detail.items() if v is not None},
    }


def finding_entry(f: Finding) -> dict[str, Any]:
    job = next((f.evidence.get(k) for k in ("job", "hpc_job", "job_id") if f.evidence.get(k)), None)
    return {
        "t": f.t,
        "what": "finding",
        "node": f.target,
        "gpu": None,
        "job": None if job is None else str(job),
        "detail": {"vector": f.vector, "severity": f.severity, "rule": f.rule, "title": f.title},
    }


def _sample_xids(
    store: Store, *, limit: int, since: float | None = None, hosts: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    rows = queries.gauge_onsets(store, vocab.DCGM_FI_DEV_XID_ERRORS, since=since, hosts=hosts, limit=limit)
    return [
        {"t": t, "what": "xid", "node": host, "gpu": gpu, "job": job, "detail": {"xid": int(value)}}
        for host, gpu, value, t, job in rows
    ]


def _problem_entries(problems: Iterable[Mapping[str, Any]], now: float) -> list[dict[str, Any]]:
    """A drain the health checks decide now, timed by what the check saw first (else ``now``)."""
    out = []
    for p in problems:
        if p.get("kind") != "health" or p.get("severity") != "drain":
            continue
        ev = p.get("evidence") or {}
        t = next((ev[k] for k in ("first_seen", "last_seen", "from", "t") if isinstance(ev.get(k), (int, float))), now)
        out.append(
            {
                "t": float(t),
                "what": "drain",
                "node": p.get("node"),
                "gpu": p.get("gpu"),
                "job": p.get("job"),
                "detail": {"rule": p.get("rule")},
            }
        )
    return out


def _down_entries(node_states: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"t": s["t"], "what": "down", "node": node, "gpu": None, "job": None, "detail": {"state": s.get("slurm")}}
        for node, s in node_states.items()
        if s.get("state") in ("down", "drained") and s.get("slurm") is not None and s.get("t") is not None
    ]


def _newest(entries: Iterable[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    seen, out = set(), []
    # One XID seen by the kernel log and by dcgm-exporter's next scrape is one entry (the earlier one).
    xids: dict[tuple[Any, Any, Any], float] = {}
    for e in sorted(entries, key=lambda e: e["t"]):
        if e["what"] == "xid":
            key3 = (e["node"], e["gpu"], e["detail"].get("xid"))
            if key3 in xids and e["t"] - xids[key3] <= XID_SAMPLES_WINDOW_S:
                e["_dup"] = True
            else:
                xids[key3] = e["t"]
    for e in sorted(entries, key=lambda e: -e["t"]):
        if e.pop("_dup", False):
            continue
        key = (e["what"], e["node"], e["gpu"], e["job"], round(e["t"], 3))
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out[:limit]


def _stored(store: Store, *, limit: int, node: str | None = None, job: str | None = None) -> list[dict[str, Any]]:
    # Health verdicts apart: one a node at every health run would push every other event out of the newest ones;
    # a node's run of drain verdicts is one entry, its first. A verdict names no job.
    kinds = [k for k in TIMELINE_EVENT_KINDS if k != EventKind.HEALTH_VERDICT]
    events = queries.recent_events(store, kinds, limit=limit * 2, node=node, job=job)
    if job is None:
        kind = EventKind.HEALTH_VERDICT
        events += queries.verdict_run_starts(store, kind=kind, verdict="drain", limit=limit, node=node)
    return [entry for e in events if (entry := event_entry(e)) is not None]


def timeline(
    store: Store,
    *,
    now: float,
    problems: Sequence[Mapping[str, Any]] = (),
    node_states: Mapping[str, Mapping[str, Any]] | None = None,
    limit: int = MAX_EVENTS,
) -> list[dict[str, Any]]:
    """The page's recent-events strip: stored events, findings, drains the health checks decide now,
    Slurm's down nodes, and what ``hpcwatch act`` and ``notify`` did, newest first, at most ``limit``."""
    entries = _stored(store, limit=limit)
    entries += _sample_xids(store, limit=limit, since=now - XID_SAMPLES_WINDOW_S)
    entries += [finding_entry(f) for f in store.findings()[-limit:]]
    entries += _problem_entries(problems, now)
    entries += _down_entries(node_states or {})
    entries += acting_timeline(store, limit=limit)
    return _newest(entries, limit)


def node_timelines(entries: Sequence[Mapping[str, Any]], limit: int = MAX_NODE_EVENTS) -> dict[str, list[Any]]:
    """The strip's entries by node (a node's card shows its own), newest first, at most ``limit`` each."""
    out: dict[str, list[Any]] = {}
    for e in entries:
        node = e.get("node")
        if node and len(out.setdefault(str(node), [])) < limit:
            out[str(node)].append(e)
    return out


def job_timeline(
    store: Store,
    job_id: str,
    *,
    limit: int = MAX_EVENTS,
    kept: KeptStretches | None = None,
) -> list[dict[str, Any]]:
    """One job's story, oldest first: XIDs, its failures, requeues, restores, its end. An XID event names a
    node, not a job: it is the job's when the job's ``failure`` names that node; an XID in dcgm-exporter's
    samples is the job's when the sample carries its ``hpc_job`` label. ``kept``: what a server keeps of the
    job's XID onsets between pages (``job_xid_onsets``)."""
    from hpcwatch.reports.jobs import first_start

    mine = _stored(store, limit=limit, job=job_id)
    failed_nodes = {e["node"] for e in mine if e["what"] == "failure" and e["node"]}
    xids = [
        entry
        for node in sorted(failed_nodes)
        for e in queries.recent_events(store, (EventKind.XID, EventKind.GPU_XID), limit=limit, node=node)
        if (entry := event_entry(e)) is not None
    ]
    record = store.job(job_id)
    t0 = first_start(store, record)
    if record is not None and t0 is not None and record.nodes:
        onsets = job_xid_onsets(store, record, t0, kept=kept)
        xids += [
            {"t": t, "what": "xid", "node": host, "gpu": gpu, "job": job, "detail": {"xid": int(value)}}
            for (host, gpu, value), (t, job) in sorted(onsets.items(), key=lambda item: (-item[1][0], str(item[0])))
            if job == job_id
        ]
    elif record is not None:
        # A requeued job waiting to run again has no nodes: then every host's XIDs, kept by their label.
        found = _sample_xids(store, limit=limit, since=t0, hosts=list(record.nodes) or None)
        xids += [e for e in found if e["job"] == job_id]
    return sorted(_newest([*mine, *xids], limit), key=lambda e: e["t"])


#: A GPU's XID onsets: (host, GPU, the gauge's value) -> (when first seen, the job label then).
XidOnsets = dict[tuple[str, "str | None", float], tuple[float, "str | None"]]


def job_xid_onsets(store: Store, record: Job, t0: float, *, kept: KeptStretches | None = None) -> XidOnsets:
    """When each non-zero value of dcgm-exporter's "last XID" gauge was first seen on each GPU of ``record``'s
    nodes from ``t0`` (its first start). With ``kept``, from the onsets up to the newest checkpoint still true
    (no sample landed before it since: ``reports.jobstretches``) on: only the samples since are grouped, where
    each page grouped the job's whole life (a 1,536-GPU job's GPUs give 1,500 of them a second); the next
    checkpoint settles from the store's newest sample (kept per commit: ``queries.latest_sample_t``)."""
    from hpcwatch.reports.jobstretches import kept_fold, window_written

    hosts, xid = list(record.nodes), vocab.DCGM_FI_DEV_XID_ERRORS
    if kept is None:
        return _earliest({}, queries.gauge_onset_groups(store, xid, since=t0, hosts=hosts))

    def read(since: float | None, cut: float | None, until: float | None) -> tuple[XidOnsets, XidOnsets]:
        since = t0 if since is None else since
        rows = queries.gauge_onset_groups(store, xid, since=since, hosts=hosts, cut=cut, until=until)
        return _earliest({}, [r for r in rows if not r[5]]), _earliest({}, [r for r in rows if r[5]])

    def store_newest(since: float | None) -> float | None:
        return queries.latest_sample_t(store, since=t0 if since is None else since)

    return kept_fold(
        store,
        kept,
        "xids",
        record,
        t0,
        written=window_written(store, record, t0, (xid,)),
        fingerprint=None,
        newest=store_newest,
        read=read,
        join=lambda earlier, later: _earliest(dict(earlier), [(*key, t, job, True) for key, (t, job) in later.items()]),
    )


def _earliest(onsets: XidOnsets, rows: Iterable[tuple[Any, ...]]) -> XidOnsets:
    """``onsets`` with those of ``rows`` (``queries.gauge_onset_groups``') that are new or earlier."""
    for host, gpu, value, t, job, _ in rows:
        key = (host, gpu, float(value))
        if key not in onsets or t < onsets[key][0]:
            onsets[key] = (float(t), job)
    return onsets
