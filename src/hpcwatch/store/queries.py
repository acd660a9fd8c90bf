"""Named read questions over the store, one function each, for ``reports/``.

Each takes a ``Store`` and plain values, and returns rows or a table whose
columns are documented on the function. This is the only place besides
``core`` where SQL is written; a view that needs a new number asks for a new
function here (through a report), never for a query string.

Times are UTC seconds, as stored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from hpcwatch.errors import ConfigError
from hpcwatch.records import Event, Sample, Span
from hpcwatch.schemas import SAMPLE_SCHEMA
from hpcwatch.store.core import NoticeRow, Store

_T = TypeVar("_T")

__all__ = [
    "window_samples",
    "samples_written",
    "training_changed_since",
    "lead_in_samples",
    "LEAD_IN_S",
    "newest_label_sets",
    "hosts_with",
    "latest_sample_t",
    "latest_gpu_values",
    "latest_node_states",
    "recent_events",
    "gauge_onsets",
    "gauge_onset_groups",
    "counter_rates",
    "last_gpu_scrape",
    "metric_activity",
    "sample_rows_since",
    "event_activity",
    "file_hook_activity",
    "span_activity",
    "open_job_count",
    "checkpoint_activity",
    "requeue_counts",
    "latest_job_time",
    "requeued_attempt_starts",
    "latest_finding_by_vector",
    "finding_counts",
    "finding_rule_counts",
    "newest_events",
    "table_counts",
    "span_tops_since",
    "span_jobs",
    "span_jobs_by_recency",
    "step_range",
    "last_step_every_rank_finished",
    "recent_spans",
    "job_span_table",
    "recent_span_table",
    "recent_steps",
    "step_span_table",
    "job_span_steps_written",
    "job_step_groups",
    "job_spans_written",
    "newest_span_start",
    "samples_matching",
    "sample_rows_matching",
    "samples_of_table",
    "events_of_kinds",
    "newest_job_events",
    "gpu_sample_cadence",
    "gpu_metric_presence",
    "job_gpu_coverage",
    "label_values_by_host",
    "label_values_any_metric",
    "counter_increase",
    "idle_gpu_maxima",
    "newest_by_labels",
    "step_walls",
    "sample_job_ids",
    "data_seen",
    "events_mark",
    "data_seen_since",
    "SeenRows",
    "job_window_samples",
    "notice_keys",
    "pending_notices",
    "sent_notices",
    "sent_counts_by_recipient",
    "ended_job_ids",
    "verdict_episode_start",
    "ended_job_owners",
    "notices_between",
    "verdict_changes",
    "window_samples_after",
]


def _marks(values: Sequence[object]) -> str:
    return ", ".join("?" * len(values))


def _among(column: str) -> str:
    """SQL: ``column`` is one of the texts of the list bound to its ``?`` (a semi-join: DuckDB tests a row
    against a hashed set, where a literal list of 192 hosts was tested value by value; a job's window read at
    1,024 nodes: 28 → 9 ms)."""
    return f"{column} IN (SELECT unnest(?::VARCHAR[]))"


# -- samples -------------------------------------------------------------------------------------


def window_samples(
    store: Store, metrics: Sequence[str], *, t0: float | None, host: str | None = None, before: float | None = None
) -> pa.Table:
    """``Store.samples(metrics, host=host, t0=t0)`` (and before ``before`` when given: one stretch of the whole
    store's, ``reports.storestretches``): the same rows in the same order, with ``labels``
    dictionary-encoded (``_with_label_sets``). A health window of 15 minutes at 1,024 nodes holds 10 million
    rows and a few hundred thousand label sets: their text was 1.1 of its 1.8 GB of Arrow, and a third of its
    read's CPU."""
    where = [f"metric IN ({_marks(metrics)})", *(["host = ?"] if host is not None else [])]
    where += ["t >= ?"] if t0 is not None else []
    where += ["t < ?"] if before is not None else []
    params = [*metrics, *([host] if host is not None else []), *([t0] if t0 is not None else [])]
    params += [before] if before is not None else []
    return _samples_where(store, " AND ".join(where), params)


#: How far before a read's start ``lead_in_samples`` looks for each series' last sample. Ours: ten 30 s scrapes
#: (dcgm-exporter's default interval is 30 s); a series silent longer than that before the start has none.
LEAD_IN_S: Final = 300.0


def lead_in_samples(store: Store, metrics: Sequence[str], *, t0: float, hosts: Sequence[str] | None) -> pa.Table:
    """Each series' last sample of ``metrics`` before ``t0`` (and at most ``LEAD_IN_S`` before it), on ``hosts``
    (None: every host), in ``window_samples``' columns and order: what a read from ``t0`` needs to see the
    change at each series' first sample in it (an energy delta, a new XID value) as a read of every sample
    does. A series is its metric, host and GPU (the store's order): the MIG instances of one GPU, scraped
    together, tie on the newest time and are all kept."""
    where = f"metric IN ({_marks(metrics)}) AND t >= ? AND t < ?" + (
        f" AND {_among('host')}" if hosts is not None else ""
    )
    params = [*metrics, t0 - LEAD_IN_S, t0, *([list(hosts)] if hosts is not None else [])]
    found = _samples_where(store, where, params)
    if not found.num_rows:
        return found
    # Of the rows, in (metric, host, gpu, t) order, those at their series' newest time, kept here: a subquery per
    # row (t = its series' newest) or a semi-join with each series' newest time cost DuckDB more scans (0.07-0.18 s
    # a one-node job at 1,024 nodes, where this is 0.05-0.1).
    starts = np.zeros(found.num_rows, dtype=bool)
    starts[0] = True
    for name in ("metric", "host", "gpu"):
        key = pc.fill_null(found.column(name), "").to_numpy(zero_copy_only=False)
        starts[1:] |= key[1:] != key[:-1]
    t = found.column("t").to_numpy()
    newest = np.maximum.reduceat(t, np.flatnonzero(starts))[np.cumsum(starts) - 1]
    return found.filter(pa.array(t == newest))


def samples_span(store: Store, metrics: Sequence[str]) -> tuple[float, float] | None:
    """The oldest and newest time of a sample of ``metrics``; None when there is none."""
    ((first, last),) = store.query(
        f"SELECT min(t), max(t) FROM samples WHERE metric IN ({_marks(metrics)})", list(metrics)
    )
    return None if first is None or last is None else (float(first), float(last))


def samples_written(store: Store, since_version: int, metrics: Sequence[str], *, before: float) -> float | None:
    """The oldest time before ``before`` of a sample of ``metrics`` that a commit after ``since_version`` added
    (None: none): what a reader kept of the rows before that time still holds (``reports.storestretches``). Reads
    only the parts committed since, and of those (their rows land in time order) only the row groups of rows
    before ``before``."""
    _, rows = store.query_since(
        since_version, f"SELECT min(t) FROM samples WHERE metric IN ({_marks(metrics)}) AND t < ?", [*metrics, before]
    )
    oldest = rows[0][0]
    return None if oldest is None else float(oldest)


def next_sample_t(store: Store, metrics: Sequence[str], t0: float) -> float | None:
    """The time of the first sample of ``metrics`` from ``t0`` on (None: none): where a read by stretches goes
    on after a silence."""
    ((first,),) = store.query(
        f"SELECT min(t) FROM samples WHERE metric IN ({_marks(metrics)}) AND t >= ?", [*metrics, t0]
    )
    return None if first is None else float(first)


def _samples_where(store: Store, where: str, params: Sequence[object]) -> pa.Table:
    """The samples matching ``where`` in ``Store.samples`` columns and order, ``labels`` dictionary-encoded
    (``_with_label_sets``), or as text per row should two label sets share a hash."""
    found = _with_label_sets(store, where, params)
    if found is not None:
        return found
    return store.query_arrow(f"SELECT * FROM samples WHERE {where} ORDER BY metric, host, gpu, t", list(params))


def _with_label_sets(store: Store, where: str, params: Sequence[object]) -> pa.Table | None:
    """The samples matching ``where`` in ``Store.samples`` columns and order (metric, host, gpu, t), with
    ``labels`` dictionary-encoded: their text read once per distinct label set, not once per row. The rows
    and the label sets are read at one version of the store, and told apart by DuckDB's 64-bit ``hash``:
    should two label sets ever share one, None (the caller reads the text per row)."""
    rows, sets = store.query_arrow_each(
        [
            (
                f"SELECT metric, t, value, host, gpu, job, hash(labels) AS labels_hash FROM samples WHERE {where} "
                "ORDER BY metric, host, gpu, t",
                list(params),
            ),
            (f"SELECT DISTINCT hash(labels) AS labels_hash, labels FROM samples WHERE {where}", list(params)),
        ],
    )
    hashes = sets["labels_hash"].to_numpy()
    if np.unique(hashes).size < hashes.size:
        return None
    order = np.argsort(hashes)
    texts = sets["labels"].take(pa.array(order)).combine_chunks()
    index = np.searchsorted(hashes[order], rows["labels_hash"].to_numpy()).astype(np.int32)
    absent = np.flatnonzero(texts.is_null().to_numpy(zero_copy_only=False))  # a row without labels: a null
    indices = pa.array(index, mask=np.isin(index, absent)) if absent.size else pa.array(index)
    labels = pa.DictionaryArray.from_arrays(indices, texts.fill_null(""))
    return rows.drop_columns(["labels_hash"]).append_column("labels", labels)


def window_samples_after(store: Store, metrics: Sequence[str], *, t0: float, version: int) -> tuple[pa.Table, pa.Table]:
    """The samples of ``metrics`` from ``t0`` that commits after ``version`` added, and their label sets: rows
    ``(metric, t, value, host, gpu, job, labels_hash, _v)`` ordered by metric then time (``_v``: the row's
    commit, which compaction keeps), and ``(labels_hash, labels)`` once per distinct label set. What a reader that
    keeps a window between reads needs (``reports.healthwindow``). Read as ``query_arrow_each`` reads, beside the
    other readers: version 0 reads the whole window."""
    where = f"metric IN ({_marks(metrics)}) AND t >= ? AND _v > ?"
    params = [*metrics, t0, version]
    source = "_all_samples"  # the store's view of every part with each row's commit (``samples`` hides it)
    rows, sets = store.query_arrow_each(
        [
            (
                f"SELECT metric, t, value, host, gpu, job, hash(labels) AS labels_hash, _v FROM {source} "
                f"WHERE {where} ORDER BY metric, t",
                params,
            ),
            (f"SELECT DISTINCT hash(labels) AS labels_hash, labels FROM {source} WHERE {where}", params),
        ]
    )
    return rows, sets


def newest_label_sets(store: Store, metric: str) -> list[tuple[str, str | None, float]]:
    """``(host, labels, t)``: the newest time each host gave ``metric`` each label set, oldest first. What a
    reader of each host's latest labels needs (Slurm's node list: its partitions), bounded by the label sets
    rather than by the history: a node list scraped every 15 s is 6 million rows a day at 1,024 nodes."""
    return [
        (host, labels, t)
        for host, labels, t in store.query(
            "SELECT host, labels, max(t) AS t FROM samples WHERE metric = ? AND host IS NOT NULL "
            "GROUP BY host, labels ORDER BY t, host, labels",
            [metric],
        )
    ]


def hosts_with(store: Store, metrics: Sequence[str]) -> frozenset[str]:
    """The hosts that ever gave one of ``metrics``."""
    rows = store.query(f"SELECT DISTINCT host FROM samples WHERE metric IN ({_marks(metrics)})", list(metrics))
    return frozenset(str(host) for (host,) in rows if host)


def latest_sample_t(store: Store, *, since: float | None = None, metrics: Sequence[str] | None = None) -> float | None:
    """The newest sample's time (of ``metrics`` when given; at or after ``since``, which lets DuckDB skip old
    row groups). Kept while no sample is committed (``Store.kept_while``): a job page asks twice (where its
    report reads to, where a running job's report ends), each a scan of the newest parts. A kept time found
    from any ``since`` is the newest of all (a sample at or after ``since`` was found); a kept None says only
    that none is at or after the ``since`` it was asked from."""
    key = ("latest_sample_t", None if metrics is None else tuple(metrics))
    found, asked_since = store.kept_while(("samples",), key, lambda: (_latest_sample_t(store, since, metrics), since))
    if found is not None:
        return found if since is None or found >= since else None
    if asked_since is None or (since is not None and since >= asked_since):
        return None
    return _latest_sample_t(store, since, metrics)  # none from a later time on: what lies before is not known


def _latest_sample_t(store: Store, since: float | None, metrics: Sequence[str] | None) -> float | None:
    where = [*(["t >= ?"] if since is not None else []), *([f"metric IN ({_marks(metrics)})"] if metrics else [])]
    params = [*([since] if since is not None else []), *(metrics or [])]
    latest: float | None  # max() over no row is NULL
    ((latest,),) = store.query(
        "SELECT max(t) FROM samples" + (" WHERE " + " AND ".join(where) if where else ""), params
    )
    return latest


#: A row of ``latest_gpu_values``: ``(metric, host, gpu, value, job, t)``.
GpuValueRow = tuple[str, str, str, float, str | None, float]


def latest_gpu_values(store: Store, metrics: Sequence[str], *, since: float) -> list[GpuValueRow]:
    """Per (metric, host, gpu) seen since ``since``: rows ``(metric, host, gpu, value, job, t)`` with the
    newest value, the job label of that newest sample (None when it has none: ``arg_max`` would give an older
    sample's, a job that ended up to a window ago) and its time. Samples without host or GPU are skipped."""
    return store.query(
        f"SELECT metric, host, gpu, arg_max(value, t), arg_max_null(job, t), max(t) FROM samples "
        f"WHERE metric IN ({_marks(metrics)}) AND t >= ? AND host IS NOT NULL "
        f"AND gpu IS NOT NULL GROUP BY metric, host, gpu",
        [*metrics, since],
    )


def latest_node_states(
    store: Store, *, metric: str, since: float | None = None
) -> list[tuple[str, float, str | None, float]]:
    """Per host, its newest ``metric`` sample (``slurm_node_up``): rows ``(host, value, state label, t)``."""
    where = "metric = ? AND host IS NOT NULL" + (" AND t >= ?" if since is not None else "")
    return store.query(
        f"SELECT host, arg_max(value, t), arg_max(json_extract_string(labels, '$.state'), t), max(t) FROM samples "
        f"WHERE {where} GROUP BY host",
        [metric, *([since] if since is not None else [])],
    )


def gauge_onsets(
    store: Store, metric: str, *, since: float | None = None, hosts: Sequence[str] | None = None, limit: int
) -> list[tuple[str, str | None, float, float, str | None]]:
    """When each non-zero value of a gauge (dcgm-exporter's "last XID" ``DCGM_FI_DEV_XID_ERRORS``) was first
    seen, per host and GPU: rows ``(host, gpu, value, first t, job label then)``, newest first, at most ``limit``."""
    where = ["metric = ?", "value != 0", "host IS NOT NULL"]
    params: list[object] = [metric]
    if since is not None:
        where.append("t >= ?")
        params.append(since)
    if hosts is not None:
        where.append(_among("host"))
        params.append(list(hosts))
    return store.query(
        f"SELECT host, gpu, value, min(t), arg_min(job, t) FROM samples WHERE {' AND '.join(where)} "
        "GROUP BY host, gpu, value ORDER BY min(t) DESC LIMIT ?",
        [*params, int(limit)],
    )


def gauge_onset_groups(
    store: Store,
    metric: str,
    *,
    since: float,
    hosts: Sequence[str],
    cut: float | None = None,
    until: float | None = None,
) -> list[tuple[str, str | None, float, float, str | None, bool]]:
    """``gauge_onsets`` on ``hosts`` without a limit, before ``until`` (None: no end), split at ``cut`` (None:
    no split): rows ``(host, gpu, value, first t, job label then, later)``, ``later`` when that group's samples
    are at or after ``cut``. As many rows as non-zero values the GPUs gave (an XID code a GPU), whatever the
    window's length."""
    later = "t >= ?" if cut is not None else "FALSE"
    before = " AND t < ?" if until is not None else ""
    return store.query(
        f"SELECT host, gpu, value, min(t), arg_min(job, t), {later} AS later FROM samples "
        f"WHERE metric = ? AND value != 0 AND host IS NOT NULL AND t >= ?{before} AND {_among('host')} "
        "GROUP BY ALL",
        [*([cut] if cut is not None else []), metric, since, *([until] if until is not None else []), list(hosts)],
    )


def recent_events(
    store: Store,
    kinds: Sequence[str],
    *,
    since: float | None = None,
    limit: int,
    node: str | None = None,
    job: str | None = None,
) -> list[Event]:
    """The newest ``limit`` events of ``kinds`` since ``since``, newest first; with ``node`` those naming it
    (attrs ``node``, or in ``nodes``), with ``job`` those naming it (attrs ``job``)."""
    where = [f"kind IN ({_marks(kinds)})"]
    params: list[object] = [*kinds]
    if since is not None:
        where.append("t >= ?")
        params.append(since)
    if node is not None:
        where.append(
            "(json_extract_string(attrs, '$.node') = ? OR list_contains("
            "CAST(json_extract(attrs, '$.nodes') AS VARCHAR[]), ?))"
        )
        params += [node, node]
    if job is not None:
        where.append("json_extract_string(attrs, '$.job') = ?")
        params.append(job)
    rows = store.query(
        f"SELECT kind, t, source, attrs FROM events WHERE {' AND '.join(where)} ORDER BY t DESC LIMIT ?",
        [*params, int(limit)],
    )
    return [Event(kind=k, t=t, source=src, attrs=orjson.loads(a)) for k, t, src, a in rows]


def counter_rates(store: Store, metrics: Sequence[str], *, since: float, group: str) -> list[tuple[str, str, float]]:
    """Per-second rate of each counter series (its two newest samples since ``since``), summed by metric and
    ``group`` (``"host"`` or ``"job"``): rows ``(metric, group value, bytes or units per s)``. A counter that
    went down (a reset) counts 0; a group value that is NULL is dropped."""
    if group not in ("host", "job"):
        raise ConfigError(f"counter_rates: group must be host or job, got {group!r}")
    # arg_max(value, t, 2): the two newest values of each series, newest first (no window sort needed).
    rows = store.query(
        f"SELECT metric, g, sum(greatest(v[1] - v[2], 0) / (ts[1] - ts[2])) FROM ("
        f"SELECT metric, {group} AS g, arg_max(value, t, 2) AS v, max(t, 2) AS ts FROM samples "
        f"WHERE metric IN ({_marks(metrics)}) AND t >= ? GROUP BY metric, host, {group}, labels) "
        f"WHERE len(ts) = 2 AND ts[1] > ts[2] GROUP BY metric, g",
        [*metrics, since],
    )
    return [(m, g, float(v)) for m, g, v in rows if g is not None]


def sample_rows_since(
    store: Store, since_version: int, metrics: Sequence[str], *, t0: float | None = None
) -> tuple[int, pa.Table, float | None]:
    """What was committed after version ``since_version``: (the version read at, the rows of ``metrics`` at or
    after ``t0`` when given, the newest time of any sample committed, None when none was). The rows' columns:
    metric, host, gpu, job, labels, value, t, in no particular order."""
    where, params = f"metric IN ({_marks(metrics)})", list[object](metrics)
    if t0 is not None:
        where += " AND t >= ?"
        params.append(t0)
    # One read of the committed rows for both answers: the newest time rides on a last row without a metric.
    version, table = store.query_arrow_since(
        since_version,
        f"SELECT metric, host, gpu, job, labels, value, t FROM samples WHERE {where} "
        "UNION ALL SELECT NULL, NULL, NULL, NULL, NULL, NULL, max(t) FROM samples",
        params,
    )
    has_metric = pc.is_valid(table["metric"])
    newest = pc.max(table.filter(pc.invert(has_metric))["t"]).as_py()
    return version, table.filter(has_metric), newest


def last_gpu_scrape(store: Store, metrics: Sequence[str], *, clock_metric: str) -> list[tuple[Any, ...]]:
    """The samples of ``metrics`` at the newest time ``clock_metric`` was scraped: rows
    ``(host, gpu, job, metric, value, user)``, ``user`` from the job record (NULL when unknown)."""
    return store.query(
        "WITH last AS (SELECT max(t) AS t FROM samples WHERE metric = ?) "
        'SELECT s.host, s.gpu, s.job, s.metric, s.value, j."user" FROM samples s JOIN last ON s.t = last.t '
        f"LEFT JOIN jobs j ON j.id = s.job WHERE s.metric IN ({_marks(metrics)})",
        [clock_metric, *metrics],
    )


def metric_activity(store: Store, *, since: float) -> list[tuple[str, int, float]]:
    """Per metric with samples since ``since``: rows ``(metric, sample count, newest t)``."""
    return store.query("SELECT metric, count(*), max(t) FROM samples WHERE t >= ? GROUP BY 1", [since])


# -- events --------------------------------------------------------------------------------------


def events_mark(store: Store, kinds: Sequence[str]) -> tuple[int, float | None]:
    """``(count, newest t)`` of the events of ``kinds``: it moves when one is added (events are never
    replaced), so a result computed from them alone is kept while it stays (the live page's NCCL card)."""
    ((n, t),) = store.query(f"SELECT count(*), max(t) FROM events WHERE kind IN ({_marks(kinds)})", list(kinds))
    return n, t


def event_activity(store: Store, *, since: float) -> list[tuple[str, int, float]]:
    """Per event kind seen since ``since``: rows ``(kind, count, newest t)``."""
    return store.query("SELECT kind, count(*), max(t) FROM events WHERE t >= ? GROUP BY 1", [since])


def file_hook_activity(
    store: Store, *, since: float, hooks: Sequence[str], path_prefix: str
) -> tuple[int, float | None]:
    """Tetragon events since ``since`` whose ``function_name`` is one of ``hooks`` on a ``path`` under
    ``path_prefix``: ``(count, newest t)``."""
    ((n, t),) = store.query(
        f"SELECT count(*), max(t) FROM events WHERE t >= ? AND {_file_hooks_where(hooks)}",
        [since, *hooks, path_prefix],
    )
    return n, t


def _file_hooks_where(hooks: Sequence[str]) -> str:
    """The condition on ``events`` of a Tetragon event of one of ``hooks`` on a path under a prefix; its
    parameters: the hooks, then the prefix."""
    return (
        f"kind = 'tetragon' AND json_extract_string(attrs, '$.function_name') IN ({_marks(hooks)}) "
        f"AND starts_with(json_extract_string(attrs, '$.path'), ?)"
    )


#: The events ``requeue_counts`` and ``checkpoint_activity`` count (``event_tallies_since`` counts the same).
_REQUEUED_WHERE = "kind = 'job_end' AND json_extract_string(attrs, '$.state') = 'REQUEUED'"
_CHECKPOINT_WHERE = "kind LIKE '%checkpoint%'"


def requeue_counts(store: Store) -> dict[str, int]:
    """Per job: the attempts Slurm requeued, one per distinct start of its REQUEUED ``job_end`` events (the
    same attempt is seen again each time a poll of ``sacct`` covers it)."""
    rows = store.query(
        "SELECT json_extract_string(attrs, '$.job'), count(DISTINCT json_extract(attrs, '$.start')) "
        f"FROM events WHERE {_REQUEUED_WHERE} GROUP BY 1"
    )
    return {str(job): int(n) for job, n in rows}


def latest_job_time(store: Store) -> float:
    """The newest start or end of any job (0.0 when none): where a report without samples ends a running job."""
    ((t,),) = store.query('SELECT max(coalesce("end", start)) FROM jobs')
    return float(t) if t is not None else 0.0


def requeued_attempt_starts(store: Store, job: str) -> list[float]:
    """Start times of ``job``'s attempts that Slurm requeued (its REQUEUED ``job_end`` events' ``start``); kept
    while the events are the same (four parts of a job page ask)."""
    return list(store.kept_while(("events",), ("requeued_attempt_starts", job), lambda: _requeued(store, job)))


def _requeued(store: Store, job: str) -> tuple[float, ...]:
    rows = store.query(
        "SELECT DISTINCT CAST(json_extract(attrs, '$.start') AS DOUBLE) FROM events "
        "WHERE kind = 'job_end' "
        "AND json_extract_string(attrs, '$.state') = 'REQUEUED' "
        "AND json_extract_string(attrs, '$.job') = ? AND json_extract(attrs, '$.start') IS NOT NULL",
        [job],
    )
    return tuple(float(t) for (t,) in rows if t is not None)


#: A REQUEUED ``job_end`` event's job and attempt start (``requeue_counts`` counts the distinct starts).
_REQUEUED_SQL = (
    "SELECT json_extract_string(attrs, '$.job') AS job, CAST(json_extract(attrs, '$.start') AS VARCHAR) AS start "
    f"FROM events WHERE {_REQUEUED_WHERE}"
)
#: The checkpoint events' count and newest time (``checkpoint_activity``).
_CHECKPOINTS_SQL = f"SELECT count(*) AS n, max(t) AS t FROM events WHERE {_CHECKPOINT_WHERE}"


def event_tallies_since(
    store: Store, since: int
) -> tuple[int, list[tuple[str | None, str | None]], tuple[int, float | None]]:
    """What ``requeue_counts`` and ``checkpoint_activity`` count, of the events committed after version ``since``
    only (``reports.liveevents``): (the version read at, each REQUEUED ``job_end`` event's (job, attempt start as
    JSON text), the checkpoint events' (count, newest t))."""
    read_at, (requeued, checkpoints) = store.query_arrow_since_each(
        since, [(_REQUEUED_SQL, ()), (_CHECKPOINTS_SQL, ())]
    )
    (n,), (t,) = checkpoints["n"].to_pylist(), checkpoints["t"].to_pylist()
    return read_at, list(zip(requeued["job"].to_pylist(), requeued["start"].to_pylist())), (int(n), t)


def checkpoint_activity(store: Store) -> tuple[int, float | None]:
    """Events whose kind names a checkpoint (``checkpoint``, ``checkpoint_save``…): ``(count, newest t)``."""
    ((n, t),) = store.query(f"SELECT count(*), max(t) FROM events WHERE {_CHECKPOINT_WHERE}")
    return n, t


def job_window_samples(
    store: Store,
    metrics: Sequence[str],
    *,
    hosts: Sequence[str],
    job: str,
    t0: float,
    t1: float | None,
    before: float | None = None,
) -> pa.Table:
    """Samples of ``metrics`` between ``t0`` and ``t1`` (None: no end), and before ``before`` when given (one
    stretch of a window: ``reports.jobstretches``), on ``hosts`` or labelled ``job``, in ``Store.samples``
    columns and order, ``labels`` dictionary-encoded (``_with_label_sets``): the share of the table a job's
    report can use, in one scan. A 1,536-GPU job's minute is 200,000 rows and 2,000 label sets: their text
    was two thirds of the rows' bytes."""
    where, params = _job_window(metrics, hosts=hosts, job=job, t0=t0, t1=t1, before=before)
    return _samples_where(store, where, params)


def job_window_samples_within(
    store: Store, metrics: Sequence[str], limit: int, *, hosts: Sequence[str], job: str, t0: float, t1: float | None
) -> pa.Table | None:
    """``job_window_samples`` of the whole window, or None when it holds more than ``limit`` rows: one scan of
    the table, which stops past ``limit`` rows. A count, then the read and its label sets, were three; each scans
    the whole table for a job on few nodes (at 1,024 nodes ten minutes old, 24 million rows: ~0.15-0.25 s each).
    The label text is read per row (``limit`` bounds it) and dictionary-encoded here; rows are put in
    ``Store.samples`` order here (rows that tie on metric, host, gpu and time in any order, as DuckDB's sort
    leaves them)."""
    where, params = _job_window(metrics, hosts=hosts, job=job, t0=t0, t1=t1, before=None)
    columns = ", ".join(SAMPLE_SCHEMA.names)
    found = store.query_arrow(f"SELECT {columns} FROM samples WHERE {where} LIMIT ?", [*params, limit + 1])
    if found.num_rows > limit:
        return None
    # DuckDB's ORDER BY puts NULLs last, as Arrow's sort does.
    found = found.sort_by([(name, "ascending") for name in ("metric", "host", "gpu", "t")]).combine_chunks()
    labels = pc.dictionary_encode(found["labels"])  # one text per label set, as ``_with_label_sets`` gives
    return found.set_column(found.schema.get_field_index("labels"), "labels", labels)


def _job_window(
    metrics: Sequence[str] | None,
    *,
    hosts: Sequence[str],
    job: str,
    t0: float,
    t1: float | None,
    before: float | None,
) -> tuple[str, list[object]]:
    """The WHERE clause of ``job_window_samples`` (``metrics`` None: any metric) and its parameters."""
    conditions: list[tuple[str, list[object]]] = [
        (f"metric IN ({_marks(metrics)})", list(metrics)) if metrics is not None else ("TRUE", []),
        ("t >= ?", [t0]),
    ]
    if t1 is not None:
        conditions.append(("t <= ?", [t1]))
    if before is not None:
        conditions.append(("t < ?", [before]))
    conditions.append((f"({_among('host')} OR job = ?)", [list(hosts), job]))
    return " AND ".join(c for c, _ in conditions), [p for _, ps in conditions for p in ps]


def job_window_span(
    store: Store, metrics: Sequence[str], *, hosts: Sequence[str], job: str, t0: float, t1: float | None
) -> tuple[float, float] | None:
    """The oldest and newest time of a sample of ``metrics`` in a job's window (``job_window_samples``') from
    ``t0`` on; None when there is none."""
    where, params = _job_window(metrics, hosts=hosts, job=job, t0=t0, t1=t1, before=None)
    ((first, last),) = store.query(f"SELECT min(t), max(t) FROM samples WHERE {where}", params)
    return None if first is None or last is None else (float(first), float(last))


def job_window_next(
    store: Store, metrics: Sequence[str], *, hosts: Sequence[str], job: str, t0: float, t1: float | None
) -> float | None:
    """The time of the first sample of ``metrics`` in a job's window from ``t0`` on (None: none): where a read
    by stretches goes on after a silence of the job's nodes."""
    where, params = _job_window(metrics, hosts=hosts, job=job, t0=t0, t1=t1, before=None)
    ((first,),) = store.query(f"SELECT min(t) FROM samples WHERE {where}", params)
    return None if first is None else float(first)


def job_window_written(
    store: Store,
    since_version: int,
    metrics: Sequence[str],
    *,
    hosts: Sequence[str],
    job: str,
    t0: float,
    before: float | None = None,
) -> float | None:
    """The oldest time of a sample of ``metrics`` that a commit after ``since_version`` added to a job's window
    (before ``before`` when given; None: none): what a job's report kept before that time still holds. Reads
    only the parts committed since, and of those (their rows land in time order) only the row groups of rows
    before ``before``."""
    where, params = _job_window(metrics, hosts=hosts, job=job, t0=t0, t1=None, before=before)
    _, rows = store.query_since(since_version, f"SELECT min(t) FROM samples WHERE {where}", params)
    oldest = rows[0][0]
    return None if oldest is None else float(oldest)


def data_seen(store: Store) -> tuple[set[str], set[str], int, int]:
    """What the store ever held: ``(metric prefixes up to the first underscore, event kinds, span rows, job
    rows)``; tells a collector that fell silent from one that was never configured."""
    _, (prefixes, kinds, spans, jobs, _) = data_seen_since(store, 0)
    return prefixes, kinds, spans, jobs


#: What ``data_seen_since`` found: (metric prefixes, event kinds, span rows, job rows, weight file hooks).
SeenRows = tuple[set[str], set[str], int, int, int]


def data_seen_since(
    store: Store, since_version: int, *, hooks: Sequence[str] = (), path_prefix: str = ""
) -> tuple[int, SeenRows]:
    """``data_seen`` of the rows committed after ``since_version`` (0: all), with the Tetragon events of
    ``hooks`` on a path under ``path_prefix`` counted too (none without hooks), and the version read at: a
    reader that keeps what it saw reads each row once (``reports.live.SeenSoFar``)."""
    weights = f"(SELECT count(*) FROM events WHERE {_file_hooks_where(hooks)})" if hooks else "0"
    version, rows = store.query_since(
        since_version,
        "SELECT (SELECT list(DISTINCT split_part(metric, '_', 1)) FROM samples), "
        f"(SELECT list(DISTINCT kind) FROM events), (SELECT count(*) FROM spans), (SELECT count(*) FROM jobs), {weights}",
        [*hooks, path_prefix] if hooks else [],
    )
    ((prefixes, kinds, spans, jobs, reads),) = rows
    return version, (set(prefixes or ()), set(kinds or ()), spans, jobs, reads)


# -- jobs, tables --------------------------------------------------------------------------------


def open_job_count(store: Store) -> int:
    """Jobs without an end time (running or pending)."""
    n: int
    ((n,),) = store.query('SELECT count(*) FROM jobs WHERE "end" IS NULL')
    return n


def table_counts(store: Store) -> dict[str, int]:
    """Rows in the tables a scan reads: ``{"samples": n, "events": n, "jobs": n}``."""
    ((samples, events, jobs),) = store.query(
        "SELECT (SELECT count(*) FROM samples), (SELECT count(*) FROM events), (SELECT count(*) FROM jobs)"
    )
    return {"samples": samples, "events": events, "jobs": jobs}


# -- findings ------------------------------------------------------------------------------------


def latest_finding_by_vector(store: Store) -> list[tuple[Any, ...]]:
    """Per threat vector with findings: rows ``(vector, count, newest t, title, severity, target, rule,
    evidence JSON text)``, the last five of the newest finding."""
    return store.query(
        "SELECT vector, count(*), max(t), arg_max(title, t), arg_max(severity, t), "
        "arg_max(target, t), arg_max(rule, t), arg_max(evidence, t) FROM findings GROUP BY vector"
    )


def finding_counts(store: Store) -> dict[tuple[str, str], int]:
    """``{(vector, severity): count}`` for the pairs that have findings."""
    return {
        (v, s): n
        for v, s, n in store.query("SELECT vector, severity, count(*) FROM findings GROUP BY vector, severity")
    }


def finding_rule_counts(store: Store) -> dict[tuple[str, str, str], int]:
    """``{(vector, rule, severity): count}`` for the triples that have findings."""
    return {
        (v, r, s): n
        for v, r, s, n in store.query(
            "SELECT vector, rule, severity, count(*) FROM findings GROUP BY vector, rule, severity"
        )
    }


def newest_events(store: Store, kind: str) -> list[Event]:
    """The events of ``kind`` that share its newest time: what one run of a task stored (``hpcwatch collect``'s
    health task writes every node's verdict with one ``t``), without reading the kind's whole history."""
    rows = store.query(
        "SELECT kind, t, source, attrs FROM events WHERE kind = ? AND t = (SELECT max(t) FROM events WHERE kind = ?)",
        [kind, kind],
    )
    return [Event(kind=k, t=t, source=src, attrs=orjson.loads(a)) for k, t, src, a in rows]


# -- spans ---------------------------------------------------------------------------------------


def _excluding(exclude: Sequence[str]) -> tuple[str, list[str]]:
    return (f"job NOT IN ({_marks(exclude)})", list(exclude)) if exclude else ("TRUE", [])


def span_tops_since(
    store: Store, since: int, *, steps: int, exclude: Sequence[str] = ()
) -> tuple[int, pa.Table, pa.Table]:
    """Of the spans committed after version ``since`` (``exclude``: jobs to leave out), read at one version:
    ``(that version, per job its largest step and latest end (columns job, step, end), each job's spans of its
    ``steps`` largest step numbers among them (``job_span_table``'s columns))``."""
    where, params = _excluding(exclude)
    version, (ends, recent) = store.query_arrow_since_each(
        since,
        [
            (f"SELECT job, max(step) AS step, max(start + dur) AS end FROM spans WHERE {where} GROUP BY job", params),
            (
                f"SELECT job, rank, step, phase, start, dur, attrs FROM spans WHERE {where} "
                "QUALIFY dense_rank() OVER (PARTITION BY job ORDER BY step DESC) <= ?",
                [*params, steps],
            ),
        ],
    )
    return version, ends, recent


def span_activity(store: Store, *, since: float, exclude: Sequence[str] = ()) -> tuple[int, float | None]:
    """Spans that started since ``since`` (``exclude``: jobs to leave out): ``(count, newest end)``."""
    where, params = _excluding(exclude)
    ((n, t),) = store.query(
        f"SELECT count(*), max(start + dur) FROM spans WHERE start >= ? AND {where}", [since, *params]
    )
    return n, t


def span_jobs(store: Store) -> list[str]:
    """Every job with spans, sorted."""
    return [j for (j,) in store.query("SELECT DISTINCT job FROM spans WHERE job IS NOT NULL ORDER BY job")]


def training_changed_since(
    store: Store, since_version: int, event_kinds: Sequence[str]
) -> tuple[int, set[str], set[str | None]]:
    """What commits after ``since_version`` (0: all) changed of the jobs' training figures: ``(the version read
    at, the jobs with spans among them, the jobs named by their events of ``event_kinds``)``, None for an event
    that names no job (the goodput's events, ``analysis.goodput``, count one for every job). Reads only the
    parts committed since."""
    version, spans = store.query_since(since_version, "SELECT DISTINCT job FROM spans WHERE job IS NOT NULL")
    _, events = store.query_since(
        since_version,
        f"SELECT DISTINCT json_extract_string(attrs, '$.job') FROM events WHERE kind IN ({_marks(event_kinds)})",
        list(event_kinds),
    )
    return version, {job for (job,) in spans}, {job for (job,) in events}


def span_jobs_by_recency(store: Store, *, limit: int) -> list[str]:
    """Jobs with spans, the one whose last span started latest first; at most ``limit``."""
    return [
        j for j, _ in store.query("SELECT job, max(start) FROM spans GROUP BY job ORDER BY 2 DESC LIMIT ?", [limit])
    ]


def step_range(store: Store, job: str) -> tuple[int | None, int | None]:
    """``(first, last)`` step numbers with spans of ``job``; ``(None, None)`` without spans."""
    ((first, last),) = store.query("SELECT min(step), max(step) FROM spans WHERE job = ?", [job])
    return first, last


def last_step_every_rank_finished(store: Store, job: str) -> int | None:
    """The newest step of ``job`` for which every rank of the job has a ``barrier_wait`` span (the newest
    step may still be arriving rank by rank); ``None`` when there is none."""
    rows = store.query(
        "SELECT step FROM spans WHERE job = ? AND phase = 'barrier_wait' GROUP BY step "
        "HAVING count(DISTINCT rank) = (SELECT count(DISTINCT rank) FROM spans WHERE job = ?) "
        "ORDER BY step DESC LIMIT 1",
        [job, job],
    )
    return rows[0][0] if rows else None


def job_span_table(store: Store, job: str) -> pa.Table:
    """Every span of ``job`` as the spans table's columns (``job``, ``rank``, ``step``, ``phase``, ``start``
    and ``dur`` in UTC s, ``attrs`` JSON text), in ``Store.spans``'s order (step, rank, start): what
    ``analysis.steps.anatomy_from_span_table`` reads, without a ``Span`` object per row (a 1,536-rank job of
    15 minutes has 8 million)."""
    return store.query_arrow(
        "SELECT job, rank, step, phase, start, dur, attrs FROM spans WHERE job = ? ORDER BY step, rank, start", [job]
    )


def job_step_groups(
    store: Store,
    job: str,
    *,
    breaks: Sequence[float] = (),
    since: float | None = None,
    cut: float | None = None,
    until: float | None = None,
) -> tuple[pa.Table, pa.Table]:
    """``job``'s spans that started at or after ``since`` (None: all) and before ``until`` (None: no end)
    grouped into executed steps, split at
    ``cut`` (None: no split): one row per (``incarnation``: how many of ``breaks``, failure times, are at or
    before the span's start; ``step``; ``later``: started at or after ``cut``) with ``first_start`` (UTC s),
    ``last_end`` (the latest start + dur), ``load_s`` (the shortest ``load`` span) and ``wait`` (the
    ``barrier_wait`` spans' sum as an exact ``DECIMAL(38, 18)``: no order of a parallel sum changes it), null
    without such a span; and the spans' distinct ranks, per ``later``. Grouped where the spans are (a 1,536-rank
    job adds 9,000 a step), in one transaction: both tables hold the same spans
    (``analysis.stepgroups.StepGroups`` reads them)."""
    incarnation = " + ".join(["(start >= ?)::INTEGER"] * len(breaks)) or "0"
    later = "start >= ?" if cut is not None else "FALSE"
    where = (
        "job = ?" + (" AND start >= ?" if since is not None else "") + (" AND start < ?" if until is not None else "")
    )
    params = [job, *([since] if since is not None else []), *([until] if until is not None else [])]
    cut_param = [cut] if cut is not None else []
    groups, ranks = store.query_arrow_each(
        [
            (
                f"SELECT {incarnation} AS incarnation, step, {later} AS later, min(start) AS first_start, "
                "max(start + dur) AS last_end, min(dur) FILTER (WHERE phase = 'load') AS load_s, "
                "sum(dur::DECIMAL(38, 18)) FILTER (WHERE phase = 'barrier_wait') AS wait "
                f"FROM spans WHERE {where} GROUP BY ALL",
                [*(float(b) for b in breaks), *cut_param, *params],
            ),
            (f"SELECT DISTINCT rank, {later} AS later FROM spans WHERE {where}", [*cut_param, *params]),
        ]
    )
    return groups, ranks


def job_spans_written(store: Store, since_version: int, job: str, *, before: float | None = None) -> float | None:
    """The earliest start of a span of ``job`` that a commit after ``since_version`` added (before ``before``
    when given; None: none): what a server kept of the job's steps before that time still holds. Reads only
    the parts committed since."""
    where, params = ("job = ?", [job]) if before is None else ("job = ? AND start < ?", [job, before])
    _, rows = store.query_since(since_version, f"SELECT min(start) FROM spans WHERE {where}", params)
    oldest = rows[0][0]
    return None if oldest is None else float(oldest)


def newest_span_start(store: Store, job: str, *, since: float | None = None) -> float | None:
    """The latest start of a span of ``job`` (at or after ``since``, which lets DuckDB skip older parts)."""
    where = "job = ?" + (" AND start >= ?" if since is not None else "")
    ((newest,),) = store.query(
        f"SELECT max(start) FROM spans WHERE {where}", [job, *([since] if since is not None else [])]
    )
    return None if newest is None else float(newest)


def recent_span_table(store: Store, job: str, *, steps: int, since: float | None = None) -> pa.Table:
    """``recent_spans`` as ``job_span_table``'s columns. ``since``: no span of those steps started before it
    (``analysis.stepgroups.StepGroups.recent_since``): the spans before are not read (at an hour, a
    1,536-rank job holds 30 million)."""
    after = " AND start >= ?" if since is not None else ""
    bound = [since] if since is not None else []
    return store.query_arrow(
        f"SELECT job, rank, step, phase, start, dur, attrs FROM spans WHERE job = ?{after} AND step IN "
        f"(SELECT DISTINCT step FROM spans WHERE job = ?{after} ORDER BY step DESC LIMIT ?) "
        "ORDER BY step, rank, start",
        [job, *bound, job, *bound, steps],
    )


def recent_steps(store: Store, job: str, *, steps: int, since: float | None = None) -> list[int]:
    """The step numbers of ``recent_span_table``'s spans, ascending: the last ``steps`` with a span that started
    at or after ``since`` (None: any)."""
    after = " AND start >= ?" if since is not None else ""
    rows = store.query(
        f"SELECT DISTINCT step FROM spans WHERE job = ?{after} ORDER BY step DESC LIMIT ?",
        [job, *([since] if since is not None else []), steps],
    )
    return sorted(int(step) for (step,) in rows)


def step_span_table(store: Store, job: str, steps: Sequence[int], *, since: float | None = None) -> pa.Table:
    """``job_span_table``'s rows of ``steps`` that started at or after ``since`` (None: all), in its order."""
    if not steps:
        return store.query_arrow("SELECT job, rank, step, phase, start, dur, attrs FROM spans WHERE FALSE")
    after = " AND start >= ?" if since is not None else ""
    return store.query_arrow(
        f"SELECT job, rank, step, phase, start, dur, attrs FROM spans WHERE job = ?{after} "
        f"AND step IN ({_marks(steps)}) ORDER BY step, rank, start",
        [job, *([since] if since is not None else []), *steps],
    )


def job_span_steps_written(store: Store, since_version: int, job: str) -> int | None:
    """The lowest step of a span of ``job`` that a commit after ``since_version`` added (None: none): a step
    below it has the spans it had then. Reads only the parts committed since."""
    _, rows = store.query_since(since_version, "SELECT min(step) FROM spans WHERE job = ?", [job])
    lowest = rows[0][0]
    return None if lowest is None else int(lowest)


def recent_spans(store: Store, job: str, *, steps: int) -> list[Span]:
    """Spans of ``job``'s last ``steps`` recorded steps (step numbers with spans: a profiler that records
    one step in 16, as the live twin does, has 20 recorded steps over 320 step numbers, and a straggler
    verdict needs several steps)."""
    rows = store.query(
        "SELECT rank, step, phase, start, dur, attrs FROM spans WHERE job = ? AND step IN "
        "(SELECT DISTINCT step FROM spans WHERE job = ? ORDER BY step DESC LIMIT ?) ORDER BY step, rank, start",
        [job, job, steps],
    )
    return [
        Span(job=job, rank=r, step=s, phase=p, start=st, dur=d, attrs=orjson.loads(a) if a else {})
        for r, s, p, st, d, a in rows
    ]


# -- what the detectors read -----------------------------------------------------------------------


def samples_matching(
    store: Store,
    metrics: Sequence[str],
    *,
    prefixes: Sequence[str] = (),
    substrings: Sequence[str] = (),
    since_version: int = 0,
) -> tuple[int, list[Sample]]:
    """(store version read at, samples) of the named metrics, or whose name starts with one of ``prefixes``
    or holds one of ``substrings``, committed after ``since_version`` (0: all), in time order."""
    version, table = sample_rows_matching(
        store, metrics, prefixes=prefixes, substrings=substrings, since_version=since_version
    )
    return version, samples_of_table(table)


def sample_rows_matching(
    store: Store,
    metrics: Sequence[str],
    *,
    prefixes: Sequence[str] = (),
    substrings: Sequence[str] = (),
    since_version: int = 0,
) -> tuple[int, pa.Table]:
    """``samples_matching``'s rows as columns: metric, labels (JSON text), t, value, in time order."""
    where = [f"metric IN ({_marks(metrics)})"] if metrics else []
    where += ["starts_with(metric, ?)"] * len(prefixes) + ["contains(metric, ?)"] * len(substrings)
    if not where:
        return store.version, _NO_SAMPLE_ROWS
    return store.query_arrow_since(
        since_version,
        f"SELECT metric, labels, t, value FROM samples WHERE {' OR '.join(where)} ORDER BY t",
        [*metrics, *prefixes, *substrings],
    )


_NO_SAMPLE_ROWS = pa.table(
    {
        "metric": pa.array([], pa.string()),
        "labels": pa.array([], pa.string()),
        "t": pa.array([], pa.float64()),
        "value": pa.array([], pa.float64()),
    }
)


def samples_of_table(table: pa.Table) -> list[Sample]:
    """``Sample``s of a table with metric, labels (JSON), t and value columns, in its row order. Each distinct
    labels text is decoded once and its dict shared by the samples that carry it (as the readers share a
    series' labels): a GPU's fields, a port's counters, tick after tick. Nothing here mutates labels."""
    metrics = _shared_strings(table.column("metric"), str)
    labels = _shared_strings(table.column("labels"), orjson.loads)
    return [
        Sample(metric=m, labels=lab, t=t, value=v)
        for m, lab, t, v in zip(metrics, labels, table.column("t").to_pylist(), table.column("value").to_pylist())
    ]


def _shared_strings(column: pa.ChunkedArray, decode: Callable[[str], _T]) -> list[_T]:
    """``decode`` of each value of a string column, decoded once a distinct value."""
    encoded = pc.dictionary_encode(column).combine_chunks()
    decoded = [decode(text) for text in encoded.dictionary.to_pylist()]
    return [decoded[i] for i in encoded.indices.to_pylist()]


def events_of_kinds(store: Store, kinds: Sequence[str], *, since_version: int = 0) -> tuple[int, list[Event]]:
    """(store version read at, events) of ``kinds`` committed after ``since_version`` (0: all), in time order."""
    if not kinds:
        return store.version, []
    version, rows = store.query_since(
        since_version,
        f"SELECT kind, t, source, attrs FROM events WHERE kind IN ({_marks(kinds)}) ORDER BY t",
        list(kinds),
    )
    return version, [Event(kind=k, t=t, source=src, attrs=orjson.loads(a)) for k, t, src, a in rows]


def newest_job_events(store: Store, kinds: Sequence[str], job: str) -> list[Event]:
    """The newest event of each of ``kinds`` whose ``job`` attribute is ``job``, oldest first: filtered by
    DuckDB, not by parsing every job's events (a collector streaming verdicts adds some every few steps)."""
    if not kinds:
        return []
    rows = store.query(
        f"SELECT kind, t, source, attrs FROM events WHERE kind IN ({_marks(kinds)}) "
        "AND json_extract_string(attrs, '$.job') = ? "
        "QUALIFY row_number() OVER (PARTITION BY kind ORDER BY t DESC) = 1 ORDER BY t",
        [*kinds, job],
    )
    return [Event(kind=k, t=t, source=src, attrs=orjson.loads(a)) for k, t, src, a in rows]


# -- what an assessment reads (assess/evidence.py) -------------------------------------------------


def gpu_sample_cadence(store: Store, metric: str) -> list[tuple[Any, ...]]:
    """Per (host, gpu) with samples of ``metric``: rows ``(host, gpu, count, first t, last t, longest gap s,
    median gap s)``; the gaps are between consecutive samples of that GPU (NULL with one sample)."""
    return store.query(
        "SELECT host, gpu, count(*), min(t), max(t), max(dt), median(dt) FROM ("
        "SELECT host, gpu, t, t - lag(t) OVER (PARTITION BY host, gpu ORDER BY t) AS dt FROM samples "
        "WHERE metric = ? AND host IS NOT NULL AND gpu IS NOT NULL) GROUP BY host, gpu ORDER BY host, gpu",
        [metric],
    )


def gpu_metric_presence(store: Store, metrics: Sequence[str]) -> list[tuple[str, str, str]]:
    """Which of ``metrics`` each (host, gpu) has at least one sample of: rows ``(host, gpu, metric)``."""
    if not metrics:
        return []
    return store.query(
        f"SELECT DISTINCT host, gpu, metric FROM samples WHERE metric IN ({_marks(metrics)}) "
        "AND host IS NOT NULL AND gpu IS NOT NULL",
        list(metrics),
    )


def job_gpu_coverage(store: Store, metric: str) -> list[tuple[Any, ...]]:
    """Per (job label, host, gpu) of ``metric``'s samples: rows ``(job, host, gpu, count, first t, last t)``."""
    return store.query(
        "SELECT job, host, gpu, count(*), min(t), max(t) FROM samples WHERE metric = ? "
        "AND job IS NOT NULL AND host IS NOT NULL AND gpu IS NOT NULL GROUP BY job, host, gpu",
        [metric],
    )


def sample_job_ids(store: Store, metrics: Sequence[str]) -> list[str]:
    """Every job label seen on samples of ``metrics``, sorted."""
    if not metrics:
        return []
    return [
        j
        for (j,) in store.query(
            f"SELECT DISTINCT job FROM samples WHERE metric IN ({_marks(metrics)}) AND job IS NOT NULL ORDER BY job",
            list(metrics),
        )
    ]


def label_values_by_host(store: Store, metric: str, label: str) -> list[tuple[str | None, str]]:
    """The distinct values of label ``label`` on ``metric``'s samples, per host: rows ``(host, value)``."""
    return store.query(
        "SELECT DISTINCT host, json_extract_string(labels, ?) AS v FROM samples "
        "WHERE metric = ? AND v IS NOT NULL ORDER BY host, v",
        [f'$."{label}"', metric],
    )


def label_values_any_metric(store: Store, label: str) -> list[tuple[str | None, str]]:
    """The distinct values of label ``label`` per host over every metric that carries it: rows ``(host, value)``.
    The LIKE skips the JSON parse of samples whose labels cannot hold it."""
    return store.query(
        "SELECT DISTINCT host, json_extract_string(labels, ?) AS v FROM samples "
        "WHERE labels LIKE ? AND v IS NOT NULL ORDER BY host, v",
        [f'$."{label}"', f'%"{label}"%'],
    )


def counter_increase(store: Store, metrics: Sequence[str]) -> list[tuple[str, str | None, str, float]]:
    """Per series of ``metrics``: rows ``(metric, host, labels JSON, newest - oldest value)``."""
    if not metrics:
        return []
    return store.query(
        f"SELECT metric, host, labels, arg_max(value, t) - arg_min(value, t) FROM samples "
        f"WHERE metric IN ({_marks(metrics)}) GROUP BY metric, host, labels",
        list(metrics),
    )


def idle_gpu_maxima(
    store: Store, *, util_metric: str, metrics: Sequence[str], idle_below_pct: float
) -> list[tuple[str, str, str, float, int]]:
    """The highest value of each of ``metrics`` per GPU at the scrapes where ``util_metric`` was under
    ``idle_below_pct``: rows ``(host, gpu, metric, max value, idle scrapes)``."""
    if not metrics:
        return []
    return store.query(
        "WITH idle AS (SELECT host, gpu, t FROM samples WHERE metric = ? AND value < ? AND host IS NOT NULL "
        "AND gpu IS NOT NULL) SELECT s.host, s.gpu, s.metric, max(s.value), count(*) FROM samples s "
        f"JOIN idle i ON s.host = i.host AND s.gpu = i.gpu AND s.t = i.t WHERE s.metric IN ({_marks(metrics)}) "
        "GROUP BY s.host, s.gpu, s.metric ORDER BY s.host, s.gpu",
        [util_metric, idle_below_pct, *metrics],
    )


def newest_by_labels(store: Store, metric: str) -> list[tuple[str | None, str, float, float]]:
    """The newest value of each series of ``metric``: rows ``(host, labels JSON, value, t)``."""
    return store.query(
        "SELECT host, labels, arg_max(value, t), max(t) FROM samples WHERE metric = ? "
        "GROUP BY host, labels ORDER BY host",
        [metric],
    )


def step_walls(store: Store, job: str) -> list[tuple[int, float, float]]:
    """Per step of ``job``'s spans: rows ``(step, first start, last end)``, in step order."""
    return store.query(
        "SELECT step, min(start), max(start + dur) FROM spans WHERE job = ? GROUP BY step ORDER BY step", [job]
    )


# -- notices (hpcwatch notify) -------------------------------------------------------------------


def notice_keys(store: Store, notices: Sequence[str]) -> set[str]:
    """Which of these notice keys already have a delivery row (pending or sent): composed before."""
    if not notices:
        return set()
    found: set[str] = set()
    for i in range(0, len(notices), 1000):  # bounded parameter lists
        chunk = list(notices[i : i + 1000])
        found |= {
            n for (n,) in store.query(f"SELECT DISTINCT notice FROM notices WHERE notice IN ({_marks(chunk)})", chunk)
        }
    return found


def pending_notices(store: Store) -> list[NoticeRow]:
    """Deliveries still owed, oldest first (their latest row is ``pending``)."""
    rows = store.query(
        "SELECT key, notice, kind, channel, recipient, state, t, attempts, payload FROM notices "
        "WHERE state = 'pending' ORDER BY t, key"
    )
    return [_notice(row) for row in rows]


def sent_notices(store: Store, *, since: float | None = None) -> list[NoticeRow]:
    """Deliveries done (at or after ``since``, UTC s), in the order they were sent."""
    where, params = ("AND t >= ?", [since]) if since is not None else ("", [])
    rows = store.query(
        "SELECT key, notice, kind, channel, recipient, state, t, attempts, payload FROM notices "
        f"WHERE state = 'sent' {where} ORDER BY t, key",
        params,
    )
    return [_notice(row) for row in rows]


def sent_counts_by_recipient(store: Store, *, since: float) -> dict[str, int]:
    """recipient -> deliveries sent to it at or after ``since`` (UTC s): what a rate limit counts."""
    rows = store.query(
        "SELECT recipient, count(*) FROM notices WHERE state = 'sent' AND t >= ? GROUP BY recipient", [since]
    )
    return {r: int(n) for r, n in rows}


def ended_job_ids(store: Store, *, since: float) -> list[str]:
    """Ids of the jobs that ended at or after ``since`` (UTC s), by end time."""
    return [j for (j,) in store.query('SELECT id FROM jobs WHERE "end" >= ? ORDER BY "end", id', [since])]


def _notice(row: tuple[Any, ...]) -> NoticeRow:
    key, notice, kind, channel, recipient, state, t, attempts, payload = row
    return NoticeRow(
        key=key,
        notice=notice,
        kind=kind,
        channel=channel,
        recipient=recipient,
        state=state,
        t=t,
        attempts=attempts,
        payload=payload,
    )


def verdict_episode_start(store: Store, *, kind: str, node: str, verdict: str, at: float) -> float:
    """When the run of ``kind`` events (``health_verdict``) of ``node`` with ``verdict`` that holds the
    event at ``at`` began: the first such event after the node's last event with another verdict (UTC s).
    A verdict held for longer than any look-back window keeps one start, so it is one episode."""
    rows = store.query(
        "SELECT min(t) FROM events WHERE kind = ? AND json_extract_string(attrs, '$.node') = ? "
        "AND json_extract_string(attrs, '$.verdict') = ? AND t <= ? AND t > coalesce(("
        "SELECT max(t) FROM events WHERE kind = ? AND json_extract_string(attrs, '$.node') = ? "
        "AND json_extract_string(attrs, '$.verdict') <> ? AND t < ?), -1e300)",
        [kind, node, verdict, at, kind, node, verdict, at],
    )
    start = rows[0][0]
    return float(start) if start is not None else at


def verdict_run_starts(store: Store, *, kind: str, verdict: str, limit: int, node: str | None = None) -> list[Event]:
    """The first event of each run of ``kind`` events (``health_verdict``) of one node with ``verdict``, newest
    first, at most ``limit``; with ``node`` its only. A verdict a node keeps over many health runs is one run,
    whatever the number of events stored for it (one a node each run)."""
    where, params = "kind = ?", [kind]
    if node is not None:
        where += " AND json_extract_string(attrs, '$.node') = ?"
        params.append(node)
    rows = store.query(
        "SELECT kind, t, source, attrs FROM (SELECT kind, t, source, attrs, json_extract_string(attrs, '$.verdict') "
        "AS v, lag(json_extract_string(attrs, '$.verdict')) OVER (PARTITION BY json_extract_string(attrs, '$.node') "
        f"ORDER BY t) AS before FROM events WHERE {where}) WHERE v = ? AND before IS DISTINCT FROM v "
        "ORDER BY t DESC LIMIT ?",
        [*params, verdict, int(limit)],
    )
    return [Event(kind=k, t=t, source=src, attrs=orjson.loads(a)) for k, t, src, a in rows]


def ended_job_owners(store: Store, *, t0: float, t1: float) -> list[tuple[str | None, str | None]]:
    """Distinct (user, account) of the jobs that ended in [t0, t1) (UTC s)."""
    rows = store.query(
        'SELECT DISTINCT "user", account FROM jobs WHERE "end" >= ? AND "end" < ? ORDER BY ALL', [t0, t1]
    )
    return [(u, a) for u, a in rows]


def notices_between(
    store: Store, *, since: float | None = None, until: float | None = None, limit: int
) -> list[NoticeRow]:
    """Each delivery's latest row (any state) written in [``since``, ``until``] (UTC s), newest first, at
    most ``limit``: what the page lists as notices sent, owed or failing."""
    where, params = _where_window("t", since, until)
    rows = store.query(
        "SELECT key, notice, kind, channel, recipient, state, t, attempts, payload FROM notices "
        f"{where} ORDER BY t DESC, key LIMIT ?",
        [*params, int(limit)],
    )
    return [_notice(row) for row in rows]


def verdict_changes(
    store: Store, *, kind: str, since: float | None = None, limit: int
) -> list[tuple[str, float, str, str | None]]:
    """The ``kind`` events (``health_verdict``) where a node's verdict changed from its previous one, at or
    after ``since`` (UTC s; a node's first event from then on counts as a change: only that window is read):
    rows ``(node, t, verdict, reason)``, newest first, at most ``limit``. What the page lists as alerts
    firing (warn, drain) and resolved (back to ok)."""
    window, params = ("AND t >= ?", [since]) if since is not None else ("", [])
    return store.query(
        "SELECT node, t, verdict, reason FROM ("
        "SELECT json_extract_string(attrs, '$.node') AS node, t, json_extract_string(attrs, '$.verdict') AS verdict, "
        "json_extract_string(attrs, '$.reason') AS reason, "
        "lag(json_extract_string(attrs, '$.verdict')) OVER (PARTITION BY json_extract_string(attrs, '$.node') "
        f"ORDER BY t) AS before FROM events WHERE kind = ? {window}) "
        "WHERE node IS NOT NULL AND verdict IS DISTINCT FROM before ORDER BY t DESC, node LIMIT ?",
        [kind, *params, int(limit)],
    )


def _where_window(column: str, since: float | None, until: float | None) -> tuple[str, list[Any]]:
    conditions, params = [], []
    if since is not None:
        conditions.append(f"{column} >= ?")
        params.append(since)
    if until is not None:
        conditions.append(f"{column} <= ?")
        params.append(until)
    return ("WHERE " + " AND ".join(conditions) if conditions else ""), params
