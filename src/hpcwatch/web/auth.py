"""Who is asking, for every request of the web app (``--auth FILE``): the login and account pages, logout, the
session cookie, and CSRF on every state-changing request.

``Authenticate`` (a pure ASGI middleware, so the SSE stream passes unbuffered) sets
``request.state.principal`` (hpcwatch.access.principal) from a bearer token of scope ``api``, a trusted
proxy's header or the session cookie (hpcwatch.access.identity); a request with none is sent to ``/login``
(a page) or answered 401 (the API). Without ``--auth`` none of this is installed and every request is ``LOCAL``.

**The cookie**: ``HttpOnly`` (no script reads it), ``SameSite=Lax``, ``Secure`` with TLS (then named
``__Host-hpcwatch_session``: the browser refuses it from plain HTTP or for another path or domain). Lax, not
Strict: with Strict a link to a job page pasted in a chat or a mail arrives without the cookie, and a
logged-in user sees the login page; Lax sends it only on top-level GET navigations, which change nothing
here, and every state-changing request is refused without its CSRF token anyway.

**CSRF** (synchronizer token): every method other than GET, HEAD and OPTIONS from a session or through the
proxy must carry the session's token (form field ``csrf`` or header ``X-CSRF-Token``), and a ``Sec-Fetch-Site``
or ``Origin`` that says cross-site is refused (through the proxy, one that says same-origin is required: the
proxy's header is set on a forged request too). The
login form itself carries a token bound to a short-lived cookie (double submit), against login CSRF.
Bearer tokens need no CSRF: no browser sends them by itself.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.concurrency import run_in_threadpool

from hpcwatch.access.identity import Identity
from hpcwatch.access.principal import Principal, principal_of
from hpcwatch.access.sessions import Session, csrf_ok
from hpcwatch.web.i18n import LANG_COOKIE, LANGUAGES, load_catalogue, negotiate

__all__ = ["install_auth", "Authenticate", "SAFE_METHODS", "PUBLIC_PATHS", "cookie_name"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: What is answered to anyone: the login page, its stylesheet, liveness for the load balancer.
PUBLIC_PATHS = ("/login", "/healthz", "/static/")
LOGIN_CSRF_COOKIE = "hpcwatch_login_csrf"
MAX_FORM_BYTES = 4096


def cookie_name(secure: bool) -> str:
    return "__Host-hpcwatch_session" if secure else "hpcwatch_session"


def install_auth(app: FastAPI, identity: Identity, *, secure: bool) -> None:
    """The middleware and the login, account and logout routes on ``app``."""
    app.state.hpcwatch_identity = identity
    app.state.hpcwatch_secure_cookies = secure
    app.add_middleware(Authenticate, identity=identity, secure=secure)
    _add_routes(app)


class Authenticate:
    def __init__(self, app: ASGIApp, identity: Identity, secure: bool) -> None:
        self.app, self.identity, self.cookie = app, identity, cookie_name(secure)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        found = self._principal(scope, headers)
        principal, session = found if found else (None, None)
        state = scope.setdefault("state", {})
        state["principal"], state["session"] = principal, session
        path, method = scope.get("path", ""), scope.get("method", "GET")
        public = path == "/login" or path == "/healthz" or path.startswith("/static/")
        if principal is None and not public:
            await _unauthenticated(scope, headers, send)
            return
        if method not in SAFE_METHODS and principal is not None and principal.via in ("session", "proxy"):
            why = _cross_site(headers, strict=principal.via == "proxy") or self._missing_csrf(
                path, session, principal, headers
            )
            if why:
                await _send(send, 403, b"text/plain; charset=utf-8", why.encode())
                return
        await self.app(scope, receive, send)

    def _principal(self, scope: Scope, headers: dict[str, str]) -> tuple[Principal, Session | None] | None:
        identity, peer = self.identity, (scope.get("client") or ("", 0))[0]
        token = identity.from_bearer(headers.get("authorization"), "api")
        if token is not None:
            return token, None
        header = identity.config.proxy.header.lower() if identity.config.proxy else None
        proxied = identity.from_proxy(headers.get(header) if header else None, peer)
        if proxied is not None:
            return proxied, None
        return identity.from_session(_cookies(headers).get(self.cookie))

    @staticmethod
    def _missing_csrf(path: str, session: Session | None, principal: Principal, headers: dict[str, str]) -> str:
        if path in ("/logout", "/login"):
            return ""  # their forms carry the token in the body; the route checks it
        if principal.via == "proxy":
            return ""  # no session to hold a token: the Origin / Sec-Fetch-Site check above is the guard
        return "" if csrf_ok(session, headers.get("x-csrf-token")) else "missing or wrong CSRF token (X-CSRF-Token)"


def _cross_site(headers: dict[str, str], *, strict: bool) -> str:
    """Why a state-changing request looks cross-site ("" if it does not). ``Sec-Fetch-Site`` decides where the
    browser sends it; else ``Origin`` (``null`` under our ``Referrer-Policy: no-referrer`` on a form post, so it
    proves nothing); ``strict`` (the proxy's header, no CSRF token behind it) refuses a request that proves nothing."""
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None:
        return (
            ""
            if fetch_site in ("same-origin", "none")
            else f"cross-site request refused (Sec-Fetch-Site: {fetch_site})"
        )
    origin = headers.get("origin")
    if origin is None or origin == "null":
        return "cross-site request refused (no Sec-Fetch-Site, no Origin)" if strict else ""
    return "" if urlsplit(origin).netloc == headers.get("host", "") else "cross-origin request refused (Origin)"


async def _unauthenticated(scope: Scope, headers: dict[str, str], send: Any) -> None:
    path = scope.get("path", "/")
    wants_page = scope.get("method") == "GET" and not path.startswith("/api/") and "html" in headers.get("accept", "")
    if wants_page:
        query = scope.get("query_string", b"").decode("latin-1")
        target = path + (f"?{query}" if query else "")
        location = f"/login?next={quote(target, safe='')}"
        await _send(send, 303, b"text/plain; charset=utf-8", b"log in first\n", [(b"location", location.encode())])
        return
    extra = [(b"www-authenticate", b'Bearer realm="hpcwatch"')]
    await _send(send, 401, b"application/json", b'{"error": "authentication required"}', extra)


async def _send(send: Any, status: int, kind: bytes, body: bytes, extra: list | None = None) -> None:
    headers = [(b"content-type", kind), (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or ()}


def _cookies(headers: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in headers.get("cookie", "").split(";"):
        name, _, value = part.strip().partition("=")
        out.setdefault(name, value)
    return out


def safe_next(target: str | None) -> str:
    """Where to go after login: a path of this server only (no ``//host``, no ``\\``, no scheme)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    parts = urlsplit(target)
    return "/" if parts.scheme or parts.netloc or any(ord(c) < 32 for c in target) else target


# -- the routes ----------------------------------------------------------------------------------------------


def _add_routes(app: FastAPI) -> None:
    env = Environment(loader=PackageLoader("hpcwatch.web", "templates"), autoescape=select_autoescape(["html"]))
    template = env.get_template("login.html")

    def page(request: Request, *, status: int = 200, **values: Any) -> HTMLResponse:
        lang = negotiate(
            forced=request.query_params.get("lang"),
            cookie=request.cookies.get(LANG_COOKIE),
            accept_language=request.headers.get("accept-language"),
        )
        t = load_catalogue(lang)
        values.setdefault("next", "/")
        values = {"account": None, "csrf": "", "message": "", "user": "", **values}
        if isinstance(values["message"], tuple):  # (key, format values)
            key, fmt = values["message"]
            values["message"] = t(key).format(**fmt)
        html = template.render(t=t, lang=lang, languages=LANGUAGES, **values)
        return HTMLResponse(html, status_code=status, headers={"Content-Language": lang, "Cache-Control": "no-store"})

    @app.get("/login", response_class=HTMLResponse, include_in_schema=False)
    async def login_page(request: Request) -> Response:
        if principal_of(request).via == "session":  # logged in already: the account page
            session: Session = request.state.session
            return page(request, account=_account(principal_of(request)), csrf=session.csrf)
        identity: Identity = request.app.state.hpcwatch_identity
        message: tuple[str, dict] | str = ("login.no_ldap", {}) if identity.ldap is None else ""
        return _with_login_csrf(page, request, next=safe_next(request.query_params.get("next")), message=message)

    @app.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        identity: Identity = request.app.state.hpcwatch_identity
        form = await _form(request)
        target = safe_next(form.get("next"))
        user = form.get("user", "")[:64]
        expected = request.cookies.get(LOGIN_CSRF_COOKIE, "")
        if not expected or not secrets.compare_digest(expected, form.get("csrf", "")):
            return _with_login_csrf(page, request, next=target, user=user, status=403, message=("login.stale", {}))
        peer = _client_address(identity, request)
        result = await run_in_threadpool(identity.login, user, form.get("password", ""), peer)
        if result.session is None:
            status = {"rate": 429, "locked": 429, "unavailable": 503, "no_ldap": 404}.get(result.why, 401)
            minutes = max(1, round(result.retry_after_s / 60))
            response = _with_login_csrf(
                page,
                request,
                next=target,
                user=user,
                status=status,
                message=(f"login.{result.why}", {"minutes": minutes}),
            )
            if result.retry_after_s:
                response.headers["Retry-After"] = str(result.retry_after_s)
            return response
        previous = getattr(request.state, "session", None)
        if previous is not None:  # logged in again: the new session replaces the old one (a new id each login)
            identity.sessions.end(previous.id)
        landing = RedirectResponse(target, status_code=303)
        _set_session_cookie(request, landing, result.session)
        landing.delete_cookie(LOGIN_CSRF_COOKIE, path="/login")
        return landing

    @app.post("/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        identity: Identity = request.app.state.hpcwatch_identity
        form = await _form(request)
        session = getattr(request.state, "session", None)
        if session is None or not csrf_ok(session, form.get("csrf")):
            return Response("missing or wrong CSRF token\n", status_code=403, media_type="text/plain")
        await run_in_threadpool(identity.logout, session.id, _client_address(identity, request))
        response = RedirectResponse("/login", status_code=303)
        secure = request.app.state.hpcwatch_secure_cookies
        response.delete_cookie(cookie_name(secure), path="/", secure=secure, httponly=True, samesite="lax")
        return response


def _account(principal: Principal) -> dict[str, str]:
    return {"name": principal.name, "roles": ", ".join(sorted(principal.roles))}


def _with_login_csrf(page: Callable[..., HTMLResponse], request: Request, **values: Any) -> HTMLResponse:
    token = secrets.token_urlsafe(32)
    response = page(request, csrf=token, **values)
    secure = request.app.state.hpcwatch_secure_cookies
    response.set_cookie(
        LOGIN_CSRF_COOKIE, token, max_age=3600, path="/login", secure=secure, httponly=True, samesite="strict"
    )
    return response


def _set_session_cookie(request: Request, response: Response, session: Session) -> None:
    secure = request.app.state.hpcwatch_secure_cookies
    identity: Identity = request.app.state.hpcwatch_identity
    response.set_cookie(
        cookie_name(secure),
        session.id,
        max_age=int(identity.sessions.absolute_s),
        path="/",
        secure=secure,
        httponly=True,
        samesite="lax",
    )


async def _form(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body, at most ``MAX_FORM_BYTES``; the first of each field."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return {}
    try:
        fields = parse_qs(body.decode("utf-8"), max_num_fields=16, strict_parsing=False)
    except (UnicodeDecodeError, ValueError):
        return {}
    return {k: v[0] for k, v in fields.items() if v}


def _client_address(identity: Identity, request: Request) -> str:
    return identity.client_address(
        request.client.host if request.client else None, request.headers.get("x-forwarded-for")
    )
