"""Server-side sessions (a random id in the cookie, everything else here) and the login limits.

A session ends at its idle expiry (no request for ``idle_minutes``), at its absolute expiry (``absolute_hours``
after login, however active) or at logout. Sessions live in the server's memory: a restart logs everyone
out, which is the safe direction, and one ``serve`` process is the only reader. Each session has its own
CSRF token (synchronizer pattern): a state-changing request must carry it in a form field or the
``X-CSRF-Token`` header, and a cross-site page cannot read it.

``LoginLimiter``: at most ``per_address_per_minute`` login attempts from one address (a sliding minute), and a
user locked out for ``lockout_minutes`` after ``lockout_failures`` failures in a row (counted per name, so a
guesser spreading over addresses is still stopped; the lock-out is the price of that, and it ends by itself).
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from hpcwatch.access.authconfig import LoginConfig, SessionConfig
from hpcwatch.access.principal import Role

__all__ = ["Session", "SessionStore", "LoginLimiter", "Verdict"]

_MAX_SESSIONS = 100_000
_MAX_TRACKED = 100_000


@dataclass(slots=True)
class Session:
    id: str
    user: str
    roles: frozenset[Role]
    csrf: str
    created: float
    seen: float


class SessionStore:
    def __init__(self, config: SessionConfig) -> None:
        self.idle_s = config.idle_minutes * 60
        self.absolute_s = config.absolute_hours * 3600
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def create(self, user: str, roles: frozenset[Role], *, now: float | None = None) -> Session:
        now = time.time() if now is None else now
        session = Session(secrets.token_urlsafe(32), user, roles, secrets.token_urlsafe(32), now, now)
        with self._lock:
            if len(self._sessions) >= _MAX_SESSIONS:
                self._expire(now)
            if len(self._sessions) >= _MAX_SESSIONS:  # memory bounded: the oldest goes
                del self._sessions[min(self._sessions.values(), key=lambda s: s.seen).id]
            self._sessions[session.id] = session
        return session

    def get(self, session_id: str | None, *, now: float | None = None) -> Session | None:
        """The live session of that id (and its idle clock restarted), or None."""
        if not session_id:
            return None
        now = time.time() if now is None else now
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return None
            if now - session.seen > self.idle_s or now - session.created > self.absolute_s:
                del self._sessions[session_id]
                return None
            session.seen = now
            return session

    def end(self, session_id: str | None) -> Session | None:
        with self._lock:
            return self._sessions.pop(session_id or "", None)

    def __len__(self) -> int:
        return len(self._sessions)

    def _expire(self, now: float) -> None:
        for sid in [s.id for s in self._sessions.values() if now - s.seen > self.idle_s]:
            del self._sessions[sid]


def csrf_ok(session: Session | None, presented: str | None) -> bool:
    return session is not None and presented is not None and hmac.compare_digest(session.csrf, presented)


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    why: str = ""
    """``rate`` (this address, too many attempts) or ``locked`` (this user, too many failures)."""
    retry_after_s: int = 0


@dataclass(slots=True)
class _Failures:
    count: int = 0
    locked_until: float = 0.0


@dataclass(slots=True)
class LoginLimiter:
    config: LoginConfig
    _attempts: dict[str, deque[float]] = field(default_factory=dict)
    _failures: dict[str, _Failures] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self, address: str, user: str, *, now: float | None = None) -> Verdict:
        """May this address try to log in as this user now? Counts the attempt when it may."""
        now = time.time() if now is None else now
        with self._lock:
            failures = self._failures.get(user)
            if failures is not None and failures.locked_until > now:
                return Verdict(False, "locked", int(failures.locked_until - now) + 1)
            recent = self._attempts.setdefault(address, deque())
            while recent and recent[0] <= now - 60:
                recent.popleft()
            if len(recent) >= self.config.per_address_per_minute:
                return Verdict(False, "rate", int(recent[0] + 60 - now) + 1)
            recent.append(now)
            self._bound(self._attempts)
            return Verdict(True)

    def failed(self, user: str, *, now: float | None = None) -> bool:
        """Count a failure; True when this one locks the user out."""
        now = time.time() if now is None else now
        with self._lock:
            failures = self._failures.setdefault(user, _Failures())
            failures.count += 1
            self._bound(self._failures)
            if failures.count >= self.config.lockout_failures:
                failures.count, failures.locked_until = 0, now + self.config.lockout_minutes * 60
                return True
            return False

    def succeeded(self, user: str) -> None:
        with self._lock:
            self._failures.pop(user, None)

    @staticmethod
    def _bound(table: dict) -> None:
        """Memory bounded whatever names and addresses are tried: past the cap, the oldest half goes."""
        if len(table) > _MAX_TRACKED:
            for key in list(table)[: _MAX_TRACKED // 2]:
                del table[key]
