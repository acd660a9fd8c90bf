"""Spool folders: files dropped by cron or a Slurm epilog (nvidia-smi, perfquery, job_stats, health
checks, Kineto traces, Flight Recorder dumps), stored once each through ``hpcwatch.ingest``.

Each run lists the folder's top-level entries and ingests those unchanged for ``settle_s`` (a writer
may still be writing the others); ingest is content-keyed, so a file seen again costs a hash, and
not even that while its size and write time stay what they were when it was stored. Traces and
op tables are read by their own commands: ingest reports them "not stored", and so do we.

A folder holding ``shipment.json`` is one host check of a node's agent (``collect/shipment.py``): it
was renamed into place whole, so it is read at once (no settling); its ``output`` is ingested with
the format and node the shipment names, an ``agent_check`` event records the run (exit status,
duration, what the reader made of it; once per shipment id), and the folder is removed. A shipment
the centre cannot read is moved to ``.rejected/`` (the newest ``REJECTED_KEPT`` are kept).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

from hpcwatch.collect.base import RunResult
from hpcwatch.collect.config import SpoolSection
from hpcwatch.collect.shipment import OUTPUT, Shipment, is_shipment, read_from_spool
from hpcwatch.errors import BackendError, ParseError, one_line
from hpcwatch.ingest import ingest_paths
from hpcwatch.records import Event
from hpcwatch.store import SourceMark, Store
from hpcwatch.vocab import EventKind

__all__ = ["SpoolCollector", "REJECTED_KEPT"]

log = logging.getLogger(__name__)

#: Unreadable shipments kept in SPOOL/.rejected/ for the operator (the oldest removed past it).
REJECTED_KEPT = 200


def _newest_mtime(path: Path) -> tuple[float, int]:
    """Newest write time under ``path`` and its size (a folder: of everything in it)."""
    st = path.stat()
    if not path.is_dir():
        return st.st_mtime, st.st_size
    newest, size = st.st_mtime, 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                s = os.stat(os.path.join(root, name))
            except OSError:
                continue
            newest, size = max(newest, s.st_mtime), size + s.st_size
    return newest, size


def _not_a_check_format(name: str) -> str | None:
    """Why a shipment's format cannot be read from one command's output (None: it can)."""
    from hpcwatch.sources.registry import format_named

    try:
        fmt = format_named(name)
    except ParseError as err:
        return err.what
    if fmt.yields != "records" or fmt.folder:
        return f"format {name!r} is not a file of records"
    return None


class SpoolCollector:
    def __init__(self, store: Store, section: SpoolSection) -> None:
        self.store, self.section = store, section
        self._seen: dict[str, tuple[float, int]] = {}
        self.rejected: dict[str, str] = {}
        """Files a reader refused, with the one-line error (kept until they change)."""

    def close(self) -> None:
        pass

    def run(self) -> RunResult:
        folder = Path(self.section.path)
        try:
            entries = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
        except OSError as err:
            raise BackendError(f"{folder}: cannot list the spool: {err.strerror or err}") from err
        now, stored, ready = time.time(), 0, []
        for entry in entries:
            if is_shipment(entry):
                stored += self._ship(entry)
                continue
            try:
                seen = _newest_mtime(entry)
            except OSError:
                continue  # removed meanwhile
            if now - seen[0] < self.section.settle_s or self._seen.get(str(entry)) == seen:
                continue
            ready.append((entry, seen))
        for entry, seen in ready:
            stored += self._ingest(entry)
            self._seen[str(entry)] = seen
        note = (
            f"{len(self.rejected)} file(s) refused, e.g. {next(iter(self.rejected.values()))}" if self.rejected else ""
        )
        return RunResult(records=stored, lag_s=0.0, note=note)

    def _ingest(self, entry: Path) -> int:
        """One entry; a file its reader refuses is reported, and the others go on (those of the same
        folder too: ``keep_going``)."""
        try:
            report = ingest_paths(
                self.store,
                [entry],
                format=self.section.format or None,
                host=self.section.host or None,
                keep_going=True,
            )
        except ParseError as err:  # --format names no format
            self.rejected[str(entry)] = str(err)
            return 0
        bad = report.bad()
        if bad:
            self.rejected[str(entry)] = bad[0].reason if len(bad) == 1 else f"{bad[0].reason} (+{len(bad) - 1} more)"
        else:
            self.rejected.pop(str(entry), None)
        return sum(report.totals().values())

    def _ship(self, entry: Path) -> int:
        """One agent shipment: its output through the registry, its run as an event, then the folder goes."""
        try:
            shipment = read_from_spool(entry)
        except ParseError as err:
            self._reject(entry, str(err))
            return 0
        status, reason, stored = "not read", "", 0
        if shipment.timed_out or shipment.truncated or not shipment.output.strip():
            reason = "timed out" if shipment.timed_out else "output cut" if shipment.truncated else "no output"
        elif (why := _not_a_check_format(shipment.format)) is not None:
            status, reason = "bad", why
        else:
            try:
                report = ingest_paths(
                    self.store, [entry / OUTPUT], format=shipment.format, host=shipment.host, keep_going=True
                )
            except (ParseError, OSError, ValueError) as err:  # one shipment never holds back the others
                report, status, reason = None, "bad", one_line(str(err))
            if report is not None:
                result = report.files[0] if report.files else None
                status = result.status if result else "empty"
                reason = result.reason if result else ""
                stored = sum(report.totals().values())
        if reason and status != "stored" and status != "already":
            log.warning("agent shipment %s: %s", one_line(entry.name), one_line(reason))
        stored += self._record_run(shipment, status, reason)
        if status == "bad":
            self._reject(entry, reason)
        else:
            shutil.rmtree(entry, ignore_errors=True)
        return stored

    def _record_run(self, s: Shipment, status: str, reason: str) -> int:
        key = f"agent-shipment:{s.id}"
        if self.store.has_source(key):
            return 0
        event = Event(
            kind=EventKind.AGENT_CHECK,
            t=s.started_s,
            source="agent",
            attrs={
                "node": s.host,
                "check": s.check,
                "command": list(s.command),
                "format": s.format,
                "exit_status": s.exit_status,
                "duration_s": s.duration_s,
                "output_bytes": len(s.output),
                "truncated": s.truncated,
                "timed_out": s.timed_out,
                "error": s.error,
                "stderr_tail": s.stderr_tail,
                "ingest": status,
                "ingest_error": reason,
            },
        )
        with self.store.transaction(source=SourceMark(key=key, path=s.spool_name(), format="agent")) as tx:
            tx.add([event])
        return 0 if tx.skipped else 1

    def _reject(self, entry: Path, reason: str) -> None:
        self.rejected[str(entry)] = reason
        while len(self.rejected) > REJECTED_KEPT:  # a shipment's folder is gone: keep the newest reasons only
            self.rejected.pop(next(iter(self.rejected)))
        kept = Path(self.section.path) / ".rejected"
        try:
            kept.mkdir(exist_ok=True)
            os.replace(entry, kept / entry.name)
            old = sorted(kept.iterdir(), key=lambda p: p.stat().st_mtime)
            for stale in old[: max(0, len(old) - REJECTED_KEPT)]:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError as err:
            log.warning("agent shipment %s: cannot move it to %s: %s", one_line(entry.name), kept, err)
            shutil.rmtree(entry, ignore_errors=True)
