"""A job's settled checkpoint kept on disk, in the store's folder, so that a restarted server reads on from it.

A server keeps each read job's checkpoints in memory (``reports.jobstretches.KeptStretches``): its next page
reads only what landed since. A process that starts (a server restarted, an upgrade) has none: its first page
of a running 1,536-GPU job read the job's whole life, ~10 ms per second of it at 1,024 nodes (a day-old job:
about 15 minutes), and its job warmer as long again before it kept the job read. So the job pages' process
also writes, at most once a ``SAVE_EVERY_S`` of the job's time, the newest settled checkpoint of the kinds read
from samples (the report's ``Partial``, the charts' cells) to a file of its own::

    STORE/checkpoints/report-<sha256 of the job id>.ckpt     one per job and kind, replaced in one rename
    STORE/checkpoints/charts-<…>.ckpt

and a process with nothing in memory for a job reads the file and resumes from it as from a kept checkpoint:
by the same checks (the job's first start and nodes, the allocations it was computed from, no row landed
before it since its store version, which the manifest keeps across processes). A file that fails any of
them, or cannot be read, is skipped with one line in the log: the page reads the job's life, as before.
``hpcwatch job ID`` and the job-end notice read the files the same way, and never write them.

What a file holds is builtins and numpy arrays only (each state's ``to_plain``), pickled, and read back by an
unpickler that refuses any other global: a file someone else wrote can fail a page's read of it, not run
code. The files are a cache of what the store's samples say: deleting the folder loses nothing. The newest
``MAX_JOBS_ON_DISK`` jobs' files are kept (a finished job's stay for its post-mortem page until then).
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from hpcwatch.errors import one_line
from hpcwatch.reports.text import visible
from hpcwatch.store.core import DERIVED_FOLDER

__all__ = ["FOLDER", "SAVE_EVERY_S", "MAX_JOBS_ON_DISK", "MAX_FILE_BYTES", "OnDisk", "Saved", "CheckpointFiles"]

log = logging.getLogger(__name__)

#: The folder in the store's folder (``store.core`` keeps it out of its tables and drops it when a new store is
#: made in the folder: its files would describe another store's rows).
FOLDER: Final = DERIVED_FOLDER
#: Of the job's time between two files of a job's kind: a restarted server reads at most about this much
#: more than it would have from memory. Ours: at 1,536 GPUs a file is ~1 MB (report) and ~7 MB (charts), 11
#: and 6 ms to write.
SAVE_EVERY_S: Final = 60.0
#: The jobs whose files are kept (the most recently written); the older ones' are deleted. Ours.
MAX_JOBS_ON_DISK: Final = 64
#: A larger file is not read (a checkpoint is bounded by the job's GPUs: ~8 MB at 1,536).
MAX_FILE_BYTES: Final = 256 << 20
#: Changed when what a file holds changes: a file of another format is skipped.
_FORMAT: Final = "hpcwatch-checkpoint/3"  # 2: the cells as columns; 3: a window read with its lead-in samples
_SUFFIX: Final = ".ckpt"
#: A file being written (renamed once whole); one a killed writer left is deleted after ``_ABANDONED_S``.
_WRITING: Final = ".writing-"
_ABANDONED_S: Final = 600.0

#: The only globals a file may name: numpy's arrays and dtypes (builtins, tuples, sets need none).
_ALLOWED: Final = frozenset(
    {
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy", "dtype"),
        ("numpy", "ndarray"),
    }
)


@dataclass(frozen=True, slots=True)
class OnDisk:
    """How a kind's checkpoint state (and what is kept beside it) is written: to builtins and arrays, and
    back. ``from_plain`` raises ``ValueError`` (or ``KeyError``, ``TypeError``) on a form it did not write."""

    state_to_plain: Callable[[Any], Any]
    state_from_plain: Callable[[Any], Any]
    extra_to_plain: Callable[[Any], Any] = lambda extra: extra
    extra_from_plain: Callable[[Any], Any] = lambda plain: plain


@dataclass(frozen=True, slots=True)
class Saved:
    """A checkpoint as a file holds it (states in their plain form)."""

    job: str
    kind: str
    t0: float
    hosts: tuple[str, ...]
    version: int
    """The store's version before the read that made it: a row committed after it may lie before ``upto``."""
    extra: Any
    upto: float
    fingerprint: Any
    state: Any


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"names {module}.{name}, which a checkpoint never holds")
        return super().find_class(module, name)


class CheckpointFiles:
    """The checkpoint files of one store's folder (module doc). Safe to share between threads."""

    def __init__(self, folder: Path, *, folder_mode: int = 0o700, file_mode: int = 0o600) -> None:
        self.folder = folder
        self.folder_mode, self.file_mode = folder_mode, file_mode
        self._lock = threading.Lock()
        self._cannot_write: str | None = None

    @classmethod
    def of(cls, store: Any) -> CheckpointFiles | None:
        """The files of ``store`` (a ``Store``); None for a store in memory (gone with its process). Readable by
        whom the store is: the folder gets the store folder's permissions, a file its manifest's (a group that
        reads the store, the epilog's job-end notice, reads them too)."""
        if not store.config.durable:
            return None
        root = Path(store.config.path)
        try:
            folder_mode, file_mode = root.stat().st_mode & 0o777, (root / "manifest.json").stat().st_mode & 0o666
        except OSError:
            folder_mode, file_mode = 0o700, 0o600
        return cls(root / FOLDER, folder_mode=folder_mode, file_mode=file_mode)

    def path(self, kind: str, job: str) -> Path:
        """The file of ``job``'s ``kind``: the id hashed (it is text from the data: any character, any length)."""
        return self.folder / f"{kind}-{hashlib.sha256(job.encode('utf-8', 'surrogatepass')).hexdigest()}{_SUFFIX}"

    def save(self, saved: Saved) -> bool:
        """Write ``saved`` over the job's file of its kind (a temporary file renamed: a reader sees the old file
        or the new one); False when the folder cannot be written (said once in the log: a store read by a user
        who may not write it)."""
        if self._cannot_write is not None:
            return False
        body = pickle.dumps(
            (_FORMAT, saved.job, saved.kind, saved.t0, saved.hosts, saved.version, saved.extra, saved.upto,
             saved.fingerprint, saved.state),
            protocol=5,
        )  # fmt: skip
        try:
            self.folder.mkdir(mode=self.folder_mode, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=_WRITING)  # 0600 until written
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(body)
                    os.fchmod(f.fileno(), self.file_mode)
                os.replace(tmp, self.path(saved.kind, saved.job))
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as err:
            with self._lock:
                if self._cannot_write is None:
                    self._cannot_write = str(err)
                    log.warning(
                        "%s: cannot keep the jobs' checkpoints there (%s): a restarted server reads each job from "
                        "its start",
                        visible(self.folder),
                        visible(one_line(str(err))),
                    )
            return False
        self._prune()
        return True

    def load(self, kind: str, job: str) -> Saved | None:
        """The job's file of ``kind``; None when there is none, or it is not one this version wrote (one line
        in the log: the page reads the job from its start)."""
        path = self.path(kind, job)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > MAX_FILE_BYTES:
                    raise ValueError(f"{size} bytes, more than a checkpoint holds ({MAX_FILE_BYTES})")
                fields = _Restricted(f).load()
            if not isinstance(fields, tuple) or len(fields) != 10 or fields[0] != _FORMAT:
                raise ValueError("not a checkpoint of this version")
            saved = Saved(*fields[1:])
            if saved.job != job or saved.kind != kind:
                raise ValueError("another job's checkpoint")
            t0, hosts, version, upto = float(saved.t0), tuple(saved.hosts), int(saved.version), float(saved.upto)
            return replace(saved, t0=t0, hosts=hosts, version=version, upto=upto)
        except FileNotFoundError:
            return None
        except PermissionError:  # the server's folder, read by another user (``hpcwatch job``): theirs to keep
            log.debug("%s: not readable by this user", visible(path))
            return None
        except Exception as err:  # a truncated, foreign or hostile file: its reader's error, whatever it is
            log.warning("%s: skipped: %s", visible(path), visible(one_line(f"{type(err).__name__}: {err}")))
            return None

    def _prune(self) -> None:
        """Delete the files of all but the ``MAX_JOBS_ON_DISK`` jobs written last (a job's kinds go together),
        and those a killed writer left."""
        try:
            found = [(e.stat().st_mtime, e.name) for e in os.scandir(self.folder)]
        except OSError:  # a file deleted under the scan: the next save prunes
            return
        now = time.time()
        for mtime, name in found:
            if name.startswith(_WRITING) and now - mtime > _ABANDONED_S:
                (self.folder / name).unlink(missing_ok=True)
        entries = [(mtime, name) for mtime, name in found if name.endswith(_SUFFIX)]
        newest_of: dict[str, float] = {}
        for mtime, name in entries:
            job = name.split("-", 1)[-1]
            newest_of[job] = max(newest_of.get(job, mtime), mtime)
        if len(newest_of) <= MAX_JOBS_ON_DISK:
            return
        stale = set(sorted(newest_of, key=newest_of.__getitem__)[: len(newest_of) - MAX_JOBS_ON_DISK])
        for _, name in entries:
            if name.split("-", 1)[-1] in stale:
                (self.folder / name).unlink(missing_ok=True)
