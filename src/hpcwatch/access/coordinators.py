"""Who coordinates which Slurm account, as the policy reads it: the file ``[coordinators] file`` names
(``sacctmgr show user withcoordinator --parsable2``, saved by a cron job: the web server runs no Slurm
command), read at load and again when it changes, at most every ``RECHECK_S`` — the watching is
``sources.sacctmgr.CoordinatorsFile``'s, which ``hpcwatch notify`` shares."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hpcwatch.errors import ConfigError, InputError
from hpcwatch.sources.sacctmgr import RECHECK_S, CoordinatorsFile

__all__ = ["Coordinators", "RECHECK_S"]


class Coordinators(CoordinatorsFile):
    """User → accounts they coordinate; thread-safe. A file that breaks later keeps the last good table
    (and logs nothing on the request path); one broken at load is a ConfigError."""

    def __init__(self, path: Path | None, *, table: Mapping[str, frozenset[str]] | None = None) -> None:
        try:
            super().__init__(path, table=table)
        except InputError as err:
            raise ConfigError(f"coordinators file: {err}") from err
