"""Spool folders: files dropped by cron or a Slurm epilog (nvidia-smi, perfquery, job_stats, health
checks, Kineto traces, Flight Recorder dumps), stored once each through ``hpcwatch.ingest``.

Each run lists the folder's top-level entries and ingests those unchanged for ``settle_s`` (a writer
may still be writing the others); ingest is content-keyed, so a file seen again costs a hash, and
not even that while its size and write time stay what they were when it was stored. Traces and
op tables are read by their own commands: ingest reports them "not stored", and so do we.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from hpcwatch.collect.base import RunResult
from hpcwatch.collect.config import SpoolSection
from hpcwatch.errors import BackendError, ParseError
from hpcwatch.ingest import ingest_paths
from hpcwatch.store import Store

__all__ = ["SpoolCollector"]


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
