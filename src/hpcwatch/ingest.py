"""Files into the store, once each: the one way in that ``ingest``, ``scan PATH`` and the collectors share.

For every input the registry plans (``sources.registry.plan_inputs``):

    identity = device, inode, size, write time (ns) + format + node
    identity already committed   -> "already": not even hashed
    key = digest(content) + format + node + (write time, when the format dates records by it)
    key already committed        -> "already": nothing written (the read stops as soon as it is known)
    else one store transaction   -> every record of the file, or (on any error) none of them

so re-ingesting the same content is a no-op, and a file whose ingest was killed is
read again whole next time (the store never committed a part of it). A strict format
with a bad line rejects its file (ParseError, the files before it stay); a
line-oriented log keeps its good lines and reports the bad ones (``FileResult.bad_lines``).
With ``keep_going`` (``hpcwatch ingest``, the spool collector) a rejected file is a "bad" result
naming its error and the walk goes on, so one bad file in a spool folder does not hold back the
files after it; without it, the first ParseError is raised (``scan PATH``: the input must be whole).

Documents that are not records are stored as events (``sources.stored``); traces and
op tables are read by their own commands, so ingest reports them "not stored".

``remote_write_paths`` is the same walk and the same readers with another end: each file's samples
are pushed (in batches of ``REMOTE_WRITE_BATCH``) to a remote-write ``write`` function handed in by
the caller (``promql.PrometheusBackend.write``), not stored. Remote write carries samples only, so a
file of events or jobs is "not sent", and a file's other records are counted, not sent. There is no
content key on that path: the receiver decides what a repeated point means (Prometheus drops an
identical one; VictoriaMetrics keeps it unless ``-dedup.minScrapeInterval`` is set).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from hpcwatch.errors import InputError, ParseError
from hpcwatch.records import Event, Finding, Job, Sample, Span
from hpcwatch.sources.registry import RECORD_KINDS, Format, Input, Skipped, format_named, plan_inputs
from hpcwatch.store import SourceMark, Store, Transaction

__all__ = [
    "FileResult",
    "IngestReport",
    "ingest_paths",
    "ingest_folder",
    "ingest_input",
    "source_key",
    "file_identity",
    "MAX_BAD_LINES_KEPT",
    "KEY_VERSION",
    "RemoteWrite",
    "remote_write_paths",
    "remote_write_input",
    "REMOTE_WRITE_BATCH",
]

#: Bad lines of one log whose errors are kept word for word (the rest are counted).
MAX_BAD_LINES_KEPT = 20
#: Bump when what a key covers changes, so older marks no longer match.
KEY_VERSION = "1"
_HASH_CHUNK = 1 << 20

#: Samples per remote-write request. Ours: about 1 MB of protobuf for dcgm-exporter series; Prometheus' own
#: sender batches fewer (queue_config max_samples_per_send, 500 in 2.42:
#: https://prometheus.io/docs/prometheus/2.42/configuration/configuration/#remote_write), but one process
#: sending one file at a time gains from fewer round trips, and both receivers take this size.
REMOTE_WRITE_BATCH = 10_000

#: Pushes samples to a remote-write receiver; returns the number of series sent (PrometheusBackend.write).
RemoteWrite = Callable[[list[Sample]], int]

#: The outcomes of one input, in the order reports list them.
_STATUS = ("stored", "sent", "already", "empty", "skipped", "not stored", "not sent", "bad")


@dataclass(slots=True, kw_only=True)
class FileResult:
    path: str
    status: str
    """stored | sent (remote write) | already (the same content was ingested before) | empty | skipped |
    not stored | not sent (remote write: no samples in this format) | bad (refused: ``reason`` is the
    one-line ``FILE:LINE: what``; only with ``keep_going``, nothing of the file is stored)."""
    format: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    reason: str = ""
    bad_lines: list[str] = field(default_factory=list)
    """The first ``MAX_BAD_LINES_KEPT`` bad lines of a log, as ``FILE:LINE: what``."""
    bad_line_count: int = 0


@dataclass(slots=True)
class IngestReport:
    files: list[FileResult] = field(default_factory=list)

    def totals(self) -> dict[str, int]:
        return {k: sum(f.counts.get(k, 0) for f in self.files) for k in RECORD_KINDS}

    def by_status(self) -> dict[str, int]:
        return {s: n for s in _STATUS if (n := sum(1 for f in self.files if f.status == s))}

    def bad(self) -> list[FileResult]:
        """The files refused (``keep_going``), in walk order."""
        return [f for f in self.files if f.status == "bad"]


def ingest_paths(
    store: Store,
    paths: Iterable[str | os.PathLike[str]],
    *,
    format: str | None = None,
    host: str | None = None,
    hosts: Iterable[str] = (),
    on_file: Callable[[FileResult], None] | None = None,
    keep_going: bool = False,
) -> IngestReport:
    """Ingest every file under ``paths``; a strict file's ParseError stops here, the earlier files kept,
    unless ``keep_going``: then it is a "bad" result and the next files are read (module docstring)."""
    forced = bool(format)
    return _each_input(
        lambda item: ingest_input(store, item, forced=forced),
        paths,
        format=format,
        host=host,
        hosts=hosts,
        on_file=on_file,
        keep_going=keep_going,
    )


def ingest_folder(store: Store, folder: Path, host: str | None) -> list[FileResult]:
    """Every file under ``folder``, ``host`` naming the node whose tools wrote them, a bad file a result and not
    an error: the live twin's host captures (``twin.livefiles.FolderIngest``), as an agent's are ingested."""
    return ingest_paths(store, [folder], host=host, keep_going=True).files


def remote_write_paths(
    write: RemoteWrite,
    paths: Iterable[str | os.PathLike[str]],
    *,
    format: str | None = None,
    host: str | None = None,
    hosts: Iterable[str] = (),
    on_file: Callable[[FileResult], None] | None = None,
    keep_going: bool = False,
) -> IngestReport:
    """Push the samples of every file under ``paths`` through ``write`` (module docstring); same errors."""
    forced = bool(format)
    return _each_input(
        lambda item: remote_write_input(write, item, forced=forced),
        paths,
        format=format,
        host=host,
        hosts=hosts,
        on_file=on_file,
        keep_going=keep_going,
    )


def _each_input(
    handle: Callable[[Input], FileResult],
    paths: Iterable[str | os.PathLike[str]],
    *,
    format: str | None,
    host: str | None,
    hosts: Iterable[str],
    on_file: Callable[[FileResult], None] | None,
    keep_going: bool,
) -> IngestReport:
    """The walk both ends share: plan the inputs, hand each to ``handle``, keep the bad lines of logs.

    With ``keep_going`` each path given is walked on its own, so one that cannot be read (missing,
    a FIFO) is a bad result too and the paths after it are still walked.
    """
    report = IngestReport()
    if format:
        format_named(format)  # an unknown name fails before anything is read
    bad: list[ParseError] = []

    def one(item: Input | Skipped) -> FileResult:
        if isinstance(item, Skipped):
            if item.error is not None:
                raise item.error
            return FileResult(path=str(item.path), status="skipped", reason=item.reason)
        bad.clear()
        result = handle(item)
        result.bad_line_count = len(bad)
        result.bad_lines = [str(e) for e in bad[:MAX_BAD_LINES_KEPT]]
        return result

    def emit(result: FileResult) -> None:
        report.files.append(result)
        if on_file is not None:
            on_file(result)

    groups: list[list[str | os.PathLike[str]]] = [[given] for given in paths] if keep_going else [list(paths)]
    for group in groups:
        try:
            for item in plan_inputs(group, format=format, host=host, hosts=hosts, on_bad_line=bad.append):
                try:
                    emit(one(item))
                except InputError as err:
                    if not keep_going:
                        raise
                    emit(_refused(item.path, err))
        except InputError as err:  # the path given itself cannot be walked (only reached with keep_going)
            if not keep_going:
                raise
            emit(_refused(group[0], err))
    return report


def _refused(path: str | os.PathLike[str], err: InputError) -> FileResult:
    """A file a reader refused, as a result: its one-line error (``FILE:LINE: what``) is the reason."""
    reason = str(err) if isinstance(err, ParseError) else f"{path}: {err}"  # a ParseError names its file
    return FileResult(path=str(path), status="bad", reason=reason)


def remote_write_input(write: RemoteWrite, item: Input, *, forced: bool = False) -> FileResult:
    """Send one input's samples in batches; its other records are counted, not sent."""
    path, fmt = item.path, item.format
    if fmt is None:
        return FileResult(path=str(path), status="empty")
    if fmt.yields != "records" or "samples" not in fmt.kinds:
        if forced:
            raise ParseError(f"format {fmt.name} holds no samples: remote write carries samples only", path=path)
        return FileResult(
            path=str(path),
            status="not sent",
            format=fmt.name,
            reason=f"remote write carries samples only ({fmt.summary or fmt.name})",
        )
    counts = dict.fromkeys(RECORD_KINDS, 0)
    batch: list[Sample] = []
    for record in fmt.read(path, item.context):
        if isinstance(record, Sample):
            batch.append(record)
        else:
            counts[_KIND_OF[type(record)]] += 1
        if len(batch) >= REMOTE_WRITE_BATCH:
            write(batch)
            counts["samples"] += len(batch)
            batch = []
    if batch:
        write(batch)
        counts["samples"] += len(batch)
    if forced and not counts["samples"]:
        raise ParseError(f"holds no {fmt.name} samples (forced with --format)", path=path)
    return FileResult(path=str(path), status="sent", format=fmt.name, counts=counts)


#: Which count a record that is not a sample adds to (remote write leaves it out).
_KIND_OF = {Event: "events", Span: "spans", Job: "jobs", Finding: "findings"}


def ingest_input(store: Store, item: Input, *, forced: bool = False) -> FileResult:
    """Store one input in one transaction (see the module docstring).

    The content key is computed on a second thread while the file is read (hashing releases the GIL),
    so a first ingest pays for one pass over the file, not two; when the key turns out to be in the store
    already, the read stops at the next chunk and nothing is written.
    """
    path, fmt = item.path, item.format
    if fmt is None:
        return FileResult(path=str(path), status="empty")
    if fmt.yields in ("trace", "op-table"):
        if forced:
            raise ParseError(f"format {fmt.name} is read by its own command, not stored by ingest", path=path)
        return FileResult(path=str(path), status="not stored", format=fmt.name, reason=f"{fmt.summary or fmt.name}")
    identity = file_identity(item)
    if store.has_identity(identity):  # the very file read before: skip without reading it again
        return FileResult(path=str(path), status="already", format=fmt.name)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpcwatch-key") as pool:
        key = pool.submit(source_key, item)
        try:
            with store.transaction() as tx:
                counts = _write(tx, item, stop=lambda: key.done() and store.has_source(key.result()))
                if forced and fmt.yields == "records" and not any(counts.values()):
                    raise ParseError(f"holds no {fmt.name} records (forced with --format)", path=path)
                if store.has_source(key.result()):
                    raise _AlreadyIngested
                tx.source = SourceMark(key=key.result(), path=str(path), format=fmt.name, identity=identity)
        except _AlreadyIngested:
            return FileResult(path=str(path), status="already", format=fmt.name)
    if tx.skipped:  # another process committed the same content meanwhile
        return FileResult(path=str(path), status="already", format=fmt.name)
    return FileResult(path=str(path), status="stored", format=fmt.name, counts=counts)


class _AlreadyIngested(Exception):
    """The content key is in the store: leave the transaction without writing (never escapes this module)."""


def _write(tx: Transaction, item: Input, *, stop: Callable[[], bool]) -> dict[str, int]:
    """Hand the input's records to the transaction, chunk by chunk; the counts per kind.

    ``stop`` is asked between chunks: true means the content is already stored, so reading on is waste.
    """
    from hpcwatch.sources.lines import file_time
    from hpcwatch.sources.stored import advisory_events, manifest_event

    fmt, path, ctx = _known_format(item), item.path, item.context
    if fmt.columns is not None:
        n = 0
        for chunk in fmt.columns(path, ctx):
            if stop():
                raise _AlreadyIngested
            n += tx.add_sample_table(chunk) or chunk.num_rows
        return {"samples": n}
    records: Iterable[Sample | Event | Span | Job | Finding]
    if fmt.yields == "advisories":
        records = advisory_events(fmt.read(path, ctx), t=file_time(path))
    elif fmt.yields == "manifest":
        records = [manifest_event(fmt.read(path, ctx), t=file_time(path))]
    else:
        records = fmt.read(path, ctx)
    counts = tx.add(records)
    return {k: getattr(counts, k) for k in RECORD_KINDS}


def _known_format(item: Input) -> Format:
    """The format of an input that is not an empty file (the callers answer "empty" before asking)."""
    if item.format is None:
        raise ValueError(f"{item.path}: an empty file has no format")
    return item.format


def file_identity(item: Input) -> str:
    """The file as the file system shows it (device, inode, size, write time in ns) and how it is read.

    Equal identities mean the file has not been touched since it was stored; only a deliberate rewrite
    that keeps the size and forges the nanosecond write time could fool it (then run with a new store
    or touch the file). Folder formats have no identity: their content key is cheap.
    """
    fmt = _known_format(item)
    if fmt.folder:
        return ""
    st = os.stat(item.path)
    return f"{KEY_VERSION}:{fmt.name}:{item.context.host or ''}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def source_key(item: Input) -> str:
    """What makes two inputs the same: their bytes, how they are read, and the context the reader used."""
    fmt = _known_format(item)
    digest = _folder_digest(item.path) if fmt.folder else _file_digest(item.path)
    parts = [KEY_VERSION, fmt.name, digest]
    if fmt.uses_host:
        parts.append(f"host={item.context.host or ''}")
    if fmt.dated_by_file or fmt.folder:
        parts.append(f"mtime_ns={os.stat(item.path).st_mtime_ns}")
    return ":".join(parts)


def _file_digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=20)
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(_HASH_CHUNK):
                h.update(chunk)
    except OSError as err:
        raise ParseError(f"cannot read the file: {err.strerror or err}", path=path) from err
    return h.hexdigest()


def _folder_digest(path: Path) -> str:
    """A folder format is keyed by the names, sizes and write times of what it holds (not every byte)."""
    h = hashlib.blake2b(digest_size=20)
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            h.update(f"{os.path.relpath(os.path.join(root, name), path)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()
