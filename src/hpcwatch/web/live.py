"""What the page shows live: the report layer's live snapshot, one per second for every viewer.

The numbers come from ``hpcwatch.reports.live.live_snapshot``; this view caches
one snapshot for ``min_interval_s`` and shares it between every SSE client and
API call (ten open tabs cost one set of queries), and adds what only the page
needs: each vector's newest finding titled in every page language.

At 1,024 GPUs a snapshot costs ~0.3 s and its JSON ~200 KiB, so viewers never wait
for one: while a thread computes the next, every other caller gets the previous
one at once, and each snapshot is encoded as an SSE frame once (``frame()``), not
once per viewer (200 viewers × 1 ms of orjson a second would be a core's fifth).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import orjson

from hpcwatch.model.cluster import Cluster
from hpcwatch.records import Event, Job
from hpcwatch.reports.healthwindow import KeptWindow
from hpcwatch.reports.live import (
    COLLECTORS,
    GPU_FIELDS,
    RECENT_S,
    Collector,
    DataSeen,
    GpuTable,
    SeenSoFar,
    apply_states,
    collector_activity,
    followed_samples,
    live_snapshot,
    problems,
    state_inputs,
)
from hpcwatch.reports.liveevents import FollowedEventTallies
from hpcwatch.reports.livesamples import LiveSamples
from hpcwatch.reports.livetraining import FollowedTraining
from hpcwatch.reports.nccl import NCCL_LOG_KINDS, nccl_card, nccl_hosts, nccl_log_events
from hpcwatch.reports.triage import alert_groups
from hpcwatch.store import Store, queries
from hpcwatch.web.i18n import LANGUAGES, finding_text
from hpcwatch.web.livedelta import delta, stream_doc

__all__ = [
    "LiveView",
    "StreamFrames",
    "Collector",
    "COLLECTORS",
    "GPU_FIELDS",
    "RECENT_S",
    "DEFAULT_MIN_INTERVAL_S",
    "PROBLEMS_INTERVAL_S",
    "PROBLEMS_BUSY_SHARE",
    "BOOT_MAX_AGE_S",
    "rest_after",
    "run_paced",
]

DEFAULT_MIN_INTERVAL_S = 0.5
#: Problems (health over a 15-minute window, the live job's straggler over its last steps, findings) are
#: judged this often at most, not every snapshot: they cost ~4x the rest of the snapshot at 128 GPUs and move at
#: the pace of scrapes (dcgm-exporter: 30 s by default), so 5 s late is still ahead of the data. Ours. A caller
#: that knows its nodes' scrape period passes it (``ProblemJudge(every_s=)``: the demo's 8 s at 1,024 nodes).
PROBLEMS_INTERVAL_S = 5.0
#: The share of the time judging the problems may take: one that lasted d s is followed by the next no sooner
#: than d / share after it began. At 1,024 nodes 15 minutes in, the first judgement takes ~8 s of CPU (the
#: health rules over the window's 10 million samples) and the next ~1.8 s (the window kept, only the rows since
#: read: ``reports.healthwindow``): one every ~12 s; since the rules judge every GPU's idle runs at once (0.33 s
#: of a judgement in process, 11 minutes in), 1.0-1.3 s beside the rest of the demo: one every ~9 s. At 128 nodes
#: (every node scraped each second) ~1.1 s, one every ~7 s. A quarter of the time gave one every ~40 s and ~27 s
#: before the window was kept. Ours.
PROBLEMS_BUSY_SHARE = 0.15
#: A page boots from the newest stream document up to this old rather than waiting for a new one: at 1,024
#: nodes a new one took ~0.5 s of a busy process, and the page's first byte waited 1.5-2 s for it half the
#: time. The stream's next delta (a tick later) brings the page up to date. Ours: a few ticks.
BOOT_MAX_AGE_S = 5.0

log = logging.getLogger(__name__)
#: The fields of a vector's entry in the snapshot (``GET /api/live``).
_VECTOR_FIELDS = ("findings", "last_t", "title", "severity", "target", "rule")


class StreamFrames:
    """One snapshot as the stream sends it, each frame encoded once for every viewer; the full frame only when a
    viewer first needs it (one that connects, or that missed a version): at 1,024 nodes its ~200 KiB of JSON
    was 3 % of the server every tick, for viewers that take the delta."""

    __slots__ = ("_doc", "_full", "base", "delta", "version")

    def __init__(
        self,
        *,
        version: int,
        base: int | None,
        delta: bytes | None,
        doc: dict[str, Any] | None = None,
        full: bytes | None = None,
    ) -> None:
        self.version = version
        self.base = base
        """The version ``delta`` applies to (None: the first snapshot, no delta)."""
        self.delta = delta
        """``event: delta`` from ``base`` to ``version``."""
        self._doc = doc
        """The whole stream document with ``v`` (not changed once made: ``full`` may encode it later)."""
        self._full = full

    @property
    def full(self) -> bytes:
        """``event: live`` with the whole stream document and ``v``. Two viewers asking at once may both encode
        it: the same bytes."""
        if self._full is None:
            self._full = _event("live", self._doc or {}, self.version)
        return self._full

    def for_viewer(self, last: int | None) -> bytes | None:
        """What a viewer that last got version ``last`` needs: nothing, the delta, or the full frame."""
        if last == self.version:
            return None
        if last is not None and last == self.base and self.delta is not None:
            return self.delta
        return self.full


@dataclass(frozen=True, slots=True)
class Judged:
    """The problems of one judgement, their groups (``reports.triage.alert_groups``) and the state inputs
    (``reports.live.state_inputs``) judged with them."""

    problems: list[dict[str, Any]]
    alerts: list[dict[str, Any]]
    states: dict[str, Any]


def rest_after(took_s: float, busy_share: float) -> float:
    """The rest after a run of ``took_s`` seconds so that runs take at most ``busy_share`` of the time (the run's
    wall time: the store's query threads count, and so does a machine too loaded to give the run its CPU)."""
    return took_s * (1 / busy_share - 1)


def run_paced(
    what: str,
    work: Callable[[], object],
    *,
    every_s: float,
    busy_share: float | None,
    stopped: Callable[[float], bool],
    ran: Callable[[str | None], None] = lambda error: None,
) -> int:
    """Run ``work()`` every ``every_s`` seconds, and at most ``busy_share`` of the time (``rest_after``), until
    ``stopped(wait_s)`` (which waits) says stop. A run that raises is logged and the next comes at its time;
    ``ran(error)`` is told after each run (None when it did not raise). Returns the runs done. The demo's
    threads (``web.demo.Periodic``) and its scan's process (``web.scanprocess``) pace their work with it."""
    runs, wait_s = 0, every_s
    while not stopped(wait_s):
        started = time.monotonic()
        error = None
        try:
            work()
        except Exception as err:
            error = f"{type(err).__name__}: {err}"
            log.warning("%s failed: %s", what, error)
        runs += 1
        ran(error)
        took_s = time.monotonic() - started
        wait_s = max(every_s, rest_after(took_s, busy_share)) if busy_share else every_s
    return runs


def nothing_judged() -> Judged:
    """No problem, no state: before the first judgement, or while the store holds no sample."""
    return Judged([], [], {"node_states": {}, "events": [], "node_events": {}})


class ProblemJudge:
    """The problems of the store, judged at most every ``every_s`` seconds (``PROBLEMS_INTERVAL_S`` at least)
    and at most ``PROBLEMS_BUSY_SHARE`` of the time, in a thread of its own: a snapshot never waits for a
    judgement but the very first, and takes the newest one done."""

    def __init__(self, store: Store, *, every_s: float = PROBLEMS_INTERVAL_S) -> None:
        self.store = store
        self.every_s = max(every_s, PROBLEMS_INTERVAL_S)
        self._judged = nothing_judged()
        self._next_at: float | None = None
        """When the next judgement may begin (None: never judged)."""
        self._running = threading.Lock()
        self._window = KeptWindow()
        """The health window, read since the last judgement only (``reports.healthwindow``)."""

    def current(self, now: float, training_job: str | None) -> Judged:
        """The newest judgement; the first is made here, a due one is started in the background."""
        if self._next_at is None:
            self._judge(now, training_job)
        elif time.monotonic() >= self._next_at and self._running.acquire(blocking=False):
            judging = threading.Thread(
                target=self._judge_in_background, args=(now, training_job), name="hpcwatch-problems", daemon=True
            )
            try:
                judging.start()
            except BaseException:  # no thread (the process's limit): the next snapshot tries again
                self._running.release()
                raise
        return self._judged

    def _judge(self, now: float, training_job: str | None) -> None:
        started = time.monotonic()
        try:
            found = problems(self.store, training_job=training_job, kept=self._window)
            self._judged = Judged(found, alert_groups(found), state_inputs(self.store, found, now=now))
        finally:
            took = time.monotonic() - started
            self._next_at = started + max(self.every_s, took + rest_after(took, PROBLEMS_BUSY_SHARE))

    def _judge_in_background(self, now: float, training_job: str | None) -> None:
        try:
            self._judge(now, training_job)
        except Exception as err:  # the page keeps the previous judgement; the next is tried at its time
            log.warning("judging the live problems failed: %s: %s", type(err).__name__, err)
        finally:
            self._running.release()


class LiveView:
    """Snapshots of the store for the schematic; thread-safe, cached for ``min_interval_s``; the problems judged
    at most every ``problems_every_s`` (``ProblemJudge``)."""

    def __init__(
        self,
        store: Store,
        cluster: Cluster,
        *,
        min_interval_s: float = DEFAULT_MIN_INTERVAL_S,
        exclude_jobs: Iterable[str] = (),
        samples: LiveSamples | None = None,
        problems_every_s: float = PROBLEMS_INTERVAL_S,
    ) -> None:
        self.store = store
        self.samples = samples if samples is not None else followed_samples(store)
        """Who answers the sample questions: the store, or a Prometheus (``serve --prometheus``)."""
        self.cluster = cluster
        self.exclude_jobs = tuple(exclude_jobs)
        """Jobs whose spans are not live training (the step player's stored pair)."""
        self.min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._computing = False
        self._frame: tuple[dict[str, Any], bytes] | None = None
        """The snapshot it was encoded from, and its ``event: live`` frame."""
        self._stream: StreamFrames | None = None
        self._requested = False
        """A stream caller was told to compute the next frames (``fresh_stream_frames``) and has not yet."""
        self._stream_doc: dict[str, Any] | None = None
        self._cached: dict[str, Any] | None = None
        self._cached_at = 0.0
        self._latest_t: float | None = None
        self._judge = ProblemJudge(store, every_s=problems_every_s)
        self._training = FollowedTraining(store, exclude_jobs=self.exclude_jobs)
        self._tallies = FollowedEventTallies(store)
        self._gpu_table = GpuTable()
        self._seen: DataSeen | None = None
        self._seen_at: float | None = None
        self._nccl: _KeptNccl | None = None
        """(NCCL events' mark, jobs' mark, when, the card)."""
        self._seen_so_far = SeenSoFar(weights_path=cluster.weights.path)
        self._collectors: tuple[float, dict[str, dict[str, Any]]] | None = None
        """(when, ``collector_activity``): refreshed with what was ever seen, every ``PROBLEMS_INTERVAL_S``: a
        collector arrives or falls silent over ``RECENT_S``, and it was 15 % of a 1,024-node snapshot."""
        self.epoch = secrets.token_hex(4)
        """Names this view's versions: a page that booted from another server process (restarted since)
        holds a version number that means nothing here."""

    def snapshot(self) -> dict[str, Any]:
        return self._current()

    def stream_boot(self) -> dict[str, Any]:
        """The newest stream document (``v`` in it): a page that holds it passes ``EPOCH.V`` back as
        ``/api/stream?since=``, and its stream starts with what came after that version, not the whole
        document again (1.8 MB at 1,024 nodes, parsed and drawn a second time by every page load). One up to
        ``BOOT_MAX_AGE_S`` old is taken as it is: the stream's first delta brings the page up to date."""
        self._current(max(self.min_interval_s, BOOT_MAX_AGE_S))
        with self._lock:
            assert self._stream_doc is not None
            return self._stream_doc

    def resumed_version(self, token: str | None) -> int | None:
        """The version a stream's ``since`` token (``EPOCH.V``) names, or None (absent, malformed, another
        epoch's): then the viewer gets the whole document first."""
        if not token or len(token) > 40:
            return None
        epoch, _, version = token.partition(".")
        if epoch != self.epoch or not version.isdecimal() or len(version) > 18:
            return None
        return int(version)

    def frame(self) -> bytes:
        """The snapshot as one Server-Sent Event (``event: live``), encoded once for every viewer, when first
        asked (the stream sends ``stream_frames``: a snapshot no one asks this of is not encoded twice)."""
        doc = self._current()
        with self._lock:
            return self._frame_of(doc)

    def fresh_frame(self) -> bytes | None:
        """The cached frame if it is still fresh (no store access: safe on the event loop), else None."""
        with self._lock:
            if self._cached is not None and time.monotonic() - self._cached_at < self.min_interval_s:
                return self._frame_of(self._cached)
        return None

    def _frame_of(self, doc: dict[str, Any]) -> bytes:
        """``doc``'s frame, encoded once (the caller holds ``_lock``)."""
        if self._frame is None or self._frame[0] is not doc:
            self._frame = (doc, b"event: live\ndata: " + orjson.dumps(doc, default=str) + b"\n\n")
        return self._frame[1]

    def stream_frames(self, max_age_s: float | None = None) -> StreamFrames:
        """The newest snapshot as the stream sends it, recomputed when older than ``max_age_s`` (default
        ``min_interval_s``): the stream asks with its tick, so versions come once a tick whatever the viewers."""
        try:
            self._current(max_age_s)
        finally:
            with self._lock:
                self._requested = False
        with self._lock:
            assert self._stream is not None
            return self._stream

    def fresh_stream_frames(self, max_age_s: float | None = None) -> StreamFrames | None:
        """``stream_frames()`` without waiting (no store access: safe on the event loop): the frames if fresh, or
        if another caller is already computing the next ones; None to one caller only, which must then call
        ``stream_frames()`` (in a thread). 200 viewers each hopping to the thread pool four times a second
        while a snapshot was computed took the GIL from the thread computing it."""
        max_age_s = self.min_interval_s if max_age_s is None else max_age_s
        with self._lock:
            if self._stream is None:
                return None  # the very first: every caller waits for it in stream_frames()
            if time.monotonic() - self._cached_at < max_age_s or self._computing or self._requested:
                return self._stream
            self._requested = True
        return None

    def drop_request(self) -> None:
        """The caller ``fresh_stream_frames`` sent to compute will not (it left first): the next caller is sent."""
        with self._lock:
            self._requested = False

    def _current(self, max_age_s: float | None = None) -> dict[str, Any]:
        max_age_s = self.min_interval_s if max_age_s is None else max_age_s
        with self._ready:
            while True:
                cached = self._cached
                if cached is not None and (self._computing or time.monotonic() - self._cached_at < max_age_s):
                    return cached
                if not self._computing:
                    break
                self._ready.wait()  # the very first snapshot: wait for it
            self._computing = True
        # A snapshot's age counts from when it began to read the store, not from when it was ready: counted from
        # the end, a stream ticking every second got one every 1 s + the snapshot's own time (0.5 Hz at 1,024
        # nodes, where one takes about a second of a busy process).
        started = time.monotonic()
        try:
            doc = self._compute()
            streamed, frames = self._next_stream(doc)
        except BaseException:
            with self._ready:
                self._computing = False
                self._ready.notify_all()
            raise
        with self._ready:
            self._cached, self._cached_at = doc, started
            self._stream_doc, self._stream = streamed, frames
            self._computing = False
            self._ready.notify_all()
            return doc

    def _next_stream(self, doc: dict[str, Any]) -> tuple[dict[str, Any], StreamFrames]:
        """The next version's stream document and its frames (called by the one computing thread)."""
        previous, last = self._stream_doc, self._stream
        version = 1 if last is None else last.version + 1
        before = None if previous is None or self._cached is None else (self._cached, previous)
        streamed = stream_doc(doc, before) | {"v": version}
        if previous is None or last is None:
            return streamed, StreamFrames(version=version, base=None, doc=streamed, delta=None)
        change = delta(previous, streamed) | {"v": version, "base": last.version}
        return streamed, StreamFrames(
            version=version, base=last.version, doc=streamed, delta=_event("delta", change, version)
        )

    def _current_problems(self, now: float | None, training: dict[str, Any] | None) -> Judged:
        """The newest judgement of the problems (``ProblemJudge``); none while the store holds no sample."""
        if now is None:
            return nothing_judged()
        return self._judge.current(now, training["job"] if training else None)

    def _current_seen(self) -> DataSeen:
        """What the sources ever held, refreshed with the problems (from the rows committed since)."""
        if self._seen is None or _due(self._seen_at):
            self._seen = self._seen_so_far(self.store, self.samples)
            self._seen_at = time.monotonic()
        return self._seen

    def _current_nccl(self) -> list[dict[str, Any]]:
        """The NCCL card, looked at again every ``PROBLEMS_INTERVAL_S`` (NCCL logs arrive when a job's ranks
        write them; asking the store at each snapshot was 7 % of the server at 1,024 nodes), and made again only
        when NCCL events came, or when a job on a host they name changed: only those jobs can be told an event's
        job (``reports.nccl.nccl_hosts``). At 1,024 nodes a job starts or ends every second, and the card read
        every NCCL event and job again every few seconds."""
        kept = self._nccl
        if kept is not None and not _due(kept.at):
            return kept.card
        mark = queries.events_mark(self.store, NCCL_LOG_KINDS)
        if kept is None or kept.mark != mark:
            events = nccl_log_events(self.store)
            hosts = nccl_hosts(events)
        else:
            events, hosts = kept.events, kept.hosts
        jobs = self.store.jobs(on_nodes=sorted(hosts)) if hosts else []
        at = time.monotonic()
        if kept is None or kept.mark != mark or kept.jobs != jobs:
            card = nccl_card(self.store, events=events, jobs=jobs)
            self._nccl = kept = _KeptNccl(mark=mark, events=events, hosts=hosts, jobs=jobs, card=card, at=at)
        else:
            self._nccl = kept = replace(kept, at=at)
        return kept.card

    def _current_collectors(self, now: float | None, seen: DataSeen) -> dict[str, dict[str, Any]]:
        """Each collector's activity, refreshed every ``PROBLEMS_INTERVAL_S`` (see ``_collectors``)."""
        if self._collectors is None or _due(self._collectors[0]):
            activity = collector_activity(
                self.store,
                self.samples,
                now,
                weights_path=self.cluster.weights.path,
                exclude_jobs=self.exclude_jobs,
                seen=seen,
            )
            self._collectors = (time.monotonic(), activity)
        return self._collectors[1]

    def latest_t(self) -> float | None:
        """The newest sample's time (``/healthz``)."""
        return self.samples.latest_t()

    def _compute(self) -> dict[str, Any]:
        started = time.perf_counter()
        now = self.samples.latest_t(hint=self._latest_t)
        self._latest_t = now if now is not None else self._latest_t
        seen = self._current_seen()
        doc = live_snapshot(
            self.store,
            weights_path=self.cluster.weights.path,
            exclude_jobs=self.exclude_jobs,
            now=now,
            with_problems=False,
            samples=self.samples,
            seen=seen,
            nccl=self._current_nccl(),
            collectors=self._current_collectors(now, seen),
            followed_training=self._training,
            gpu_table=self._gpu_table,
            event_tallies=self._tallies,
        )
        judged = self._current_problems(now, doc["training"])
        doc["problems"], doc["alerts"] = judged.problems, judged.alerts
        apply_states(doc, judged.problems, judged.states)
        doc["vectors"] = {v: _titled(entry) for v, entry in doc["vectors"].items()}
        doc["query_ms"] = round((time.perf_counter() - started) * 1000, 2)
        return doc


@dataclass(frozen=True, slots=True, kw_only=True)
class _KeptNccl:
    """The NCCL card as last made (``LiveView._current_nccl``), and what it was made of."""

    mark: tuple[int, float | None]
    """``queries.events_mark`` of the NCCL log events."""
    events: list[Event]
    hosts: frozenset[str]
    jobs: list[Job]
    """The jobs on ``hosts``, as they were."""
    card: list[dict[str, Any]]
    at: float
    """When it was last looked at (``time.monotonic``)."""


def _event(kind: str, doc: dict[str, Any], version: int) -> bytes:
    return b"event: %s\nid: %d\ndata: %s\n\n" % (kind.encode(), version, orjson.dumps(doc, default=str))


def _due(last: float | None) -> bool:
    """A slow part (problems, what was ever seen) is refreshed every ``PROBLEMS_INTERVAL_S``."""
    return last is None or time.monotonic() - last >= PROBLEMS_INTERVAL_S


def _titled(entry: dict[str, Any]) -> dict[str, Any]:
    """A vector's entry as the page reads it: ``text`` is its newest finding's title in every page language,
    or None when its rule has no template (the page then shows the detector's English ``title``)."""
    out = {k: entry[k] for k in _VECTOR_FIELDS}
    if entry["rule"] is None:
        out["text"] = None
        return out
    texts = {
        lang: finding_text(entry["rule"], entry["evidence"], target=entry["target"], t=entry["last_t"], lang=lang)
        for lang in LANGUAGES
    }
    out["text"] = None if any(v is None for v in texts.values()) else texts
    return out
