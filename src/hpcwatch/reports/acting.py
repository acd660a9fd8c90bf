"""What hpcwatch did about what it saw: the notices it sent and the actions it took, and undid.

Read from the store only, so ``hpcwatch serve`` shows what ``hpcwatch notify``, ``act`` and ``collect`` did
in other processes:

- notices: the ``notices`` table (``hpcwatch notify``), one row per delivery, its latest state: ``sent``,
  ``pending`` (owed; ``failing`` once a try failed) or ``unrouted`` (no channel carries it, nobody receives it)
- actions: the ``act_action`` events (``act/audit.py`` writes them), each with its undo (the first
  ``act_undo`` event naming it that succeeded)
- remediation: per node, where its newest remediation episode stands (``act/remediate.py``'s steps):

      warn (alone)     -> not shown       (a notice; the node is not touched before ``reserve``)
      reserve, resume  -> ``reserved``   check submitted -> ``checking``
      result passed    -> ``passed``     result failed, or a step that failed -> ``failed``
      an episode released (or undone) more than ``REMEDIATION_SHOWN_S`` ago is no longer shown

- checks: per node, what its remediation's checks answered (``node_checks``, read by ``reports.health``):
  the node is under test from its ``resume`` into the reservation until a ``result`` (at most the reservation's
  length); checks that passed and released it answer everything it showed before that ``resume``

A notice concerns a job or a node through its key (``job-end/<id>``, ``health/<node>/...``) or its
document (an action's ``target``, a health notice's ``node``, a job-end report's ``job``). The recipient is
its own field, never part of a sentence, so a view can hide it from whom it should not show it to.
Times are UTC seconds (wall clock: when the delivery or the action was written).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import orjson

from hpcwatch.records import Event
from hpcwatch.store import NoticeRow, Store, queries
from hpcwatch.vocab import EventKind

__all__ = [
    "NoticeEntry",
    "ActionEntry",
    "RemediationStage",
    "MAX_NOTICES",
    "MAX_ACTIONS",
    "REMEDIATION_SHOWN_S",
    "notices_sent",
    "actions_taken",
    "remediation_states",
    "NodeChecks",
    "node_checks",
    "acting_timeline",
    "job_acting",
]

#: The most notices and actions one answer lists (ours: a page's list, newest first).
MAX_NOTICES = 50
MAX_ACTIONS = 50
#: Act events read to find the nodes' remediation stages (ours: far more than a day of episodes).
_ACT_EVENTS_READ = 2000
#: A finished remediation episode stays on its node's tile this long (ours: an on-call hour).
REMEDIATION_SHOWN_S = 3600.0
#: The evidence summary's length on the page (the store keeps all of it).
_SUMMARY_CHARS = 200

NoticeState = Literal["sent", "pending", "failing", "unrouted"]
RemediationStage = Literal["reserved", "checking", "passed", "failed"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NoticeEntry:
    t: float
    """When its latest row was written: for ``sent``, when the channel took it."""
    notice: str
    kind: str
    """``health``, ``finding``, ``job_end``, ``digest``, ``action``."""
    channel: str
    recipient: str
    """A mail address, or the audience a webhook posted for (``operators``)."""
    state: NoticeState
    attempts: int
    subject: str
    job: str | None
    node: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionEntry:
    id: str
    t: float
    policy: str
    step: str
    target: str
    who: str
    why: str
    ok: bool
    rc: int | None
    evidence: str
    """The evidence, one short line (``key=value; ...``)."""
    passed: bool | None
    """A remediation ``result``: whether the checks passed (None for any other step)."""
    can_undo: bool
    undo_note: str
    undone_by: str | None
    undone_t: float | None
    job: str | None
    node: str | None


# -- notices ----------------------------------------------------------------------------------------------


def _document(row: NoticeRow) -> Mapping[str, Any]:
    try:
        payload = orjson.loads(row.payload)
    except orjson.JSONDecodeError:
        return {}
    return payload if isinstance(payload, dict) else {}


def _target(target: object) -> tuple[str | None, str | None]:
    """``job 4101`` -> (``4101``, None); ``node node3`` -> (None, ``node3``)."""
    kind, _, name = str(target or "").partition(" ")
    return (name or None, None) if kind == "job" else (None, name or None) if kind == "node" else (None, None)


def _notice_subject(row: NoticeRow, payload: Mapping[str, Any]) -> tuple[str | None, str | None]:
    doc = payload.get("document")
    doc = doc if isinstance(doc, dict) else {}
    job, node = _target(doc.get("target"))
    if row.notice.startswith("job-end/"):
        job = row.notice[len("job-end/") :]
    elif row.notice.startswith("health/"):
        node = row.notice.split("/")[1] or None
    job_doc = doc.get("job")
    if job is None and isinstance(job_doc, dict) and job_doc.get("id") is not None:
        job = str(job_doc["id"])
    if node is None and isinstance(doc.get("node"), str):
        node = doc["node"]
    return job, node


def _notice_entry(row: NoticeRow) -> NoticeEntry:
    payload = _document(row)
    job, node = _notice_subject(row, payload)
    state: NoticeState = "failing" if row.state == "pending" and row.attempts else row.state  # type: ignore[assignment]
    return NoticeEntry(
        t=row.t,
        notice=row.notice,
        kind=row.kind,
        channel=row.channel,
        recipient=row.recipient,
        state=state,
        attempts=row.attempts,
        subject=str(payload.get("subject") or "")[:_SUMMARY_CHARS],
        job=job,
        node=node,
    )


def notices_sent(
    store: Store,
    *,
    since: float | None = None,
    until: float | None = None,
    node: str | None = None,
    job: str | None = None,
    limit: int = MAX_NOTICES,
) -> list[NoticeEntry]:
    """The deliveries written in [``since``, ``until``], newest first, at most ``limit``; with ``node`` or
    ``job`` only those concerning it. Read in windows of ``limit`` (a busy channel's other notices do not
    hide a node's)."""
    out: list[NoticeEntry] = []
    read = max(limit, 1) * 4
    for row in queries.notices_between(store, since=since, until=until, limit=read):
        entry = _notice_entry(row)
        if (node is None or entry.node == node) and (job is None or entry.job == job):
            out.append(entry)
    return out[:limit]


# -- actions ----------------------------------------------------------------------------------------------


def _summary(evidence: object) -> str:
    if not isinstance(evidence, dict):
        return ""
    text = "; ".join(f"{k}={v}" for k, v in evidence.items() if v not in (None, "", [], {}))
    return text if len(text) <= _SUMMARY_CHARS else text[: _SUMMARY_CHARS - 1] + "…"


def _undos(events: Iterable[Event]) -> dict[str, Event]:
    """Action id -> its first undo that succeeded (events oldest first)."""
    out: dict[str, Event] = {}
    for e in events:
        if e.kind == EventKind.ACT_UNDO and e.attrs.get("rc") == 0 and e.attrs.get("of"):
            out.setdefault(str(e.attrs["of"]), e)
    return out


def _action_entry(e: Event, undo: Event | None) -> ActionEntry:
    a = e.attrs
    job, node = _target(a.get("target"))
    details: dict[str, Any] = a["details"] if isinstance(a.get("details"), dict) else {}
    if job is None and a.get("policy") == "idle_gpus" and details.get("job"):
        job = str(details["job"])
    rc = a.get("rc")
    evidence: dict[str, Any] = a["evidence"] if isinstance(a.get("evidence"), dict) else {}
    return ActionEntry(
        id=str(a.get("id", "")),
        t=e.t,
        policy=str(a.get("policy", "")),
        step=str(a.get("step", "")),
        target=str(a.get("target", "")),
        who=str(a.get("who", "")),
        why=str(a.get("why", ""))[: _SUMMARY_CHARS * 2],
        ok=rc in (None, 0),
        rc=rc if isinstance(rc, int) else None,
        evidence=_summary(a.get("evidence")),
        passed=evidence.get("passed") if isinstance(evidence.get("passed"), bool) else None,
        can_undo=bool(a.get("undo")) or bool(details.get("stand_down")),
        undo_note=str(a.get("undo_note", "")),
        undone_by=None if undo is None else str(undo.attrs.get("who", "")),
        undone_t=None if undo is None else undo.t,
        job=job,
        node=node,
    )


def _act_events(store: Store, *, since: float | None, limit: int) -> list[Event]:
    found = queries.recent_events(store, (EventKind.ACT_ACTION, EventKind.ACT_UNDO), since=since, limit=limit)
    return sorted(found, key=lambda e: e.t)


def actions_taken(
    store: Store,
    *,
    since: float | None = None,
    until: float | None = None,
    node: str | None = None,
    job: str | None = None,
    limit: int = MAX_ACTIONS,
) -> list[ActionEntry]:
    """The actions ``hpcwatch act`` took in [``since``, ``until``], newest first, at most ``limit``, each with
    who undid it and when; with ``node`` or ``job`` only those on it."""
    events = _act_events(store, since=since, limit=_ACT_EVENTS_READ)
    undos = _undos(events)
    out = []
    for e in reversed(events):
        if e.kind != EventKind.ACT_ACTION or (until is not None and e.t > until):
            continue
        entry = _action_entry(e, undos.get(str(e.attrs.get("id", ""))))
        if (node is None or entry.node == node) and (job is None or entry.job == job):
            out.append(entry)
        if len(out) >= limit:
            break
    return out


# -- remediation on the drawing ----------------------------------------------------------------------------


def _stage(steps: Sequence[ActionEntry]) -> RemediationStage | None:
    """Where one episode (its actions, oldest first) stands; None when it ended long enough ago."""
    by_step = {a.step: a for a in steps}
    if "reserve" not in by_step:  # warned only (or stood down): nothing is done to the node yet
        return None
    if any(not a.ok for a in steps):
        return "failed"
    result = by_step.get("result")
    if result is not None:
        return "passed" if result.passed else "failed"
    if "check" in by_step:
        return "checking"
    return "reserved"


def remediation_states(store: Store, *, now: float) -> dict[str, dict[str, Any]]:
    """Node -> ``stage`` (``RemediationStage``), ``t`` (its newest step), ``episode``, ``action`` (that step's
    id): the node's newest remediation episode, while it runs and for ``REMEDIATION_SHOWN_S`` after it
    ended (released, or its reservation undone)."""
    events = _act_events(store, since=now - 7 * 86400.0, limit=_ACT_EVENTS_READ)
    undos = _undos(events)
    episodes: dict[str, list[ActionEntry]] = {}
    newest: dict[str, str] = {}
    for e in events:
        if e.kind != EventKind.ACT_ACTION or e.attrs.get("policy") != "remediate":
            continue
        entry = _action_entry(e, undos.get(str(e.attrs.get("id", ""))))
        if entry.node is None:
            continue
        episode = str(e.attrs.get("episode", ""))
        episodes.setdefault(episode, []).append(entry)
        newest[entry.node] = episode
    out: dict[str, dict[str, Any]] = {}
    for node, episode in newest.items():
        steps = episodes[episode]
        last = steps[-1]
        ended = "release" in {a.step for a in steps} or any(a.undone_t is not None for a in steps)
        if ended and now - max(last.t, *(a.undone_t or 0.0 for a in steps)) > REMEDIATION_SHOWN_S:
            continue
        stage = _stage(steps)
        if stage is not None:
            out[node] = {"stage": stage, "t": last.t, "episode": episode, "action": last.id}
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeChecks:
    """What ``hpcwatch act``'s checks say of one node (its remediation episodes, newest last)."""

    answered_to: float | None = None
    """UTC s: the ``resume`` into the reservation of the newest checks that passed and released the node.
    What the node showed until then was tested and found fine."""
    under_test: str = ""
    """The ``resume`` action of checks under way (no result yet), while its reservation lasts."""
    test_ends: float | None = None
    """UTC s: when that reservation ends (the node takes jobs again, tested or not)."""


#: A reservation's length when its ``scontrol create reservation`` line is not readable (act's default).
_RESERVATION_MINUTES = 60.0


def _reservation_end(reserve: Event | None, resume: Event) -> float:
    argv = reserve.attrs.get("argv") if reserve is not None else None
    minutes = next(
        (a.removeprefix("duration=") for a in argv or () if isinstance(a, str) and a.startswith("duration=")), ""
    )
    start = reserve.t if reserve is not None else resume.t
    return start + 60.0 * (float(minutes) if minutes.isdigit() else _RESERVATION_MINUTES)


def node_checks(store: Store) -> dict[str, NodeChecks]:
    """Node -> what its remediation's checks answered (``NodeChecks``); nodes never tested are absent. A step
    that failed or was undone answers nothing (the undo of a resume or a release drains the node again)."""
    events = _act_events(store, since=None, limit=_ACT_EVENTS_READ)
    undos = _undos(events)
    episodes: dict[str, dict[str, Event]] = {}
    for e in events:
        if e.kind == EventKind.ACT_ACTION and e.attrs.get("policy") == "remediate":
            episodes.setdefault(str(e.attrs.get("episode", "")), {}).setdefault(str(e.attrs.get("step", "")), e)
    out: dict[str, NodeChecks] = {}
    for steps in episodes.values():  # in the order they began
        resume = steps.get("resume")
        node = _target(resume.attrs.get("target"))[1] if resume is not None else None
        if resume is None or node is None:
            continue
        before = out.get(node, NodeChecks())
        held = all(e.attrs.get("rc") in (None, 0) and str(e.attrs.get("id")) not in undos for e in steps.values())
        result, release = steps.get("result"), steps.get("release")
        if not held:
            out[node] = NodeChecks(answered_to=before.answered_to)
        elif result is None:
            end = _reservation_end(steps.get("reserve"), resume)
            out[node] = NodeChecks(answered_to=before.answered_to, under_test=str(resume.attrs["id"]), test_ends=end)
        else:
            passed = isinstance(result.attrs.get("evidence"), dict) and result.attrs["evidence"].get("passed") is True
            out[node] = NodeChecks(answered_to=resume.t if passed and release is not None else before.answered_to)
    return out


# -- the recent-events strip and the job page ------------------------------------------------------------


def acting_timeline(store: Store, *, limit: int) -> list[dict[str, Any]]:
    """Timeline entries (``reports.timeline``'s shape) for the newest actions (``action``), undos
    (``undone``) and notices delivered or failing (``notice``)."""
    entries: list[dict[str, Any]] = []
    for a in actions_taken(store, limit=limit):
        detail = {"policy": a.policy, "step": a.step, "target": a.target, "who": a.who, "ok": a.ok}
        entries.append({"t": a.t, "what": "action", "node": a.node, "gpu": None, "job": a.job, "detail": detail})
        if a.undone_t is not None:
            undo = {"step": a.step, "target": a.target, "who": a.undone_by, "of": a.id}
            entries.append(
                {"t": a.undone_t, "what": "undone", "node": a.node, "gpu": None, "job": a.job, "detail": undo}
            )
    for n in notices_sent(store, limit=limit):
        if n.state == "unrouted":
            continue
        detail = {"kind": n.kind, "channel": n.channel, "recipient": n.recipient, "state": n.state}
        entries.append({"t": n.t, "what": "notice", "node": n.node, "gpu": None, "job": n.job, "detail": detail})
    return entries


def job_acting(
    store: Store, job_id: str, *, nodes: Sequence[str] = (), t0: float | None = None, t1: float | None = None
) -> dict[str, list[dict[str, Any]]]:
    """``notices`` and ``actions`` (dicts of ``NoticeEntry`` / ``ActionEntry``, newest first) that concern
    the job: those naming it, and those on its nodes while it ran (from ``t0`` to ``t1``, None: still running)."""

    def during(t: float) -> bool:
        return t0 is not None and t >= t0 and (t1 is None or t <= t1)

    notices = [
        n
        for n in notices_sent(store, since=t0, limit=MAX_NOTICES * 4)
        if n.job == job_id or (n.node in nodes and during(n.t))
    ]
    actions = [
        a
        for a in actions_taken(store, since=t0, limit=MAX_ACTIONS * 4)
        if a.job == job_id or (a.node in nodes and during(a.t))
    ]
    return {
        "notices": [asdict(n) for n in notices[:MAX_NOTICES]],
        "actions": [asdict(a) for a in actions[:MAX_ACTIONS]],
    }
