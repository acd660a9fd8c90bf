"""``[[receive]]``: the central end of the agents' HTTP push, writing each shipment into a spool folder.

    POST /v1/agent/shipments
    Authorization: Bearer TOKEN          the node's token (tokens_file: one "NODE TOKEN" a line)
    X-Hpcwatch-Node: NODE
    Content-Length: N                    at most max_body_bytes, else 413 before a byte is read
    {shipment JSON}                      collect/shipment.py; its host must be NODE

    202  written into the spool (the ``[[spool]]`` of the same daemon ingests it)
    400  not a shipment; 401 unknown node or wrong token; 403 a shipment of another node
    411  no Content-Length; 413 too large; 429 the node's rate (Retry-After: seconds)

    POST /v1/live/JOB/RANK               a training hook's live stream (instrument/live.py), same headers
    {JSON lines}                         appended to LIVE_SPOOL/JOB/rank-RANK.jsonl, read by [[live]]
                                         (a rate bucket per stream, apart from the node's; 404 without
                                         live_spool)
    202  appended; the body is the job's control file (application/json) when it has one: how requests
         for dumps and traces reach a rank that pushes (an empty batch is a poll)

    POST /v1/live/JOB/RANK/dump/ID       a rank's answer to a request of the control file, same headers:
    POST /v1/live/JOB/RANK/trace/ID      its Flight Recorder dump or Kineto trace (collect/live.py
                                         ``land_answer``: read with the reader [[live]] uses, then written
                                         beside the stream); one is read at a time (else 503)
    201  written; 400 not a dump / trace of that rank; 404 no such request; 409 already answered;
    413  over MAX_ANSWER_BYTES (sources/livehook.py), before a byte is read

The token compare is constant-time (``hmac.compare_digest``, against a dummy for an unknown node, so
the answer's timing does not say which nodes exist). A refused token is logged once per node and
address until a good one comes from there. TLS when ``cert_file``/``key_file`` are set. Each request
has 10 s per read (a client that stalls is dropped). The server runs in the daemon as a collector:
its first run starts it, later runs refresh the status note, ``close()`` stops it.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from hpcwatch.collect.base import RunResult
from hpcwatch.collect.config import ReceiveSection
from hpcwatch.collect.live import AlreadyAnswered, UnknownRequest, control_for, land_answer
from hpcwatch.collect.shipment import NAME_RE, PUSH_PATH, Shipment, write_to_spool
from hpcwatch.errors import ConfigError, InputError, ParseError, one_line
from hpcwatch.sources.livehook import MAX_ANSWER_BYTES, parse_answer_path, stream_name
from hpcwatch.store import Store

__all__ = ["Receiver", "ReceiveCollector", "read_tokens", "PUSH_PATH", "LIVE_PUSH_PATH", "live_target", "append_live"]

log = logging.getLogger(__name__)

_DUMMY = "x" * 43
#: Rate buckets kept before those refilled to the brim (senders quiet for a while) are forgotten.
_MAX_BUCKETS = 4096


def read_tokens(path: str) -> dict[str, str]:
    """``NODE TOKEN`` lines; a malformed line is a ConfigError naming it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the tokens: {getattr(err, 'strerror', None) or err}") from err
    tokens: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not NAME_RE.fullmatch(parts[0]) or len(parts[1]) < 16:
            raise ConfigError(f"{path}:{number}: expected NODE TOKEN (a token of at least 16 characters)")
        tokens[parts[0]] = parts[1]
    return tokens


class _Server(ThreadingHTTPServer):
    """TLS, when set, is negotiated in each request's thread: a client that stalls its handshake holds
    its own thread only, not the accept loop."""

    daemon_threads = True
    tls: ssl.SSLContext | None = None

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(10.0)
        if self.tls is not None:
            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError):  # a client that does not trust us, or speaks plain HTTP
                request.close()
                return
        super().finish_request(request, client_address)


class _Bucket:
    __slots__ = ("at", "level")

    def __init__(self, level: float, at: float) -> None:
        self.level, self.at = level, at


class Receiver:
    """The HTTP server; ``start()`` binds (``port`` then says the real one), ``stop()`` closes."""

    def __init__(self, section: ReceiveSection) -> None:
        self.section = section
        self.accepted = 0
        self.refused: dict[int, int] = {}
        """Refusals by HTTP status since start."""
        self._lock = threading.Lock()
        self._tokens: dict[str, str] = read_tokens(section.tokens_file)
        self._tokens_seen = self._stamp()
        self._buckets: dict[str, _Bucket] = {}
        self._logged: set[tuple[str, str]] = set()
        self.answering = threading.BoundedSemaphore(1)
        """One dump or trace in memory at a time (each is up to MAX_ANSWER_BYTES)."""
        host, _, port = section.listen.rpartition(":")
        self._server = _Server((host.strip("[]"), int(port)), self._handler())
        if section.cert_file:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            try:
                ctx.load_cert_chain(section.cert_file, section.key_file)
            except (OSError, ssl.SSLError) as err:
                self._server.server_close()
                raise ConfigError(f"{section.cert_file}: cannot load the certificate: {err}") from err
            self._server.tls = ctx
        self.port: int = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="receive", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(5)
        self._server.server_close()

    # -- deciding --------------------------------------------------------------------------------------------

    def _stamp(self) -> tuple[float, int]:
        try:
            st = os.stat(self.section.tokens_file)
        except OSError:
            return (0.0, 0)
        return (st.st_mtime, st.st_size)

    def _token_of(self, node: str) -> str | None:
        stamp = self._stamp()
        if stamp != self._tokens_seen:
            try:
                self._tokens = read_tokens(self.section.tokens_file)
            except ConfigError as err:  # a half-edited file: keep the tokens we had
                log.warning("receive: %s (keeping the previous tokens)", err)
            self._tokens_seen = stamp
        return self._tokens.get(node)

    def authenticate(self, node: str, header: str) -> bool:
        scheme, _, given = header.partition(" ")
        with self._lock:
            expected = self._token_of(node)
        good = hmac.compare_digest(given.strip().encode(), (expected or _DUMMY).encode())
        return good and expected is not None and scheme.lower() == "bearer"

    def allow(self, node: str) -> float:
        """0 when ``node`` (or one of its ranks' streams) may send now, else the seconds until it may."""
        now = time.monotonic()
        with self._lock:
            if len(self._buckets) >= _MAX_BUCKETS:  # the streams of jobs long ended: their buckets are full again
                refill_s = self.section.burst / self.section.rate_per_s
                self._buckets = {k: b for k, b in self._buckets.items() if now - b.at < refill_s}
                if len(self._buckets) >= _MAX_BUCKETS:  # all busy (a node inventing streams): memory first
                    self._buckets.clear()
            b = self._buckets.setdefault(node, _Bucket(float(self.section.burst), now))
            b.level = min(float(self.section.burst), b.level + (now - b.at) * self.section.rate_per_s)
            b.at = now
            if b.level >= 1.0:
                b.level -= 1.0
                return 0.0
            return (1.0 - b.level) / self.section.rate_per_s

    def note_refusal(self, status: int, node: str, address: str, why: str) -> None:
        with self._lock:
            self.refused[status] = self.refused.get(status, 0) + 1
            first = (node, address) not in self._logged
            self._logged.add((node, address))
        if first:
            log.warning("receive: refused a push from %s (node %r): %s", address, node[:64], why)

    def note_accepted(self, node: str, address: str) -> None:
        with self._lock:
            self.accepted += 1
            self._logged.discard((node, address))

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 10.0
            server_version = "hpcwatch-receive"
            sys_version = ""

            def log_message(self, format: str, *args: Any) -> None:
                pass  # one line per refusal (note_refusal), not one per request

            def _answer(
                self, status: int, text: str, headers: dict[str, str] | None = None, *, json: bytes | None = None
            ) -> None:
                body = json if json is not None else (text + "\n").encode()
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                kind = "application/json" if json is not None else "text/plain; charset=utf-8"
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                if status >= 400:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer(200 if self.path == "/healthz" else 404, "ok" if self.path == "/healthz" else "no")

            def do_POST(self) -> None:
                address = self.client_address[0]
                node = self.headers.get("X-Hpcwatch-Node", "")
                if self.path.startswith(LIVE_PUSH_PATH) and receiver.section.live_spool:
                    answer = parse_answer_path(self.path)
                    if answer is not None:
                        self._live_answer(node, address, *answer)
                    else:
                        self._live(node, address)
                    return
                if self.path != PUSH_PATH:
                    self._answer(404, f"POST {PUSH_PATH}")
                    return
                if not receiver.authenticate(node, self.headers.get("Authorization", "")):
                    receiver.note_refusal(401, node, address, "unknown node or wrong token")
                    self._answer(401, "unknown node or wrong token", {"WWW-Authenticate": "Bearer"})
                    return
                wait = receiver.allow(node)
                if wait:
                    receiver.note_refusal(429, node, address, f"over {receiver.section.rate_per_s:g} requests/s")
                    self._answer(429, "too many requests", {"Retry-After": str(max(1, round(wait + 0.5)))})
                    return
                length = self.headers.get("Content-Length", "")
                if not length.isdigit():
                    receiver.note_refusal(411, node, address, "no Content-Length")
                    self._answer(411, "Content-Length required")
                    return
                if int(length) > receiver.section.max_body_bytes:
                    receiver.note_refusal(413, node, address, f"a body of {length} bytes")
                    self._answer(413, f"body over {receiver.section.max_body_bytes} bytes")
                    return
                body = self.rfile.read(int(length))
                try:
                    shipment = Shipment.from_wire(body, where=f"push from {node}")
                    if shipment.host != node:
                        receiver.note_refusal(403, node, address, f"a shipment of host {shipment.host!r}")
                        self._answer(403, "a node ships its own results only")
                        return
                    write_to_spool(receiver.section.spool, shipment)
                except ParseError as err:
                    receiver.note_refusal(400, node, address, str(err))
                    self._answer(400, one_line(str(err))[:300])
                    return
                except OSError as err:
                    log.warning("receive: cannot write to %s: %s", receiver.section.spool, err)
                    self._answer(503, "the spool cannot be written", {"Retry-After": "30"})
                    return
                receiver.note_accepted(node, address)
                self._answer(202, "queued")

            def _live_allowed(self, node: str, address: str, cap: int) -> int | None:
                """The body's length once the sender, its rate and the size are checked; None: answered."""
                if not receiver.authenticate(node, self.headers.get("Authorization", "")):
                    receiver.note_refusal(401, node, address, "unknown node or wrong token")
                    self._answer(401, "unknown node or wrong token", {"WWW-Authenticate": "Bearer"})
                    return None
                # a bucket per rank's stream: a node's eight ranks each flush 5 times a second, and neither they nor
                # a job's stream starve each other or the node's agent
                stream = _LIVE_PATH.match(self.path)
                wait = receiver.allow(f"{node}\0{stream.group(0) if stream else 'live'}")
                if wait:
                    receiver.note_refusal(429, node, address, f"live: over {receiver.section.rate_per_s:g} requests/s")
                    self._answer(429, "too many requests", {"Retry-After": str(max(1, round(wait + 0.5)))})
                    return None
                length = self.headers.get("Content-Length", "")
                if not length.isdigit() or int(length) > cap:
                    receiver.note_refusal(413, node, address, f"live: a body of {length or 'unknown'} bytes")
                    self._answer(413, f"Content-Length up to {cap} bytes")
                    return None
                return int(length)

            def _live(self, node: str, address: str) -> None:
                """A batch of a rank's live stream, appended to its file in ``live_spool`` (collect/live.py reads
                and judges every line; here only the sender, the size and the rate are checked). The answer
                carries the job's control file: the rank's requests."""
                target = live_target(receiver.section.live_spool, self.path)
                if target is None:
                    self._answer(404, f"POST {LIVE_PUSH_PATH}JOB/RANK")
                    return
                length = self._live_allowed(node, address, receiver.section.max_body_bytes)
                if length is None:
                    return
                body = self.rfile.read(length)
                try:
                    if body.strip():  # an empty batch only asks for the control file
                        append_live(target, body)
                except OSError as err:
                    log.warning("receive: cannot write to %s: %s", target, err)
                    self._answer(503, "the live spool cannot be written", {"Retry-After": "30"})
                    return
                receiver.note_accepted(node, address)
                control = control_for(receiver.section.live_spool, target.parent.name)
                self._answer(202, "appended", json=control)

            def _live_answer(self, node: str, address: str, job: str, rank: int, kind: str, request: str) -> None:
                """A rank's dump or trace, answering a request of its job's control file."""
                length = self._live_allowed(node, address, MAX_ANSWER_BYTES)
                if length is None:
                    return
                if not receiver.answering.acquire(blocking=False):
                    self._answer(503, "another answer is being read", {"Retry-After": "2"})
                    return
                refusal: tuple[int, str] | None = None
                try:  # released before answering: the rank's next answer never finds it taken
                    body = self.rfile.read(length)
                    where = land_answer(receiver.section.live_spool, job, rank, kind, request, body)
                except UnknownRequest as err:
                    refusal = (409 if isinstance(err, AlreadyAnswered) else 404, one_line(str(err)))
                except (InputError, ValueError, TypeError, KeyError, OverflowError, RecursionError) as err:
                    refusal = (400, one_line(str(err)))  # hostile bytes: whatever the reader raises is a 400
                except OSError as err:
                    log.warning("receive: cannot write the %s of %s rank %d: %s", kind, job, rank, err)
                    refusal = (503, "the live spool cannot be written")
                finally:
                    receiver.answering.release()
                if refusal is not None:
                    status, why = refusal
                    if status != 503:
                        receiver.note_refusal(status, node, address, f"live: {why}")
                    self._answer(status, why[:300], {"Retry-After": "30"} if status == 503 else None)
                    return
                receiver.note_accepted(node, address)
                self._answer(201, f"{kind} {request} of rank {rank} written as {where.name}")

        return Handler


#: Where a hook pushes its live stream: ``LIVE_PUSH_PATH + "JOB/RANK"``.
LIVE_PUSH_PATH = "/v1/live/"
#: A pushed stream file is rotated to ``.1`` past this (as the hook rotates its own): bounded on disk.
LIVE_FILE_BYTES = 64 << 20
_LIVE_PATH = re.compile(r"/v1/live/([A-Za-z0-9_-][A-Za-z0-9_.-]{0,63})/(\d{1,9})")


def live_target(spool: str, path: str) -> Path | None:
    """The stream file a push path names, or None for a path that names none (no ``..``, no other folder)."""
    found = _LIVE_PATH.fullmatch(path)
    if found is None:
        return None
    return Path(spool) / found.group(1) / stream_name(int(found.group(2)))


def append_live(target: Path, body: bytes) -> None:
    """Append whole lines to a stream file (a body not ending in a newline gets one: lines never merge)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        if target.stat().st_size + len(body) > LIVE_FILE_BYTES:
            os.replace(target, target.with_name(target.name + ".1"))
    except FileNotFoundError:
        pass
    with open(target, "ab") as f:
        f.write(body if body.endswith(b"\n") else body + b"\n")


class ReceiveCollector:
    """The receiver as one of the daemon's collectors (its status: accepted and refused pushes)."""

    def __init__(self, store: Store, section: ReceiveSection) -> None:
        self.section = section
        self.receiver: Receiver | None = None

    def run(self) -> RunResult:
        if self.receiver is None:
            Path(self.section.spool).mkdir(parents=True, exist_ok=True)
            self.receiver = Receiver(self.section)
            self.receiver.start()
        r = self.receiver
        refused = ", ".join(f"{n} x {s}" for s, n in sorted(r.refused.items()))
        return RunResult(
            records=0,
            note=f"port {r.port}: {r.accepted} shipments accepted" + (f", refused {refused}" if refused else ""),
        )

    def close(self) -> None:
        if self.receiver is not None:
            self.receiver.stop()
            self.receiver = None
