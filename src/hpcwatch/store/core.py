"""The embedded store: DuckDB tables of the five records, file-backed or in memory.

Writes go in batches, one transaction each, so a ``kill -9`` during an ingest
loses at most the batch in flight and leaves a readable file (DuckDB's WAL
replays committed transactions on the next open).

Samples are kept with their host, gpu and job pulled out of the labels
(``schemas.sample_keys``).

Queries return records (few rows) or a ``pyarrow.Table`` (many rows) whose
columns are documented on the method.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa

from hpcwatch.errors import StoreError
from hpcwatch.records import Event, Finding, Job, Sample, Span
from hpcwatch.schemas import SAMPLE_SCHEMA, sample_keys

__all__ = ["Store", "StoreConfig", "IngestCounts", "DEFAULT_BATCH_SIZE", "sample_keys", "SAMPLE_SCHEMA"]

DEFAULT_BATCH_SIZE = 20_000

_DDL = """
CREATE TABLE IF NOT EXISTS samples (metric VARCHAR, t DOUBLE, value DOUBLE, host VARCHAR, gpu VARCHAR,
                                    job VARCHAR, labels VARCHAR);
CREATE TABLE IF NOT EXISTS events (kind VARCHAR, t DOUBLE, source VARCHAR, attrs VARCHAR);
CREATE TABLE IF NOT EXISTS spans (job VARCHAR, rank INTEGER, step INTEGER, phase VARCHAR, start DOUBLE,
                                  dur DOUBLE, attrs VARCHAR);
CREATE TABLE IF NOT EXISTS jobs (id VARCHAR PRIMARY KEY, "user" VARCHAR, account VARCHAR, partition VARCHAR,
                                 nodes VARCHAR, gpus INTEGER, gpus_by_node VARCHAR, start DOUBLE, "end" DOUBLE,
                                 state VARCHAR, name VARCHAR);
CREATE TABLE IF NOT EXISTS findings (vector VARCHAR, severity VARCHAR, target VARCHAR, title VARCHAR,
                                     evidence VARCHAR, t DOUBLE, rule VARCHAR);
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreConfig:
    path: str = ":memory:"
    """A file path, or ``:memory:``."""
    batch_size: int = DEFAULT_BATCH_SIZE
    """Records per transaction; what a crash can lose at most."""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


@dataclass(slots=True)
class IngestCounts:
    samples: int = 0
    events: int = 0
    spans: int = 0
    jobs: int = 0
    findings: int = 0

    def total(self) -> int:
        return self.samples + self.events + self.spans + self.jobs + self.findings


def _json(value: Any) -> str:
    return orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


class Store:
    """DuckDB store of samples, events, spans, jobs and findings. Safe to share between threads."""

    def __init__(self, path: str | Path = ":memory:", *, batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        self.config = StoreConfig(path=str(path), batch_size=batch_size)
        try:
            if self.config.path != ":memory:":
                Path(self.config.path).parent.mkdir(parents=True, exist_ok=True)
            self._con = duckdb.connect(self.config.path)
            self._con.execute(_DDL)
        except (duckdb.Error, OSError) as err:
            raise StoreError(f"{self.config.path}: cannot open the store: {err}") from err
        self._lock = threading.RLock()

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            self._con.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing -------------------------------------------------------------------------------

    def add(self, records: Iterable[Sample | Event | Span | Job | Finding]) -> IngestCounts:
        """Store records of any kind, one transaction per ``batch_size`` records."""
        counts = IngestCounts()
        batch: list[Any] = []
        for record in records:
            batch.append(record)
            if len(batch) >= self.config.batch_size:
                self._flush(batch, counts)
                batch = []
        if batch:
            self._flush(batch, counts)
        return counts

    def add_sample_table(self, table: pa.Table) -> int:
        """Fast path: a table with ``SAMPLE_SCHEMA`` columns, in one transaction."""
        table = table.select(SAMPLE_SCHEMA.names).cast(SAMPLE_SCHEMA)
        def write(con: duckdb.DuckDBPyConnection) -> None:
            con.register("_batch", table)
            con.execute("INSERT INTO samples SELECT * FROM _batch")
            con.unregister("_batch")

        with self._lock:
            self._transaction(write)
        return table.num_rows

    def _flush(self, batch: list[Any], counts: IngestCounts) -> None:
        by_kind: dict[type, list[Any]] = {}
        for record in batch:
            by_kind.setdefault(type(record), []).append(record)
        samples = by_kind.pop(Sample, [])
        sample_rows = _sample_table(samples) if samples else None

        def write(con: duckdb.DuckDBPyConnection) -> None:
            if sample_rows is not None:
                con.register("_batch", sample_rows)
                con.execute("INSERT INTO samples SELECT * FROM _batch")
                con.unregister("_batch")
            for kind, rows in by_kind.items():
                writer = _ROW_WRITERS[kind]
                if kind is Job:  # the last sighting of a job in a batch wins
                    rows = list({job.id: job for job in rows}.values())
                con.register("_batch", writer.table(rows))
                con.execute(f"{writer.verb} INTO {writer.name} SELECT * FROM _batch")
                con.unregister("_batch")

        with self._lock:
            self._transaction(write)
        counts.samples += len(samples)
        counts.events += len(by_kind.get(Event, []))
        counts.spans += len(by_kind.get(Span, []))
        counts.jobs += len(by_kind.get(Job, []))
        counts.findings += len(by_kind.get(Finding, []))

    def _transaction(self, work) -> None:
        try:
            self._con.execute("BEGIN TRANSACTION")
            work(self._con)
            self._con.execute("COMMIT")
        except duckdb.Error as err:
            try:
                self._con.execute("ROLLBACK")
            except duckdb.Error:
                pass  # the failed transaction is already gone
            raise StoreError(f"{self.config.path}: write failed: {err}") from err

    # -- reading -------------------------------------------------------------------------------

    def query(self, sql: str, params: list[Any] | tuple[Any, ...] = ()) -> list[tuple]:
        """Rows of any SQL over the tables above (read-only use, please)."""
        with self._lock:
            try:
                return self._con.execute(sql, params).fetchall()
            except duckdb.Error as err:
                raise StoreError(f"{self.config.path}: query failed: {err}") from err

    def query_arrow(self, sql: str, params: list[Any] | tuple[Any, ...] = ()) -> pa.Table:
        with self._lock:
            try:
                relation = self._con.sql(sql, params=list(params) or None)
                # DuckDB 2 names it to_arrow_table; 1.x calls it arrow.
                fetch = getattr(relation, "to_arrow_table", None) or relation.arrow
                return fetch()
            except duckdb.Error as err:
                raise StoreError(f"{self.config.path}: query failed: {err}") from err

    def samples(self, metric: str | Iterable[str] | None = None, *, host: str | None = None,
                job: str | None = None, t0: float | None = None, t1: float | None = None) -> pa.Table:
        """Samples as a table with ``SAMPLE_SCHEMA`` columns, ordered by metric, host, gpu, t."""
        where, params = [], []
        if metric is not None:
            metrics = [metric] if isinstance(metric, str) else list(metric)
            where.append(f"metric IN ({', '.join('?' * len(metrics))})")
            params.extend(metrics)
        for column, value in (("host", host), ("job", job)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if t0 is not None:
            where.append("t >= ?")
            params.append(t0)
        if t1 is not None:
            where.append("t <= ?")
            params.append(t1)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        return self.query_arrow(f"SELECT * FROM samples {clause} ORDER BY metric, host, gpu, t", params)

    def iter_samples(self, metric: str | Iterable[str] | None = None, **filters: Any) -> Iterator[Sample]:
        table = self.samples(metric, **filters)
        for row in table.to_pylist():
            yield Sample(metric=row["metric"], labels=orjson.loads(row["labels"]), t=row["t"], value=row["value"])

    def metrics(self) -> list[str]:
        return [m for (m,) in self.query("SELECT DISTINCT metric FROM samples ORDER BY metric")]

    def time_range(self) -> tuple[float | None, float | None]:
        (lo, hi), = self.query("SELECT min(t), max(t) FROM samples")
        return lo, hi

    def events(self, kind: str | None = None, *, t0: float | None = None, t1: float | None = None) -> list[Event]:
        where, params = ["TRUE"], []
        if kind is not None:
            where.append("kind = ?")
            params.append(kind)
        if t0 is not None:
            where.append("t >= ?")
            params.append(t0)
        if t1 is not None:
            where.append("t <= ?")
            params.append(t1)
        rows = self.query(f"SELECT kind, t, source, attrs FROM events WHERE {' AND '.join(where)} ORDER BY t", params)
        return [Event(kind=k, t=t, source=s, attrs=orjson.loads(a)) for k, t, s, a in rows]

    def spans(self, job: str | None = None, *, step: int | None = None) -> list[Span]:
        where, params = ["TRUE"], []
        if job is not None:
            where.append("job = ?")
            params.append(job)
        if step is not None:
            where.append("step = ?")
            params.append(step)
        rows = self.query(f"SELECT job, rank, step, phase, start, dur, attrs FROM spans "
                          f"WHERE {' AND '.join(where)} ORDER BY step, rank, start", params)
        return [Span(job=j, rank=r, step=s, phase=p, start=st, dur=d, attrs=orjson.loads(a))
                for j, r, s, p, st, d, a in rows]

    def jobs(self) -> list[Job]:
        rows = self.query(f"SELECT {_JOB_COLUMNS} FROM jobs ORDER BY start NULLS LAST, id")
        return [_job_from_row(row) for row in rows]

    def job(self, job_id: str) -> Job | None:
        rows = self.query(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ?", [job_id])
        return _job_from_row(rows[0]) if rows else None

    def findings(self, vector: str | None = None) -> list[Finding]:
        where, params = ("WHERE vector = ?", [vector]) if vector else ("", [])
        rows = self.query(f"SELECT vector, severity, target, title, evidence, t, rule FROM findings {where} "
                          f"ORDER BY t", params)
        return [Finding(vector=v, severity=s, target=tg, title=ti, evidence=orjson.loads(e), t=t, rule=r)
                for v, s, tg, ti, e, t, r in rows]

    def clear_findings(self) -> None:
        """Forget stored findings (a new scan replaces the previous one's)."""
        with self._lock:
            self._transaction(lambda con: con.execute("DELETE FROM findings"))


def _sample_table(samples: list[Sample]) -> pa.Table:
    keys = [sample_keys(s.labels) for s in samples]
    return pa.table({
        "metric": [s.metric for s in samples],
        "t": [float(s.t) for s in samples],
        "value": [float(s.value) for s in samples],
        "host": [k[0] for k in keys],
        "gpu": [k[1] for k in keys],
        "job": [k[2] for k in keys],
        "labels": [_json(dict(s.labels)) for s in samples],
    }, schema=SAMPLE_SCHEMA)


_JOB_COLUMNS = 'id, "user", account, partition, nodes, gpus, gpus_by_node, start, "end", state, name'


def _job_from_row(row: tuple) -> Job:
    jid, user, account, partition, nodes, gpus, by_node, start, end, state, name = row
    return Job(id=jid, user=user, account=account, partition=partition, nodes=tuple(orjson.loads(nodes)),
               gpus=gpus, gpus_by_node={k: tuple(v) for k, v in orjson.loads(by_node).items()},
               start=start, end=end, state=state, name=name)


@dataclass(frozen=True, slots=True)
class _RowWriter:
    """How one record kind becomes an Arrow batch: columnar inserts are ~100x faster than executemany."""

    name: str
    schema: pa.Schema
    row: Any
    verb: str = "INSERT"

    def table(self, records: list[Any]) -> pa.Table:
        columns = list(zip(*(self.row(r) for r in records)))
        return pa.table({field.name: pa.array(column, type=field.type)
                         for field, column in zip(self.schema, columns)}, schema=self.schema)


_ROW_WRITERS = {
    Event: _RowWriter("events", pa.schema([("kind", pa.string()), ("t", pa.float64()), ("source", pa.string()),
                                           ("attrs", pa.string())]),
                      lambda e: (e.kind, e.t, e.source, _json(dict(e.attrs)))),
    Span: _RowWriter("spans", pa.schema([("job", pa.string()), ("rank", pa.int32()), ("step", pa.int32()),
                                         ("phase", pa.string()), ("start", pa.float64()), ("dur", pa.float64()),
                                         ("attrs", pa.string())]),
                     lambda s: (s.job, s.rank, s.step, s.phase, s.start, s.dur, _json(dict(s.attrs)))),
    # A job seen again (squeue then sacct, pending then running) replaces the older row.
    Job: _RowWriter("jobs", pa.schema([("id", pa.string()), ("user", pa.string()), ("account", pa.string()),
                                       ("partition", pa.string()), ("nodes", pa.string()), ("gpus", pa.int32()),
                                       ("gpus_by_node", pa.string()), ("start", pa.float64()),
                                       ("end", pa.float64()), ("state", pa.string()), ("name", pa.string())]),
                    lambda j: (j.id, j.user, j.account, j.partition, _json(list(j.nodes)), j.gpus,
                               _json({k: list(v) for k, v in j.gpus_by_node.items()}), j.start, j.end, j.state,
                               j.name),
                    verb="INSERT OR REPLACE"),
    Finding: _RowWriter("findings", pa.schema([("vector", pa.string()), ("severity", pa.string()),
                                               ("target", pa.string()), ("title", pa.string()),
                                               ("evidence", pa.string()), ("t", pa.float64()), ("rule", pa.string())]),
                        lambda f: (f.vector, f.severity, f.target, f.title, _json(dict(f.evidence)), f.t, f.rule)),
}
