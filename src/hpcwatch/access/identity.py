"""From a request's credentials to a ``Principal``: a session cookie, a bearer token, a trusted proxy's header,
or a login (LDAP bind) that opens a session. Every login, failure, lock-out and logout is an audit event
(``auth_*`` kinds, hpcwatch.vocab) handed to ``audit`` (the web app writes them to the store).

Which comes first, for one request: a bearer token (a script says who it is explicitly), then the proxy's
header (only from a peer in ``[proxy] trusted``; the same header from anyone else is ignored, and logged once
per address), then the session cookie.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from hpcwatch.access.authconfig import AuthConfig, roles_for
from hpcwatch.access.ldap import LdapAuthenticator, valid_login_name
from hpcwatch.access.principal import Principal
from hpcwatch.access.sessions import LoginLimiter, Session, SessionStore
from hpcwatch.access.tokens import Scope, TokenStore
from hpcwatch.errors import BackendError
from hpcwatch.records import Event
from hpcwatch.vocab import EventKind

__all__ = ["Identity", "LoginResult"]

log = logging.getLogger(__name__)
AUDIT_SOURCE = "hpcwatch-auth"
_MAX_WARNED = 10_000


@dataclass(frozen=True, slots=True)
class LoginResult:
    session: Session | None
    why: str = ""
    """Empty on success; else ``bad`` (wrong name or password), ``locked``, ``rate``, ``unavailable``
    (the directory did not answer), ``no_ldap``."""
    retry_after_s: int = 0


#: Hops of ``X-Forwarded-For`` looked at, from its right end (a chain of proxies is a few long).
_MAX_FORWARDED_HOPS = 8


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


class Identity:
    """Everything the auth config sets up, for one server process."""

    def __init__(self, config: AuthConfig, *, audit: Callable[[Event], None] = lambda _e: None) -> None:
        self.config = config
        self.audit = audit
        self.ldap = LdapAuthenticator(config.ldap) if config.ldap else None
        self.tokens = TokenStore(config.tokens.file) if config.tokens else None
        self.sessions = SessionStore(config.session)
        self.limiter = LoginLimiter(config.login)
        self._trusted = config.trusted_networks()
        self._warned: set[str] = set()

    # -- each kind of credential -----------------------------------------------------------------------

    def from_bearer(self, authorization: str | None, scope: Scope) -> Principal | None:
        """``Authorization: Bearer hpcw_...`` of a valid token with ``scope``; None otherwise."""
        if self.tokens is None or not authorization:
            return None
        kind, _, token = authorization.partition(" ")
        if kind.lower() != "bearer":
            return None
        entry = self.tokens.verify(token.strip())
        if entry is None or entry.scope != scope:
            return None
        roles = roles_for(self.config, entry.user)
        return Principal(name=entry.user, roles=roles, via="token", scopes=frozenset({entry.scope}))

    def from_proxy(self, user: str | None, peer: str | None) -> Principal | None:
        """The proxy's header, if the peer is a trusted proxy and the name a valid one."""
        if self.config.proxy is None or user is None:
            return None
        if not self.trusted_peer(peer):
            self._warn_once(peer or "?", f"{self.config.proxy.header} from {peer}, not a trusted proxy: ignored")
            return None
        if not valid_login_name(user):
            self._warn_once(f"name:{peer}", f"{self.config.proxy.header} from {peer}: not a user name, ignored")
            return None
        return Principal(name=user, roles=roles_for(self.config, user), via="proxy")

    def trusted_peer(self, peer: str | None) -> bool:
        try:
            address = ipaddress.ip_address(peer or "")
        except ValueError:
            return False
        return any(address in network for network in self._trusted)

    def client_address(self, peer: str | None, forwarded_for: str | None) -> str:
        """Who a login comes from: the peer, or, when the peer is a trusted proxy, the nearest address of its
        ``X-Forwarded-For`` that is not a trusted proxy too (each proxy appends the address it saw, so only
        the right end of the list is theirs; what a client wrote at its left is not believed). Without it,
        behind a proxy every login would share the proxy's address: one rate limit and one audit address."""
        if not forwarded_for or not self.trusted_peer(peer):
            return peer or "?"
        for hop in reversed(forwarded_for.split(",")[-_MAX_FORWARDED_HOPS:]):
            hop = hop.strip()
            if not _is_address(hop):
                return peer or "?"  # not what a proxy writes: the header is ignored
            if not self.trusted_peer(hop):
                return hop
        return peer or "?"

    def from_session(self, session_id: str | None) -> tuple[Principal, Session] | None:
        session = self.sessions.get(session_id)
        if session is None:
            return None
        return Principal(name=session.user, roles=session.roles, via="session"), session

    # -- login and logout ----------------------------------------------------------------------------------

    def login(self, name: str, password: str, address: str) -> LoginResult:
        if self.ldap is None:
            return LoginResult(None, "no_ldap")
        verdict = self.limiter.check(address, name)
        if not verdict.allowed:
            self._event(EventKind.AUTH_LOGIN_FAILED, name, address, why=verdict.why)
            return LoginResult(None, verdict.why, verdict.retry_after_s)
        try:
            user = self.ldap.authenticate(name, password)
        except BackendError as err:
            log.warning("login of %r from %s: %s", name, address, err)
            self._event(EventKind.AUTH_LOGIN_FAILED, name, address, why="unavailable")
            return LoginResult(None, "unavailable")
        if user is None:
            self._event(EventKind.AUTH_LOGIN_FAILED, name, address, why="bad")
            if self.limiter.failed(name):
                self._event(EventKind.AUTH_LOCKOUT, name, address, minutes=self.config.login.lockout_minutes)
            return LoginResult(None, "bad")
        self.limiter.succeeded(name)
        roles = roles_for(self.config, user.name, user.groups)
        session = self.sessions.create(user.name, roles)
        self._event(EventKind.AUTH_LOGIN, user.name, address, via="ldap", roles=sorted(roles))
        return LoginResult(session)

    def logout(self, session_id: str | None, address: str) -> None:
        session = self.sessions.end(session_id)
        if session is not None:
            self._event(EventKind.AUTH_LOGOUT, session.user, address)

    def _event(self, kind: str, user: str, address: str, **attrs: object) -> None:
        # A login name that is not a user name is kept out of the record (it may be anything a client sent).
        shown = user if valid_login_name(user) else "(invalid name)"
        self.audit(
            Event(kind=kind, t=time.time(), source=AUDIT_SOURCE, attrs={"user": shown, "address": address, **attrs})
        )

    def _warn_once(self, key: str, message: str) -> None:
        if key in self._warned or len(self._warned) >= _MAX_WARNED:
            return
        self._warned.add(key)
        log.warning("%s", message)
