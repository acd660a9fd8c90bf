"""The largest running jobs kept read in the job pages' process, so that their first page is a next page.

A job page's first open reads the job's whole life (``reports.jobstretches``): in the 1,024-node demo a 1,536-GPU
job's first page took 4.8 s five minutes in, 10 s at ten minutes, and a day of it would take minutes. Its next
page reads only what landed since the last, from the checkpoints the page process keeps (``KeptStretches``).

So, every ``WARM_EVERY_S``, the job pages' process reads as a page would the ``WARM_JOBS`` running jobs with the
most GPU-seconds (``--keep-read-jobs`` of ``demo`` and ``serve``; 0: none): GPUs × time since the job started, to
the store's newest sample, what a first page reads grows with both; of those with ``WARM_MIN_GPU_S`` at least
(below, a first page's cost is the store's scan, not the job's life, and a round would only take the pages' time).
It pins their checkpoints: pages of other jobs do not push them out. Pages come first: a round reads a job only
once no page has run for ``WARM_QUIET_S`` (a page under way shares the process's interpreter and the machine's
cores with a round). A round reads nothing when the store was not written since the last (a post-mortem's
store). Its work is bounded: after a round of d seconds, the next starts no sooner than d × (1 / ``WARM_SHARE`` -
1) later. At 1,024 nodes a round (the 1,536-GPU job read on from 30 s before) is ~1 s of one core in process:
~0.03 core.

While someone reads job pages (one ran within the last ``WARM_ACTIVE_S``), the rounds come every
``WARM_ACTIVE_EVERY_S`` instead: a person going through the jobs of an incident opens each page seconds to
minutes after the last, and each first page then reads a few seconds of its job, not up to thirty. Nobody
looking, the rounds go back to ``WARM_EVERY_S``: the CPU is spent while it shortens someone's wait.

::

    page process:  [page] [page] ...quiet... [round: job A, job B, job C] ...... [page of A: ~30 s read, not its life]
                                  <--------> a round waits for ``WARM_QUIET_S`` without a page
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final

from hpcwatch.errors import HpcwatchError, InputError, one_line
from hpcwatch.reports.jobpage import job_overview
from hpcwatch.reports.text import visible
from hpcwatch.store import queries

if TYPE_CHECKING:
    from hpcwatch.reports.jobstretches import KeptStretches
    from hpcwatch.store import Store

__all__ = [
    "JobWarmer",
    "jobs_to_warm",
    "WARM_EVERY_S",
    "WARM_ACTIVE_EVERY_S",
    "WARM_ACTIVE_S",
    "WARM_JOBS",
    "WARM_MAX_JOBS",
    "WARM_MIN_GPU_S",
    "WARM_SHARE",
    "WARM_QUIET_S",
]

log = logging.getLogger(__name__)

#: How often the running jobs are read on. Ours: a first page then reads at most this much of the job's life.
WARM_EVERY_S: Final = 30.0
#: How often they are read on while pages are read (module doc). Ours: at 1,024 nodes the first page of the
#: 1,536-GPU job 20-40 s after the last one (benchmarks/RESULTS.md) takes ~0.3 s against ~0.5 s with rounds every
#: 30 s, for ~0.06 core more while it lasts.
WARM_ACTIVE_EVERY_S: Final = 5.0
#: How long after a page the rounds keep that pace. Ours: an incident's pages come minutes apart.
WARM_ACTIVE_S: Final = 600.0
#: Running jobs kept read, the most GPU-seconds first. Ours: a few, beside the ``KeptStretches`` entries of pages.
WARM_JOBS: Final = 3
#: The most ``--keep-read-jobs`` takes: each pinned job's checkpoints are a few MB at 1,536 GPUs, and the rounds'
#: share of the time is the same for any number (more jobs: each read less often). Ours.
WARM_MAX_JOBS: Final = 32
#: GPU-seconds a running job needs to be kept read. Ours: a 1,536-GPU job after a minute, a 4-GPU job after seven
#: hours; at 1,024 nodes the life of a 4-GPU job of an hour is read in one scan of the store.
WARM_MIN_GPU_S: Final = 100_000.0
#: The most of one core the rounds may take (module doc). Ours: at a tenth, a first round reading hours of a
#: large job's life (a server started beside it) leaves the pages nine tenths of the time.
WARM_SHARE: Final = 0.1
#: Seconds without a page before a round reads a job. Ours: a person going through job pages opens the next
#: within seconds; the round reads once they read.
WARM_QUIET_S: Final = 2.0


def jobs_to_warm(store: Store, count: int = WARM_JOBS, min_gpu_s: float = WARM_MIN_GPU_S) -> list[str]:
    """The ids of the ``count`` running jobs (started, on nodes, not ended) with the most GPU-seconds to the
    store's newest sample, of those with ``min_gpu_s`` at least; ties: the one that started first, then by id."""
    newest = queries.latest_sample_t(store)
    if newest is None:
        return []
    running = [j for j in store.jobs() if j.end is None and j.start is not None and j.nodes]
    gpu_s = {j.id: (j.gpus or 0) * max(0.0, newest - (j.start or newest)) for j in running}
    running = [j for j in running if gpu_s[j.id] >= min_gpu_s]
    running.sort(key=lambda j: (-gpu_s[j.id], j.start, j.id))
    return [j.id for j in running[:count]]


class JobWarmer:
    """Rounds of ``jobs_to_warm``'s pages into ``kept`` (module doc), in a thread of the process that serves
    the pages from ``kept``. The pages say when they run (``page``): a round waits for the page under way."""

    def __init__(
        self,
        store: Store,
        kept: KeptStretches,
        *,
        every_s: float = WARM_EVERY_S,
        active_every_s: float = WARM_ACTIVE_EVERY_S,
        active_s: float = WARM_ACTIVE_S,
        jobs: int = WARM_JOBS,
        share: float = WARM_SHARE,
        quiet_s: float = WARM_QUIET_S,
        min_gpu_s: float = WARM_MIN_GPU_S,
    ) -> None:
        self.store, self.kept = store, kept
        self.every_s, self.jobs, self.share, self.quiet_s = every_s, jobs, share, quiet_s
        self.active_every_s, self.active_s = active_every_s, active_s
        self.min_gpu_s = min_gpu_s
        self.rounds = 0
        """Rounds that read the store (not counting those it skipped, unwritten since)."""
        self._stop = threading.Event()
        self._paged = threading.Event()
        """Set when a page ends: a rest between rounds is measured again (a page starts the faster pace)."""
        self._idle = threading.Event()
        self._idle.set()
        self._page_ended = -math.inf
        self._read_at: int | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> JobWarmer:
        self._thread = threading.Thread(target=self._run, name="jobpage-warm", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop after the job under way (not waited for past ``timeout_s``: the process ends under it)."""
        self._stop.set()
        self._idle.set()
        self._paged.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    @contextmanager
    def page(self) -> Iterator[None]:
        """Around a page: the rounds wait until it is done, and ``quiet_s`` after."""
        self._idle.clear()
        try:
            yield
        finally:
            self._page_ended = time.monotonic()
            self._idle.set()
            self._paged.set()

    def warm(self) -> list[str]:
        """One round: the jobs to warm read into ``kept`` and pinned there; the ids read. Nothing when the store
        was not written since the last round."""
        version = self.store.version
        if version == self._read_at:
            return []
        self._read_at = version
        jobs = jobs_to_warm(self.store, self.jobs, self.min_gpu_s)
        self.kept.pin(self.store, jobs)
        read = []
        for job in jobs:
            self._wait_for_quiet()
            if self._stop.is_set():
                break
            try:
                job_overview(self.store, job, kept=self.kept)
            except InputError:  # nothing to read of it yet (ended meanwhile, no samples): its page says why
                continue
            read.append(job)
        self.rounds += 1
        return read

    def _wait_for_quiet(self) -> None:
        """Return once no page is under way and none ended in the last ``quiet_s`` (or when stopped)."""
        while not self._stop.is_set():
            self._idle.wait()
            left = self._page_ended + self.quiet_s - time.monotonic()
            if left <= 0 and self._idle.is_set():
                return
            self._stop.wait(max(left, 0.01))

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.warm()
            except HpcwatchError as err:  # the store went away under the round (the process is stopping)
                if self._stop.is_set():
                    return
                log.warning("keeping the running jobs read: %s", visible(one_line(str(err))))
            except Exception as err:  # a bug in a report: the pages still answer, each reading as it would
                if self._stop.is_set():
                    return
                log.error("keeping the running jobs read failed: %s", visible(one_line(f"{type(err).__name__}: {err}")))
            ended = time.monotonic()
            self._rest(ended, ended - started)

    def _rest(self, ended: float, spent_s: float) -> None:
        """Wait until the next round is due (``next_round_in`` after ``ended``), measured again after each page:
        the first page after a quiet spell brings the next round closer (or until stopped)."""
        while not self._stop.is_set():
            left = ended + self.next_round_in(spent_s) - time.monotonic()
            if left <= 0:
                return
            self._paged.wait(left)
            self._paged.clear()

    def next_round_in(self, spent_s: float) -> float:
        """Seconds from the end of a round of ``spent_s`` to the next: ``every_s`` from its start
        (``active_every_s`` while a page ran within ``active_s``), and no sooner than keeps the rounds within
        ``share`` of the time."""
        reading = time.monotonic() - self._page_ended < self.active_s
        every = min(self.every_s, self.active_every_s) if reading else self.every_s
        return max(every - spent_s, spent_s * (1.0 / self.share - 1.0))
