"""Who is asking, against real services: a real slapd (OpenLDAP 2.5, Debian), ``hpcwatch serve --auth`` logged
into from a real Chromium (one server start for the module), and a real Prometheus scraping ``hpcwatch
exporter`` with a bearer token from ``authorization: {credentials_file: ...}``.

slapd, Prometheus and the server are started by fixtures on ports of their own and stopped by their PID.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hpcwatch.store import Store
from hpcwatch.vocab import EventKind

from .conftest import need, stop_process, wait_until
from .services import SLAPD, ServiceError, start_slapd

pytestmark = pytest.mark.integration

SLAPD_PORT = 29389
SLAPD_TLS_PORT = 29390
WEB_PORT = 29980
EXPORTER_AUTH_PORT = 29979
PROM_AUTH_PORT = 29085  # apart from every other test's Prometheus (29087-29099, VictoriaMetrics +100/+200)
SUFFIX = "dc=hpcwatch,dc=test"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
LOCKOUT_FAILURES = 3


def _person(uid: str, number: int, password: str) -> str:
    return (
        f"dn: uid={uid},ou=people,{SUFFIX}\nobjectClass: inetOrgPerson\nobjectClass: posixAccount\nuid: {uid}\n"
        f"cn: {uid}\nsn: {uid}\nuidNumber: {number}\ngidNumber: {number}\nhomeDirectory: /home/{uid}\n"
        f"userPassword: {password}\n\n"
    )


LDIF = (
    f"dn: {SUFFIX}\nobjectClass: dcObject\nobjectClass: organization\no: hpcwatch test\ndc: hpcwatch\n\n"
    f"dn: ou=people,{SUFFIX}\nobjectClass: organizationalUnit\nou: people\n\n"
    f"dn: ou=groups,{SUFFIX}\nobjectClass: organizationalUnit\nou: groups\n\n"
    + _person("alice", 5001, "alice-pw")
    + _person("bob", 5002, "bob-pw")
    + _person("carol", 5003, "carol-pw")
    + f"dn: cn=hpc-admins,ou=groups,{SUFFIX}\nobjectClass: posixGroup\ncn: hpc-admins\ngidNumber: 6001\nmemberUid: alice\n"
)


@pytest.fixture(scope="module")
def slapd_cert(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA), made with the openssl CLI."""
    folder = tmp_path_factory.mktemp("slapd-tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
            "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def slapd(tmp_path_factory, slapd_cert) -> Iterator[str]:
    need(Path(SLAPD).exists(), "slapd (Debian's OpenLDAP) is not installed: run scripts/install-system")
    need(os.geteuid() == 0, "the test's slapd reads its key as root; run as root or in CI")
    try:
        service = start_slapd(
            tmp_path_factory.mktemp("slapd"),
            port=SLAPD_PORT,
            suffix=SUFFIX,
            root_password="admin-pw",
            ldif=LDIF,
            tls=slapd_cert,
            tls_port=SLAPD_TLS_PORT,
        )
    except ServiceError as err:
        pytest.fail(str(err))
    yield service.url
    stop_process(service.proc)


@pytest.fixture(scope="module")
def auth_file(slapd, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("auth")
    path = folder / "auth.toml"
    path.write_text(
        f'[ldap]\nurl = "{slapd}"\nuser_dn = "uid={{user}},ou=people,{SUFFIX}"\n'
        f'group_base = "ou=groups,{SUFFIX}"\ntimeout_s = 5\n\n'
        f'[tokens]\nfile = "{folder / "tokens.json"}"\n\n'
        '[proxy]\nheader = "X-Remote-User"\ntrusted = ["10.99.0.1"]\n\n'
        '[roles]\noperator = ["@hpc-admins", "prometheus"]\ndecider = ["carol"]\n\n'
        f"[login]\nper_address_per_minute = 60\nlockout_failures = {LOCKOUT_FAILURES}\nlockout_minutes = 10\n"
    )
    return path


@pytest.fixture(scope="module")
def server(auth_file, tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """``hpcwatch serve --auth`` on a store of its own: the one server start of the module."""
    db = tmp_path_factory.mktemp("store") / "store"
    Store(db).close()
    cmd = [sys.executable, "-m", "hpcwatch", "serve", "--db", str(db), "--port", str(WEB_PORT)]
    proc = subprocess.Popen(
        [*cmd, "--auth", str(auth_file), "--duration", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{WEB_PORT}"

    def up() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"hpcwatch serve --auth exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, timeout_s=60, what="hpcwatch serve --auth")
    yield url, db
    stop_process(proc)


def _events(db: Path, kind: str) -> list[dict]:
    store = Store(db)
    try:
        return [dict(e.attrs) for e in store.events(kind)]
    finally:
        store.close()


def test_login_in_chromium_against_slapd_then_logout(server):
    """A viewer is sent to the login page, a wrong password is refused, the right one lands on the page it
    asked for with a HttpOnly, SameSite=Lax session cookie, the account page names its LDAP group's role,
    logout ends the session; each step is an audit event in the store."""
    url, db = server
    need(Path(CHROMIUM).exists(), "Debian chromium is not installed")
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(locale="en-US")
            page = context.new_page()
            page.goto(f"{url}/?lang=en")
            assert page.url.startswith(f"{url}/login?next=")
            page.fill("#user", "alice")
            page.fill("#password", "not-her-password")
            page.click("#login-submit")
            assert page.locator("#login-error").inner_text() == "Wrong user name or password."
            page.fill("#password", "alice-pw")
            page.click("#login-submit")
            page.wait_for_url(f"{url}/?lang=en")
            assert page.locator("svg").count() > 0  # the schematic, rendered for a logged-in viewer
            assert page.locator("#account-link").inner_text() == "Logged in as alice"
            cookie = next(c for c in context.cookies() if c["name"] == "hpcwatch_session")
            assert cookie["httpOnly"] and cookie["sameSite"] == "Lax" and not cookie["secure"]  # plain HTTP here
            page.click("#account-link")
            assert page.locator("#account-title").inner_text() == "Logged in as alice"
            assert "operator" in page.locator("#account-roles").inner_text()
            page.click("#logout")
            page.wait_for_url(f"{url}/login")
            page.goto(f"{url}/")
            assert page.url.startswith(f"{url}/login?next=")
            assert httpx.get(f"{url}/api/live", cookies={"hpcwatch_session": cookie["value"]}).status_code == 401
        finally:
            browser.close()
    wait_until(lambda: _events(db, EventKind.AUTH_LOGOUT), timeout_s=10, what="the logout event")
    assert [e["user"] for e in _events(db, EventKind.AUTH_LOGIN)] == ["alice"]
    assert [e["why"] for e in _events(db, EventKind.AUTH_LOGIN_FAILED) if e["user"] == "alice"] == ["bad"]


def _login_form(client: httpx.Client, url: str) -> str:
    html = client.get(f"{url}/login").text
    return html.split('name="csrf" value="', 1)[1].split('"', 1)[0]


def test_lockout_after_failures_refuses_even_the_right_password(server):
    url, db = server
    with httpx.Client() as client:
        for _ in range(LOCKOUT_FAILURES):
            csrf = _login_form(client, url)
            r = client.post(f"{url}/login", data={"user": "carol", "password": "guess", "csrf": csrf})
            assert r.status_code == 401
        csrf = _login_form(client, url)
        r = client.post(f"{url}/login", data={"user": "carol", "password": "carol-pw", "csrf": csrf})
        assert r.status_code == 429 and int(r.headers["retry-after"]) > 500
        assert "Too many failed attempts" in r.text
        csrf = _login_form(client, url)  # another user from the same address is not locked out
        assert client.post(f"{url}/login", data={"user": "bob", "password": "bob-pw", "csrf": csrf}).status_code == 303
    wait_until(lambda: _events(db, EventKind.AUTH_LOCKOUT), timeout_s=10, what="the lock-out event")


def test_proxy_header_from_an_untrusted_address_is_ignored(server):
    url, _db = server
    r = httpx.get(f"{url}/api/live", headers={"X-Remote-User": "alice"})
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")


def test_prometheus_scrapes_the_exporter_with_a_token_and_not_without(auth_file, start_prometheus, tmp_path):
    """hpcwatch exporter --auth: Prometheus's job with ``authorization.credentials_file`` gets samples, the
    same target without it is down (401)."""
    from hpcwatch.model.cluster import reference_cluster
    from hpcwatch.twin import Twin

    db = tmp_path / "store"
    store = Store(db)
    twin = Twin(reference_cluster(), seed=4)
    for _ in range(3):
        twin.advance(5.0)
        store.add(twin.records())
    store.close()

    def token_for(user: str) -> str:
        created = subprocess.run(
            [sys.executable, "-m", "hpcwatch", "token", "create", "--auth", str(auth_file)]
            + ["--user", user, "--scope", "metrics", "--expires", "1d"],
            capture_output=True,
            text=True,
            check=True,
        )
        return created.stdout.strip()

    token_file = tmp_path / "token"
    token_file.write_text(token_for("prometheus"))  # an operator in [roles]: every job, with its user
    exporter = subprocess.Popen(
        [sys.executable, "-m", "hpcwatch", "exporter", "--db", str(db), "--port", str(EXPORTER_AUTH_PORT)]
        + ["--auth", str(auth_file), "--duration", "300"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(lambda: _listening(EXPORTER_AUTH_PORT, exporter), timeout_s=30, what="hpcwatch exporter --auth")
        target = {"targets": [f"127.0.0.1:{EXPORTER_AUTH_PORT}"]}
        config = {
            "global": {"scrape_interval": "2s", "scrape_timeout": "2s"},
            "scrape_configs": [
                {
                    "job_name": "with-token",
                    "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
                    "static_configs": [target],
                },
                {"job_name": "without", "static_configs": [target]},
            ],
        }
        prom = start_prometheus(json.dumps(config), port=PROM_AUTH_PORT)
        wait_until(lambda: len(prom.query("up")) == 2, timeout_s=30, what="both scrape jobs to have run")
        up = {r["metric"]["job"]: r["value"][1] for r in prom.query("up")}
        assert up == {"with-token": "1", "without": "0"}
        hours = prom.query("hpcwatch_job_gpu_hours")
        assert hours and {r["metric"]["job"] for r in hours} == {"with-token"}
        assert httpx.get(f"http://127.0.0.1:{EXPORTER_AUTH_PORT}/metrics").status_code == 401
        users = {r["metric"]["user"] for r in hours}
        assert users and not any(u.startswith("u-") for u in users)

        # Each token's labels are its user's scope: a decider reads pseudonyms, a plain user their own jobs only.
        def scrape(user: str) -> str:
            headers = {"Authorization": f"Bearer {token_for(user)}"}
            r = httpx.get(f"http://127.0.0.1:{EXPORTER_AUTH_PORT}/metrics", headers=headers)
            assert r.status_code == 200
            return r.text

        decider = [line for line in scrape("carol").splitlines() if line.startswith("hpcwatch_job_gpu_hours{")]
        assert decider and all('user="u-' in line for line in decider), decider[:3]
        assert not any(u in "\n".join(decider) for u in users)
        dave = [line for line in scrape("dave").splitlines() if line.startswith("hpcwatch_job_gpu_hours{")]
        assert dave and all('user="dave"' in line for line in dave)  # a twin user: their own jobs only
        nobody = scrape("nobody")
        assert not [line for line in nobody.splitlines() if line.startswith("hpcwatch_job_gpu_hours{")]
    finally:
        stop_process(exporter)


def _listening(port: int, proc: subprocess.Popen) -> bool:
    if proc.poll() is not None:
        pytest.fail(f"hpcwatch exporter exited: {proc.stderr.read().decode()[-2000:]}")
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_ldaps_and_starttls_verify_the_directory_s_certificate(slapd, slapd_cert):
    """Against the same slapd: ldaps and StartTLS log in with the site CA given, and refuse (directory
    unavailable, not a wrong password) without it; a DN found by search, and a name with filter characters
    finds nobody."""
    from hpcwatch.access.authconfig import LdapConfig
    from hpcwatch.access.ldap import LdapAuthenticator
    from hpcwatch.errors import BackendError

    ca = str(slapd_cert[0])
    people, groups = f"ou=people,{SUFFIX}", f"ou=groups,{SUFFIX}"
    ldaps = f"ldaps://127.0.0.1:{SLAPD_TLS_PORT}"
    for url, start_tls in ((ldaps, False), (slapd, True)):
        config = LdapConfig(
            url=url, start_tls=start_tls, user_dn=f"uid={{user}},{people}", group_base=groups, ca_file=ca
        )
        user = LdapAuthenticator(config).authenticate("alice", "alice-pw")
        assert user is not None and "hpc-admins" in user.groups, url
        assert LdapAuthenticator(config).authenticate("alice", "wrong") is None
        untrusted = LdapConfig(url=url, start_tls=start_tls, user_dn=f"uid={{user}},{people}", ca_file="")
        with pytest.raises(BackendError):
            LdapAuthenticator(untrusted).authenticate("alice", "alice-pw")
    search = LdapConfig(url=slapd, search_base=people, group_base=groups)
    found = LdapAuthenticator(search).authenticate("bob", "bob-pw")
    assert found is not None and found.dn == f"uid=bob,{people}" and found.groups == frozenset()
    assert LdapAuthenticator(search)._user_dn("*") is None  # escaped: the literal name "*", nobody
    assert LdapAuthenticator(search)._user_dn("bob)(uid=*") is None
