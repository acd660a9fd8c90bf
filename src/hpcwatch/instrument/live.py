"""The hook's live stream: each rank's steps, phases and where it is, to a per-node spool, as they happen.

``StepRecorder`` hands this stream each phase's entry (``enter``: the phase and the collective a rank is
about to wait in) and each resolved step's spans; the training thread only appends a dict to a bounded
queue (``put``: no I/O, no lock, no collective). One daemon thread per rank does the rest every
``flush_s``: writes the queue to ``SPOOL/<job>/rank-N.jsonl`` (rotated to ``.1`` past ``max_bytes``, so a
rank holds at most twice that on disk), polls the job's control file (one ``stat`` unless it changed) and
acts on its requests. The layout and formats are ``sources.livehook``'s.

A full queue drops records and counts them (``dropped``): the step never waits on the disk.
Nothing here calls ``torch.distributed``: a rank of a sub-group, or of a DTensor mesh, writes its own
records, whatever the other ranks do.

Switching it at run time: ``HPCWATCH_LIVE_DIR`` (read once, when the recorder is made) turns it on;
``{"live": false}`` in the control file pauses it and ``true`` resumes it, within ``flush_s``.

Pushed instead of spooled (``push_url``; the recorder reads ``HPCWATCH_LIVE_URL``, ``HPCWATCH_LIVE_TOKEN_FILE``
and the node name once): the thread POSTs each batch to the collector's ``[[receive]]``
(``POST /v1/live/JOB/RANK``, the node's bearer token; 2 s timeout), which appends it to its ``live_spool``
for ``[[live]]``. A batch the collector could not take now (no answer, 429, 503) is kept and sent again,
after the ``Retry-After`` it named (a lost ``enter`` would leave the collector with a wrong idea of where a
rank stopped); one it refuses (401, 413, ...) is dropped and counted. Kept lines count against the queue's
bound, so a collector down for long costs the newest records, never memory. The requests
come back the same way, so no port opens on the training node: the collector's answer to each POST
carries the job's control file (which ``[[live]]`` and ``hpcwatch trace`` write on the collector's side),
and a thread with nothing to send still POSTs an empty batch every ``poll_s`` to ask for it (a rank stuck
in a collective is still asked for its dump). The local control file is then not read. The answers are
written in the local spool folder as below, then POSTed to ``/v1/live/JOB/RANK/dump|trace/ID``
(``sources.livehook.answer_path``) by the thread, and removed once the collector took them; one it
refuses (404, 409, 413, 400) stays where it was written, named in one log line; one it could not take
now (no answer, 429, 503) is tried again, ``_TRIES`` times in all.

Requests (the control file, written by ``hpcwatch collect`` or ``hpcwatch trace``):

- ``dump``: the thread writes this rank's Flight Recorder (``torch._C._distributed_c10d``'s
  ``_dump_nccl_trace_json`` on CUDA builds with NCCL, else ``_dump_fr_trace_json``, which gloo records
  into) to ``fr-<id>_<rank>.json``. It is the thread that writes it, so a rank stuck in a collective
  (the collective releases the GIL) still answers. The recorder sets ``TORCH_FR_BUFFER_SIZE`` (2000
  entries, torch's default size) when nothing set it and no process group exists yet: Flight Recorder
  records only with a buffer.
- ``trace``: the next step starts ``torch.profiler`` for that many steps (``StepRecorder`` owns the
  profiler; see ``take_trace``), exported as ``trace-<id>-rank-<rank>.json``.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import orjson

from hpcwatch.errors import ConfigError, ParseError
from hpcwatch.sources.livehook import (
    CLOSED,
    MAX_ANSWER_BYTES,
    MAX_LINE_BYTES,
    Control,
    answer_path,
    dump_name,
    parse_control,
    read_control,
    stream_name,
)

__all__ = ["LiveStream", "LIVE_DIR_ENV", "LIVE_URL_ENV", "LIVE_TOKEN_FILE_ENV", "DEFAULT_MAX_BYTES", "DEFAULT_QUEUE"]

log = logging.getLogger(__name__)

LIVE_DIR_ENV = "HPCWATCH_LIVE_DIR"
LIVE_URL_ENV = "HPCWATCH_LIVE_URL"
LIVE_TOKEN_FILE_ENV = "HPCWATCH_LIVE_TOKEN_FILE"
#: A step of five phases is ~1.5 KB of lines: 8 MiB is thousands of steps, twice that on disk at most.
DEFAULT_MAX_BYTES = 8 << 20
#: Records waiting for the writer thread; past it they are dropped (a stalled disk never stalls a step).
DEFAULT_QUEUE = 20_000
_FR_DEFAULT_ENTRIES = "2000"
#: Seconds between two polls of the collector by a pushing thread that has nothing to send.
DEFAULT_POLL_S = 2.0
#: Times an answer the collector could not take now is sent before it is left on the node's disk.
_TRIES = 5
#: Statuses that mean "not now": the batch or answer is sent again (0: no answer at all).
_NOT_NOW = (0, 429, 503)
#: The most one POST of the stream carries (the receiver's default body cap is 8 MiB).
_MAX_BATCH_BYTES = 1 << 20
#: Seconds to wait after a "not now" whose answer named no Retry-After, and the most one may ask for.
_RETRY_S, _MAX_RETRY_S = 1.0, 60.0


class LiveStream:
    """One rank's stream into ``spool/<job>/`` and its watcher thread."""

    def __init__(
        self,
        spool: str | os.PathLike[str],
        *,
        job: str,
        rank: int,
        flush_s: float = 0.2,
        max_bytes: int = DEFAULT_MAX_BYTES,
        queue_max: int = DEFAULT_QUEUE,
        push_url: str | None = None,
        token: str = "",
        node: str = "",
        poll_s: float = DEFAULT_POLL_S,
    ) -> None:
        self.job, self.rank = job, rank
        self.folder = Path(spool) / job
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / stream_name(rank)
        self.flush_s, self.max_bytes, self.queue_max, self.poll_s = flush_s, max_bytes, queue_max, poll_s
        self.push = _Push(push_url, job=job, rank=rank, token=token, node=node) if push_url else None
        self.enabled = True
        self.dropped = 0
        self.written = 0
        self._queue: deque[dict[str, Any]] = deque()
        self._held: deque[bytes] = deque()  # pushed: lines the collector could not take yet, oldest first
        self._trace: tuple[str, int] | None = None
        self._done: set[str] = set()  # request ids acted on
        self._outbox: deque[tuple[str, str, Path, int]] = deque()  # answers to POST: (kind, id, file, tries left)
        self._sent_at = 0.0
        self._control_stat: tuple[float, int] | None = None
        self._stop = threading.Event()
        _ask_for_flight_recorder()
        self._thread = threading.Thread(target=self._loop, name=f"hpcwatch-live-{rank}", daemon=True)
        self._thread.start()

    # --- the training thread's side: appends only ----------------------------------------------
    def put(self, doc: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if len(self._queue) + len(self._held) >= self.queue_max:
            self.dropped += 1
            return
        self._queue.append(doc)

    def enter(self, step: int | None, phase: str, collective: str | None = None) -> None:
        doc = {"kind": "enter", "job": self.job, "rank": self.rank, "step": step, "phase": phase, "t": time.time()}
        if collective is not None:
            doc["collective"] = collective
        self.put(doc)

    def take_trace(self) -> tuple[str, int] | None:
        """The pending on-demand trace (id, steps), once."""
        request, self._trace = self._trace, None
        return request

    def answered(self, kind: str, request: str, path: Path) -> None:
        """An answer (``dump`` or ``trace``) now written at ``path``; pushed, the thread sends it."""
        if self.push is not None:
            self._outbox.append((kind, request, path, _TRIES))

    def close(self) -> None:
        self.enter(None, CLOSED)
        self._stop.set()
        self._thread.join(timeout=5)

    # --- the writer thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.flush_s):
            try:
                self._flush()
                self._poll()
                self._deliver()
            except Exception:  # the stream is best effort: a full disk must not end the job
                log.warning("hpcwatch live stream of rank %d: %s", self.rank, "write failed", exc_info=True)
        self._flush()

    def _flush(self) -> None:
        if self.push is not None:
            self._push_held()
            return
        if not self._queue:
            return
        lines = []
        while self._queue:
            lines.append(orjson.dumps(self._queue.popleft()))
        data = b"\n".join(lines) + b"\n"
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size and size + len(data) > self.max_bytes:
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        with open(self.path, "ab") as f:
            f.write(data)
        self.written += len(lines)

    def _push_held(self) -> None:
        """POST the oldest waiting lines (at most ``_MAX_BATCH_BYTES``), or an empty poll every ``poll_s``,
        unless the collector asked to wait; what it could not take now stays first in line."""
        push = self.push
        assert push is not None
        now = time.monotonic()
        if now < push.wait_until:
            return
        while self._queue:
            self._held.append(orjson.dumps(self._queue.popleft()))
        if not self._held and now - self._sent_at < self.poll_s:
            return
        batch: list[bytes] = []
        size = 0
        for line in self._held:
            if batch and size + len(line) + 1 > _MAX_BATCH_BYTES:
                break
            batch.append(line)
            size += len(line) + 1
        self._sent_at = now
        status = push.send(b"".join(line + b"\n" for line in batch))  # empty: only asks for the control file
        if status in _NOT_NOW:
            return
        for _ in batch:
            self._held.popleft()
        if status == 202:
            self.written += len(batch)
        else:
            self.dropped += len(batch)

    def _poll(self) -> None:
        if self.push is not None:  # pushed: the control file comes with the collector's answers
            control, self.push.control = self.push.control, None
            if control is not None:
                self._apply(control)
            return
        try:
            st = (self.folder / "control.json").stat()
        except FileNotFoundError:
            return
        if (st.st_mtime, st.st_size) == self._control_stat:
            return
        self._control_stat = (st.st_mtime, st.st_size)
        try:
            control = read_control(self.folder)
        except ParseError as err:
            log.warning("hpcwatch live: %s", err)
            return
        if control is not None:
            self._apply(control)

    def _apply(self, control: Control) -> None:
        self.enabled = control.live
        if control.trace_id is not None and control.trace_id not in self._done:
            self._done.add(control.trace_id)
            self._trace = (control.trace_id, control.trace_steps)
        if control.dump_id is not None and control.dump_id not in self._done:
            self._done.add(control.dump_id)
            self._dump(control.dump_id)

    def _dump(self, request: str) -> None:
        data = _flight_recorder_json()
        if data is None:
            log.warning("hpcwatch live: this torch has no Flight Recorder dump; request %s not answered", request)
            return
        target = self.folder / dump_name(request, self.rank)
        tmp = target.with_name("." + target.name)
        tmp.write_bytes(data)
        os.replace(tmp, target)
        self.answered("dump", request, target)

    def _deliver(self) -> None:
        """POST the answers waiting, each at most ``_TRIES`` times; what the collector took leaves the disk."""
        push = self.push
        if push is None or time.monotonic() < push.wait_until:
            return
        for _ in range(len(self._outbox)):
            kind, request, path, tries = self._outbox.popleft()
            size = path.stat().st_size
            if size > MAX_ANSWER_BYTES:
                log.warning(
                    "hpcwatch live: %s %s is %d bytes, over %d: kept at %s", kind, request, size, MAX_ANSWER_BYTES, path
                )
                continue
            status, why = push.post(answer_path(self.job, self.rank, kind, request), path.read_bytes())
            if 200 <= status < 300:
                path.unlink(missing_ok=True)
            elif status in _NOT_NOW and tries > 1:  # not now: again once the collector's pause is over
                self._outbox.append((kind, request, path, tries - 1))
                return
            else:
                log.warning(
                    "hpcwatch live: the collector did not take %s %s (%s): kept at %s", kind, request, why, path
                )


def _ask_for_flight_recorder() -> None:
    """Give Flight Recorder a buffer unless the user chose one or the process groups already exist."""
    if "TORCH_FR_BUFFER_SIZE" in os.environ or "TORCH_NCCL_TRACE_BUFFER_SIZE" in os.environ:
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        os.environ["TORCH_FR_BUFFER_SIZE"] = _FR_DEFAULT_ENTRIES


def _flight_recorder_json() -> bytes | None:
    """This process's Flight Recorder as JSON (collectives included, completed ones too), or None."""
    try:
        import torch
        import torch._C._distributed_c10d as c10d
    except ImportError:
        return None
    dump = getattr(c10d, "_dump_nccl_trace_json", None) if torch.cuda.is_available() else None
    dump = dump or getattr(c10d, "_dump_fr_trace_json", None)
    if dump is None:
        return None
    out = dump(True, False)
    return out if isinstance(out, bytes) else str(out).encode()


class _Push:
    """POSTs to ``[[receive]]``; one connection kept open, a refused batch logged once until a success.
    ``control``: the control file the last answer carried, until the stream takes it."""

    def __init__(self, url: str, *, job: str, rank: int, token: str, node: str) -> None:
        import urllib.parse

        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"HPCWATCH_LIVE_URL must be http(s)://host:port, got {url!r}")
        self.parts, self.host, self.path = parts, parts.hostname, f"/v1/live/{job}/{rank}"
        self.headers = {"Authorization": f"Bearer {token}", "X-Hpcwatch-Node": node}
        self.control: Control | None = None
        self.wait_until = 0.0
        """``time.monotonic()`` before which nothing is sent: the collector said "not now"."""
        self._conn: Any = None
        self._failing = False

    def send(self, body: bytes) -> int:
        """One batch of lines (empty: a poll); the answer's status (202: appended, 0: no answer)."""
        status, why = self.post(self.path, body)
        if status != 202 and not self._failing:
            log.warning(
                "hpcwatch live: push to %s refused or failed (%s); %s until it works",
                self.parts.netloc,
                why,
                "batches kept and sent again" if status in _NOT_NOW else "batches dropped",
            )
        self._failing = status != 202
        return status

    def post(self, path: str, body: bytes) -> tuple[int, str]:
        """(status, why) of one POST, status 0 when there was no answer; keeps the control file it carried,
        and after a "not now" the time to wait."""
        status, why, retry_after = self._exchange(path, body)
        if status in _NOT_NOW:
            self.wait_until = time.monotonic() + _retry_seconds(retry_after)
        return status, why

    def _exchange(self, path: str, body: bytes) -> tuple[int, str, str | None]:
        import http.client

        try:
            if self._conn is None:
                kind = http.client.HTTPSConnection if self.parts.scheme == "https" else http.client.HTTPConnection
                self._conn = kind(self.host, self.parts.port, timeout=2.0)
            self._conn.request("POST", path, body=body, headers=self.headers)
            answer = self._conn.getresponse()
            retry_after = answer.getheader("Retry-After")
            text = answer.read(MAX_LINE_BYTES + 1)  # a control file's cap
            status, why = (
                answer.status,
                f"{answer.status} {answer.reason}: {text[:200].decode(errors='replace').strip()}",
            )
            if answer.getheader("Connection", "").lower() == "close" or not answer.isclosed():
                self._drop_connection()
        except (OSError, http.client.HTTPException) as err:
            self._drop_connection()
            return 0, str(err), None
        if status == 202 and answer.getheader("Content-Type", "").startswith("application/json"):
            try:
                self.control = parse_control(text, path=self.parts.netloc + path)
            except ParseError as err:
                log.warning("hpcwatch live: %s", err)
        return status, why, retry_after

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _retry_seconds(header: str | None) -> float:
    """The seconds a ``Retry-After`` of delay-seconds asks for, within [``_RETRY_S``, ``_MAX_RETRY_S``]."""
    try:
        seconds = float(header) if header is not None else _RETRY_S
    except ValueError:  # an HTTP date, or garbage: the default pause
        seconds = _RETRY_S
    if not math.isfinite(seconds):
        seconds = _RETRY_S
    return min(max(seconds, _RETRY_S), _MAX_RETRY_S)
