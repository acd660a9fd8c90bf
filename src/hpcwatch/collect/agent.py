"""``hpcwatch collect --agent``: the host checks of one node, run on their cadence and shipped to the centre.

    scheduler (main thread):  each check at its next due time (monotonic clock) ─ run ─ queue
    sender thread:            oldest queued shipment ─ ship ─ remove; on failure wait (1, 2, 4 ... s)

A check is an argument vector (no shell) run in its own process group, its standard output kept up to
``max_output_bytes`` (the rest read and thrown away, so the command never blocks on a full pipe), its
standard error's last 2 KiB, killed with its group at ``timeout_s``. The result (``Shipment``) is
queued on disk (``queue_dir``, one file each, temp + rename) and shipped one of two ways:

    spool     written into a shared folder the central ``[[spool]]`` reads (shipment.write_to_spool)
    push      POSTed to the central ``[[receive]]`` with this node's bearer token (collect/receive.py)

Nothing queued is lost while the centre is down, up to ``max_queue`` shipments; past it the oldest are
dropped and counted. An outage is logged once when it starts and once when it ends (how long, how
many sent, how many dropped), not once per retry. Checks run one after another: a slow one delays the
next by at most its timeout.
"""

from __future__ import annotations

import http.client
import logging
import os
import random
import selectors
import signal
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hpcwatch.collect.config import AgentCheck, AgentSection
from hpcwatch.collect.shipment import PUSH_PATH, Shipment, write_to_spool
from hpcwatch.errors import ParseError, one_line

__all__ = ["Agent", "run_check", "ShipmentQueue", "ShipError", "PUSH_PATH", "STDERR_TAIL"]

log = logging.getLogger(__name__)

STDERR_TAIL = 2048
_READ = 64 * 1024


class ShipError(Exception):
    """A shipment did not reach the centre. ``retry``: try again later; else drop it (it never will)."""

    def __init__(self, what: str, *, retry: bool = True, after_s: float | None = None) -> None:
        super().__init__(what)
        self.retry, self.after_s = retry, after_s


def run_check(check: AgentCheck, node: str, *, clock: Callable[[], float] = time.time) -> Shipment:
    """Run one check now; whatever happens (not found, killed at its timeout), a shipment says so."""
    started, t0 = clock(), time.monotonic()

    def made(**rest: Any) -> Shipment:
        return Shipment(
            host=node, check=check.name, command=check.command, format=check.format, started_s=started, **rest
        )

    try:
        proc = subprocess.Popen(
            list(check.command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: a timeout kills what it started too
            close_fds=True,
        )
    except OSError as err:
        return made(
            duration_s=time.monotonic() - t0,
            exit_status=None,
            error=one_line(f"cannot run {check.command[0]}: {err.strerror or err}"),
        )
    out, err_tail, truncated, timed_out = bytearray(), b"", False, False
    deadline = t0 + check.timeout_s
    with selectors.DefaultSelector() as sel:
        assert proc.stdout is not None and proc.stderr is not None
        sel.register(proc.stdout, selectors.EVENT_READ, "out")
        sel.register(proc.stderr, selectors.EVENT_READ, "err")
        open_pipes = 2
        while open_pipes:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, _READ)
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_pipes -= 1
                elif key.data == "out":
                    room = check.max_output_bytes - len(out)
                    if len(chunk) > room:
                        truncated = True
                    out += chunk[: max(0, room)]
                else:
                    err_tail = (err_tail + chunk)[-STDERR_TAIL:]
    if timed_out:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    status: int | None
    try:
        status = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:  # the pipes closed but the process lingers past its timeout
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        timed_out, status = True, None
    proc.stdout.close()
    proc.stderr.close()
    if timed_out:
        status = None
    return made(
        duration_s=time.monotonic() - t0,
        exit_status=status,
        output=bytes(out),
        truncated=truncated,
        timed_out=timed_out,
        error=f"killed after {check.timeout_s:g} s" if timed_out else "",
        stderr_tail=err_tail.decode("utf-8", errors="replace"),
    )


class ShipmentQueue:
    """Shipments waiting to go, one file each in ``folder`` (oldest first), at most ``bound`` of them."""

    def __init__(self, folder: str | os.PathLike[str], bound: int) -> None:
        self.folder, self.bound = Path(folder), bound
        self.folder.mkdir(parents=True, exist_ok=True)
        self.dropped = 0
        """Shipments dropped since start (the queue was full, or the centre can never take them)."""
        self._lock = threading.Lock()
        self._seq = 0

    def put(self, shipment: Shipment) -> None:
        data = shipment.to_wire()
        with self._lock:
            self._seq += 1
            name = f"{time.time_ns():020d}-{self._seq:06d}-{shipment.check}.json"
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".put-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, self.folder / name)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            waiting = self._names()
            for old in waiting[: max(0, len(waiting) - self.bound)]:
                (self.folder / old).unlink(missing_ok=True)
                self.dropped += 1

    def _names(self) -> list[str]:
        return sorted(n for n in os.listdir(self.folder) if n.endswith(".json") and not n.startswith("."))

    def __len__(self) -> int:
        with self._lock:
            return len(self._names())

    def oldest(self) -> tuple[Path, Shipment] | None:
        """The oldest shipment that reads; one that does not (a disk error, an older agent's) is dropped."""
        with self._lock:
            for name in self._names():
                path = self.folder / name
                try:
                    return path, Shipment.from_wire(path.read_bytes(), where=str(path))
                except (OSError, ParseError) as err:
                    log.warning("agent queue: dropping %s: %s", name, one_line(str(err)))
                    path.unlink(missing_ok=True)
                    self.dropped += 1
        return None

    def done(self, path: Path) -> None:
        with self._lock:
            path.unlink(missing_ok=True)


class SpoolSink:
    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.where = folder

    def ship(self, shipment: Shipment) -> None:
        try:
            write_to_spool(self.folder, shipment)
        except OSError as err:
            raise ShipError(f"{self.folder}: {err.strerror or err}") from err


class PushSink:
    def __init__(self, section: AgentSection, node: str) -> None:
        url = urlsplit(section.push_url)
        self.where = section.push_url
        self.https = url.scheme == "https"
        self.host, self.port = url.hostname or "", url.port or (443 if self.https else 80)
        self.path = (url.path.rstrip("/") or "") + PUSH_PATH
        self.timeout_s, self.node, self.token_file = section.timeout_s, node, section.token_file
        self.context: ssl.SSLContext | None = None
        if self.https:
            self.context = ssl.create_default_context(cafile=section.ca_file or None)

    def _token(self) -> str:
        """Re-read each push: a renewed token takes effect without a restart."""
        try:
            return Path(self.token_file).read_text(encoding="utf-8").strip()
        except OSError as err:
            raise ShipError(f"{self.token_file}: cannot read the token: {err.strerror or err}") from err

    def ship(self, shipment: Shipment) -> None:
        body = shipment.to_wire()
        headers = {
            "Authorization": f"Bearer {self._token()}",
            "X-Hpcwatch-Node": self.node,
            "Content-Type": "application/json",
            "Content-Length": str(len(body)),
        }
        conn: http.client.HTTPConnection
        if self.context is not None:
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout_s, context=self.context)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.request("POST", self.path, body=body, headers=headers)
            resp = conn.getresponse()
            text = resp.read(512).decode("utf-8", errors="replace")
        except (OSError, http.client.HTTPException) as err:
            raise ShipError(one_line(f"{self.where}: {err}")) from err
        finally:
            conn.close()
        if resp.status in (200, 201, 202):
            return
        what = one_line(f"{self.where}: HTTP {resp.status}: {text}")
        if resp.status == 413:
            raise ShipError(what, retry=False)  # too big for the centre: it never will fit
        retry_after = resp.getheader("Retry-After")
        after = float(retry_after) if retry_after and retry_after.isdigit() else None
        raise ShipError(what, after_s=after)  # 401/403: the token may be fixed; 429/5xx: later


@dataclass(slots=True)
class AgentStats:
    runs: int = 0
    shipped: int = 0
    failures: int = 0
    """Ship attempts that failed (each retry counts)."""
    outages: int = 0


class Agent:
    def __init__(
        self,
        section: AgentSection,
        *,
        node: str,
        sink: SpoolSink | PushSink | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.section, self.node, self.clock = section, node, clock
        self.sink = sink or (SpoolSink(section.spool) if section.spool else PushSink(section, node))
        self.queue = ShipmentQueue(section.queue_dir, section.max_queue)
        self.stats = AgentStats()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._sender: threading.Thread | None = None
        self._down_since: float | None = None
        self._down_sent = 0
        self._down_dropped = 0
        self._retry_after: float | None = None

    # -- running ---------------------------------------------------------------------------------------------

    def run(self, *, duration_s: float = 0.0) -> None:
        """Run the checks on their cadence until ``stop()`` (or ``duration_s``, when > 0)."""
        self.start_sender()
        end = time.monotonic() + duration_s if duration_s else None
        due = {c.name: time.monotonic() for c in self.section.checks}
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if end is not None and now >= end:
                    break
                for check in self.section.checks:
                    if due[check.name] <= now and not self._stop.is_set():
                        self.run_one(check)
                        # the next tick of its cadence; a run longer than the interval skips the missed ticks
                        late = time.monotonic() - due[check.name]
                        due[check.name] += check.interval_s * (int(late // check.interval_s) + 1)
                wait = min(due.values()) - time.monotonic()
                if end is not None:
                    wait = min(wait, end - time.monotonic())
                self._stop.wait(max(0.0, wait))
        finally:
            self.stop()

    def run_once(self, *, drain_timeout_s: float = 30.0) -> bool:
        """Every check once, then ship until the queue is empty (or ``drain_timeout_s``): True if all went."""
        for check in self.section.checks:
            self.run_one(check)
        deadline = time.monotonic() + drain_timeout_s
        while len(self.queue) and time.monotonic() < deadline:
            if not self.ship_next():
                self._stop.wait(min(1.0, max(0.0, deadline - time.monotonic())))
        return not len(self.queue)

    def run_one(self, check: AgentCheck) -> Shipment:
        shipment = run_check(check, self.node, clock=self.clock)
        self.stats.runs += 1
        if shipment.error:
            log.warning("check %s: %s", check.name, shipment.error)
        before = self.queue.dropped
        self.queue.put(shipment)
        if self.queue.dropped > before and self._down_since is not None:
            self._down_dropped += self.queue.dropped - before
        self._wake.set()
        return shipment

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._sender is not None and self._sender is not threading.current_thread():
            self._sender.join(self.section.timeout_s + 1)

    # -- shipping --------------------------------------------------------------------------------------------

    def start_sender(self) -> None:
        if self._sender is None:
            self._sender = threading.Thread(target=self._send_loop, name="agent-send", daemon=True)
            self._sender.start()

    def _send_loop(self) -> None:
        delay = 0.0
        while not self._stop.is_set():
            if delay:
                self._stop.wait(delay)
                if self._stop.is_set():
                    return
            if not len(self.queue):
                self._wake.wait()
                self._wake.clear()
                continue
            if self.ship_next():
                delay = 0.0
            else:
                delay = self._backoff(delay)

    def _backoff(self, delay: float) -> float:
        base = min(self.section.backoff_max_s, max(1.0, delay * 2) if delay else 1.0)
        if self._retry_after:
            base = max(base, min(self._retry_after, self.section.backoff_max_s))
        return base * (1 + random.random() * 0.1)

    def ship_next(self) -> bool:
        """Ship the oldest queued shipment: True when it went (or was dropped for good), False to retry."""
        item = self.queue.oldest()
        if item is None:
            return True
        path, shipment = item
        self._retry_after = None
        try:
            self.sink.ship(shipment)
        except ShipError as err:
            self.stats.failures += 1
            if not err.retry:
                log.warning("agent: %s: dropping shipment %s of %s", err, shipment.id, shipment.check)
                self.queue.done(path)
                self.queue.dropped += 1
                return True
            self._retry_after = err.after_s
            if self._down_since is None:
                self._down_since, self._down_sent, self._down_dropped = time.monotonic(), 0, 0
                self.stats.outages += 1
                log.warning(
                    "agent: cannot ship to %s (%s); queueing up to %d shipments in %s until it answers",
                    self.sink.where,
                    err,
                    self.section.max_queue,
                    self.queue.folder,
                )
            return False
        self.queue.done(path)
        self.stats.shipped += 1
        if self._down_since is not None:
            self._down_sent += 1
            if not len(self.queue):
                log.warning(
                    "agent: %s answers again after %.0f s: %d queued shipments sent, %d dropped (queue full)",
                    self.sink.where,
                    time.monotonic() - self._down_since,
                    self._down_sent,
                    self._down_dropped,
                )
                self._down_since = None
        return True
