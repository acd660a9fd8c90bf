"""Alerts firing and resolved: Alertmanager's (``hpcwatch serve --alertmanager``) and the store's health verdicts.

Two origins, one entry shape (``name``, ``node``, ``severity``, ``summary``, ``starts_at``, ``resolved_at``,
``origin``):

- ``alertmanager``: what ``alertmanager.AlertWatch`` saw since the server started (firing: in the newest
  answer; resolved: left the list). The node is the alert's ``node``, ``hostname``/``Hostname``, ``host``
  label, or its ``instance`` without the port.
- ``store``: the ``health_verdict`` events ``hpcwatch collect`` wrote: a node whose verdict turned ``warn``
  or ``drain`` fires (the rule set's verdict is the alert, ``deploy/prometheus/hpcwatch-alerts.yml`` routes
  the same verdicts); a node whose verdict went back to ``ok`` resolved it.

With an Alertmanager, firing alerts are its own (the verdicts reach it through ``/metrics`` and the alerting
rules), resolved ones both; without, the store's alone. Times are UTC seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hpcwatch.store import Store, queries
from hpcwatch.vocab import EventKind

__all__ = [
    "alert_history",
    "job_alerts",
    "node_of_labels",
    "MAX_ALERTS_SHOWN",
    "VERDICT_CHANGES_READ",
    "LOOKBACK_S",
]

#: Entries of each list (ours: a page's panel).
MAX_ALERTS_SHOWN = 50
#: Verdict changes read from the store (ours: a day of a flapping 128-node cluster stays under it).
VERDICT_CHANGES_READ = 2000
#: How far back the page's panel reads the store's verdicts (ours: a day; the job page reads its job's run).
LOOKBACK_S = 86400.0
_NODE_LABELS = ("node", "hostname", "Hostname", "host", "nodename")


def node_of_labels(labels: Mapping[str, str]) -> str | None:
    """The node an alert is about, from its labels (see the module docstring), or None."""
    for key in _NODE_LABELS:
        if labels.get(key):
            return labels[key]
    instance = labels.get("instance", "")
    if not instance:
        return None
    host = instance.rsplit(":", 1)[0] if instance.count(":") == 1 else instance
    return host or None


def _from_watch(a: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "name": a.get("name") or "",
        "node": node_of_labels(a.get("labels") or {}),
        "severity": a.get("severity") or "",
        "summary": a.get("summary") or "",
        "state": a.get("state") or "active",
        "starts_at": a.get("starts_at") if a.get("starts_at") is not None else a.get("first_seen"),
        "resolved_at": a.get("resolved_at"),
        "origin": "alertmanager",
    }


def _verdict_alerts(store: Store, *, since: float | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(firing, resolved) from the store's verdict changes, newest first."""
    changes = queries.verdict_changes(store, kind=EventKind.HEALTH_VERDICT, since=since, limit=VERDICT_CHANGES_READ)
    firing: list[dict[str, Any]] = []
    resolved: list[dict[str, Any]] = []
    later: dict[str, tuple[float, str]] = {}  # node -> the change after this one (walking newest first)
    for node, t, verdict, reason in changes:
        if verdict in ("warn", "drain"):
            after = later.get(node)
            entry = {
                "name": f"health_{verdict}",
                "node": node,
                "severity": verdict,
                "summary": reason or "",
                "state": "active",
                "starts_at": t,
                "resolved_at": after[0] if after is not None and after[1] == "ok" else None,
                "origin": "store",
            }
            if after is None:
                firing.append(entry)
            elif entry["resolved_at"] is not None:
                resolved.append(entry)
        later[node] = (t, verdict)
    return firing, resolved


def alert_history(
    store: Store, *, watch: Mapping[str, Any] | None = None, since: float | None = None, limit: int = MAX_ALERTS_SHOWN
) -> dict[str, Any]:
    """``firing`` and ``resolved`` (entries as the module docstring says, newest first, at most ``limit``
    each), ``source`` (the Alertmanager's label, or None: the store only), ``down_since`` (when it stopped
    answering, else None) and ``error`` (its one-line failure)."""
    firing, resolved = _verdict_alerts(store, since=since)
    if watch is not None:
        firing = [_from_watch(a) for a in watch.get("firing", ())]
        resolved = [_from_watch(a) for a in watch.get("resolved", ())] + resolved
        resolved.sort(key=lambda e: -(e["resolved_at"] or 0.0))
    return {
        "source": None if watch is None else watch.get("source"),
        "down_since": None if watch is None else watch.get("down_since"),
        "error": None if watch is None else watch.get("error"),
        "firing": firing[:limit],
        "resolved": resolved[:limit],
    }


def job_alerts(
    history: Mapping[str, Any], nodes: Sequence[str], *, t0: float | None, t1: float | None
) -> list[dict[str, Any]]:
    """The alerts of ``history`` (``alert_history``) on the job's ``nodes`` that fired while it ran (from
    ``t0`` to ``t1``; None: still running), oldest first."""
    if t0 is None or not nodes:
        return []
    out = []
    for entry in [*history.get("firing", ()), *history.get("resolved", ())]:
        start, end = entry.get("starts_at"), entry.get("resolved_at")
        if entry.get("node") not in nodes or start is None:
            continue
        if (t1 is None or start <= t1) and (end is None or end >= t0):
            out.append(dict(entry))
    return sorted(out, key=lambda e: e["starts_at"])
