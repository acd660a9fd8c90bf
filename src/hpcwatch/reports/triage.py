"""Triage of the live problems: one entry per kind of problem, the worst first.

At 128 nodes the twin's idle GPUs gave 131 ``idle_allocated`` problems and one XID; listed one by one, the
XID drowned among them (issue 27, point 3). ``alert_groups`` folds the problems of
``reports.live.problems`` into groups of one rule, one severity and one subject (an XID code, a threat
vector), ranked by severity, then by extent (how many GPUs, else nodes, it touches), then by the natural
order of the first element (``node2`` before ``node10``). The page only words them: a group of one says
what it is where, a group of many says how many (``131 GPUs idle while allocated``) and lists them.

``mark_of`` says which mark a problem puts on the drawing: one per kind, so a straggler, an idle
allocated GPU, an XID, a drained node and a GPU that stopped reporting never share a mark.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

__all__ = [
    "Mark",
    "MARKS",
    "SEVERITY_RANK",
    "MAX_GROUP_MEMBERS",
    "natural_key",
    "mark_of",
    "alert_groups",
]

Mark = Literal["straggler", "xid", "lost", "drain", "idle", "warn", "finding"]
#: Every mark the drawing knows, worst first (a GPU with two problems shows the first of this order).
MARKS: tuple[Mark, ...] = ("xid", "lost", "drain", "straggler", "idle", "warn", "finding")
#: Severity order of health verdicts (``drain``, ``warn``) and finding severities (records.SEVERITIES).
SEVERITY_RANK: dict[str, int] = {"drain": 0, "critical": 0, "high": 1, "warn": 2, "medium": 2, "low": 3, "info": 4}
#: A group lists at most this many of its elements (the snapshot goes to every viewer every second; a
#: cluster-wide problem on 1,024 GPUs is told by its count, the page lists the first ones). Ours.
MAX_GROUP_MEMBERS = 64

_DIGITS = re.compile(r"(\d+)")


def natural_key(text: str | None) -> tuple[tuple[int, int, str], ...]:
    """Sort key that orders the numbers inside names by value: ``node2`` < ``node10``, ``gpu:node1/2`` <
    ``gpu:node1/10``. Each piece is ``(0, number, "")`` or ``(1, 0, text)``, so pieces always compare."""
    return tuple(
        (0, int(piece), "") if piece.isdigit() else (1, 0, piece) for piece in _DIGITS.split(text or "") if piece
    )


def mark_of(problem: Mapping[str, Any]) -> Mark:
    """The drawing's mark of one problem of ``reports.live.problems``."""
    if problem["kind"] == "straggler":
        return "straggler"
    if problem["kind"] == "finding":
        return "finding"
    rule = problem.get("rule")
    if rule == "xid":
        return "xid"
    if rule == "gpu_missing":
        return "lost"
    if rule == "idle_allocated":
        return "idle"
    return "drain" if problem.get("severity") == "drain" else "warn"


def _subject(problem: Mapping[str, Any]) -> str:
    """What else must match for two problems of one rule to be one group: an XID's code, a finding's vector."""
    evidence = problem.get("evidence") or {}
    if problem.get("rule") == "xid":
        return str(evidence.get("xid", ""))
    if problem["kind"] == "finding":
        return str(evidence.get("vector", ""))
    return ""


def _rank(group: Mapping[str, Any]) -> tuple[int, int, int, tuple[tuple[int, int, str], ...]]:
    severity = SEVERITY_RANK.get(group["severity"] or "", len(SEVERITY_RANK))
    return (severity, -group["gpus"], -group["nodes"], natural_key(group["members"][0]["el"]))


def alert_groups(problems: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The problems as groups, worst first. Each group: ``key`` (``kind:rule:severity:subject``), ``kind``,
    ``rule``, ``severity``, ``mark`` (``mark_of``), ``count`` (problems), ``gpus`` and ``nodes`` (distinct
    ones it touches), ``jobs`` (distinct job ids, natural order), ``first`` (its first problem, whole: a group
    of one is worded from it), ``members`` (``el``, ``node``, ``gpu``, ``job`` of each problem in natural
    order of ``el``, at most ``MAX_GROUP_MEMBERS``) and ``title`` (the first problem's English title, for a
    rule the page has no words for)."""
    by_key: dict[str, list[Mapping[str, Any]]] = {}
    for p in problems:
        key = f"{p['kind']}:{p.get('rule') or ''}:{p.get('severity') or ''}:{_subject(p)}"
        by_key.setdefault(key, []).append(p)
    groups = [_group(key, sorted(found, key=lambda p: natural_key(p["el"]))) for key, found in by_key.items()]
    return sorted(groups, key=_rank)


def _group(key: str, found: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    first = found[0]
    gpus = {p["el"] for p in found if str(p["el"]).startswith("gpu:")}
    nodes = {p["node"] for p in found if p.get("node")}
    jobs = sorted({str(p["job"]) for p in found if p.get("job")}, key=natural_key)
    return {
        "key": key,
        "kind": first["kind"],
        "rule": first.get("rule"),
        "severity": first.get("severity"),
        "mark": mark_of(first),
        "count": len(found),
        "gpus": len(gpus),
        "nodes": len(nodes),
        "jobs": jobs,
        "first": dict(first),
        "members": [
            {"el": p["el"], "node": p.get("node"), "gpu": p.get("gpu"), "job": p.get("job")}
            for p in found[:MAX_GROUP_MEMBERS]
        ],
        "title": first.get("title"),
    }
