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
for ``[[live]]``. A batch the collector refuses or does not answer is dropped and counted. The spool folder
is still where the control file is polled and the answers (dumps, traces) are written: requests and
answers travel only when it is the collector's ``[[live]]`` folder (shared); over HTTP alone they do not.

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
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import orjson

from hpcwatch.errors import ConfigError, ParseError
from hpcwatch.sources.livehook import CLOSED, Control, dump_name, read_control, stream_name

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
    ) -> None:
        self.job, self.rank = job, rank
        self.folder = Path(spool) / job
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / stream_name(rank)
        self.flush_s, self.max_bytes, self.queue_max = flush_s, max_bytes, queue_max
        self.push = _Push(push_url, job=job, rank=rank, token=token, node=node) if push_url else None
        self.enabled = True
        self.dropped = 0
        self.written = 0
        self._queue: deque[dict[str, Any]] = deque()
        self._trace: tuple[str, int] | None = None
        self._done: set[str] = set()  # request ids acted on
        self._control_stat: tuple[float, int] | None = None
        self._stop = threading.Event()
        _ask_for_flight_recorder()
        self._thread = threading.Thread(target=self._loop, name=f"hpcwatch-live-{rank}", daemon=True)
        self._thread.start()

    # --- the training thread's side: appends only ----------------------------------------------
    def put(self, doc: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if len(self._queue) >= self.queue_max:
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
            except Exception:  # the stream is best effort: a full disk must not end the job
                log.warning("hpcwatch live stream of rank %d: %s", self.rank, "write failed", exc_info=True)
        self._flush()

    def _flush(self) -> None:
        if not self._queue:
            return
        lines = []
        while self._queue:
            lines.append(orjson.dumps(self._queue.popleft()))
        data = b"\n".join(lines) + b"\n"
        if self.push is not None:
            if self.push.send(data):
                self.written += len(lines)
            else:
                self.dropped += len(lines)
            return
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size and size + len(data) > self.max_bytes:
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        with open(self.path, "ab") as f:
            f.write(data)
        self.written += len(lines)

    def _poll(self) -> None:
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
    """POSTs batches to ``[[receive]]``; one connection kept open, a refusal logged once until a success."""

    def __init__(self, url: str, *, job: str, rank: int, token: str, node: str) -> None:
        import urllib.parse

        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"HPCWATCH_LIVE_URL must be http(s)://host:port, got {url!r}")
        self.parts, self.host, self.path = parts, parts.hostname, f"/v1/live/{job}/{rank}"
        self.headers = {"Authorization": f"Bearer {token}", "X-Hpcwatch-Node": node}
        self._conn: Any = None
        self._failing = False

    def send(self, body: bytes) -> bool:
        import http.client

        try:
            if self._conn is None:
                kind = http.client.HTTPSConnection if self.parts.scheme == "https" else http.client.HTTPConnection
                self._conn = kind(self.host, self.parts.port, timeout=2.0)
            self._conn.request("POST", self.path, body=body, headers=self.headers)
            answer = self._conn.getresponse()
            answer.read()
            ok = answer.status == 202
            why = f"{answer.status} {answer.reason}"
            if answer.getheader("Connection", "").lower() == "close":
                self._drop_connection()
        except (OSError, http.client.HTTPException) as err:
            self._drop_connection()
            ok, why = False, str(err)
        if not ok and not self._failing:
            log.warning(
                "hpcwatch live: push to %s refused or failed (%s); batches dropped until it works",
                self.parts.netloc,
                why,
            )
        self._failing = not ok
        return ok

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
