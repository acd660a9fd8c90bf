"""The twin, live: a background thread that advances it and writes each tick into a Store.

Used by ``hpcwatch top`` and ``hpcwatch demo``: the views read the store (as they would read a
real cluster's), never the twin's internals. Simulated time starts at the real time (unless told
otherwise) and runs ``speed`` simulated seconds per real second, one tick every ``tick_s`` real
seconds; the simulation itself never reads the clock, so a seed gives the same cluster.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from hpcwatch.errors import ConfigError
from hpcwatch.model import Cluster
from hpcwatch.twin.core import Twin
from hpcwatch.twin.ebpf import checkpoint_docs_of_tick, events_of
from hpcwatch.twin.exposition import perfquery_table
from hpcwatch.twin.livefiles import FolderIngest, HostFiles
from hpcwatch.twin.scenarios import Scenario
from hpcwatch.twin.workload import PlannedJob
from hpcwatch.vocab import EventKind

__all__ = [
    "LiveTwin",
    "RecordSink",
    "DEFAULT_TICK_S",
    "PERFQUERY_INTERVAL_S",
    "SCRAPED_NODES_PER_S",
    "scrape_interval_s",
]


class TickWriter(Protocol):
    """What one tick is written through: a store transaction."""

    def add(self, records: Iterable[Any]) -> Any: ...

    def add_sample_table(self, table: Any) -> Any: ...

    def add_span_table(self, table: Any) -> Any: ...


class RecordSink(Protocol):
    """Where the live twin writes, a tick in one transaction: ``hpcwatch.store.Store`` is one (the twin does not
    import the store)."""

    def transaction(self) -> AbstractContextManager[TickWriter]: ...


#: One tick per real second: what a person watching a dashboard expects.
DEFAULT_TICK_S = 1.0
#: The most nodes whose exporters the live twin's scrapes read in one simulated second: a larger twin scrapes
#: each node every ``ceil(nodes / this)`` s, the nodes in turn (1,024 nodes: every 8 s), as a Prometheus
#: spreads a large cluster's targets over its interval (dcgm-exporter's own collection interval defaults to
#: 30 s). Ours: scraped every second, a 1,024-node twin wrote 170,000 samples a second, 8 to 30 times what
#: such a cluster's scrapes bring, and the store, the scan and the page paid for each.
SCRAPED_NODES_PER_S = 128


def scrape_interval_s(nodes: int) -> float:
    """Simulated seconds between two scrapes of a node's exporters, by default (``SCRAPED_NODES_PER_S``)."""
    return float(max(1, -(-nodes // SCRAPED_NODES_PER_S)))


#: How often (simulated seconds) the live twin's perfquery collector reads every HCA. Ours: perfquery sends one
#: MAD per port, so collectors poll it every few seconds, not every tick (node-exporter's counters come every tick).
PERFQUERY_INTERVAL_S = 10.0


class LiveTwin:
    """``start()`` runs the twin in a daemon thread, writing ``twin.records()`` into ``store`` every tick;
    ``stop()`` ends it. ``lock`` guards the twin while a tick runs (hold it to read the twin directly).
    ``host_files``: how the scenarios' host captures reach the store (twin/livefiles.py); None: they don't.
    ``scrape_s``: simulated seconds between two scrapes of a node's exporters (None: ``scrape_interval_s``);
    each tick writes the nodes whose turn it is, the first tick every node."""

    def __init__(
        self,
        store: RecordSink,
        cluster: Cluster,
        *,
        seed: int = 0,
        scenarios: Iterable[str | Scenario] = (),
        speed: float = 1.0,
        tick_s: float = DEFAULT_TICK_S,
        start: float | None = None,
        on_tick: Callable[[Twin], None] | None = None,
        host_files: FolderIngest | None = None,
        scrape_s: float | None = None,
    ) -> None:
        if speed <= 0 or tick_s <= 0:
            raise ConfigError(f"speed and tick_s must be > 0, got {speed} and {tick_s}")
        if scrape_s is not None and scrape_s <= 0:
            raise ConfigError(f"scrape_s must be > 0, got {scrape_s}")
        self.store = store
        self.twin = Twin(
            cluster, seed=seed, scenarios=tuple(scenarios), start=float(int(time.time())) if start is None else start
        )
        self.speed = speed
        self.tick_s = tick_s
        interval = scrape_s if scrape_s is not None else scrape_interval_s(len(cluster.nodes))
        self.scrape_groups = max(1, round(interval / (tick_s * speed)))
        """The nodes are scraped in this many groups, one a tick (1: every node every tick)."""
        self._written_ticks = 0
        self.on_tick = on_tick
        self.lock = threading.RLock()
        self.ticks = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._started = threading.Event()
        """Set once the thread wrote its first tick, or died."""
        self._thread: threading.Thread | None = None
        self._written_jobs: dict[str, tuple] = {}
        self._perfquery_t: float | None = None
        # The scenarios' host captures (smartctl, df, dmesg...), fed through the readers as an agent ships them.
        self._host_files = None if host_files is None else HostFiles(self.twin.scenarios, host_files)

    def write_tick(self) -> None:
        """Put the twin's current tick into the store (samples in one table, changed jobs, spans, events, and
        what the slower collectors saw: perfquery every ``PERFQUERY_INTERVAL_S``, Tetragon on checkpoints)."""
        with self.lock:
            twin = self.twin
            # The first tick scrapes every node, as a Prometheus's first round does; then a group a tick.
            turn = (self._written_ticks % self.scrape_groups, self.scrape_groups) if self._written_ticks else (0, 1)
            self._written_ticks += 1
            table = twin.sample_table(scrape=turn)
            # Records only of the jobs that changed: a 1,024-node twin's Slurm knows thousands of jobs.
            jobs = [j.record() for j in twin.scheduler.jobs if self._changed(j)]
            events = twin.events()
            perfquery = self._perfquery(twin)
            captured = self._host_files.capture(twin) if self._host_files is not None else None
            spans = twin.finished_span_columns()
            others = [*jobs, *events, *events_of(checkpoint_docs_of_tick(twin, events), EventKind.TETRAGON)]
        # One commit a tick: readers following the store see a tick whole, and it makes one part a table.
        with self.store.transaction() as tx:
            tx.add_sample_table(table)
            if perfquery is not None:
                tx.add_sample_table(perfquery)
            if spans is not None:
                tx.add_span_table(spans)
            if others:
                tx.add(others)
        if captured is not None and self._host_files is not None:
            self._host_files.feed(captured)  # outside the lock: the ingest reads files, the twin is not needed

    def _perfquery(self, twin: Twin) -> Any:
        """Every HCA's ``perfquery -x`` counters as a sample table, when the collector's interval has passed."""
        if self._perfquery_t is not None and twin.now - self._perfquery_t < PERFQUERY_INTERVAL_S:
            return None
        self._perfquery_t = twin.now
        return perfquery_table(twin)

    def _changed(self, job: PlannedJob) -> bool:
        key = (job.state, job.record_start, job.end)
        if self._written_jobs.get(job.id) == key:
            return False
        self._written_jobs[job.id] = key
        return True

    def step(self) -> None:
        """One tick: advance by tick_s x speed simulated seconds and write it."""
        with self.lock:
            self.twin.advance(self.tick_s * self.speed)
        self.write_tick()
        self.ticks += 1
        if self.on_tick is not None:
            self.on_tick(self.twin)

    def _run(self) -> None:
        try:
            self.write_tick()
            self._started.set()
            next_at = time.monotonic() + self.tick_s
            while not self._stop.wait(max(0.0, next_at - time.monotonic())):
                self.step()
                next_at += self.tick_s
        except BaseException as err:  # surfaced by stop() / .error: a dead thread must not look alive
            self.error = err
            self._started.set()

    def start(self) -> LiveTwin:
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._started.clear()
        self._thread = threading.Thread(target=self._run, name="hpcwatch-live-twin", daemon=True)
        self._thread.start()
        return self

    def wait_started(self, timeout_s: float | None = None) -> bool:
        """Wait until the thread has written its first tick: True; False after ``timeout_s``; what killed the
        thread re-raised if it died first."""
        started = self._started.wait(timeout_s)
        if self.error is not None:
            raise self.error
        return started

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread; re-raises what killed it, if anything did."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self.error is not None:
            raise self.error

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> LiveTwin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
