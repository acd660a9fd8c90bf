"""Route guards: every route of the app declares the permissions that open it (``ROUTE_NEEDS``, the one
registry of this extension point), and one app-wide dependency checks them before any route runs.

A route the registry does not name is refused at ``create_app`` (``check_routes``) and answers 403 if
it is added later: fail closed. ``current_principal`` is the one seam identity plugs into (it reads
``request.state.principal``, which identity's middleware sets; tests override the dependency). The
guard leaves the principal's ``Scope`` on ``request.state.scope`` for the routes to filter their
reports with (``reports.scoped``), and ``Audit`` records who opened which job and which finding.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, Final

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.routing import APIRoute
from starlette.routing import Mount

from hpcwatch.access.policy import PERMISSIONS
from hpcwatch.access.principal import Principal, principal_of
from hpcwatch.access.scope import Scope
from hpcwatch.errors import ConfigError
from hpcwatch.records import Event
from hpcwatch.reports.scoped import Owners, job_owners
from hpcwatch.store import Store
from hpcwatch.vocab import EventKind

__all__ = [
    "ROUTE_NEEDS",
    "PUBLIC",
    "ANY",
    "current_principal",
    "guard",
    "check_routes",
    "scope_of",
    "Audit",
    "OwnersCache",
]

PUBLIC: Final[frozenset[str]] = frozenset()
"""No permission and no sign-in: assets, liveness, the API's schema (no data)."""
ANY: Final = frozenset(PERMISSIONS)
"""Any role: the route filters what it returns by the scope."""
JOBS: Final = frozenset({"jobs:own", "jobs:account", "jobs:all"})
AGGREGATES: Final = frozenset({"aggregates", "health"})

#: Route path (as declared) → the permissions of which one opens it. A new route without a line fails.
ROUTE_NEEDS: Final[Mapping[str, frozenset[str]]] = {
    "/": ANY,
    "/healthz": PUBLIC,
    "/openapi.json": PUBLIC,
    "/login": PUBLIC,  # web/auth.py: the form, the sign-in itself and the sign-out (with --auth only)
    "/logout": PUBLIC,
    "/static": PUBLIC,
    "/vendor/plotly.min.js": PUBLIC,
    "/assess": AGGREGATES,
    "/api/assess": AGGREGATES,
    "/api/assess/latest": AGGREGATES,
    "/api/decider": frozenset({"aggregates"}),  # per-account totals: the cluster's numbers, names pseudonymised
    "/api/live": ANY,
    "/api/stream": ANY,
    "/api/model": ANY,
    "/api/stragglersim": ANY,
    "/api/steps/sources": JOBS,
    "/api/steps": JOBS,
    "/api/findings": frozenset({"findings"}),
    "/api/alerts": frozenset({"health"}),  # Alertmanager's labels and summaries name nodes, jobs, users
    "/api/history": JOBS | {"health"},
    "/job/{job_id:path}": JOBS,
    "/api/job/{job_id:path}": JOBS,
    "/api/audit": frozenset({"audit"}),
    "/audit": frozenset({"audit"}),
}


def current_principal(request: Request) -> Principal:
    """Who the request comes from: identity's ``request.state.principal``, else ``LOCAL``."""
    return principal_of(request)


async def guard(request: Request, principal: Principal = Depends(current_principal)) -> None:
    """The app-wide dependency: 401 for a stranger, 403 for a role without the route's permission."""
    path, needs = _needs_of(request)
    if needs is None:
        raise HTTPException(403, f"route {path} declares no permission (web/access.py ROUTE_NEEDS)")
    scope: Scope = request.app.state.hpcwatch.access.scope(principal)
    request.state.scope = scope
    request.state.principal_seen = principal
    if needs is PUBLIC:
        return
    if not principal.authenticated:
        raise HTTPException(401, "sign in first")
    if not needs & scope.permissions:
        raise HTTPException(403, f"{path} needs one of: {', '.join(sorted(needs))}")


def _needs_of(request: Request) -> tuple[str | None, frozenset[str] | None]:
    """The matched route's declared path and needs, found by its endpoint (the route object a request
    sees may be a copy made by an include; its endpoint is the function itself)."""
    endpoint = request.scope.get("endpoint")
    table = getattr(request.app.state, "route_needs", None)
    if table is None or endpoint not in table:
        table = request.app.state.route_needs = {route.endpoint: path for path, route in routes_of(request.app)}
    path = table.get(endpoint)
    return path, ROUTE_NEEDS.get(path or "")


def routes_of(app: FastAPI) -> Iterator[tuple[str, Any]]:
    """Every route and mount of ``app`` with its full path, routers included (found from the app itself)."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # FastAPI before 0.130 lists included routes flat in app.routes
        yield from ((str(getattr(r, "path", "")), r) for r in app.routes)
        return
    for context in iter_route_contexts(app.routes):
        yield str(context.path), context


def scope_of(request: Request) -> Scope:
    """The scope the guard left; a route the guard did not run for (none should) sees nothing."""
    scope = getattr(request.state, "scope", None)
    return scope if isinstance(scope, Scope) else Scope(name="", permissions=frozenset())


def check_routes(app: FastAPI) -> None:
    """Every route and mount named in ``ROUTE_NEEDS``; a plain (non-API) route, which the guard does not
    run for, only when public. A ConfigError names the first that is not."""
    for path, route in routes_of(app):
        if path not in ROUTE_NEEDS:
            raise ConfigError(f"web route {path!r} declares no permission: add it to web/access.py ROUTE_NEEDS")
        original = getattr(route, "original_route", route)
        guarded = isinstance(original, APIRoute) and not isinstance(original, Mount)
        if not guarded and ROUTE_NEEDS[path] is not PUBLIC:
            raise ConfigError(f"web route {path!r} is not guarded by the app's dependency: it must be public")


class OwnersCache:
    """Job → (user, account), recomputed when the store changes (its version), not on every request."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._at: int | None = None
        self._owners: Owners = {}

    def get(self) -> Owners:
        version = self.store.version
        with self._lock:
            if version != self._at:
                self._owners, self._at = job_owners(self.store.jobs()), version
            return self._owners


#: One audit event per (who, kind, what) at most this often: a reload storm writes one, not thousands.
AUDIT_EVERY_S: Final = 60.0
_MAX_REMEMBERED = 10_000


class Audit:
    """Writes ``access_job`` / ``access_finding`` events for authenticated principals (the local one,
    with no authentication configured, is one person on their own machine: not recorded)."""

    def __init__(self, store: Store, *, every_s: float = AUDIT_EVERY_S) -> None:
        self.store = store
        self.every_s = every_s
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str, str], float] = {}

    def opened(self, request: Request, kind: str, what: str) -> None:
        principal: Principal | None = getattr(request.state, "principal_seen", None)
        if principal is None or principal.via == "local":
            return
        key = (principal.name, kind, what)
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(key, -self.every_s) < self.every_s:
                return
            if len(self._last) >= _MAX_REMEMBERED:
                self._last = {k: t for k, t in self._last.items() if now - t < self.every_s}
            self._last[key] = now
        field = "job" if kind == EventKind.ACCESS_JOB else "vector"
        attrs: dict[str, Any] = {"who": principal.name, "via": principal.via, field: what, "route": request.url.path}
        self.store.add([Event(kind=kind, t=time.time(), source="web", attrs=attrs)])
