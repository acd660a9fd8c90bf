"""Who coordinates which Slurm account, as the policy reads it: the file ``[coordinators] file`` names
(``sacctmgr show user withcoordinator --parsable2``, saved by a cron job: the web server runs no Slurm
command), read at load and again when it changes, at most every ``RECHECK_S``."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from hpcwatch.errors import ConfigError, InputError
from hpcwatch.sources.sacctmgr import read_coordinators

__all__ = ["Coordinators", "RECHECK_S"]

#: How often the file's mtime is looked at: a coordinator added in sacctmgr shows within a minute of cron.
RECHECK_S: Final = 30.0


class Coordinators:
    """User → accounts they coordinate; thread-safe. A file that breaks later keeps the last good table
    (and logs nothing on the request path); one broken at load is a ConfigError."""

    def __init__(self, path: Path | None, *, table: Mapping[str, frozenset[str]] | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._table: Mapping[str, frozenset[str]] = dict(table or {})
        self._mtime: float | None = None
        self._checked = 0.0
        if path is not None:
            try:
                self._load()
            except InputError as err:
                raise ConfigError(f"coordinators file: {err}") from err

    def table(self) -> Mapping[str, frozenset[str]]:
        if self.path is not None and time.monotonic() - self._checked >= RECHECK_S:
            with self._lock:
                try:
                    self._load()
                except (InputError, OSError):
                    pass  # keep the last good table: a half-written file must not lock coordinators out
        return self._table

    def _load(self) -> None:
        assert self.path is not None
        self._checked = time.monotonic()
        try:
            mtime = self.path.stat().st_mtime
        except OSError as err:
            raise ConfigError(f"{self.path}: cannot read the coordinators file: {err.strerror}") from err
        if mtime != self._mtime:
            self._table, self._mtime = read_coordinators(self.path), mtime
