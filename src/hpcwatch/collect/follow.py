"""Logs that grow (Falco, Tetragon, the hook's JSON lines, NCCL_DEBUG=INFO), followed like ``tail -F``, each
line stored once.

The position is a cursor (collect/cursor.py) committed with the lines it covers::

    {"dev", "ino"}     which file (a rotated file keeps its inode under its new name)
    "offset", "line"   bytes and lines of it already stored
    "head_n", "head"   digest of its first head_n (<= 256) bytes: tells a file truncated and
                       rewritten past our offset, or a new file on a reused inode

Each run, for the file at ``path``:

    same inode, same head, size >= offset   read on from offset, whole lines only, commit
    path now names another inode (rotated)  finish the old file (we hold it open; a partial
                                            last line is taken), then the new one from 0
    smaller, or another head (truncated)    first the copy (copytruncate: a file beside it with
                                            our head and >= offset bytes) from offset, then 0
    restart, cursor names a rotated file    find it beside ``path`` by inode, finish it first

A format whose records sum up many lines (NCCL: one ``nccl_rank`` per process, ``STREAM_PARSERS``) keeps
its reader's state in the cursor too (``"stream"``), committed with the lines it has seen; a file finished
(rotated, or truncated with its copy read) hands over what it still held before the next file starts.

A truncation with no copy beside the file loses what was written between our last read and the
truncation (tail -F loses it too); the status says so (``truncated`` count).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from hpcwatch.collect.base import RunResult
from hpcwatch.collect.config import FollowSection
from hpcwatch.collect.cursor import Cursor
from hpcwatch.errors import BackendError, ParseError
from hpcwatch.sources.falco import parse_falco_json
from hpcwatch.sources.hook import parse_hook_jsonl
from hpcwatch.sources.nccl_log import NcclLogStream
from hpcwatch.sources.tetragon import parse_tetragon_json
from hpcwatch.store import Store

__all__ = ["LogFollower", "LINE_PARSERS", "STREAM_PARSERS", "HEAD_BYTES"]

#: Bytes of a file's start that identify it beside its inode (ours: enough for a timestamp and a rule name).
HEAD_BYTES = 256
LineParser = Callable[..., Iterator[Any]]
LINE_PARSERS: dict[str, LineParser] = {
    "falco-json": parse_falco_json,
    "tetragon-json": parse_tetragon_json,
    "hook-jsonl": parse_hook_jsonl,
}
#: Formats read by a stream whose state (a JSON value) rides in the cursor: ``cls(state, path=)``, ``.feed(lines,
#: first_line=, t=, on_bad_line=)``, ``.finish(t=)``, ``.state()`` (sources/nccl_log.NcclLogStream).
STREAM_PARSERS: dict[str, Callable[..., Any]] = {"nccl-log": NcclLogStream}


def _head(fh: BinaryIO, n: int) -> str:
    return hashlib.blake2b(os.pread(fh.fileno(), n, 0), digest_size=12).hexdigest()


class LogFollower:
    """One followed log; ``run()`` stores what was appended since the last run."""

    def __init__(self, store: Store, section: FollowSection, *, node: str = "") -> None:
        self.section = section
        self.path = Path(section.path)
        self.parse = LINE_PARSERS.get(section.format)
        self.stream = STREAM_PARSERS.get(section.format)
        # the node too: the followers of several nodes (a DaemonSet) may share one store and one name
        self.cursor = Cursor(store, f"follow:{node}:{section.name}", path=section.path)
        self._fh: BinaryIO | None = None
        self._pending: dict[str, Any] | None = None
        """The state of a file started but not yet committed (the cursor still names the one before)."""
        self.bad_lines = 0
        self.truncations = 0
        self.last_bad: str | None = None

    @property
    def _held(self) -> BinaryIO:
        """The file being read: ``run`` opens it before anything reads it."""
        if self._fh is None:
            raise BackendError(f"{self.path}: read before it was opened")
        return self._fh

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    # -- one run ------------------------------------------------------------------------------------

    def run(self) -> RunResult:
        notes: list[str] = []
        stored = 0
        if self._fh is None:
            stored += self._open(notes)
        stored += self._check_truncation(notes)
        stored += self._read_on(final=False)
        if self._rotated():
            stored += self._read_on(final=True)  # the old file's last lines, partial one included
            self.close()
            notes.append(f"{self.path} rotated")
            stored += self._open(notes, fresh=True)
            stored += self._read_on(final=False)
        return RunResult(records=stored, lag_s=self._lag_s(), note="; ".join(notes))

    def _lag_s(self) -> float:
        st = os.fstat(self._held.fileno())
        return 0.0 if st.st_size <= self.cursor.state.get("offset", 0) else max(0.0, time.time() - st.st_mtime)

    # -- opening and identity -----------------------------------------------------------------------

    def _open(self, notes: list[str], *, fresh: bool = False) -> int:
        """Open ``path``; resume from the cursor when it names this file, after finishing a rotated one."""
        stored = 0
        state = self.cursor.state
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 -- the follower keeps it open across reads
        except OSError as err:
            raise BackendError(f"{self.path}: cannot open: {err.strerror or err}") from err
        st = os.fstat(fh.fileno())
        same = state and (state.get("dev"), state.get("ino")) == (st.st_dev, st.st_ino)
        if state and not same and not fresh:
            old = self._beside(lambda s: (s.st_dev, s.st_ino) == (state.get("dev"), state.get("ino")))
            if old is not None:
                notes.append(f"finishing rotated {old.name}")
                stored += self._drain_other(old, state)
        if not same or fresh:
            self._start(fh, st)
        self._fh = fh
        return stored

    def _start(self, fh: BinaryIO, st: os.stat_result) -> None:
        """The cursor moves to a new file at 0 with its first commit (until then it still names the old)."""
        self._pending = {"dev": st.st_dev, "ino": st.st_ino, "offset": 0, "line": 0, "head_n": 0, "head": ""}

    def _state(self) -> dict[str, Any]:
        return self._pending or self.cursor.state

    def _beside(self, match: Callable[[os.stat_result], bool], *, head: tuple[int, str] | None = None) -> Path | None:
        """A file next to ``path`` whose name starts with its name (falco.log.1, falco.log-20240101), that
        ``match``es and (``head``) begins with the bytes of that digest."""
        try:
            siblings = sorted(
                p for p in self.path.parent.iterdir() if p.name.startswith(self.path.name) and p != self.path
            )
        except OSError:
            return None
        for p in siblings:
            try:
                if not (p.is_file() and match(p.stat())):
                    continue
                if head is None:
                    return p
                with open(p, "rb") as other:
                    if _head(other, head[0]) == head[1]:
                        return p
            except OSError:
                continue
        return None

    def _rotated(self) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False  # moved away, not yet recreated: keep reading the file we hold
        held = os.fstat(self._held.fileno())
        return (st.st_dev, st.st_ino) != (held.st_dev, held.st_ino)

    def _check_truncation(self, notes: list[str]) -> int:
        state = self._state()
        offset = state.get("offset", 0)
        if not offset:
            return 0
        fh = self._held
        size = os.fstat(fh.fileno()).st_size
        if size >= offset and _head(fh, state["head_n"]) == state["head"]:
            return 0
        self.truncations += 1
        copy = self._beside(lambda s: s.st_size >= offset, head=(state["head_n"], state["head"]))
        stored = 0
        if copy is not None:
            notes.append(f"{self.path} truncated; read its copy {copy.name} from byte {offset}")
            st = copy.stat()
            stored += self._drain_other(copy, {**state, "dev": st.st_dev, "ino": st.st_ino})
        else:
            notes.append(f"{self.path} truncated")
            stored += self._finish()
        self._start(fh, os.fstat(fh.fileno()))
        return stored

    # -- reading and committing ---------------------------------------------------------------------

    def _drain_other(self, path: Path, state: dict[str, Any]) -> int:
        """Store the rest of another file (rotated or copied) from ``state``'s offset, to its end."""
        saved_fh, saved_pending = self._fh, self._pending
        try:
            with open(path, "rb") as fh:
                self._fh, self._pending = fh, dict(state)
                return self._read_on(final=True)
        finally:
            self._fh, self._pending = saved_fh, saved_pending

    def _read_on(self, *, final: bool) -> int:
        """Commit whole lines from the offset to the end of the held file (``final``: a last line without
        its newline too), at most ``max_batch_bytes`` per commit."""
        stored = 0
        while True:
            state = self._state()
            data = os.pread(self._held.fileno(), self.section.max_batch_bytes, state["offset"])
            if not data:
                return stored + (self._finish() if final else 0)
            cut = data.rfind(b"\n") + 1
            if cut == 0 and not (final and len(data) < self.section.max_batch_bytes):
                if len(data) < self.section.max_batch_bytes:
                    return stored  # a line still being written
                cut = len(data)  # one line longer than a batch: stored in pieces, flagged bad
            stored += self._commit(data[:cut] if cut else data, state)

    def _commit(self, chunk: bytes, state: dict[str, Any]) -> int:
        lines = chunk.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        base = state["line"]
        bad: list[ParseError] = []
        extra: dict[str, Any] = {}
        if self.stream is not None:
            stream = self.stream(state.get("stream"), path=str(self.path))
            records = stream.feed(lines, first_line=base + 1, t=self._file_time(), on_bad_line=bad.append)
            extra, shift = {"stream": stream.state()}, 0  # the stream numbers lines in the file already
        else:
            if self.parse is None:  # FollowSection admits only formats with a line or a stream parser
                raise BackendError(f"{self.path}: no reader for format {self.section.format!r}")
            records, shift = list(self.parse(lines, path=str(self.path), on_bad_line=bad.append)), base
        for err in bad:
            self.bad_lines += 1
            self.last_bad = str(ParseError(err.what, path=self.path, line=(err.line or 0) + shift, text=err.text))
        offset = state["offset"] + len(chunk)
        head_n = state["head_n"] if state["head_n"] >= HEAD_BYTES else min(HEAD_BYTES, offset)
        new = {
            **state,
            **extra,
            "offset": offset,
            "line": base + len(lines),
            "head_n": head_n,
            "head": state["head"] if head_n == state["head_n"] else _head(self._held, head_n),
        }
        with self.cursor.commit(new) as tx:
            tx.add(records)
        self._pending = None
        return len(records)

    def _finish(self) -> int:
        """A stream's last records, once its file is over (committed with the cursor that says so)."""
        state = self._state()
        if self.stream is None or not (state.get("stream") or {}).get("ranks"):
            return 0
        stream = self.stream(state["stream"], path=str(self.path))
        records = stream.finish(t=self._file_time())
        with self.cursor.commit({**state, "stream": stream.state()}) as tx:
            tx.add(records)
        self._pending = None
        return len(records)

    def _file_time(self) -> float:
        """NCCL lines carry no time: their records are dated by the held file's last write (as ``ingest``)."""
        return os.fstat(self._held.fileno()).st_mtime
