"""The job pages' reports in a process of their own, beside the web server's.

A job page is one ``reports.jobpage.job_overview``: at 1,024 nodes a 1,536-GPU job's is a few hundred
milliseconds of Python and numpy, run under the interpreter lock that the server's process shares with the
live snapshot, the problems' judgement and, in the demo, the twin. In one process each waited on the others
(a page took two to three times its own work, and the stream's tick waited on the page). A process of its
own reads the same store folder (any number of processes may, ``store.core``) and runs on another core; it
keeps the job's settled stretches between pages (``OverviewCache.kept``), as the server did, and between pages
reads on the largest running jobs into them (``web.pagewarm``): their first page reads seconds, not their life.
It also writes each job's newest settled checkpoint into the store's folder (``reports.checkpointfiles``): the
child of a restarted server reads on from there.

The server asks for one overview at a time over the child's standard input and reads the answer from a pipe
of its own, each a length-prefixed pickle (a frame between a process and the child it started, nothing
else). A ``HpcwatchError`` (an unknown job: ``InputError``) crosses as itself. When the parent dies, however
it dies, the child reads the end of its input and stops. A child that dies or does not answer within
``ANSWER_TIMEOUT_S`` is replaced, and that page gets a ``StoreError`` (503): the next page has a new child.
Stopping the server does not wait for a page under way: its child is ended under it.

The garbage collector does not run during a page (``_collecting_after``): a page makes ~100,000 objects (a
1,536-GPU job's accumulators, reports and rows), and each of the collector's full passes went through every object
the child keeps (the settled stretches of four jobs, eight overviews): 20-90 ms, every second or third page, in
the page's time. It collects once the answer is written, and freezes the survivors out of later passes
(``gc.freeze``; they are still freed when nothing refers to them): each collection goes through what one page
made. Every ``FULL_COLLECTION_PAGES`` pages it goes through everything again, so that a reference cycle that
became garbage after it was frozen is freed.

    python -m hpcwatch.web.pageprocess STORE [KEEP_READ_JOBS]
"""

from __future__ import annotations

import gc
import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from hpcwatch.errors import HpcwatchError, StoreError, one_line
from hpcwatch.reports.text import visible
from hpcwatch.web.children import end_child

if TYPE_CHECKING:
    from hpcwatch.reports.jobpage import OverviewCache
    from hpcwatch.store import Store

__all__ = ["PageProcess", "ANSWER_TIMEOUT_S", "STOP_TIMEOUT_S", "FULL_COLLECTION_PAGES", "main"]

log = logging.getLogger(__name__)

#: How long a page waits for the child's answer before it gives up and the child is replaced. Ours: a page that
#: reads a ten-day 1,536-GPU job stretch by stretch takes tens of seconds; a child stuck for minutes is broken.
ANSWER_TIMEOUT_S = 300.0
#: How long ``stop()`` waits for the child to leave through its store's close before it is killed.
STOP_TIMEOUT_S = 2.0
_HEADER = struct.Struct("!Q")
#: Every this many pages the child's collection after a page goes through all it keeps, not only what the page
#: made (module doc). Ours: a full pass costs about what a page does at 1,024 nodes; one in 64 pages is ~2 %.
FULL_COLLECTION_PAGES = 64
#: The largest frame either side reads: an overview of a 1,536-GPU job is ~300 KB pickled. Ours.
_MAX_FRAME = 1 << 30


class PageProcess:
    """``job_overview`` of the store folder ``path``, computed in a child process (module doc). Safe to share
    between threads: one page at a time goes to the child, the others wait their turn."""

    def __init__(
        self, path: Path, *, answer_timeout_s: float = ANSWER_TIMEOUT_S, keep_read_jobs: int | None = None
    ) -> None:
        self.path, self.answer_timeout_s = path, answer_timeout_s
        self.keep_read_jobs = keep_read_jobs
        """Running jobs the child keeps read between pages (``web.pagewarm``; 0: none; None: its default)."""
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._stopped = False

    def start(self) -> PageProcess:
        with self._lock:
            self._start()
        return self

    def _start(self) -> subprocess.Popen[bytes]:
        self._child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hpcwatch.web.pageprocess",
                str(self.path),
                *([] if self.keep_read_jobs is None else [str(self.keep_read_jobs)]),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        return self._child

    @property
    def running(self) -> bool:
        return self._child is not None and self._child.poll() is None

    def overview(self, job_id: str, *, price_per_gpu_hour: float | None = None, currency: str = "") -> Any:
        """``reports.jobpage.job_overview`` of ``job_id``, from the child's ``OverviewCache``."""
        with self._lock:
            if self._stopped:
                raise StoreError(f"job {job_id}: the server is stopping")
            child = self._child  # once: ``stop()`` may take it meanwhile, and ends it under this page
            if child is None or child.poll() is not None:
                if child is not None:
                    end_child(child, timeout_s=STOP_TIMEOUT_S, outputs=True)  # died between pages: its pipes
                child = self._start()
            assert child.stdin is not None and child.stdout is not None
            try:
                _write_frame(child.stdin, pickle.dumps((job_id, price_per_gpu_hour, currency)))
                status, value = pickle.loads(_read_frame(child.stdout, timeout_s=self.answer_timeout_s))
            except (OSError, ValueError, EOFError, TimeoutError, pickle.UnpicklingError) as err:
                # ValueError: a pipe ``stop()`` closed under this page.
                end_child(child, timeout_s=STOP_TIMEOUT_S, outputs=True)  # the next page starts a new child
                if self._child is child:
                    self._child = None
                raise StoreError(f"job {job_id}: the job pages' process did not answer ({err}); try again") from None
        if status == "ok":
            return value
        if status == "error":
            raise value
        raise RuntimeError(f"job {job_id}: the job pages' process failed: {value}")

    def stop(self) -> None:
        """End the child; later pages are refused. Not behind a page under way (a server stopping does not wait
        for a ten-day job's page): its child is ended under it, and it answers 503."""
        self._stopped = True
        idle = self._lock.acquire(blocking=False)
        try:
            child, self._child = self._child, None
            if child is not None:  # a page under way reads the child's output: that page closes it
                end_child(child, timeout_s=STOP_TIMEOUT_S, outputs=idle)
        finally:
            if idle:
                self._lock.release()


def _write_frame(out: IO[bytes], payload: bytes) -> None:
    out.write(_HEADER.pack(len(payload)) + payload)
    out.flush()


def _read_frame(source: IO[bytes], *, timeout_s: float | None = None) -> bytes:
    """One frame from ``source`` (EOFError at its end; TimeoutError past ``timeout_s`` without one)."""
    fd = source.fileno()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    header = _read_exactly(fd, _HEADER.size, deadline)
    (size,) = _HEADER.unpack(header)
    if size > _MAX_FRAME:
        raise EOFError(f"a frame of {size} bytes, over {_MAX_FRAME}")
    return _read_exactly(fd, size, deadline)


def _read_exactly(fd: int, size: int, deadline: float | None) -> bytes:
    chunks, left = [], size
    while left:
        if deadline is not None:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError("no answer in time")
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other end closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def serve_pages(path: str, requests: IO[bytes], answers: IO[bytes], *, keep_read_jobs: int | None = None) -> int:
    """The child's loop: an overview for each request until the end of ``requests``. Returns the pages served.
    ``keep_read_jobs``: how many of the largest running jobs are kept read between pages (``web.pagewarm``; 0:
    none; None: ``WARM_JOBS``)."""
    from hpcwatch.reports.jobpage import OverviewCache
    from hpcwatch.store import Store
    from hpcwatch.web.pagewarm import WARM_JOBS, JobWarmer

    jobs = WARM_JOBS if keep_read_jobs is None else keep_read_jobs

    served = 0
    cache = OverviewCache(on_disk=True)  # a restarted server's pages read on from its checkpoints
    with Store(path) as store:
        warmer = JobWarmer(store, cache.kept, jobs=jobs).start() if jobs > 0 else None
        try:
            while True:
                try:
                    job_id, price, currency = pickle.loads(_read_frame(requests))
                except EOFError:
                    return served
                with _collecting_after(full=served % FULL_COLLECTION_PAGES == 0):
                    with warmer.page() if warmer is not None else nullcontext():
                        answer = _answer(cache, store, job_id, price, currency)
                    _write_frame(answers, _pickled(answer))
                served += 1
        finally:
            if warmer is not None:
                warmer.stop()


@contextmanager
def _collecting_after(*, full: bool) -> Iterator[None]:
    """No collection during the block; after it, one of what the block made (``full``: of everything), and the
    survivors frozen out of later collections (module doc). The job warmer's thread allocates meanwhile: its
    objects wait for the same collection."""
    gc.disable()
    try:
        yield
    finally:
        if full:
            gc.unfreeze()
        gc.collect()
        gc.freeze()
        gc.enable()


def _answer(cache: OverviewCache, store: Store, job_id: str, price: float | None, currency: str) -> tuple[str, Any]:
    """One page's answer: its overview, the error it tells the user, or the one line of a failure (its 500;
    the child goes on with the next page)."""
    try:
        return ("ok", cache.overview(store, job_id, price_per_gpu_hour=price, currency=currency))
    except HpcwatchError as err:
        return ("error", err)
    except Exception as err:
        log.error("job %s's page failed:\n%s", visible(job_id), _trace(err))
        return ("failed", one_line(f"{type(err).__name__}: {err}"))


def _trace(err: BaseException) -> str:
    """``err``'s traceback, each line with its control characters written out: the id and the message come from a
    URL and from data, and the log is a terminal's in ``hpcwatch demo``."""
    return "\n".join(visible(line) for line in "".join(traceback.format_exception(err)).splitlines())


def _pickled(answer: tuple[str, Any]) -> bytes:
    """``answer`` as a frame's payload; an error that does not pickle (an argument of its own that cannot) as
    the text of a failure."""
    try:
        return pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as err:  # whatever pickling raises (an object of its own), the page gets an answer
        status, value = answer
        return pickle.dumps(("failed", one_line(f"{status}: {value!r} ({type(err).__name__})")))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2 or (len(args) == 2 and not args[1].isdecimal()):
        print("usage: python -m hpcwatch.web.pageprocess STORE [KEEP_READ_JOBS]", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="hpcwatch job pages: %(message)s")
    # The answers keep standard output's pipe to themselves: anything printed goes to standard error.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        serve_pages(args[0], sys.stdin.buffer, answers, keep_read_jobs=int(args[1]) if len(args) == 2 else None)
    except (KeyboardInterrupt, BrokenPipeError):  # Ctrl-C reaches the whole process group; the parent stops us
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
