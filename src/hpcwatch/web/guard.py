"""The web app's guard: the headers, Host allow-list, body and stream caps of hpcwatch.httpguard applied
to every request (``Guard``, an ASGI middleware), and the connection cap and header deadline applied
to every TCP connection (``GuardedH11``, uvicorn's h11 protocol with two additions).

A pure ASGI middleware, not Starlette's ``BaseHTTPMiddleware``: the SSE stream must pass through it
unbuffered, and a stream slot must be given back however the response ends (``finally``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from hpcwatch.httpguard import DEFAULT_LIMITS, SECURITY_HEADERS, Limits, host_allowed

__all__ = ["GuardSettings", "Guard", "GuardedH11", "guarded_protocol"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_HEADERS = [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS]


@dataclass(slots=True, kw_only=True)
class GuardSettings:
    """What the guard enforces; ``serve_app`` sets ``hosts`` to the bound address and the allowed names
    before the server starts. ``hosts`` None: no Host check (an app used in-process, e.g. by TestClient)."""

    limits: Limits = DEFAULT_LIMITS
    hosts: frozenset[str] | None = None
    stream_paths: frozenset[str] = frozenset({"/api/stream"})
    open_streams: Counter[str] = field(default_factory=Counter)
    """Open SSE responses per client address (event-loop thread only: no lock)."""


class Guard:
    """ASGI middleware: 431 on a head over ``max_header_bytes``, 400 on a Host not allowed, 413 on a body
    over ``max_body_bytes``, 503 with ``Retry-After`` past the stream caps; the security headers on every
    response, refusals included."""

    def __init__(self, app: ASGIApp, settings: GuardSettings) -> None:
        self.app, self.settings = app, settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        s, send = self.settings, _with_headers(send)
        raw = scope.get("headers") or ()
        # h11 bounds a head still incomplete in its buffer; one that arrived whole in a read is counted here.
        if sum(len(k) + len(v) + 4 for k, v in raw) > s.limits.max_header_bytes:
            await _refuse(send, 431, f"request head over {s.limits.max_header_bytes} bytes")
            return
        headers = dict(raw)
        if s.hosts is not None and not host_allowed(_text(headers.get(b"host")), s.hosts):
            await _refuse(send, 400, "this server does not answer that Host name (see --allow-host)")
            return
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > s.limits.max_body_bytes):
            await _refuse(send, 413, f"request body over {s.limits.max_body_bytes} bytes")
            return
        receive, send = _capped(receive, send, s.limits.max_body_bytes)
        if scope.get("path") not in s.stream_paths:
            await self.app(scope, receive, send)
            return
        client = (scope.get("client") or ("?", 0))[0]
        total = sum(s.open_streams.values())
        if total >= s.limits.max_streams or s.open_streams[client] >= s.limits.max_streams_per_client:
            which = "all clients" if total >= s.limits.max_streams else "this address"
            await _refuse(send, 503, f"too many open live streams for {which}", retry_after=s.limits.retry_after_s)
            return
        s.open_streams[client] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            s.open_streams[client] -= 1
            if s.open_streams[client] <= 0:
                del s.open_streams[client]


def _capped(receive: Receive, send: Send, limit: int) -> tuple[Receive, Send]:
    """``receive`` that stops at ``limit`` body bytes (a chunked body has no length to check first), and
    ``send`` that answers 413 instead of whatever the app answers to the body it did not get whole."""
    seen, tripped, refused = 0, False, False

    async def capped_receive() -> Message:
        nonlocal seen, tripped
        if tripped:
            return {"type": "http.disconnect"}
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                tripped = True
                return {"type": "http.disconnect"}
        return message

    async def capped_send(message: Message) -> None:
        nonlocal refused
        if not tripped:
            await send(message)
        elif not refused and message["type"] == "http.response.start":
            refused = True
            await _refuse(send, 413, f"request body over {limit} bytes")

    return capped_receive, capped_send


def _with_headers(send: Send) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            present = {k.lower() for k, _ in message.get("headers", ())}
            message["headers"] = [*message.get("headers", ()), *(h for h in _HEADERS if h[0] not in present)]
        await send(message)

    return wrapped


async def _refuse(send: Send, status: int, why: str, *, retry_after: int | None = None) -> None:
    body = f'{{"error": "{why}"}}'.encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol, plus: past ``limits.max_connections`` open connections a new one is
    answered 503 (``Retry-After``) and closed at once; a connection that has not sent a whole request
    within ``limits.header_timeout_s`` of connecting (or of its previous response) is answered 408
    and closed. uvicorn itself arms no timer before the first request: an idle socket was held forever."""

    limits: Limits = DEFAULT_LIMITS
    _deadline_task: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._close_with(503, b"too many connections", retry_after=self.limits.retry_after_s)
            return
        self._arm_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_deadline()

    def _arm_deadline(self) -> None:
        if self._deadline_task is not None:  # the previous request's timer: that request came in time
            self._deadline_task.cancel()
        self._deadline_task = self.loop.call_later(self.limits.header_timeout_s, self._deadline)

    def _deadline(self) -> None:
        # No complete request head since the timer was armed (h11 IDLE), or its body still coming.
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE:
            self._close_with(408, b"request not received in time")
        elif self.conn.their_state is h11.SEND_BODY:
            self.transport.close()

    def _close_with(self, status: int, why: bytes, *, retry_after: int | None = None) -> None:
        reason = {408: b"Request Timeout", 503: b"Service Unavailable"}[status]
        extra = b"" if retry_after is None else b"Retry-After: %d\r\n" % retry_after
        self.transport.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n%s\r\n%s"
            % (status, reason, len(why), extra, why)
        )
        self.transport.close()


def guarded_protocol(limits: Limits) -> type[GuardedH11]:
    """A ``GuardedH11`` subclass bound to ``limits`` (uvicorn's ``Config(http=...)`` takes a class)."""
    return type("GuardedH11Bound", (GuardedH11,), {"limits": limits})
