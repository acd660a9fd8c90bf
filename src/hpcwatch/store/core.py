"""The store: a folder of immutable Parquet parts and one manifest, queried by DuckDB.

Layout of a store folder (the ``--db PATH``)::

    manifest.json            the committed parts of every table, the committed sources, a version
    samples/part-*.parquet   one folder per table: samples, events, spans, jobs, findings, notices
    staging/<writer-id>/     a writer's parts before their commit (the writer holds an flock on it)
    .lock                    flock'ed by a writer for the few milliseconds of a commit

A commit moves its staged parts into the table folders and replaces ``manifest.json``
(temp file, fsync, ``os.replace``): that rename is the only commit point, so a
``kill -9`` at any moment leaves either the old manifest or the new one. Parts
that no manifest lists are invisible and collected by the next commit. Readers
never lock: each query checks (one ``fstat``) whether the manifest changed and
rebinds its views to the listed files. Parts that a commit drops (compaction,
``clear_findings``) are deleted only ``retire_grace_s`` later, so a reader that
bound the previous manifest keeps its files; one that still misses a file
re-reads the manifest and tries once more.

Every row carries the version of the commit that added it (``_v``, hidden from
the tables: the manifest knows it per part, merged parts store it as a column).
It makes two things exact: a job seen again replaces its row (the latest commit
wins; so does a notice's delivery row, ``notices``, keyed by ``key``), and ``query_since`` reads only what was committed after a version.

Samples are kept with their host, gpu and job pulled out of the labels
(``schemas.sample_keys``). Queries return records (few rows) or a
``pyarrow.Table`` (many rows) whose columns are documented on the method.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

import duckdb
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from hpcwatch.errors import StoreError
from hpcwatch.records import Event, Finding, Job, Sample, Span
from hpcwatch.schemas import SAMPLE_SCHEMA, sample_keys

_T = TypeVar("_T")

__all__ = [
    "Store",
    "StoreConfig",
    "IngestCounts",
    "SourceMark",
    "Transaction",
    "NoticeRow",
    "NOTICE_STATES",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_COMPACT_FANIN",
    "DEFAULT_COMPACT_MAX_ROWS",
    "DEFAULT_RETIRE_GRACE_S",
    "DERIVED_FOLDER",
    "TABLES",
    "sample_keys",
    "SAMPLE_SCHEMA",
]

DEFAULT_BATCH_SIZE = 20_000
#: A size tier (rows within a factor of the fan-in) holding this many parts is merged into one part.
DEFAULT_COMPACT_FANIN = 8
#: The most rows one merge writes (parts above this over the fan-in are left alone): a commit that
#: merges holds the commit lock, and rewriting big parts saves little (one footer each).
DEFAULT_COMPACT_MAX_ROWS = 2_000_000
#: A merge of samples at least this big is written sorted by (metric, host, gpu, t), so that a metric filter skips
#: most of its row groups (DuckDB writes 122,880 rows a group). A smaller one is a group or two that a reader reads
#: whole anyway, and sorting it was most of a live writer's merge: 8 ticks of a 1,024-node twin (200,000 rows)
#: took 0.29 s of CPU with the sort, 0.11-0.16 s without. Ours.
SORTED_MERGE_ROWS = 4 * 122_880
#: How long a dropped part stays on disk for readers that bound the manifest before the drop.
DEFAULT_RETIRE_GRACE_S = 60.0

_MANIFEST = "manifest.json"
#: A folder of what readers derived from the store's rows (``reports.checkpointfiles``): no table's, never
#: collected; dropped when a store is made in the folder (a previous one's would pass the new one's checks).
DERIVED_FOLDER = "checkpoints"
#: flock'ed by the one writer compacting (non-blocking: the others leave compaction to it).
_COMPACT_LOCK = ".compact-lock"
#: Times a reader re-reads the manifest when a part it names was already collected (see ``_execute``).
_VANISHED_PART_RETRIES = 5
#: Results ``Store.kept_while`` keeps: a few per page a server is asked for, not a history.
_KEPT_RESULTS = 64
_FORMAT = "hpcwatch-store/1"
_MANIFEST_TMP_PREFIX = ".manifest-"


def _crash_hook(point: str) -> None:
    """Called at the commit's crash points ("staged", "moved", "committed"); tests replace it to kill -9."""


# -- tables ------------------------------------------------------------------------------------

_EVENT_SCHEMA = pa.schema([("kind", pa.string()), ("t", pa.float64()), ("source", pa.string()), ("attrs", pa.string())])
_SPAN_SCHEMA = pa.schema(
    [
        ("job", pa.string()),
        ("rank", pa.int32()),
        ("step", pa.int32()),
        ("phase", pa.string()),
        ("start", pa.float64()),
        ("dur", pa.float64()),
        ("attrs", pa.string()),
    ]
)
_JOB_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("user", pa.string()),
        ("account", pa.string()),
        ("partition", pa.string()),
        ("nodes", pa.string()),
        ("gpus", pa.int32()),
        ("gpus_by_node", pa.string()),
        ("start", pa.float64()),
        ("end", pa.float64()),
        ("state", pa.string()),
        ("name", pa.string()),
        ("mail_user", pa.string()),
    ]
)
_FINDING_SCHEMA = pa.schema(
    [
        ("vector", pa.string()),
        ("severity", pa.string()),
        ("target", pa.string()),
        ("title", pa.string()),
        ("evidence", pa.string()),
        ("t", pa.float64()),
        ("rule", pa.string()),
    ]
)

_NOTICE_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("notice", pa.string()),
        ("kind", pa.string()),
        ("channel", pa.string()),
        ("recipient", pa.string()),
        ("state", pa.string()),
        ("t", pa.float64()),
        ("attempts", pa.int32()),
        ("payload", pa.string()),
    ]
)

#: The tables and their columns (labels, attrs, evidence, nodes, gpus_by_node, payload: JSON text): the five
#: kinds of records, and ``notices``, what ``hpcwatch notify`` delivered or still owes (``NoticeRow``).
TABLES: dict[str, pa.Schema] = {
    "samples": SAMPLE_SCHEMA,
    "events": _EVENT_SCHEMA,
    "spans": _SPAN_SCHEMA,
    "jobs": _JOB_SCHEMA,
    "findings": _FINDING_SCHEMA,
    "notices": _NOTICE_SCHEMA,
}
#: Tables where a row seen again replaces the previous one (the latest commit wins), and their key column.
_KEYED = {"jobs": "id", "notices": "key"}
#: A delivery's states: owed (written before the first try, so a crash or an outage loses nothing), done, or
#: a notice composed that no channel carries or nobody receives (kept so it is not composed again).
NOTICE_STATES = ("pending", "sent", "unrouted")
_SQL_TYPES = {pa.string(): "VARCHAR", pa.float64(): "DOUBLE", pa.int32(): "INTEGER"}
#: A table's column count before columns were appended to it: a part listed without ``columns`` (written by
#: an older hpcwatch) has only these, and reads NULL for the later ones (``jobs.mail_user``). Columns are
#: only ever appended, so a part's count says which it has.
_FIRST_COLUMNS = {"jobs": 11}


def _columns(table: str) -> str:
    return ", ".join(f'"{name}"' for name in TABLES[table].names)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreConfig:
    path: str = ":memory:"
    """A folder path, or ``:memory:`` (a temporary folder removed on close)."""
    batch_size: int = DEFAULT_BATCH_SIZE
    """Records per row group; also per commit for ``Store.add`` (what a crash can lose at most)."""
    compact_fanin: int = DEFAULT_COMPACT_FANIN
    """Parts of one size tier merged at once; bounds the part count to about fan-in x tiers."""
    compact_max_rows: int = DEFAULT_COMPACT_MAX_ROWS
    """The most rows a merge writes: parts of more than ``compact_max_rows / compact_fanin`` stay as they are."""
    retire_grace_s: float = DEFAULT_RETIRE_GRACE_S
    """Seconds a dropped part stays for readers of an older manifest."""
    durable: bool = True
    """fsync parts, manifest and folders (off for ``:memory:``: nothing outlives the process)."""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.compact_fanin < 2:
            raise ValueError(f"compact_fanin must be >= 2, got {self.compact_fanin}")
        if self.retire_grace_s < 0:
            raise ValueError(f"retire_grace_s must be >= 0, got {self.retire_grace_s}")


@dataclass(frozen=True, slots=True, kw_only=True)
class NoticeRow:
    """One delivery of one notice (``hpcwatch notify``): a row per state change, the latest by ``key`` wins."""

    key: str
    """``<notice>|<channel>|<recipient>``: what is delivered once."""
    notice: str
    """The notice's own key (``job-end/<id>``, ``health/<node>/<verdict>/<t>``, ``digest/daily/user/<u>/<day>``)."""
    kind: str
    channel: str
    """The channel's name in the config."""
    recipient: str
    """A mail address, or the audience a webhook posts for (``operators``)."""
    state: str
    """One of ``NOTICE_STATES``."""
    t: float
    """UTC seconds this row was written (for ``sent``: when the channel took the message)."""
    attempts: int = 0
    """Failed tries so far."""
    payload: str = "{}"
    """The rendered message as JSON text (subject, text, html, the webhook document), so what a restart
    sends is what was composed, whatever the store holds by then."""

    def __post_init__(self) -> None:
        if self.state not in NOTICE_STATES:
            raise ValueError(f"notice {self.key!r}: unknown state {self.state!r} (known: {', '.join(NOTICE_STATES)})")


def _where(*conditions: tuple[str, Any]) -> tuple[str, list[Any]]:
    """A WHERE clause of the ``(sql, value)`` conditions whose value is given, and their parameters."""
    given = [(sql, value) for sql, value in conditions if value is not None]
    return " AND ".join(["TRUE", *(sql for sql, _ in given)]), [value for _, value in given]


@dataclass(slots=True)
class IngestCounts:
    samples: int = 0
    events: int = 0
    spans: int = 0
    jobs: int = 0
    findings: int = 0

    def total(self) -> int:
        return self.samples + self.events + self.spans + self.jobs + self.findings

    def add(self, other: IngestCounts) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceMark:
    """A source (a file) whose records a transaction commits once: its key is committed with its parts."""

    key: str
    """What identifies the content, e.g. a hash of the file's bytes; a key already committed adds nothing."""
    path: str = ""
    format: str = ""
    identity: str = ""
    """How the file looked when read (device, inode, size, write time and the reading context), so a
    re-run can skip a file it already stored without reading it again; "" when unknown."""
    counts: IngestCounts | None = None
    """Rows committed per kind (set by the store)."""
    committed_s: float | None = None
    """UTC seconds of the commit (set by the store)."""
    replaces: tuple[str, ...] = ()
    """Keys this commit removes from the committed sources: a cursor (a followed log's position) keeps
    one mark that moves with its data, rather than one more mark per commit."""


def _json(value: Any) -> str:
    return orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


# -- files -------------------------------------------------------------------------------------


@contextmanager
def _flocked(path: Path) -> Iterator[None]:
    """An exclusive flock on ``path`` for the block; a fresh descriptor each time, so threads exclude too."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes, *, durable: bool) -> None:
    """Temp file in the same folder, fsync, rename: readers see the old bytes or the new ones."""
    tmp = path.with_name(f"{_MANIFEST_TMP_PREFIX}{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            if durable:
                os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        _fsync_path(path.parent)


def _names(sql: str, table: str) -> bool:
    """Whether ``sql`` names ``table`` as a word (``_since`` binds the views of the tables a statement reads)."""
    return re.search(rf"\b{table}\b", sql, re.IGNORECASE) is not None


def _sql_path(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _empty_manifest() -> dict[str, Any]:
    return {"format": _FORMAT, "version": 0, "tables": {t: [] for t in TABLES}, "sources": {}, "retired": []}


_DUCKDB_MAGIC = b"DUCK"


def _check_root(root: Path) -> None:
    """Refuse a DuckDB file of the previous version, and a folder of someone else's files."""
    if root.is_file():
        with open(root, "rb") as f:
            head = f.read(12)
        if head[8:12] == _DUCKDB_MAGIC:
            raise StoreError(
                f"{root}: a DuckDB file of an older hpcwatch; the store is now a folder: re-ingest into a new --db path"
            )
        raise StoreError(f"{root}: cannot open the store: a file, not a store folder")
    if root.is_dir() and not (root / _MANIFEST).exists():
        ours = {".lock", "staging", DERIVED_FOLDER, _MANIFEST, *TABLES}  # the manifest: another opener made it
        strangers = [
            p.name for p in root.iterdir() if p.name not in ours and not p.name.startswith(_MANIFEST_TMP_PREFIX)
        ]
        if strangers:
            raise StoreError(
                f"{root}: cannot open the store: a folder that is not a store (no {_MANIFEST}; holds {strangers[0]!r})"
            )


# -- writing -----------------------------------------------------------------------------------


class _PartWriter:
    """One table's staged part of one transaction: rows go to disk a row group at a time."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.path, self.schema, self.rows = path, schema, 0
        self._writer: pq.ParquetWriter | None = None

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, self.schema)
        self._writer.write_table(table)
        self.rows += table.num_rows

    def close(self, *, durable: bool) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            if durable:
                _fsync_path(self.path)


class Transaction:
    """Records staged on disk, made visible together (with their source mark) by one manifest commit.

    Made by ``Store.transaction``; memory stays bounded whatever is added (a row group is written every
    ``batch_size`` records), except jobs, which are kept by id until the commit (the last sighting wins).
    After the block, ``skipped`` says the source was already committed (another ingest of it won), and
    ``counts`` what this transaction added (what it would have added, when skipped). ``source`` is read
    at the commit, so it may be set inside the block (an ingest that learns its content key while it
    reads the file).
    """

    def __init__(self, store: Store, source: SourceMark | None) -> None:
        self.source, self.skipped, self.counts = source, False, IngestCounts()
        self.version: int | None = None
        """The store version of the commit (None before it, or when skipped)."""
        self._store, self._id = store, uuid.uuid4().hex[:12]
        self._staging = store._staging_dir()
        self._writers: dict[str, _PartWriter] = {}
        self._jobs: dict[str, Job] = {}
        self._clear_findings = False

    def add(self, records: Iterable[Sample | Event | Span | Job | Finding | NoticeRow]) -> IngestCounts:
        """Stage records of any kind (and notice rows); returns the counts of this call."""
        counts = IngestCounts()
        batch: list[Any] = []
        for record in records:
            batch.append(record)
            if len(batch) >= self._store.config.batch_size:
                self._write_records(batch, counts)
                batch = []
        if batch:
            self._write_records(batch, counts)
        self.counts.add(counts)
        return counts

    def add_sample_table(self, table: pa.Table) -> int:
        """Stage a table with ``SAMPLE_SCHEMA`` columns (one row group); returns its row count."""
        table = table.select(SAMPLE_SCHEMA.names).cast(SAMPLE_SCHEMA)
        self._writer("samples").write(table)
        self.counts.samples += table.num_rows
        _crash_hook("staged")
        return int(table.num_rows)

    def add_span_table(self, table: pa.Table) -> int:
        """Stage a table with the spans' columns (``Store.spans``'s fields, ``attrs`` as JSON text); returns its
        row count. A training job's step is one span per rank and phase: thousands a second at scale."""
        table = table.select(_SPAN_SCHEMA.names).cast(_SPAN_SCHEMA)
        self._writer("spans").write(table)
        self.counts.spans += table.num_rows
        _crash_hook("staged")
        return int(table.num_rows)

    def clear_findings(self) -> None:
        """Drop every committed finding in this commit (findings added by this transaction stay)."""
        self._clear_findings = True

    def _writer(self, table: str) -> _PartWriter:
        if table not in self._writers:
            self._writers[table] = _PartWriter(self._staging / f"{self._id}-{table}.parquet", TABLES[table])
        return self._writers[table]

    def _write_records(self, batch: list[Any], counts: IngestCounts) -> None:
        by_kind: dict[type, list[Any]] = {}
        for record in batch:
            by_kind.setdefault(type(record), []).append(record)
        for kind, rows in by_kind.items():
            if kind is Job:
                self._jobs.update((job.id, job) for job in rows)
            elif kind is Sample:
                self._writer("samples").write(_sample_table(rows))
            elif kind in _ROW_WRITERS:
                writer = _ROW_WRITERS[kind]
                self._writer(writer.name).write(writer.table(rows))
            else:
                raise TypeError(f"not a record the store keeps: {kind.__name__}")
            if kind in _KIND_TABLES:  # notices are not ingested records: no count
                setattr(counts, _KIND_TABLES[kind], getattr(counts, _KIND_TABLES[kind]) + len(rows))
        _crash_hook("staged")

    def _close_parts(self) -> dict[str, _PartWriter]:
        if self._jobs:
            self._writer("jobs").write(_ROW_WRITERS[Job].table(list(self._jobs.values())))
            self._jobs.clear()
        durable = self._store.config.durable
        for writer in self._writers.values():
            writer.close(durable=durable)
        return {name: w for name, w in self._writers.items() if w.rows}

    def _discard(self) -> None:
        for writer in self._writers.values():
            try:
                writer.close(durable=False)
            except Exception:  # a half-written part is being thrown away anyway
                pass
            writer.path.unlink(missing_ok=True)


_KIND_TABLES = {Sample: "samples", Event: "events", Span: "spans", Job: "jobs", Finding: "findings"}


# -- the store ---------------------------------------------------------------------------------


class Store:
    """Samples, events, spans, jobs and findings in a store folder. Safe to share between threads;
    any number of processes may read and write the same folder at once."""

    def __init__(
        self,
        path: str | Path = ":memory:",
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        compact_fanin: int = DEFAULT_COMPACT_FANIN,
        compact_max_rows: int = DEFAULT_COMPACT_MAX_ROWS,
        retire_grace_s: float = DEFAULT_RETIRE_GRACE_S,
    ) -> None:
        memory = str(path) == ":memory:"
        self.config = StoreConfig(
            path=str(path),
            batch_size=batch_size,
            compact_fanin=compact_fanin,
            compact_max_rows=compact_max_rows,
            retire_grace_s=retire_grace_s,
            durable=not memory,
        )
        self._lock = threading.RLock()
        self._read_done = threading.Condition(self._lock)
        self._reading = 0
        """Reads running outside the lock (``_read``); ``close`` waits for them."""
        self._idle_cursors: list[duckdb.DuckDBPyConnection] = []
        self._compact_lock = threading.Lock()
        self._staging: tuple[Path, int] | None = None
        self._closed = False
        try:
            self.path = Path(tempfile.mkdtemp(prefix="hpcwatch-store-")) if memory else Path(path)
            # A temporary store's folder goes with it: at close, or when it is collected or the interpreter
            # exits without a close (a test's store, a command that raised); only a killed process leaves it.
            self._remove_folder = (
                weakref.finalize(self, shutil.rmtree, self.path, ignore_errors=True) if memory else None
            )
            _check_root(self.path)
            self._create()
            self._con = duckdb.connect(":memory:")
            self._since_con = self._con.cursor()
            self._merge_con: duckdb.DuckDBPyConnection | None = None  # compaction's own, made at its first merge
            self._define_views()
        except (duckdb.Error, OSError) as err:
            raise StoreError(f"{self.config.path}: cannot open the store: {err}") from err
        self._bound_key: tuple[int, int, int] | None = None  # the manifest read (inode, mtime, size)
        self._views_key: tuple[int, int, int] | None = None  # the manifest the views were bound to
        self._bound_parts: dict[str, tuple[str, ...]] = {}  # table -> the part files its view reads
        self._since_keys: dict[str, tuple[int, tuple[int, int, int] | None]] = {}  # table: (since, manifest) bound
        self._manifest = _empty_manifest()
        self._identities: tuple[dict[str, Any], set[str]] | None = None  # (manifest it was built from, identities)
        self._all_jobs: _KeptJobs | None = None
        """Every job as last read, see ``jobs()``."""
        self._jobs_lock = threading.Lock()  # held by the thread reading on ``_all_jobs``
        self._kept_results: OrderedDict[Hashable, tuple[Any, Any]] = OrderedDict()  # ``kept_while``'s
        self._computing: dict[Hashable, threading.Lock] = {}  # ``kept_while``'s key -> held while one computes it
        self._execute(lambda: None)  # bind the views, as a query does (a part may vanish meanwhile)
        self._collect_garbage_if_idle()

    def _create(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        for folder in (*TABLES, "staging"):
            (self.path / folder).mkdir(exist_ok=True)
        if (self.path / _MANIFEST).exists():
            return
        with _flocked(self.path / ".lock"):
            if not (self.path / _MANIFEST).exists():  # another process may have created it meanwhile
                # What readers derived from the rows of a store that was here before (its manifest deleted):
                # this one's versions start again, and would pass its checks.
                shutil.rmtree(self.path / DERIVED_FOLDER, ignore_errors=True)
                _write_atomic(self.path / _MANIFEST, orjson.dumps(_empty_manifest()), durable=self.config.durable)

    def _collect_garbage_if_idle(self) -> None:
        """What a killed writer left (its staging folder, parts moved but never listed), collected on open
        when no commit is under way: a writer that re-runs a killed ingest may commit nothing new."""
        try:
            fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return  # a read-only store: its writers collect
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._collect_garbage(self._read_manifest(), [])
        except BlockingIOError:
            pass  # a writer is committing, and collects after its commit
        except OSError:
            pass  # a reader without write access to the folder: the store's writers collect
        finally:
            os.close(fd)

    def _define_views(self) -> None:
        self._con.execute("SET parquet_metadata_cache = true")  # parts never change once written
        self._con.execute("CREATE SCHEMA _since")
        for table, schema in TABLES.items():
            typed = ", ".join(f'"{f.name}" {_SQL_TYPES[f.type]}' for f in schema)
            self._con.execute(f"CREATE TABLE _empty_{table} ({typed}, _v BIGINT)")
            self._con.execute(f"CREATE VIEW _all_{table} AS SELECT * FROM _empty_{table}")
            self._con.execute(f"CREATE VIEW {table} AS {self._public_sql(table, f'_all_{table}')}")
        self._since_con.execute("SET search_path = '_since,main'")

    @staticmethod
    def _public_sql(table: str, source: str) -> str:
        if table in _KEYED:  # a job (a notice's delivery) seen again replaces its row: the latest commit wins
            return (
                f"SELECT {_columns(table)} FROM {source} "
                f'QUALIFY row_number() OVER (PARTITION BY "{_KEYED[table]}" ORDER BY _v DESC) = 1'
            )
        return f"SELECT {_columns(table)} FROM {source}"

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while self._reading:  # a read runs outside the lock (_read): its cursor is closed when it is done
                self._read_done.wait()
            for con in (*self._idle_cursors, self._merge_con, self._since_con, self._con):
                if con is not None:
                    con.close()
            self._idle_cursors.clear()
            if self._staging is not None:
                folder, fd = self._staging
                shutil.rmtree(folder, ignore_errors=True)
                os.close(fd)
            if self._remove_folder is not None:
                self._remove_folder()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing -------------------------------------------------------------------------------

    @contextmanager
    def transaction(self, *, source: SourceMark | None = None) -> Iterator[Transaction]:
        """Stage in the block, commit on its normal exit; an exception leaves nothing of it visible.

        With a ``source``, its mark is committed with the parts, and a source whose key is already
        committed adds nothing (``tx.skipped``)."""
        tx = Transaction(self, source)
        try:
            yield tx
            parts = tx._close_parts()
        except BaseException:
            tx._discard()
            raise
        try:
            self._commit(tx, parts)
        except (OSError, duckdb.Error) as err:  # the parts it moved are unlisted: the next commit collects them
            tx._discard()
            raise StoreError(f"{self.config.path}: write failed: {err}") from err
        except BaseException:
            tx._discard()
            raise

    def add(self, records: Iterable[Sample | Event | Span | Job | Finding | NoticeRow]) -> IngestCounts:
        """Store records of any kind (and notice rows), one commit per ``batch_size`` records."""
        counts = IngestCounts()
        batch: list[Any] = []
        for record in records:
            batch.append(record)
            if len(batch) >= self.config.batch_size:
                counts.add(self._add_batch(batch))
                batch = []
        if batch:
            counts.add(self._add_batch(batch))
        return counts

    def _add_batch(self, batch: list[Any]) -> IngestCounts:
        with self.transaction() as tx:
            tx.add(batch)
        return tx.counts

    def add_sample_table(self, table: pa.Table) -> int:
        """Fast path: a table with ``SAMPLE_SCHEMA`` columns, in one commit."""
        with self.transaction() as tx:
            return tx.add_sample_table(table)

    def clear_findings(self) -> None:
        """Forget stored findings (a new scan replaces the previous one's)."""
        with self.transaction() as tx:
            tx.clear_findings()

    def has_source(self, key: str) -> bool:
        with self._lock:
            self._refresh()
            return key in self._manifest["sources"]

    def has_identity(self, identity: str) -> bool:
        """Whether a committed source was read from a file that looked exactly like this (``SourceMark.identity``)."""
        if not identity:
            return False
        with self._lock:
            self._refresh()
            if self._identities is None or self._identities[0] is not self._manifest:
                found = {m.get("identity") for m in self._manifest["sources"].values()}
                self._identities = (self._manifest, found - {None, ""})
            return identity in self._identities[1]

    def sources(self) -> list[SourceMark]:
        """The committed sources, oldest commit first."""
        with self._lock:
            self._refresh()
            marks = [
                SourceMark(
                    key=key,
                    path=m["path"],
                    format=m["format"],
                    identity=m.get("identity", ""),
                    counts=IngestCounts(**m["counts"]),
                    committed_s=m["committed_s"],
                )
                for key, m in self._manifest["sources"].items()
            ]
        return sorted(marks, key=lambda m: (m.committed_s, m.key))

    def _staging_dir(self) -> Path:
        """This store's staging folder, made and flock'ed under the commit lock so that no garbage
        collection sees it before it is held."""
        with self._lock:
            if self._staging is None:
                with _flocked(self.path / ".lock"):
                    folder = self.path / "staging" / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
                    folder.mkdir(parents=True)
                    fd = os.open(folder, os.O_RDONLY)
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._staging = (folder, fd)
            return self._staging[0]

    def _commit(self, tx: Transaction, parts: dict[str, _PartWriter]) -> None:
        if not parts and tx.source is None and not tx._clear_findings:
            return
        with _flocked(self.path / ".lock"):
            manifest = self._read_manifest()
            if tx.source is not None and tx.source.key in manifest["sources"]:
                tx.skipped = True
                tx._discard()
                return
            now, version = time.time(), manifest["version"] + 1
            if tx._clear_findings:
                self._retire(manifest, "findings", list(manifest["tables"]["findings"]), now)
            for table, writer in parts.items():
                name = f"part-{version:010d}-{uuid.uuid4().hex[:8]}.parquet"
                os.rename(writer.path, self.path / table / name)
                manifest["tables"][table].append(
                    {"file": name, "rows": writer.rows, "v": version, "columns": len(TABLES[table])}
                )
            if self.config.durable:
                for table in parts:
                    _fsync_path(self.path / table)
            _crash_hook("moved")
            if tx.source is not None:
                for old in tx.source.replaces:
                    manifest["sources"].pop(old, None)
                manifest["sources"][tx.source.key] = {
                    "path": tx.source.path,
                    "format": tx.source.format,
                    "identity": tx.source.identity,
                    "counts": tx.counts.as_dict(),
                    "committed_s": now,
                }
            expired = self._expire(manifest, now)
            manifest["version"] = version
            _write_atomic(self.path / _MANIFEST, orjson.dumps(manifest), durable=self.config.durable)
            tx.version = version
            _crash_hook("committed")
            self._collect_garbage(manifest, expired)
        for table in parts:
            self._compact(table)

    def _read_manifest(self) -> dict[str, Any]:
        with open(self.path / _MANIFEST, "rb") as f:
            return _with_every_table(orjson.loads(f.read()))

    def _retire(self, manifest: dict[str, Any], table: str, parts: list[dict[str, Any]], now: float) -> None:
        dropped = {p["file"] for p in parts}
        manifest["tables"][table] = [p for p in manifest["tables"][table] if p["file"] not in dropped]
        manifest["retired"].extend({"file": f"{table}/{name}", "at_s": now} for name in sorted(dropped))

    def _expire(self, manifest: dict[str, Any], now: float) -> list[str]:
        """Drop retired parts past their grace from the manifest; the caller deletes them after the commit."""
        keep = [r for r in manifest["retired"] if now - r["at_s"] < self.config.retire_grace_s]
        expired = [r["file"] for r in manifest["retired"] if now - r["at_s"] >= self.config.retire_grace_s]
        manifest["retired"] = keep
        return expired

    def _collect_garbage(self, manifest: dict[str, Any], expired: list[str]) -> None:
        """Under the commit lock: expired parts, parts no manifest lists (a crash between move and
        manifest), stale manifest temp files, and staging folders whose writer died."""
        for name in expired:
            (self.path / name).unlink(missing_ok=True)
        kept = {r["file"] for r in manifest["retired"]}
        for table, parts in manifest["tables"].items():
            listed = {p["file"] for p in parts}
            for entry in os.scandir(self.path / table):
                if entry.name not in listed and f"{table}/{entry.name}" not in kept:
                    os.unlink(entry.path)
        for entry in os.scandir(self.path):
            if entry.name.startswith(_MANIFEST_TMP_PREFIX):
                os.unlink(entry.path)
        own = self._staging[0].name if self._staging else None
        for entry in os.scandir(self.path / "staging"):
            if entry.name != own and _is_abandoned(Path(entry.path)):
                shutil.rmtree(entry.path, ignore_errors=True)

    # -- compaction ----------------------------------------------------------------------------

    def _compact(self, table: str) -> None:
        """Merge parts of one size tier once it holds ``compact_fanin`` of them (repeatedly: a merged
        part may fill the next tier), so a live writer's one part a second stays a few dozen files.

        The merges run outside the commit lock (listed parts never change, so they are read as any
        reader reads them) into this writer's staging folder; only the swap takes the lock, once for
        the whole cascade, so a reader never binds a part that lives for one merge. The merged parts
        replace their groups if every part they came from is still listed (another writer may have
        merged them meanwhile: ours are then dropped). Other writers' commits wait for renames and a
        manifest write, not for the merges (seconds on a big tier: benchmarks/RESULTS.md, "Store").
        """
        if not self._compact_lock.acquire(blocking=False):
            return  # another thread of this process is compacting: it will see this tier too
        fd = os.open(self.path / _COMPACT_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        staged: list[dict[str, Any]] = []
        listed: list[dict[str, Any]] = []
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # one compactor at a time, or the work is done twice
            listed = self._read_manifest()["tables"][table]
            parts, replaced = list(listed), []
            while group := self._merge_group(parts):
                merged = self._merge(table, group)
                staged.append(merged)
                replaced += [p for p in group if "staged" not in p]
                parts = [p for p in parts if p not in group] + [merged]
            if replaced:
                self._swap_in(table, replaced, [p for p in parts if "staged" in p])
        except BlockingIOError:
            pass  # another process is compacting; what it leaves, the next commit's compaction takes
        except (OSError, duckdb.Error) as err:
            if self._still_listed(table, listed):
                # The commit before is whole; an unmerged tier only costs reads. The next commit retries.
                warnings.warn(f"{self.config.path}: compaction of {table} postponed: {err}", stacklevel=2)
            # else another writer merged (and, past the grace, deleted) these parts first: nothing to do
        finally:
            os.close(fd)
            for part in staged:
                part["staged"].unlink(missing_ok=True)  # the intermediates, and all of them if dropped
            self._compact_lock.release()

    def _still_listed(self, table: str, parts: list[dict[str, Any]]) -> bool:
        listed = {p["file"] for p in self._read_manifest()["tables"][table]}
        return all(p["file"] in listed for p in parts)

    def _swap_in(self, table: str, replaced: list[dict[str, Any]], merged: list[dict[str, Any]]) -> None:
        """Under the commit lock: the merged parts (in staging) replace the listed parts they came from."""
        with _flocked(self.path / ".lock"):
            if not self._still_listed(table, replaced):
                return
            manifest = self._read_manifest()
            for part in merged:
                os.rename(part["staged"], self.path / table / part["file"])
            if self.config.durable:
                _fsync_path(self.path / table)
            now = time.time()
            self._retire(manifest, table, replaced, now)
            manifest["tables"][table] += [{k: v for k, v in p.items() if k != "staged"} for p in merged]
            expired = self._expire(manifest, now)
            manifest["version"] += 1
            _write_atomic(self.path / _MANIFEST, orjson.dumps(manifest), durable=self.config.durable)
            self._collect_garbage(manifest, expired)

    def _merge_group(self, parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        fanin = self.config.compact_fanin
        tiers: dict[int, list[dict[str, Any]]] = {}
        for part in parts:
            if part["rows"] * fanin <= self.config.compact_max_rows:
                tier = tiers.setdefault(_tier(part["rows"], fanin), [])
                tier.append(part)
                if len(tier) >= fanin:
                    return tier
        return []

    def _merge(self, table: str, group: list[dict[str, Any]]) -> dict[str, Any]:
        versions = [p["v"] for p in group] + [p.get("v_min", p["v"]) for p in group]
        name = f"part-{max(versions):010d}-{uuid.uuid4().hex[:8]}-merged.parquet"
        target = self._staging_dir() / f"{table}-{name}"
        rows_sql = " UNION ALL ".join(self._part_sql(table, p) for p in group)
        if table in _KEYED:
            rows_sql = (
                f"SELECT * FROM ({rows_sql}) "
                f'QUALIFY row_number() OVER (PARTITION BY "{_KEYED[table]}" ORDER BY _v DESC) = 1'
            )
        elif table == "samples" and sum(int(p["rows"]) for p in group) >= SORTED_MERGE_ROWS:
            rows_sql = f"SELECT * FROM ({rows_sql}) ORDER BY metric, host, gpu, t"
        # Only the thread holding _compact_lock gets here, so the connection is never shared.
        if self._merge_con is None:
            # A database of its own, on one thread: a merge runs in the background of a writer, and a second
            # DuckDB thread took 40-100 % more CPU for the same merge (benchmarks/RESULTS.md, "Store"). Made at
            # the first merge: opening one costs tens of ms, which a store that never merges should not pay.
            self._merge_con = duckdb.connect(":memory:", config={"threads": 1})
        self._merge_con.execute(f"COPY ({rows_sql}) TO {_sql_path(target)} (FORMAT parquet)")
        if self.config.durable:
            _fsync_path(target)
        return {
            "file": name,
            "rows": pq.ParquetFile(target).metadata.num_rows,
            "v": max(versions),
            "v_min": min(versions),
            "merged": True,
            "columns": len(TABLES[table]),
            "staged": target,
        }

    def _part_sql(self, table: str, part: dict[str, Any]) -> str:
        path = _sql_path(part.get("staged") or self.path / table / part["file"])
        version = "_v" if part.get("merged") else f"{int(part['v'])}::BIGINT AS _v"
        return f"SELECT {_part_columns(table, part)}, {version} FROM read_parquet({path})"

    # -- reading -------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The committed version: 0 for an empty store, one more per commit. See ``query_since``."""
        with self._lock:
            self._refresh_or_fail()
            return int(self._manifest["version"])

    def table_mark(self, *tables: str) -> tuple[tuple[int, int], ...]:
        """Per table, (its newest part's version, its rows as listed): it changes with every commit that adds or
        drops rows of the table, not when compaction merges parts (a merged part keeps the newest version and
        the rows of what it merged; of a keyed table it may drop replaced rows, which only changes the mark).
        The key of a result computed from these tables alone (``jobs()``, the live page's NCCL card)."""
        with self._lock:
            self._refresh_or_fail()
            return tuple(
                (max((int(p["v"]) for p in parts), default=0), sum(int(p["rows"]) for p in parts))
                for parts in (self._manifest["tables"][table] for table in tables)
            )

    def part_counts(self) -> dict[str, int]:
        """Committed parts per table (what compaction keeps bounded)."""
        with self._lock:
            self._refresh()
            return {table: len(parts) for table, parts in self._manifest["tables"].items()}

    def _refresh_or_fail(self) -> None:
        """``_refresh`` for a caller outside ``_execute``: a store that cannot be read is a ``StoreError``."""
        try:
            self._refresh()
        except OSError as err:
            raise StoreError(f"{self.config.path}: cannot read the store: {err}") from err

    def _refresh(self, *, force: bool = False) -> None:
        """Read the manifest when it changed (one fstat when it did not)."""
        with open(self.path / _MANIFEST, "rb") as f:
            st = os.fstat(f.fileno())
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            if key == self._bound_key and not force:
                return
            manifest = _with_every_table(orjson.loads(f.read()))
        self._manifest, self._bound_key = manifest, key

    def _bind_views(self, *, force: bool = False, sqls: Sequence[str] = ()) -> None:
        """Point the views at the newest manifest's parts, only when a query is about to read them: an ingest
        asks the manifest once per file (``has_identity``) and rebinding there cost more than the parsing.
        ``sqls``: the statements about to run; the ``_all_`` view of a table that no commit replaces rows of
        is bound only for a statement that names it (``window_samples_after``)."""
        self._refresh(force=force)
        named = [
            t for t in TABLES if t not in _KEYED and any(_names(sql, f"_all_{t}") for sql in sqls if "_all_" in sql)
        ]
        if self._views_key == self._bound_key and not force and not named:
            return
        for table in TABLES:
            # Only the views whose parts changed: a tick's commit or a merge changes a few of them, and each
            # view costs 1-4 ms to create (at 1,024 nodes the views were a twentieth of the live page's CPU).
            parts = self._manifest["tables"][table]
            if table in _KEYED or table in named:
                self._bind(f"_all_{table}", parts, force, partial(self._union_sql, table, parts, since=None))
            if table not in _KEYED:
                self._bind(table, parts, force, partial(self._scan_sql, table, parts))
        self._views_key = self._bound_key

    def _bind(self, view: str, parts: list[dict[str, Any]], force: bool, sql: Callable[[], str]) -> None:
        """``CREATE OR REPLACE VIEW view AS sql()``, unless it was bound to these very parts."""
        listed = tuple(part["file"] for part in parts)
        if force or self._bound_parts.get(view) != listed:
            self._con.execute(f"CREATE OR REPLACE VIEW {view} AS {sql()}")
            self._bound_parts[view] = listed

    def _scan_sql(self, table: str, parts: list[dict[str, Any]]) -> str:
        """The public view of a table whose rows no later commit replaces: every part in one multi-file scan,
        which DuckDB plans in about half the time of a union of one scan a part (an empty read of 16 parts 4.8
        → 2.5 ms, a one-GPU job's window over 12 million rows 106 → 75 ms, DuckDB 2.0). Merged parts hold an
        extra ``_v`` column, which the scan leaves out (columns are matched by name). A table with a part written
        before its last column was appended is read as a union, which fills that column with NULLs."""
        held = len(TABLES[table])
        if not parts or any(int(p.get("columns", _FIRST_COLUMNS.get(table, held))) < held for p in parts):
            return self._public_sql(table, f"({self._union_sql(table, parts, since=None)})")
        files = ", ".join(_sql_path(self.path / table / part["file"]) for part in parts)
        return f"SELECT {_columns(table)} FROM read_parquet([{files}], union_by_name = true)"

    def _since_sql(self, table: str, parts: list[dict[str, Any]], since: int) -> str:
        """The public view of ``table``'s rows committed after version ``since``. When every row of the parts
        listed after it came after it (a part of one commit, a merge of commits all after it), those parts in
        one scan (``_scan_sql``); otherwise each part's rows filtered on their commit (``_v``)."""
        after = [part for part in parts if part["v"] > since]
        if table not in _KEYED and all(part.get("v_min", part["v"]) > since for part in after):
            return self._scan_sql(table, after)
        return self._public_sql(table, f"({self._union_sql(table, parts, since=since)})")

    def _union_sql(self, table: str, parts: list[dict[str, Any]], *, since: int | None) -> str:
        selects = [f"SELECT * FROM main._empty_{table}"]  # the column types when no part is listed
        for part in parts:
            if since is None or part["v"] > since:
                selects.append(self._part_sql(table, part))
        union = " UNION ALL ".join(selects)
        return union if since is None else f"SELECT * FROM ({union}) WHERE _v > {int(since)}"

    def _execute(self, run: Callable[[], _T], *, retries: int = _VANISHED_PART_RETRIES) -> _T:
        with self._lock:
            try:
                self._bind_views(force=retries < _VANISHED_PART_RETRIES)
                return run()
            except (duckdb.Error, OSError) as err:
                self._since_keys.clear()  # a retry binds every view anew
                self._raise_unless_vanished(err, retries)
            return self._execute(run, retries=retries - 1)

    def _read(
        self,
        run: Callable[[duckdb.DuckDBPyConnection], _T],
        sqls: Sequence[str] = (),
        *,
        retries: int = _VANISHED_PART_RETRIES,
    ) -> _T:
        """``run(cursor)`` on a cursor of its own, the views bound first under the lock and the query run
        outside it: several threads' reads (a job page, the live page, the problems' judgement) run at once
        instead of each waiting for the one before; at 1,024 nodes a job page waited behind a 10-million-row
        window read."""
        with self._lock:
            if self._closed:
                raise StoreError(f"{self.config.path}: the store is closed")
            try:
                self._bind_views(force=retries < _VANISHED_PART_RETRIES, sqls=sqls)
                cursor = self._borrow_cursor()
            except (duckdb.Error, OSError) as err:
                self._raise_unless_vanished(err, retries)
                return self._read(run, sqls, retries=retries - 1)
        try:
            return run(cursor)
        except (duckdb.Error, OSError) as err:
            self._raise_unless_vanished(err, retries)
        finally:
            self._return_cursor(cursor)
        return self._read(run, sqls, retries=retries - 1)

    def _raise_unless_vanished(self, err: duckdb.Error | OSError, retries: int) -> None:
        """``err`` as a StoreError, unless a part vanished and a retry is left. A part vanishes under a manifest
        bound long ago (past the grace): the retry reads the new one. Each retry means a newer manifest was
        committed meanwhile; a few cover a writer far faster than this reader (a grace of 0, or a reader
        paused for longer than the grace)."""
        if isinstance(err, duckdb.IOException) and retries:
            return
        if isinstance(err, duckdb.Error):
            raise StoreError(f"{self.config.path}: query failed: {err}") from err
        raise StoreError(f"{self.config.path}: cannot read the store: {err}") from err

    def _borrow_cursor(self) -> duckdb.DuckDBPyConnection:
        """An idle cursor, or a new one (called under the lock). A cursor is a connection to the same
        database: it sees the views, and takes the session settings of ``_define_views`` again."""
        if self._idle_cursors:
            cursor = self._idle_cursors.pop()
        else:
            cursor = self._con.cursor()
            cursor.execute("SET parquet_metadata_cache = true")
        self._reading += 1
        return cursor

    def _return_cursor(self, cursor: duckdb.DuckDBPyConnection) -> None:
        with self._lock:
            self._reading -= 1
            if self._closed:
                cursor.close()
            else:
                self._idle_cursors.append(cursor)
            self._read_done.notify_all()

    def query(self, sql: str, params: list[Any] | tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of any SQL over the tables above (read-only use, please)."""
        return self._read(lambda cursor: cursor.execute(sql, params).fetchall(), [sql])

    def query_arrow(self, sql: str, params: list[Any] | tuple[Any, ...] = ()) -> pa.Table:
        (table,) = self.query_arrow_each([(sql, params)])
        return table

    def query_arrow_each(self, statements: Sequence[tuple[str, list[Any] | tuple[Any, ...]]]) -> list[pa.Table]:
        """``query_arrow`` of several ``(sql, params)`` in one transaction: they read the same parts (DuckDB's
        catalog is transactional: the views they read are those bound when it began)."""

        def run(cursor: duckdb.DuckDBPyConnection) -> list[pa.Table]:
            tables = []
            cursor.begin()
            try:
                for sql, params in statements:
                    relation = cursor.sql(sql, params=list(params) or None)
                    # DuckDB 2 names it to_arrow_table; 1.x calls it arrow.
                    tables.append((getattr(relation, "to_arrow_table", None) or relation.arrow)())
            finally:
                cursor.rollback()  # it only read
            return tables

        return self._read(run, [sql for sql, _ in statements])

    def query_since(
        self, since: int, sql: str, params: list[Any] | tuple[Any, ...] = ()
    ) -> tuple[int, list[tuple[Any, ...]]]:
        """Rows of ``sql`` where the tables hold only the rows committed after version ``since``, with
        the version they were read at: pass it as ``since`` next time to read each row once."""
        return self._since(since, [sql], lambda: self._since_con.execute(sql, params).fetchall())

    def query_arrow_since(self, since: int, sql: str, params: list[Any] | tuple[Any, ...] = ()) -> tuple[int, pa.Table]:
        """``query_since`` as an arrow table: no Python object a row (what a reader of many rows wants)."""
        version, (table,) = self.query_arrow_since_each(since, [(sql, params)])
        return version, table

    def query_arrow_since_each(
        self, since: int, statements: Sequence[tuple[str, list[Any] | tuple[Any, ...]]]
    ) -> tuple[int, list[pa.Table]]:
        """``query_arrow_since`` of several ``(sql, params)`` read at one version: their answers hold the same
        rows (two calls could read either side of a commit)."""

        def fetch() -> list[pa.Table]:
            tables = []
            for sql, params in statements:
                relation = self._since_con.sql(sql, params=list(params) or None)
                tables.append((getattr(relation, "to_arrow_table", None) or relation.arrow)())  # DuckDB 2 / 1.x
            return tables

        return self._since(since, [sql for sql, _ in statements], fetch)

    def _since(self, since: int, sqls: Sequence[str], fetch: Callable[[], _T]) -> tuple[int, _T]:
        """(the version read at, what ``fetch`` reads) with the ``_since`` views of the tables ``sqls`` name
        bound to the rows after ``since``."""

        def run() -> tuple[int, _T]:
            # Only the tables the statements name (a name read as a word: one more is bound at worst, never one
            # fewer), and each once per (since, manifest): the live page asks what landed since its last tick
            # several times a tick, a job page since one version for each of its parts, and each view costs
            # ~3 ms to create.
            key = (since, self._views_key)
            for table in TABLES:
                if self._since_keys.get(table) != key and any(_names(sql, table) for sql in sqls):
                    after = self._since_sql(table, self._manifest["tables"][table], since)
                    self._since_con.execute(f"CREATE OR REPLACE VIEW _since.{table} AS {after}")
                    self._since_keys[table] = key
            return int(self._manifest["version"]), fetch()

        return self._execute(run)

    def samples(
        self,
        metric: str | Iterable[str] | None = None,
        *,
        host: str | None = None,
        job: str | None = None,
        t0: float | None = None,
        t1: float | None = None,
    ) -> pa.Table:
        """Samples as a table with ``SAMPLE_SCHEMA`` columns, ordered by metric, host, gpu, t."""
        where, params = _where(("host = ?", host), ("job = ?", job), ("t >= ?", t0), ("t <= ?", t1))
        if metric is not None:
            metrics = [metric] if isinstance(metric, str) else list(metric)
            where += f" AND metric IN ({', '.join('?' * len(metrics))})"
            params.extend(metrics)
        return self.query_arrow(f"SELECT * FROM samples WHERE {where} ORDER BY metric, host, gpu, t", params)

    def iter_samples(self, metric: str | Iterable[str] | None = None, **filters: Any) -> Iterator[Sample]:
        table = self.samples(metric, **filters)
        for row in table.to_pylist():
            yield Sample(metric=row["metric"], labels=orjson.loads(row["labels"]), t=row["t"], value=row["value"])

    def metrics(self) -> list[str]:
        return [m for (m,) in self.query("SELECT DISTINCT metric FROM samples ORDER BY metric")]

    def time_range(self) -> tuple[float | None, float | None]:
        ((lo, hi),) = self.query("SELECT min(t), max(t) FROM samples")
        return lo, hi

    def events(
        self,
        kind: str | None = None,
        *,
        t0: float | None = None,
        t1: float | None = None,
        kinds: Sequence[str] | None = None,
    ) -> list[Event]:
        """Events in time order: of ``kind``, or of any of ``kinds`` (one query for several), between ``t0``
        and ``t1``."""
        where, params = _where(("kind = ?", kind), ("t >= ?", t0), ("t <= ?", t1))
        if kinds is not None:
            where = f"{where} AND kind IN ({', '.join('?' for _ in kinds)})" if kinds else "FALSE"
            params = [*params, *kinds]
        rows = self.query(f"SELECT kind, t, source, attrs FROM events WHERE {where} ORDER BY t", params)
        return [Event(kind=k, t=t, source=s, attrs=orjson.loads(a)) for k, t, s, a in rows]

    def spans(self, job: str | None = None, *, step: int | None = None) -> list[Span]:
        where, params = _where(("job = ?", job), ("step = ?", step))
        rows = self.query(
            f"SELECT job, rank, step, phase, start, dur, attrs FROM spans WHERE {where} ORDER BY step, rank, start",
            params,
        )
        return [
            Span(job=j, rank=r, step=s, phase=p, start=st, dur=d, attrs=orjson.loads(a))
            for j, r, s, p, st, d, a in rows
        ]

    def jobs(self, *, on_nodes: Sequence[str] | None = None) -> list[Job]:
        """Every job, or (``on_nodes``) those allocated one of these nodes: a job's neighbours, whatever the
        size of the store's history."""
        # Kept while the table holds the same rows: the live page asks every tick, a job changes far less often;
        # a job page's neighbours are read from it too (at 1,024 nodes, parsing every job's nodes in SQL was
        # 25 ms a page).
        kept = self._current_jobs()
        if on_nodes is None:
            return list(kept.jobs)
        wanted = set(on_nodes)
        return [job for job in kept.jobs if not wanted.isdisjoint(job.nodes)]

    def jobs_by_id(self) -> Mapping[str, Job]:
        """Every job by its id, as ``jobs()`` gives them, without a copy (the live page asks every tick)."""
        return self._current_jobs().by_id

    def _current_jobs(self) -> _KeptJobs:
        mark = self.table_mark("jobs")
        kept = self._all_jobs
        if kept is None or kept.mark != mark:
            # One thread reads on at a time: a job page's two threads ask at once, and the second finds the
            # first's jobs (each read is a scan of the jobs committed since).
            with self._jobs_lock:
                kept = self._all_jobs
                if kept is None or kept.mark != mark:
                    self._all_jobs = kept = self._jobs_read_on(kept, mark)
        return kept

    def _jobs_read_on(self, kept: _KeptJobs | None, mark: Any) -> _KeptJobs:
        """Every job: ``kept``'s, with the rows committed since it was read (``query_since``) in place of their
        job's. The table's history only grows (a job's row is replaced, never removed), and at 1,024 nodes a job
        starts or ends every second: reading every row of the day's jobs each time was a twentieth of the live
        page's CPU after ten minutes. A row read before (its JSON text included) is the same Job."""
        version, rows = self.query_since(0 if kept is None else kept.version, f"SELECT {_JOB_COLUMNS} FROM jobs")
        row_of, by_id = ({}, {}) if kept is None else (dict(kept.row_of), dict(kept.by_id))
        for row in rows:
            if row_of.get(row[0]) != row:
                row_of[row[0]], by_id[row[0]] = row, _job_from_row(row)
        jobs = sorted(by_id.values(), key=_job_order)
        return _KeptJobs(mark=mark, version=version, jobs=jobs, by_id=by_id, row_of=row_of)

    def kept_while(self, tables: Sequence[str], key: Hashable, compute: Callable[[], _T]) -> _T:
        """``compute()``, kept under ``key`` while ``tables`` hold the same rows (``table_mark``): a small result
        of those tables alone that several parts of one page ask for (a job's requeued attempts: four parts of
        a job page). The last ``_KEPT_RESULTS`` keys are kept; the result is shared: never change it."""
        mark = self.table_mark(*tables)
        with self._lock:
            found = self._kept_results.get(key)
            if found is not None and found[0] == mark:
                return cast("_T", found[1])
            # One thread computes a key at a time: a job page's two threads ask for its requeued attempts at once,
            # and the second finds the first's answer.
            computing = self._computing.setdefault(key, threading.Lock())
        with computing:
            with self._lock:
                found = self._kept_results.get(key)
            if found is not None and found[0] == mark:
                return cast("_T", found[1])
            try:
                value = compute()  # a commit meanwhile: kept under the mark before it, so asked again next time
            except BaseException:
                with self._lock:
                    self._computing.pop(key, None)  # nothing kept under it: nor its lock
                raise
            with self._lock:
                self._kept_results[key] = (mark, value)
                self._kept_results.move_to_end(key)
                while len(self._kept_results) > _KEPT_RESULTS:
                    self._computing.pop(self._kept_results.popitem(last=False)[0], None)
        return value

    def job(self, job_id: str) -> Job | None:
        """The job ``job_id``, None when the store has none. In a process that asked for every job (``jobs()``:
        the live page, the job pages' process), from those, read on to the newest commit; else read by id once
        while the table does not change (a job page asks for its job five times)."""
        if self._all_jobs is not None:
            # This process keeps every job (it asked for them): reading on from them is one scan of the rows
            # committed since, where a lookup by id scans the whole table (at 1,024 nodes, 4 against 10 ms; a job
            # page asked five times a page, in two threads).
            return self._current_jobs().by_id.get(job_id)
        return self.kept_while(("jobs",), ("job", job_id), lambda: self._read_job(job_id))

    def _read_job(self, job_id: str) -> Job | None:
        rows = self.query(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ?", [job_id])
        return _job_from_row(rows[0]) if rows else None

    def findings(self, vector: str | None = None) -> list[Finding]:
        where, params = ("WHERE vector = ?", [vector]) if vector else ("", [])
        rows = self.query(
            f"SELECT vector, severity, target, title, evidence, t, rule FROM findings {where} ORDER BY t", params
        )
        return [
            Finding(vector=v, severity=s, target=tg, title=ti, evidence=orjson.loads(e), t=t, rule=r)
            for v, s, tg, ti, e, t, r in rows
        ]


def _part_columns(table: str, part: dict[str, Any]) -> str:
    """The table's columns as one part holds them: NULL for those appended after it was written."""
    schema = TABLES[table]
    held = int(part.get("columns", _FIRST_COLUMNS.get(table, len(schema))))
    return ", ".join(
        f'"{f.name}"' if i < held else f'NULL::{_SQL_TYPES[f.type]} AS "{f.name}"' for i, f in enumerate(schema)
    )


def _with_every_table(manifest: dict[str, Any]) -> dict[str, Any]:
    """A manifest written before a table existed (``notices``) lists it empty."""
    for table in TABLES:
        manifest["tables"].setdefault(table, [])
    return manifest


def _tier(rows: int, fanin: int) -> int:
    tier = 0
    while rows >= fanin:
        rows //= fanin
        tier += 1
    return tier


def _is_abandoned(folder: Path) -> bool:
    """A staging folder whose writer died: its flock is free."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _sample_table(samples: list[Sample]) -> pa.Table:
    keys = [sample_keys(s.labels, s.metric) for s in samples]
    return pa.table(
        {
            "metric": [s.metric for s in samples],
            "t": [float(s.t) for s in samples],
            "value": [float(s.value) for s in samples],
            "host": [k[0] for k in keys],
            "gpu": [k[1] for k in keys],
            "job": [k[2] for k in keys],
            "labels": [_json(dict(s.labels)) for s in samples],
        },
        schema=SAMPLE_SCHEMA,
    )


_JOB_COLUMNS = 'id, "user", account, partition, nodes, gpus, gpus_by_node, start, "end", state, name, mail_user'


@dataclass(frozen=True, slots=True, kw_only=True)
class _KeptJobs:
    """Every job as ``Store.jobs`` last read them."""

    mark: Any
    """The jobs table's ``table_mark`` when read."""
    version: int
    """The store version read at: the next read reads the rows committed after it."""
    jobs: list[Job]
    """In the order ``ORDER BY start NULLS LAST, id`` gives."""
    by_id: dict[str, Job]
    row_of: dict[str, tuple[Any, ...]]
    """Job id -> the row its Job was made of."""


def _job_order(job: Job) -> tuple[bool, float, str]:
    """``ORDER BY start NULLS LAST, id`` (an id's text compares by code point, as DuckDB's bytes of UTF-8 do)."""
    return (job.start is None, job.start or 0.0, job.id)


def _job_from_row(row: tuple[Any, ...]) -> Job:
    jid, user, account, partition, nodes, gpus, by_node, start, end, state, name, mail_user = row
    return Job(
        id=jid,
        user=user,
        account=account,
        partition=partition,
        nodes=tuple(orjson.loads(nodes)),
        gpus=gpus,
        gpus_by_node={k: tuple(v) for k, v in orjson.loads(by_node).items()},
        start=start,
        end=end,
        state=state,
        name=name,
        mail_user=mail_user,
    )


@dataclass(frozen=True, slots=True)
class _RowWriter:
    """How one record kind becomes an Arrow batch: columnar writes are ~100x faster than row by row."""

    name: str
    schema: pa.Schema
    row: Any

    def table(self, records: list[Any]) -> pa.Table:
        columns = list(zip(*(self.row(r) for r in records)))
        return pa.table(
            {field.name: pa.array(column, type=field.type) for field, column in zip(self.schema, columns)},
            schema=self.schema,
        )


_ROW_WRITERS = {
    Event: _RowWriter("events", _EVENT_SCHEMA, lambda e: (e.kind, e.t, e.source, _json(dict(e.attrs)))),
    Span: _RowWriter(
        "spans", _SPAN_SCHEMA, lambda s: (s.job, s.rank, s.step, s.phase, s.start, s.dur, _json(dict(s.attrs)))
    ),
    Job: _RowWriter(
        "jobs",
        _JOB_SCHEMA,
        lambda j: (
            j.id,
            j.user,
            j.account,
            j.partition,
            _json(list(j.nodes)),
            j.gpus,
            _json({k: list(v) for k, v in j.gpus_by_node.items()}),
            j.start,
            j.end,
            j.state,
            j.name,
            j.mail_user,
        ),
    ),
    Finding: _RowWriter(
        "findings",
        _FINDING_SCHEMA,
        lambda f: (f.vector, f.severity, f.target, f.title, _json(dict(f.evidence)), f.t, f.rule),
    ),
    NoticeRow: _RowWriter(
        "notices",
        _NOTICE_SCHEMA,
        lambda n: (n.key, n.notice, n.kind, n.channel, n.recipient, n.state, n.t, n.attempts, n.payload),
    ),
}
