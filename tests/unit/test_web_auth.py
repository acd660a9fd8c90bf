"""The web app with ``--auth``: who gets in, the cookie's flags, CSRF on every state-changing route, and the
XSS / open-redirect / header suite of the login routes. The directory is a stand-in here (the real slapd is
in tests/integration/test_auth.py); everything else is the app as ``serve --auth`` builds it."""

from __future__ import annotations

import re
import threading
import urllib.error
import urllib.request

import pytest
from fastapi import Request
from fastapi.testclient import TestClient

from hpcwatch.access.authconfig import parse_auth_text
from hpcwatch.access.identity import Identity
from hpcwatch.access.ldap import LdapUser
from hpcwatch.access.principal import principal_of
from hpcwatch.httpguard import CSP
from hpcwatch.model.cluster import reference_cluster
from hpcwatch.store import Store
from hpcwatch.vocab import EventKind
from hpcwatch.web.access import ANY, ROUTE_NEEDS
from hpcwatch.web.app import create_app
from hpcwatch.web.auth import SAFE_METHODS, safe_next

BASE = "http://127.0.0.1:8000"
CONFIG = (
    '[ldap]\nurl = "ldap://127.0.0.1:1"\nuser_dn = "uid={user},ou=people,dc=x"\n'
    '[proxy]\ntrusted = ["10.9.0.1"]\n'
    "[login]\nper_address_per_minute = 100\nlockout_failures = 3\n"
    '[roles]\noperator = ["@admins"]\n'
)


@pytest.fixture(autouse=True)
def _test_routes_declared(monkeypatch):
    """The routes this file adds after ``create_app``, declared as a new route must be (fail closed)."""
    for path in ("/test/whoami", "/test/change"):
        monkeypatch.setitem(ROUTE_NEEDS, path, ANY)  # type: ignore[arg-type]


class FakeDirectory:
    """alice/alice-pw (in group admins), bob/bob-pw."""

    def authenticate(self, name: str, password: str) -> LdapUser | None:
        if {"alice": "alice-pw", "bob": "bob-pw"}.get(name) != password:
            return None
        return LdapUser(name, f"uid={name},ou=people,dc=x", frozenset({"admins"} if name == "alice" else ()))


def _app(tmp_path, *, secure: bool = False, client: tuple[str, int] = ("127.0.0.1", 40000)):
    events: list = []
    identity = Identity(parse_auth_text(CONFIG + f'[tokens]\nfile = "{tmp_path}/t.json"\n'), audit=events.append)
    identity.ldap = FakeDirectory()  # type: ignore[assignment]
    app = create_app(Store(":memory:"), reference_cluster(), identity=identity, secure_cookies=secure)

    @app.get("/test/whoami")
    async def whoami(request: Request) -> dict:
        p = principal_of(request)
        return {"name": p.name, "via": p.via, "roles": sorted(p.roles)}

    @app.post("/test/change")
    async def change() -> dict:  # a state-changing route as another engineer would add one
        return {"changed": True}

    base = "https://127.0.0.1:8000" if secure else BASE
    return TestClient(app, base_url=base, client=client), identity, events


def _csrf(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)  # type: ignore[union-attr]


def _login(c: TestClient, user: str = "alice", password: str = "alice-pw", next_: str = "/"):
    csrf = _csrf(c.get("/login").text)
    return c.post(
        "/login", data={"user": user, "password": password, "csrf": csrf, "next": next_}, follow_redirects=False
    )


def test_without_credentials_a_page_goes_to_login_and_the_api_answers_401(tmp_path):
    c, _, _ = _app(tmp_path)
    r = c.get("/job/123?lang=fr", headers={"accept": "text/html"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login?next=%2Fjob%2F123%3Flang%3Dfr"
    r = c.get("/api/live")
    assert r.status_code == 401 and r.headers["www-authenticate"] == 'Bearer realm="hpcwatch"'
    assert r.headers["content-security-policy"] == CSP  # the guard's headers on a refusal too
    assert c.get("/healthz").status_code == 200 and c.get("/static/app.css").status_code == 200


def test_login_sets_an_httponly_lax_session_cookie_and_lands_where_asked(tmp_path):
    c, _identity, events = _app(tmp_path)
    r = _login(c, next_="/job/7?lang=fr")
    assert r.status_code == 303 and r.headers["location"] == "/job/7?lang=fr"
    cookie = next(h for h in r.headers.get_list("set-cookie") if h.startswith("hpcwatch_session="))
    assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "Path=/" in cookie and "Secure" not in cookie
    me = c.get("/test/whoami").json()
    assert me == {"name": "alice", "via": "session", "roles": ["operator", "user"]}
    assert 'id="account-link" href="/login">Logged in as alice</a>' in c.get("/?lang=en").text
    assert [e.kind for e in events] == [EventKind.AUTH_LOGIN]
    assert events[0].attrs["user"] == "alice" and events[0].attrs["address"] == "127.0.0.1"


def test_with_tls_the_cookie_is_secure_and_host_prefixed(tmp_path):
    c, _, _ = _app(tmp_path, secure=True)
    r = _login(c)
    cookie = next(h for h in r.headers.get_list("set-cookie") if "hpcwatch_session=" in h)
    assert cookie.startswith("__Host-hpcwatch_session=") and "Secure" in cookie and "HttpOnly" in cookie
    assert c.get("/test/whoami").json()["name"] == "alice"


def test_a_wrong_password_is_401_and_audited_and_n_of_them_lock_the_user_out(tmp_path):
    c, _, events = _app(tmp_path)
    for _ in range(3):
        assert _login(c, password="guess").status_code == 401
    r = _login(c)  # the right password, too late
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 800
    kinds = [e.kind for e in events]
    assert kinds.count(EventKind.AUTH_LOGIN_FAILED) == 4 and kinds.count(EventKind.AUTH_LOCKOUT) == 1
    assert _login(c, "bob", "bob-pw").status_code == 303


def test_logout_needs_the_session_csrf_token_and_ends_the_session(tmp_path):
    c, identity, events = _app(tmp_path)
    _login(c)
    assert c.post("/logout", data={"csrf": "wrong"}).status_code == 403
    csrf = _csrf(c.get("/login").text)  # the account page's form
    r = c.post("/logout", data={"csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert len(identity.sessions) == 0 and events[-1].kind == EventKind.AUTH_LOGOUT
    assert c.get("/api/live").status_code == 401


def test_every_state_changing_route_of_the_app_refuses_a_session_request_without_csrf(tmp_path):
    c, identity, _ = _app(tmp_path)
    _login(c)
    session = next(iter(identity.sessions._sessions.values()))
    changing = sorted(
        (route.path, method)
        for route in c.app.routes
        for method in getattr(route, "methods", None) or ()
        if method not in SAFE_METHODS
    )
    assert ("/login", "POST") in changing and ("/logout", "POST") in changing and ("/test/change", "POST") in changing
    for path, method in changing:
        assert c.request(method, path, data={"csrf": "no"}).status_code == 403, (path, method)
    assert c.post("/test/change", headers={"x-csrf-token": session.csrf}).json() == {"changed": True}
    # the right token from another site is still refused
    cross = {"x-csrf-token": session.csrf, "sec-fetch-site": "cross-site"}
    assert c.post("/test/change", headers=cross).status_code == 403
    assert (
        c.post("/test/change", headers={"x-csrf-token": session.csrf, "origin": "https://evil.example"}).status_code
        == 403
    )


def test_login_csrf_the_form_must_come_from_our_page(tmp_path):
    c, _, events = _app(tmp_path)
    r = c.post("/login", data={"user": "alice", "password": "alice-pw", "csrf": "forged"})
    assert r.status_code == 403 and "expired" in r.text and events == []
    c.cookies.set("hpcwatch_login_csrf", "x", path="/login")
    assert c.post("/login", data={"user": "alice", "password": "alice-pw", "csrf": "y"}).status_code == 403


def test_the_login_page_escapes_what_it_echoes_and_has_no_inline_script(tmp_path):
    c, _, _ = _app(tmp_path)
    evil = '"><script>alert(1)</script><img src=x onerror=alert(2)>'
    csrf = _csrf(c.get("/login").text)
    r = c.post("/login", data={"user": evil, "password": "x", "csrf": csrf, "next": evil})
    assert r.status_code == 401
    assert "<script>" not in r.text and "<img" not in r.text
    assert "&lt;script&gt;" in r.text
    page = c.get("/login?next=" + evil)
    assert "<script" not in page.text and "javascript:" not in page.text
    assert not re.search(r"<[^>]+\son\w+=", page.text)  # no inline handlers
    assert page.headers["content-security-policy"] == CSP and page.headers["x-frame-options"] == "DENY"
    assert page.headers["cache-control"] == "no-store"
    login_cookie = next(h for h in page.headers.get_list("set-cookie") if h.startswith("hpcwatch_login_csrf="))
    assert "HttpOnly" in login_cookie and "SameSite=strict" in login_cookie and "Path=/login" in login_cookie


@pytest.mark.parametrize(
    "target, expected",
    [
        ("/job/1?lang=fr", "/job/1?lang=fr"),
        ("//evil.example/x", "/"),
        ("/\\evil.example", "/"),
        ("https://evil.example/", "/"),
        ("javascript:alert(1)", "/"),
        ("/ok\r\nSet-Cookie: a=b", "/"),
        ("", "/"),
        (None, "/"),
    ],
)
def test_after_login_only_a_path_of_this_server(target, expected):
    assert safe_next(target) == expected


def test_a_trusted_proxy_header_is_a_principal_and_the_same_header_from_elsewhere_is_not(tmp_path):
    proxied, _, _ = _app(tmp_path, client=("10.9.0.1", 5000))
    assert proxied.get("/test/whoami", headers={"x-remote-user": "bob"}).json()["via"] == "proxy"
    # through the proxy a state-changing request must say same-origin (the proxy adds the header to forgeries too)
    assert proxied.post("/test/change", headers={"x-remote-user": "bob"}).status_code == 403
    ok = {"x-remote-user": "bob", "sec-fetch-site": "same-origin"}
    assert proxied.post("/test/change", headers=ok).status_code == 200
    direct, _, _ = _app(tmp_path, client=("10.9.0.2", 5000))
    assert direct.get("/test/whoami", headers={"x-remote-user": "bob"}).status_code == 401


def test_an_api_token_is_a_principal_and_a_metrics_token_is_not_one_for_the_web(tmp_path):
    c, identity, _ = _app(tmp_path)
    assert identity.tokens is not None
    api, _ = identity.tokens.create("scripts", "api", 3600)
    metrics, _ = identity.tokens.create("prom", "metrics", 3600)
    me = c.get("/test/whoami", headers={"authorization": f"Bearer {api}"}).json()
    assert me == {"name": "scripts", "via": "token", "roles": ["user"]}
    assert (
        c.post("/test/change", headers={"authorization": f"Bearer {api}"}).status_code == 200
    )  # no CSRF: not a cookie
    assert c.get("/api/live", headers={"authorization": f"Bearer {metrics}"}).status_code == 401


def test_without_auth_the_app_is_unchanged_and_every_request_is_local():
    app = create_app(Store(":memory:"), reference_cluster())
    c = TestClient(app)
    assert c.get("/api/live").status_code == 200
    assert c.get("/login").status_code == 404
    assert principal_of(type("R", (), {"state": type("S", (), {})()})()).via == "local"


def test_the_exporter_with_auth_answers_401_without_a_metrics_token(tmp_path):
    from hpcwatch.exporter import serve_metrics

    identity = Identity(parse_auth_text(f'[tokens]\nfile = "{tmp_path}/t.json"\n'))
    assert identity.tokens is not None
    metrics, _ = identity.tokens.create("prom", "metrics", 3600)
    api, _ = identity.tokens.create("scripts", "api", 3600)
    server, thread = serve_metrics(
        Store(":memory:"), port=0, authenticate=lambda header: identity.from_bearer(header, "metrics")
    )
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"

    def status(token: str | None) -> int:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as err:
            assert err.headers["WWW-Authenticate"].startswith("Bearer")
            return err.code

    try:
        assert (status(None), status(api), status("hpcw_junk"), status(metrics)) == (401, 401, 401, 200)
    finally:
        server.shutdown()
        thread.join(timeout=10)
    assert isinstance(thread, threading.Thread)


def test_a_session_id_set_before_login_is_never_adopted(tmp_path):
    """Session fixation: a cookie planted before login is not the session the login opens."""
    c, identity, _ = _app(tmp_path)
    csrf = _csrf(c.get("/login").text)
    login_cookie = c.cookies.get("hpcwatch_login_csrf")
    r = c.post(
        "/login",
        data={"user": "alice", "password": "alice-pw", "csrf": csrf},
        headers={"cookie": f"hpcwatch_session=planted; hpcwatch_login_csrf={login_cookie}"},
        follow_redirects=False,
    )
    assert r.status_code == 303
    opened = r.headers["set-cookie"].split("hpcwatch_session=", 1)[1].split(";", 1)[0]
    assert opened != "planted" and identity.sessions.get("planted") is None
    assert identity.sessions.get(opened) is not None


def test_logins_failures_and_lockouts_reach_the_security_roles_audit_trail(tmp_path):
    store = Store(":memory:")
    text = CONFIG + 'security = ["alice"]\n' + f'[tokens]\nfile = "{tmp_path}/t.json"\n'  # CONFIG ends in [roles]
    identity = Identity(parse_auth_text(text), audit=lambda event: store.add([event]))  # as serve --auth wires it
    identity.ldap = FakeDirectory()  # type: ignore[assignment]
    app = create_app(store, reference_cluster(), identity=identity)
    c = TestClient(app, base_url=BASE, client=("10.1.2.3", 40000))
    for _ in range(3):
        assert _login(c, "bob", "guess").status_code == 401
    assert _login(c).status_code == 303
    entries = c.get("/api/audit").json()["entries"]
    seen = {(e["kind"], e["who"], e["what"]) for e in entries}
    assert (EventKind.AUTH_LOGIN, "alice", "10.1.2.3") in seen
    assert (EventKind.AUTH_LOGIN_FAILED, "bob", "10.1.2.3") in seen
    assert (EventKind.AUTH_LOCKOUT, "bob", "10.1.2.3") in seen
    panel = c.get("/audit?lang=fr").text
    assert "s&#39;est connecté" in panel and "a été bloqué" in panel


def test_behind_a_trusted_proxy_a_login_is_from_the_address_it_forwarded(tmp_path):
    c, _, events = _app(tmp_path, client=("10.9.0.1", 40000))  # the proxy of CONFIG's [proxy] trusted
    # The client wrote 6.6.6.6 itself; the proxy appended the address it saw, 192.0.2.7.
    csrf = _csrf(c.get("/login").text)
    form = {"user": "alice", "password": "alice-pw", "csrf": csrf, "next": "/"}
    c.post("/login", data=form, headers={"x-forwarded-for": "6.6.6.6, 192.0.2.7"}, follow_redirects=False)
    assert [(e.kind, e.attrs["address"]) for e in events] == [(EventKind.AUTH_LOGIN, "192.0.2.7")]


@pytest.mark.parametrize(
    ("peer", "forwarded", "address"),
    [
        ("10.9.0.1", "192.0.2.7", "192.0.2.7"),
        ("10.9.0.1", "6.6.6.6, 192.0.2.7", "192.0.2.7"),  # the left end is the client's word
        ("10.9.0.1", "192.0.2.7, 10.9.0.1", "192.0.2.7"),  # through two trusted proxies
        ("10.1.2.3", "192.0.2.7", "10.1.2.3"),  # not a trusted proxy: its header is not believed
        ("10.9.0.1", "192.0.2.7, <script>", "10.9.0.1"),  # not what a proxy writes
        ("10.9.0.1", None, "10.9.0.1"),
        (None, "192.0.2.7", "?"),
    ],
)
def test_the_client_address_is_read_from_the_right_end_of_a_trusted_proxys_header(tmp_path, peer, forwarded, address):
    identity = Identity(parse_auth_text(CONFIG + f'[tokens]\nfile = "{tmp_path}/t.json"\n'))
    assert identity.client_address(peer, forwarded) == address


def test_a_proxy_that_only_terminates_tls_names_no_user_but_forwards_the_address(tmp_path):
    text = CONFIG.replace("[proxy]\n", '[proxy]\nheader = ""\n') + f'[tokens]\nfile = "{tmp_path}/t.json"\n'
    identity = Identity(parse_auth_text(text))
    identity.ldap = FakeDirectory()  # type: ignore[assignment]
    c = TestClient(create_app(Store(":memory:"), reference_cluster(), identity=identity), client=("10.9.0.1", 1))
    r = c.get("/api/live", headers={"x-remote-user": "alice"})  # a client's own header, through the proxy
    assert r.status_code == 401
    assert identity.client_address("10.9.0.1", "192.0.2.7") == "192.0.2.7"
