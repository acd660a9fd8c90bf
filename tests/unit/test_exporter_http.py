"""The exporter's HTTP server hardened (issue #25, items 4 and 5): headers, Host allow-list, connection cap,
handshake and head deadline, TLS; each refusal against a real server on port 0."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from hpcwatch.exporter import serve_metrics
from hpcwatch.httpguard import CSP, Limits
from hpcwatch.store import Store
from tests.unit.stretch_fixtures import store_reads  # noqa: F401  (fixture)


@pytest.fixture
def store() -> Iterator[Store]:
    s = Store(":memory:")
    yield s
    s.close()


@contextmanager
def exporter(store: Store, **kw) -> Iterator[int]:
    server, thread = serve_metrics(store, port=0, **kw)
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _closed_with(sock: socket.socket) -> int | None:
    try:
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        data = b""
    finally:
        sock.close()
    return int(data.split()[1]) if data.startswith(b"HTTP/") else None


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=20)


def test_metrics_carry_the_security_headers_and_refuse_another_host(store):
    with exporter(store, allow_hosts=("prom.example.org",)) as port:
        ok = httpx.get(f"http://localhost:{port}/metrics")
        named = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Host": "prom.example.org"})
        evil = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Host": "evil.example"})
    assert (ok.status_code, named.status_code, evil.status_code) == (200, 200, 400)
    assert "hpcwatch_findings" in ok.text
    for response in (ok, evil):
        assert response.headers["content-security-policy"] == CSP
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["referrer-policy"] == "no-referrer"


def test_idle_sockets_are_capped_and_cut_at_the_deadline(store):
    """500 idle sockets: past ``max_connections`` a 503 at once; the held ones closed at the deadline."""
    with exporter(store, limits=Limits(max_connections=50, header_timeout_s=1.0)) as port:
        started = time.monotonic()
        socks = [_connect(port) for _ in range(500)]
        socks[-1].settimeout(20)
        refused = socks[-1].recv(4096)  # past the cap: answered at once, before any request
        statuses = [_closed_with(s) for s in socks[:-1]] + [int(refused.split()[1])]
        elapsed = time.monotonic() - started
        # every slot came back: the server still answers
        deadline = time.monotonic() + 20
        while (status := httpx.get(f"http://localhost:{port}/metrics").status_code) != 200:
            assert time.monotonic() < deadline, status
            time.sleep(0.05)
    assert statuses.count(503) == 450 and statuses.count(None) == 50, sorted(set(map(str, statuses)))
    assert b"Retry-After: 5\r\n" in refused
    assert elapsed < 15


def test_a_trickled_request_head_is_cut(store):
    with exporter(store, limits=Limits(header_timeout_s=0.5)) as port:
        sock = _connect(port)
        started, sent = time.monotonic(), 0
        try:
            for byte in b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 200:
                sock.send(bytes([byte]))
                sent += 1
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass
        _closed_with(sock)
    assert sent < 150 and time.monotonic() - started < 10


@pytest.fixture(scope="module")
def cert(tmp_path_factory) -> tuple[Path, Path]:
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


def test_tls_and_a_silent_client_does_not_stop_the_scrapes(store, cert):
    """client_python's own server handshakes in its accept loop: one client that connects and says nothing
    stops every scrape. Ours handshakes in the connection's thread, under the deadline."""
    crt, key = cert
    verify = ssl.create_default_context(cafile=crt)
    with exporter(store, tls_cert=crt, tls_key=key, limits=Limits(header_timeout_s=2.0)) as port:
        silent = _connect(port)  # no ClientHello
        response = httpx.get(f"https://localhost:{port}/metrics", verify=verify, timeout=10)
        assert _closed_with(silent) is None  # cut at the deadline, without an answer
    assert response.status_code == 200 and "hpcwatch_findings" in response.text
    assert response.headers["x-content-type-options"] == "nosniff"


def test_a_stopped_exporter_frees_its_port_at_once():
    """shutdown() closes the socket: a test (or a restart) binding the same port next must not wait for the GC."""
    store = Store(":memory:")
    first, _ = serve_metrics(store, port=0)
    port = first.server_address[1]
    first.shutdown()
    second, _ = serve_metrics(store, port=port)  # `first` is still referenced: only shutdown() freed the port
    second.shutdown()
    assert first.socket.fileno() == -1


def test_each_token_scrapes_its_own_scope():
    """``--auth``: the bearer's principal picks the scope its labels are filtered by, one registry per scope."""
    from hpcwatch.access.policy import DEFAULT_POLICY
    from hpcwatch.access.principal import Principal
    from hpcwatch.access.scope import scope_for
    from hpcwatch.records import Job

    people = {
        "op": Principal(name="olga", roles=frozenset({"operator"}), via="token"),
        "bob": Principal(name="bob", roles=frozenset({"user"}), via="token"),
        "dec": Principal(name="carol", roles=frozenset({"decider"}), via="token"),
    }
    with Store(":memory:") as store:
        store.add(
            [
                Job(id="71", user="alice", account="proj-llm", gpus=8, start=1.0, state="RUNNING"),
                Job(id="72", user="bob", account="proj-vision", gpus=1, start=1.0, state="RUNNING"),
            ]
        )
        authenticate = lambda header: people.get((header or "").removeprefix("Bearer "))  # noqa: E731
        scope_of = lambda p: scope_for(p, DEFAULT_POLICY, key=b"k" * 32)  # noqa: E731
        with exporter(store, authenticate=authenticate, scope_of=scope_of) as port:

            def info(token: str) -> list[str]:
                r = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"})
                assert r.status_code == 200
                return [line for line in r.text.splitlines() if line.startswith("hpcwatch_job_info{")]

            operator, bob, decider = info("op"), info("bob"), info("dec")
            assert len(operator) == 2 and any('user="alice"' in line for line in operator)
            assert len(bob) == 1 and 'user="bob"' in bob[0]
            assert len(decider) == 2 and not any("alice" in line or "bob" in line for line in decider)
            assert info("op") == operator  # the operator's registry again, not the decider's
            assert httpx.get(f"http://127.0.0.1:{port}/metrics").status_code == 401


def test_scrapes_of_every_scope_read_on_from_one_kept_store(store, store_reads) -> None:
    """A Prometheus per scope (a user's token, a decider's) scrapes the same per-job sums: the second scope's
    first scrape reads on from where the first scope's read ended, not the store again."""
    from hpcwatch.access.scope import FULL, Scope
    from hpcwatch.records import Job, Sample

    job = Job(id="7", user="ann", account="ml", gpus=1, nodes=("n1",), gpus_by_node={"n1": (0,)}, start=0.0)
    store.add([job])
    store.add(
        Sample(metric="DCGM_FI_DEV_GPU_UTIL", labels={"Hostname": "n1", "gpu": "0"}, t=float(t), value=50.0)
        for t in range(1, 60)
    )
    reads = store_reads
    ann = Scope(name="ann", permissions=FULL.permissions)
    scopes = {"Bearer local": FULL, "Bearer ann": ann}
    with exporter(store, authenticate=lambda header: header, scope_of=scopes.__getitem__) as port:
        texts = []
        for token in scopes:
            texts.append(
                httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": token}, timeout=30).text
            )
            if token == "Bearer local":
                assert reads  # the first scrape read the store
                reads.clear()
    assert reads == []
    assert all('hpcwatch_job_gpu_utilization_percent{account="ml",hpc_job="7",user="ann"} 50.0' in t for t in texts)
