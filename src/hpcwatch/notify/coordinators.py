"""The account coordinators Slurm knows, for ``[notify] coordinators_file``: the same saved
``sacctmgr show user withcoordinator --parsable2`` listing the access policy reads, watched by
``sources.sacctmgr.CoordinatorsFile`` (re-read when it changes, at most every ``RECHECK_S``).

One watcher per path for the process: ``collect`` and ``act`` parse the ``[notify]`` table, and every
notice asks who coordinates its account, so the file is read once and again only when it changes.
"""

from __future__ import annotations

import logging
import threading

from hpcwatch.errors import InputError
from hpcwatch.sources.sacctmgr import CoordinatorsFile

__all__ = ["watch_coordinators", "coordinator_users"]

log = logging.getLogger("hpcwatch.notify")

_WATCHED: dict[str, CoordinatorsFile] = {}
_REPORTED: dict[str, str | None] = {}
_LOCK = threading.Lock()


def watch_coordinators(path: str) -> CoordinatorsFile:
    """The file's watcher, read now on first use: ``ValueError`` naming the file and its line when it is
    missing or not sacctmgr's listing (the config's check: exit 2 at start)."""
    with _LOCK:
        if path not in _WATCHED:
            try:
                _WATCHED[path] = CoordinatorsFile(path)
            except InputError as err:
                raise ValueError(f"coordinators_file: {err}") from err
        return _WATCHED[path]


def coordinator_users(path: str, account: str) -> frozenset[str]:
    """The users coordinating ``account``; a file that broke since keeps its last good table, said once
    in the log (and once again when it reads well)."""
    watcher = watch_coordinators(path)
    users = watcher.users_of(account)
    if _REPORTED.get(path) != watcher.error:
        _REPORTED[path] = watcher.error
        if watcher.error:
            log.warning("coordinators file kept as last read: %s", watcher.error)
        else:
            log.info("coordinators file %s read again", path)
    return users
