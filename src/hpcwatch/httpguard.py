"""What both HTTP servers (``serve``/``demo``: hpcwatch.web; ``exporter``) share to be exposed safely.

* the response headers: a Content-Security-Policy with no inline script (``script-src 'self'``),
  ``frame-ancestors 'none'`` and ``X-Frame-Options: DENY``, ``X-Content-Type-Options: nosniff``,
  ``Referrer-Policy: no-referrer``;
* the ``Host`` allow-list (DNS rebinding: a page of evil.example whose name was re-pointed at 127.0.0.1
  sends ``Host: evil.example``; it gets 400; see ``allowed_hosts`` for a wildcard bind);
* the limits (``Limits``) and their defaults, each with the answer its refusal gets;
* the rule that a server bound off loopback without authentication needs ``--insecure-no-auth``, and
  the check of TLS certificate and key files (one line, exit 2, before the server starts).

Pure functions and one settings dataclass; the servers apply them (web/guard.py, exporter.py).
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hpcwatch.errors import ConfigError

__all__ = [
    "CSP",
    "SECURITY_HEADERS",
    "Limits",
    "DEFAULT_LIMITS",
    "DEFAULT_MAX_STREAMS",
    "DEFAULT_MAX_STREAMS_PER_CLIENT",
    "allowed_hosts",
    "ANY_ADDRESS",
    "host_allowed",
    "is_loopback",
    "check_exposure",
    "check_tls",
]

#: Scripts and styles from this origin only (plotly.js is served by the app from the installed wheel);
#: inline ``style`` stays allowed: plotly and the SVG schematic set style attributes, and CSS cannot run code.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
#: Sent on every response of both servers (names lower-case, as ASGI carries them).
SECURITY_HEADERS: tuple[tuple[str, str], ...] = (
    ("content-security-policy", CSP),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
)


#: ``Limits.max_streams`` and ``max_streams_per_client`` (the defaults ``hpcwatch serve --help`` shows).
DEFAULT_MAX_STREAMS = 64
DEFAULT_MAX_STREAMS_PER_CLIENT = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """How much one server holds open for its clients. The defaults are ``DEFAULT_LIMITS``."""

    max_connections: int = 256
    """Open TCP connections at once; the next one is answered 503 with ``Retry-After`` and closed."""
    max_streams: int = DEFAULT_MAX_STREAMS
    """Open ``/api/stream`` (SSE) responses at once, all clients together; the next: 503, ``Retry-After``."""
    max_streams_per_client: int = DEFAULT_MAX_STREAMS_PER_CLIENT
    """Open SSE responses per client address: a few tabs and a wall screen (behind a proxy every viewer is
    the proxy's address: raise it to ``max_streams``)."""
    header_timeout_s: float = 10.0
    """Seconds from connect (or from the end of the previous response) to a complete request head and
    body; past it the connection is closed (slowloris sending a header byte every few seconds)."""
    keep_alive_s: int = 5
    """Seconds an idle keep-alive connection is kept after a response (uvicorn's ``timeout_keep_alive``)."""
    max_header_bytes: int = 16 * 1024
    """A request head larger than this is refused with 400 (h11's ``max_incomplete_event_size``) or 431."""
    max_body_bytes: int = 64 * 1024
    """A request body larger than this is refused with 413 (the largest the app takes is a few hundred bytes)."""
    retry_after_s: int = 5
    """The ``Retry-After`` of a 503 refusal."""

    def __post_init__(self) -> None:
        for name in (
            "max_connections",
            "max_streams",
            "max_streams_per_client",
            "keep_alive_s",
            "max_header_bytes",
            "max_body_bytes",
            "retry_after_s",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"limits: {name} must be >= 1, got {getattr(self, name)}")
        if not self.header_timeout_s > 0:
            raise ConfigError(f"limits: header_timeout_s must be > 0, got {self.header_timeout_s}")


DEFAULT_LIMITS = Limits()

_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


#: In an allow-list: any IP-literal ``Host`` is accepted (a wildcard bind: clients use any of its addresses).
ANY_ADDRESS = "<any address>"


def allowed_hosts(bound: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The ``Host`` names a server answers: the address it is bound to, ``localhost``, ``127.0.0.1``,
    ``::1``, and ``extra`` (the names clients use: ``--allow-host``). Lower case, without port.

    A wildcard bind (``0.0.0.0``, ``::``) is no name a client sends; it adds the machine's host name and
    FQDN, and any IP literal (``ANY_ADDRESS``): a Prometheus scraping ``10.0.0.5:9977`` or a pod's address.
    That keeps the defence: DNS rebinding needs a *name* (the attacker's, re-pointed), and a browser sends
    an IP literal only to a page whose origin is that address itself."""
    names = {_bare(h) for h in (*_LOOPBACK_NAMES, *extra)}
    if bound in ("0.0.0.0", "::", ""):
        names |= {_bare(socket.gethostname()), _bare(socket.getfqdn()), ANY_ADDRESS}
    else:
        names.add(_bare(bound))
    return frozenset(names)


def host_allowed(header: str | None, allowed: frozenset[str]) -> bool:
    """Whether a request's ``Host`` header (``name``, ``name:port``, ``[v6]:port``) names an allowed host."""
    if header is None:
        return False
    host = _bare(header)
    return host in allowed or (ANY_ADDRESS in allowed and _is_address(host))


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _bare(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):  # [::1]:8000
        return host[1 : host.find("]")] if "]" in host else host
    if host.count(":") == 1:  # name:port (a bare IPv6 address has several colons)
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def is_loopback(host: str) -> bool:
    """``localhost`` or an address of 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, *, insecure_no_auth: bool, option: str = "--host") -> None:
    """Refuse to bind off loopback while the server has no authentication, unless the operator said so."""
    if not is_loopback(host) and not insecure_no_auth:
        raise ConfigError(
            f"{option} {host} is not loopback and this server has no authentication: anyone who reaches the "
            "port reads every job (put an authenticating proxy in front and keep loopback, or say "
            "--insecure-no-auth)"
        )


def check_tls(cert: Path | None, key: Path | None) -> None:
    """Both files or neither; each readable; the pair loadable (PEM certificate chain, matching key)."""
    if (cert is None) != (key is None):
        raise ConfigError("--tls-cert and --tls-key go together (give both, or neither)")
    if cert is None or key is None:
        return
    for option, path in (("--tls-cert", cert), ("--tls-key", key)):
        if not path.is_file():
            raise ConfigError(f"{option} {path}: no such file")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(certfile=cert, keyfile=key)
    except (ssl.SSLError, OSError) as err:
        reason = getattr(err, "reason", None) or getattr(err, "strerror", None) or type(err).__name__
        raise ConfigError(f"--tls-cert {cert} / --tls-key {key}: cannot load the pair ({reason})") from err
