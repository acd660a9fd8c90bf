"""The audit trail (``GET /api/audit``, the security role's panel): who opened which job and which
finding (``access_job``, ``access_finding``, written by the web app), who acted and who undid
(``act_action``, ``act_undo``, written by ``hpcwatch act``), who logged in, failed, was locked out or
logged out (``auth_*``, written by ``access/identity.py``; *what* is then the client's address),
newest first, within a time window."""

from __future__ import annotations

from typing import Any, Final

from hpcwatch.store import Store
from hpcwatch.vocab import EventKind

__all__ = ["AUDIT_KINDS", "audit_trail", "MAX_AUDIT_ROWS"]

AUDIT_KINDS: Final = (
    EventKind.ACCESS_JOB,
    EventKind.ACCESS_FINDING,
    EventKind.ACT_ACTION,
    EventKind.ACT_UNDO,
    EventKind.AUTH_LOGIN,
    EventKind.AUTH_LOGIN_FAILED,
    EventKind.AUTH_LOCKOUT,
    EventKind.AUTH_LOGOUT,
)
MAX_AUDIT_ROWS: Final = 2000


def audit_trail(store: Store, *, t0: float, t1: float, limit: int = MAX_AUDIT_ROWS) -> list[dict[str, Any]]:
    """Entries ``t``, ``kind``, ``who``, ``what`` (the job, the vector, the action's id) and ``attrs``."""
    rows: list[dict[str, Any]] = []
    for kind in AUDIT_KINDS:
        for event in store.events(kind, t0=t0, t1=t1):
            attrs = dict(event.attrs)
            what = attrs.get("job") or attrs.get("vector") or attrs.get("id") or attrs.get("of") or attrs.get("address")
            who = attrs.get("who") or attrs.get("user")  # the login events name the user, not an actor
            rows.append({"t": event.t, "kind": kind, "who": who, "what": what, "attrs": attrs})
    rows.sort(key=lambda r: -float(r["t"]))
    return rows[:limit]
