"""The scheduler: every collector in its own thread on its own interval, none able to stop another.

    thread per collector:  run ─ record success or error ─ sleep to the next tick ─ run ...
    status thread:         every status_every_s, STORE/collect/status.json (temp file + rename)

A run that raises (an ``HpcwatchError``, or a bug: any ``Exception``) is recorded as that
collector's ``last_error`` and retried at its next tick; the others never notice. Each collector
writes through its own ``Store`` (the store admits many writers; commits take turns on its lock),
so a slow commit of one never holds another's thread. ``stop()`` (SIGTERM, SIGINT) lets running
collectors finish their run, up to ``stop_timeout_s``.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import orjson

from hpcwatch.act.config import ActConfig
from hpcwatch.collect.base import Collector
from hpcwatch.collect.config import (
    ActiveSection,
    CollectConfig,
    FollowSection,
    LiveSection,
    PrometheusSection,
    ReceiveSection,
    ScheduleSection,
    ScrapeSection,
    SlurmSection,
    SpoolSection,
)
from hpcwatch.errors import one_line
from hpcwatch.notify.config import NotifyConfig
from hpcwatch.reports.collectors import CollectorStatus, status_path
from hpcwatch.store import Store

__all__ = ["Daemon", "build_collector", "KINDS"]

log = logging.getLogger(__name__)

#: The status ``kind`` of each section type.
KINDS = {
    SlurmSection: "slurm",
    PrometheusSection: "prometheus",
    ScrapeSection: "scrape",
    FollowSection: "follow",
    SpoolSection: "spool",
    LiveSection: "live",
    ScheduleSection: "schedule",
    ReceiveSection: "receive",
    NotifyConfig: "notify",
    ActConfig: "act",
    ActiveSection: "active",
}


def build_collector(store: Store, section: Any, *, node: str = "", notify: NotifyConfig | None = None) -> Collector:
    """The collector of one config section (imports stay lazy: a site without Slurm never loads it);
    ``notify``: the file's ``[notify]`` table, which ``[act]``'s warnings go through."""
    if isinstance(section, SlurmSection):
        from hpcwatch.collect.slurm import SlurmCollector

        return SlurmCollector(store, section)
    if isinstance(section, PrometheusSection):
        from hpcwatch.collect.prometheus import PromqlCollector

        return PromqlCollector(store, section)
    if isinstance(section, ScrapeSection):
        from hpcwatch.collect.prometheus import ScrapeCollector

        return ScrapeCollector(store, section)
    if isinstance(section, FollowSection):
        from hpcwatch.collect.follow import LogFollower

        return LogFollower(store, section, node=node)
    if isinstance(section, SpoolSection):
        from hpcwatch.collect.spool import SpoolCollector

        return SpoolCollector(store, section)
    if isinstance(section, LiveSection):
        from hpcwatch.collect.live import LiveCollector

        return LiveCollector(store, section)
    if isinstance(section, ScheduleSection):
        from hpcwatch.collect.schedule import ScheduledTask

        return ScheduledTask(store, section)
    if isinstance(section, ReceiveSection):
        from hpcwatch.collect.receive import ReceiveCollector

        return ReceiveCollector(store, section)
    if isinstance(section, NotifyConfig):
        from hpcwatch.collect.notify import NotifyCollector

        return NotifyCollector(store, section)
    if isinstance(section, ActConfig):
        from hpcwatch.collect.act import ActCollector

        return ActCollector(store, section, notify=notify)
    if isinstance(section, ActiveSection):
        from hpcwatch.collect.active import ActiveChecks

        return ActiveChecks(store, section)
    raise TypeError(f"no collector for {type(section).__name__}")


def _kind(section: Any) -> str:
    kind = KINDS[type(section)]
    if isinstance(section, SlurmSection):
        return f"slurm-{section.mode}"
    if isinstance(section, ScheduleSection):
        return f"schedule-{section.task}"
    return kind


class Daemon:
    def __init__(
        self,
        config: CollectConfig,
        *,
        node: str,
        open_store: Callable[[], Store] | None = None,
        build: Callable[..., Collector] = build_collector,
    ) -> None:
        self.config, self.node = config, node
        self._open_store = open_store or (lambda: Store(config.store.path))
        self._build = build
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._status: dict[str, CollectorStatus] = {
            s.name: CollectorStatus(name=s.name, kind=_kind(s), interval_s=s.interval_s) for s in config.collectors
        }
        self._notes: dict[str, str] = {}
        self._threads: list[threading.Thread] = []
        self.status_file = status_path(config.store.path, node)

    # -- running ------------------------------------------------------------------------------------

    def start(self) -> None:
        for section in self.config.collectors:
            thread = threading.Thread(target=self._loop, args=(section,), name=f"collect-{section.name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        writer = threading.Thread(target=self._write_loop, name="collect-status", daemon=True)
        writer.start()
        self._threads.append(writer)

    def stop(self) -> None:
        self._stop.set()
        deadline = time.monotonic() + self.config.collect.stop_timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.write_status()

    def run_once(self) -> dict[str, CollectorStatus]:
        """Every collector once, in config order, in this thread (``hpcwatch collect --once``)."""
        for section in self.config.collectors:
            store = self._open_store()
            try:
                self._run_one(section, self._make(section, store))
            finally:
                store.close()
        self.write_status()
        return self.statuses()

    def statuses(self) -> dict[str, CollectorStatus]:
        with self._lock:
            return dict(self._status)

    def _make(self, section: Any, store: Store) -> Collector | None:
        try:
            extra = {"notify": self.config.notify} if isinstance(section, ActConfig) else {}
            return self._build(store, section, node=self.node, **extra)
        except Exception as err:  # a collector that cannot even start is that collector's error only
            self._record(section.name, error=err)
            return None

    def _loop(self, section: Any) -> None:
        store = self._store_or_none(section)
        collector = None
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                store = store or self._store_or_none(section)
                collector = collector or (self._make(section, store) if store is not None else None)
                if collector is not None:
                    self._run_one(section, collector)
                self._stop.wait(max(0.0, section.interval_s - (time.monotonic() - started)))
        finally:
            if collector is not None:
                collector.close()
            if store is not None:
                store.close()

    def _store_or_none(self, section: Any) -> Store | None:
        """A store that cannot be opened now (a full disk, a folder being made) is this collector's error
        until the next try: the thread lives on and retries on its interval."""
        try:
            return self._open_store()
        except Exception as err:
            self._record(section.name, error=err)
            log.warning("collector %s: %s", section.name, one_line(str(err)))
            return None

    def _run_one(self, section: Any, collector: Collector | None) -> None:
        if collector is None:
            return
        try:
            result = collector.run()
        except Exception as err:  # never let one collector's failure (or bug) reach another
            self._record(section.name, error=err)
            log.warning("collector %s: %s", section.name, one_line(str(err)))
            return
        self._record(section.name, records=result.records, lag_s=result.lag_s, note=result.note)

    def _record(
        self,
        name: str,
        *,
        error: BaseException | None = None,
        records: int = 0,
        lag_s: float | None = None,
        note: str = "",
    ) -> None:
        now = time.time()
        with self._lock:
            old = self._status[name]
            if error is not None:
                text = one_line(str(error)) or type(error).__name__
                if not isinstance(error, Exception) or type(error).__module__.split(".")[0] != "hpcwatch":
                    text = f"{type(error).__name__}: {text}"
                new = replace(
                    old,
                    runs=old.runs + 1,
                    errors=old.errors + 1,
                    last_error=text,
                    last_error_s=now,
                    lag_s=None if old.last_success_s is None else now - old.last_success_s,
                )
            else:
                new = replace(
                    old,
                    runs=old.runs + 1,
                    records=old.records + records,
                    last_success_s=now,
                    last_error=None,
                    last_error_s=None,
                    lag_s=lag_s,
                )
                if note:
                    self._notes[name] = note
            self._status[name] = new

    # -- the status file ----------------------------------------------------------------------------

    def _write_loop(self) -> None:
        while not self._stop.wait(self.config.collect.status_every_s):
            try:
                self.write_status()
            except OSError as err:
                log.warning("status file %s: %s", self.status_file, err)

    def write_status(self) -> None:
        """The status file, replaced atomically (a reader sees the old one or the new one)."""
        with self._lock:
            doc = {
                "written_s": time.time(),
                "pid": os.getpid(),
                "daemon": self.node,
                "config": self.config.path,
                "collectors": [{**asdict(s), "note": self._notes.get(s.name, "")} for s in self._status.values()],
            }
        folder = self.status_file.parent
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".status-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
            os.replace(tmp, self.status_file)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
