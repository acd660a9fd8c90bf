"""The web server hardened (issue #25, items 4 and 5): every header, every limit and its refusal, against a
real uvicorn on port 0 (raw sockets where the refusal is about the connection itself), and TLS with a
certificate the ``openssl`` command makes in the test."""

from __future__ import annotations

import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from hpcwatch.httpguard import CSP, Limits, allowed_hosts, host_allowed, is_loopback
from hpcwatch.model import reference_cluster
from hpcwatch.records import Job
from hpcwatch.store import Store
from hpcwatch.web.app import create_app
from hpcwatch.web.demo import Listen, uvicorn_config
from hpcwatch.web.guard import Guard, GuardSettings

T0 = 1_796_000_000.0


@pytest.fixture
def store() -> Iterator[Store]:
    s = Store(":memory:")
    s.add([Job(id="7", user="ana", account="ml", state="RUNNING", start=T0, nodes=("gpu-node-01",), gpus=8)])
    yield s
    s.close()


def _app(store: Store, **limits: float):
    return create_app(store, reference_cluster(), stream_interval_s=0.05, limits=Limits(**limits))


@contextmanager
def running(app, *, host: str = "127.0.0.1", **listen) -> Iterator[int]:
    """The app under uvicorn (the guarded protocol of ``uvicorn_config``) on a port the kernel chose."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app, Listen(host=host, port=port, **listen)))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    _until(lambda: server.started, "server started")
    try:
        yield port
    finally:
        app.state.hpcwatch.stopping.set()
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


def _until(condition, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.02)


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.settimeout(20)
    sock.connect(("127.0.0.1", port))
    return sock


def _request(port: int, path: str = "/healthz", host: str = "localhost", source: str = "127.0.0.1") -> socket.socket:
    sock = _connect(port, source)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    return sock


def _head(sock: socket.socket) -> tuple[int, dict[str, str]]:
    """Status and headers of the response on ``sock`` (read up to the blank line)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    lines = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}


# --- headers -------------------------------------------------------------------------------------------------

PAGES = ["/", "/job/7", "/job/nope", "/assess", "/healthz", "/api/live", "/static/app.js", "/openapi.json", "/x404"]


@pytest.mark.parametrize("path", PAGES)
def test_every_response_carries_the_security_headers(store, path):
    response = TestClient(_app(store)).get(path)
    assert response.headers["content-security-policy"] == CSP
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["referrer-policy"] == "no-referrer"


def test_an_unexpected_error_s_500_carries_them_too(store, monkeypatch):
    app = _app(store)
    monkeypatch.setattr(app.state.hpcwatch.live, "latest_t", lambda: 1 / 0)
    response = TestClient(app, raise_server_exceptions=False).get("/healthz")
    assert response.status_code == 500 and response.json()["type"] == "ZeroDivisionError"
    assert response.headers["content-security-policy"] == CSP and response.headers["x-frame-options"] == "DENY"


def test_the_policy_allows_no_inline_script_and_no_framing():
    directives = dict(d.strip().split(" ", 1) for d in CSP.split(";"))
    assert directives["script-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"
    assert "unsafe-inline" not in directives["script-src"] and "unsafe-eval" not in CSP


class _Scripts(HTMLParser):
    """Every inline script (a ``<script>`` without ``src`` that is not JSON data) and ``on*=`` handler."""

    def __init__(self) -> None:
        super().__init__()
        self.inline: list[str] = []
        self._in_inline = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.inline += [f"<{tag} {k}=>" for k in found if k.startswith("on")]
        if tag == "script" and "src" not in found and found.get("type") != "application/json":
            self._in_inline = True

    def handle_endtag(self, tag: str) -> None:
        self._in_inline = False

    def handle_data(self, data: str) -> None:
        if self._in_inline and data.strip():
            self.inline.append(data[:60])


@pytest.mark.parametrize("path", ["/", "/?lang=fr", "/job/7", "/job/nope", "/assess"])
def test_no_page_has_an_inline_script_or_handler(store, path):
    response = TestClient(_app(store)).get(path)
    assert response.status_code in (200, 404)
    parser = _Scripts()
    parser.feed(response.text)
    assert parser.inline == []
    # the scripts it loads are ours, from this origin
    for src in re.findall(r'<script[^>]* src="([^"]+)"', response.text):
        assert src.startswith("/"), src


def test_the_assess_file_report_keeps_its_inline_scripts_under_its_own_policy(store):
    """``hpcwatch assess --html`` writes a file opened from disk: no origin to load plotly from, so its
    scripts stay inline, allowed by the file's own meta policy (which fetches nothing)."""
    from hpcwatch.web import api
    from hpcwatch.web.assess_html import render_assessment_html

    app = _app(store)
    html = render_assessment_html(api.assessment_doc(app.state.hpcwatch))
    assert "script-src 'unsafe-inline'" in html and "default-src 'none'" in html
    assert "Plotly.newPlot" in html and "/vendor/plotly.min.js" not in html
    served = TestClient(app).get("/assess").text
    assert "/vendor/plotly.min.js" in served and "/static/assess.js" in served and 'id="figures"' in served
    assert "http-equiv" not in served  # the server's header is the policy; a meta one would be intersected


# --- Host allow-list -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("localhost", True),
        ("localhost:8000", True),
        ("127.0.0.1:8000", True),
        ("[::1]:8000", True),
        ("LOCALHOST.", True),  # case and a trailing dot are the same name
        ("hpc.example.org", True),  # --allow-host
        ("evil.example", False),  # DNS rebinding: a page of evil.example re-pointed at 127.0.0.1
        ("localhost.evil.example", False),
        ("", False),
        (None, False),  # HTTP/1.0 without Host
    ],
)
def test_host_allow_list(header, ok):
    assert host_allowed(header, allowed_hosts("127.0.0.1", ["hpc.example.org"])) is ok


def test_a_wildcard_bind_takes_any_address_and_the_machine_s_names_but_no_other_name():
    wildcard = allowed_hosts("0.0.0.0")
    assert "0.0.0.0" not in wildcard
    assert host_allowed("10.0.0.5:9977", wildcard) and host_allowed("[fd00::5]:9977", wildcard)
    assert host_allowed(socket.gethostname(), wildcard)
    assert not host_allowed("evil.example", wildcard) and not host_allowed("10.0.0.5.evil.example", wildcard)
    bound = allowed_hosts("10.0.0.5")
    assert host_allowed("10.0.0.5:8000", bound) and not host_allowed("10.0.0.6", bound)


def test_the_server_refuses_another_host_with_400(store):
    with running(_app(store), allow_hosts=("hpc.example.org",)) as port:
        ok, _ = _head(_request(port, host=f"localhost:{port}"))
        allowed, _ = _head(_request(port, host="hpc.example.org"))
        refused, headers = _head(_request(port, host="evil.example"))
    assert (ok, allowed, refused) == (200, 200, 400)
    assert headers["content-security-policy"] == CSP  # a refusal too carries the headers


# --- SSE caps ------------------------------------------------------------------------------------------------


def _stream(port: int, source: str = "127.0.0.1") -> tuple[int, dict[str, str], socket.socket]:
    sock = _request(port, "/api/stream", source=source)
    status, headers = _head(sock)
    return status, headers, sock


def test_live_streams_are_capped_per_address_and_in_total(store):
    app = _app(store, max_streams=3, max_streams_per_client=2)
    with running(app) as port:
        a1, a2 = _stream(port), _stream(port)
        a3 = _stream(port)  # a third from the same address
        b1 = _stream(port, source="127.0.0.2")
        c1 = _stream(port, source="127.0.0.3")  # a fourth in all
        assert [a1[0], a2[0], a3[0], b1[0], c1[0]] == [200, 200, 503, 200, 503]
        assert a3[1]["retry-after"] == "5" and c1[1]["retry-after"] == "5"
        open_streams = app.state.hpcwatch.guard.open_streams
        assert dict(open_streams) == {"127.0.0.1": 2, "127.0.0.2": 1}
        a1[2].close()  # a viewer leaves: its slot comes back
        _until(lambda: open_streams["127.0.0.1"] == 1, "the closed stream's slot released")
        again = _stream(port)
        assert again[0] == 200
        for s in (a2[2], a3[2], b1[2], c1[2], again[2]):
            s.close()
        _until(lambda: not open_streams, "every slot released")


# --- connections: the cap and the header deadline (slowloris) ------------------------------------------------


def _closed_with(sock: socket.socket) -> int | None:
    """The status the server wrote before closing ``sock`` (None: closed without a word)."""
    try:
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    finally:
        sock.close()
    return int(data.split()[1]) if data.startswith(b"HTTP/1.1 ") else None


def test_500_idle_sockets_are_not_all_held(store):
    """The issue's measure: 500 idle sockets were all accepted and held. Now the ones past
    ``max_connections`` are answered 503 at once, and the held ones 408 at the header deadline."""
    limits = {"max_connections": 100, "header_timeout_s": 1.0}
    with running(_app(store, **limits)) as port:
        started = time.monotonic()
        socks = [_connect(port) for _ in range(500)]
        last_status, last_headers = _head(socks[-1])  # past the cap: refused at once, before any request
        statuses = [_closed_with(s) for s in socks[:-1]] + [last_status]
        elapsed = time.monotonic() - started
        assert _head(_request(port))[0] == 200  # and the server still answers
    assert last_headers["retry-after"] == "5" and last_headers["connection"] == "close"
    assert statuses.count(503) == 400 and statuses.count(408) == 100, sorted(set(map(str, statuses)))
    assert elapsed < 15  # all 500 are gone within the deadline (and the machine's load), not held


def test_a_slowloris_trickling_its_head_is_cut_at_the_deadline(store):
    with running(_app(store, header_timeout_s=0.5)) as port:
        sock = _connect(port)
        started = time.monotonic()
        sent = 0
        try:
            for byte in b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 200:
                sock.send(bytes([byte]))
                sent += 1
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass
        status = _closed_with(sock)
    assert status == 408
    assert sent < 150 and time.monotonic() - started < 10  # cut well before the head was whole


def test_keep_alive_still_serves_several_requests_on_one_connection(store):
    with running(_app(store, header_timeout_s=0.5)) as port, httpx.Client(base_url=f"http://localhost:{port}") as c:
        for _ in range(3):
            assert c.get("/healthz").status_code == 200
            time.sleep(0.3)  # each request within the deadline re-arms it


# --- sizes ---------------------------------------------------------------------------------------------------


def test_a_request_head_over_the_limit_is_refused(store):
    head = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 8192
    with running(_app(store, max_header_bytes=4096)) as port:
        whole = _connect(port)  # arrives in one read: counted by the guard
        whole.sendall(head + b"\r\n\r\n")
        partial = _connect(port)  # never ends: h11 stops buffering at the limit
        partial.sendall(head)
        fits = _connect(port)
        fits.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 1000 + b"\r\n\r\n")
        statuses = [_head(whole)[0], _head(partial)[0], _head(fits)[0]]
    assert statuses == [431, 400, 200]


def test_a_body_over_the_limit_is_refused_with_413(store):
    with running(_app(store, max_body_bytes=1024)) as port, httpx.Client(base_url=f"http://localhost:{port}") as c:
        assert c.post("/healthz", content=b"x" * 2048).status_code == 413
        assert c.post("/healthz", content=b"x" * 10).status_code == 405  # under the cap: the route's own answer


async def _run_asgi(app, chunks: list[bytes]) -> list[dict]:
    scope = {"type": "http", "path": "/echo", "headers": [(b"host", b"localhost")], "client": ("127.0.0.1", 1)}
    sent: list[dict] = []
    pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive():
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    return sent


def test_a_chunked_body_over_the_limit_is_refused_with_413():
    """No Content-Length to check first: the guard counts what the app reads, then answers 413."""
    import asyncio

    async def echo(scope, receive, send):
        body = b""
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            body += message["body"]
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    guard = Guard(echo, GuardSettings(limits=Limits(max_body_bytes=100)))
    small = asyncio.run(_run_asgi(guard, [b"a" * 40, b"b" * 40]))
    big = asyncio.run(_run_asgi(guard, [b"a" * 80, b"b" * 80]))
    assert small[0]["status"] == 200 and small[1]["body"] == b"a" * 40 + b"b" * 40
    assert big[0]["status"] == 413 and len(big) == 2


def test_job_ids_stay_capped(store):
    from hpcwatch.records import MAX_JOB_ID_CHARS

    client = TestClient(_app(store))
    assert MAX_JOB_ID_CHARS == 512
    assert client.get("/api/job/" + "a" * 600).status_code == 400


@pytest.mark.parametrize("bad", [{"max_streams": 0}, {"header_timeout_s": 0}, {"max_body_bytes": -1}])
def test_limits_are_checked(bad):
    from hpcwatch.errors import ConfigError

    with pytest.raises(ConfigError, match=next(iter(bad))):
        Limits(**bad)


# --- exposure and TLS ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("host", "loop"), [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True),
                                            ("localhost", True), ("0.0.0.0", False), ("10.0.0.5", False),
                                            ("::", False), ("hpc.example.org", False)])  # fmt: skip
def test_loopback(host, loop):
    assert is_loopback(host) is loop


def _hpcwatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcwatch", *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("command", ["serve", "exporter"])
def test_a_non_loopback_host_without_auth_is_refused_in_one_line(command, tmp_path):
    result = _hpcwatch(command, "--db", str(tmp_path / "db"), "--host", "0.0.0.0", "--port", "1")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--insecure-no-auth" in lines[0] and "no authentication" in lines[0], result.stderr


def test_insecure_no_auth_lets_it_bind_off_loopback(tmp_path):
    result = _hpcwatch(
        "exporter", "--db", str(tmp_path / "db"), "--host", "0.0.0.0", "--insecure-no-auth", "--port", "0",
        "--duration", "0.2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    bound = re.search(r"http://0\.0\.0\.0:(\d+)/metrics", result.stdout)
    assert bound and int(bound[1]) > 0, result.stdout


@pytest.fixture(scope="module")
def cert(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for localhost, made by the openssl command (cryptography is not installed)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    folder = tmp_path_factory.mktemp("tls")
    crt, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(crt)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return crt, key


def test_serve_speaks_tls_with_the_given_certificate(store, cert):
    crt, key = cert
    with running(_app(store), tls_cert=crt, tls_key=key) as port:
        response = httpx.get(f"https://localhost:{port}/healthz", verify=ssl.create_default_context(cafile=crt))
        with pytest.raises(httpx.HTTPError):  # plain HTTP to the TLS port is no answer
            httpx.get(f"http://localhost:{port}/healthz", timeout=5)
    assert response.status_code == 200 and response.json()["ok"] is True
    assert response.headers["x-frame-options"] == "DENY"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--tls-cert", "{crt}"], "go together"),
        (["--tls-cert", "{missing}", "--tls-key", "{key}"], "no such file"),
        (["--tls-cert", "{key}", "--tls-key", "{key}"], "cannot load the pair"),  # a key is no certificate
    ],
)
def test_bad_tls_files_are_one_line(args, says, cert, tmp_path):
    crt, key = cert
    filled = [a.format(crt=crt, key=key, missing=tmp_path / "none.pem") for a in args]
    result = _hpcwatch("serve", "--db", str(tmp_path / "db"), "--port", "1", *filled)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], result.stderr
