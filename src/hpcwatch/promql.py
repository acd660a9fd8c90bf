"""The PromQL backend: read samples from Prometheus (or VictoriaMetrics) over its HTTP API.

Why: at 128+ nodes the samples already live in a Prometheus that scrapes dcgm-exporter and
node-exporter; copying them into the embedded store would double the work. This module turns
the HTTP API's answers into the same columnar table ``Store.samples()`` returns
(``store.SAMPLE_SCHEMA``: metric, t, value, host, gpu, job, labels), so every analysis reads
either backend unchanged.

    Store.samples(metric, host=, job=, t0=, t1=)  ──┐
                                                    ├─> pyarrow table, SAMPLE_SCHEMA
    PrometheusBackend.samples(metric, ...)        ──┘   (raw scraped points, ordered alike)

``samples()`` asks for a range-vector selector (``m[Ns]`` evaluated at ``t1``), which Prometheus
answers with the raw scraped points, not with resampled ones: the same rows the store holds after
ingesting the same scrapes. ``query_range()`` returns Prometheus' evaluation grid instead.

The labels column holds every label Prometheus returns except ``__name__``, including the
``instance`` and ``job`` (scrape job) labels Prometheus adds; the ``job`` *column* is the Slurm
job (``hpc_job``), never the scrape job. The HTTP client is injectable (``client=``) so tests run
against ``httpx.MockTransport``. API reference: https://prometheus.io/docs/prometheus/2.42/querying/api/
"""

from __future__ import annotations

import struct
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from hpcwatch.errors import BackendError
from hpcwatch.records import Sample
from hpcwatch.schemas import SAMPLE_SCHEMA, sample_keys

__all__ = [
    "PrometheusBackend",
    "PromConfig",
    "result_table",
    "safe_url",
    "server_time",
    "newest_scrape_t",
    "counter_rate",
    "prefix_activity",
    "prefix_selector",
    "encode_remote_write",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_LOOKBACK_S",
    "HOST_LABEL",
    "JOB_LABEL",
]

DEFAULT_TIMEOUT_S = 10.0
"""Per request; a PromQL query over a day of 1,000 GPUs answers in well under this."""
DEFAULT_LOOKBACK_S = 3600.0
"""``samples()`` without ``t0``: the last hour, like a dashboard's default range."""
HOST_LABEL = "Hostname"
"""dcgm-exporter's host label (``hostname`` in newer releases; both are tried)."""
JOB_LABEL = "hpc_job"
"""dcgm-exporter's job label, set from the --hpc-job-mapping-dir files."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PromConfig:
    url: str
    """Base URL of the Prometheus HTTP API, e.g. http://127.0.0.1:9090 (no /api/v1)."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Seconds per request."""

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise BackendError(f"prometheus url must be http(s)://host:port, got {safe_url(self.url)!r}")
        if self.timeout_s <= 0:
            raise BackendError(f"timeout_s must be > 0, got {self.timeout_s}")

    def __repr__(self) -> str:
        return f"PromConfig(url={safe_url(self.url)!r}, timeout_s={self.timeout_s})"


class PrometheusBackend:
    """Samples from a Prometheus HTTP API as ``SAMPLE_SCHEMA`` tables."""

    def __init__(self, url: str, *, client: httpx.Client | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.config = PromConfig(url=url.rstrip("/"), timeout_s=timeout_s)
        self._client = client or httpx.Client(timeout=timeout_s, trust_env=False)
        self._owns_client = client is None

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> PrometheusBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PrometheusBackend({safe_url(self.config.url)!r})"

    # -- raw API ---------------------------------------------------------------------------------

    def api(self, endpoint: str, params: Mapping[str, Any]) -> dict:
        """``data`` of one API call (POST form, so long selectors fit); BackendError otherwise."""
        url = f"{self.config.url}/api/v1/{endpoint}"
        try:
            response = self._client.post(
                url, data={k: str(v) for k, v in params.items()}, timeout=self.config.timeout_s
            )
        except httpx.HTTPError as err:
            raise BackendError(f"{safe_url(url)}: {type(err).__name__}: {err}") from err
        try:
            body = orjson.loads(response.content)
        except orjson.JSONDecodeError as err:
            raise BackendError(
                f"{safe_url(url)}: HTTP {response.status_code}, not JSON: {response.text[:120]!r}"
            ) from err
        if not isinstance(body, dict) or body.get("status") != "success":
            what = body.get("error", body) if isinstance(body, dict) else body
            kind = body.get("errorType", "error") if isinstance(body, dict) else "error"
            raise BackendError(f"{safe_url(url)}: HTTP {response.status_code} {kind}: {what}")
        return body["data"]

    def label_values(
        self, label: str, *, match: Iterable[str] = (), t0: float | None = None, t1: float | None = None
    ) -> list[str]:
        """Values ``label`` takes in series matching ``match`` between ``t0`` and ``t1`` (GET: the endpoint
        takes no form body in Prometheus 2.42). Answered from the index, not the samples: cheap at any size."""
        params: list[tuple[str, str]] = [("match[]", m) for m in match]
        params += [(k, _ts(v)) for k, v in (("start", t0), ("end", t1)) if v is not None]
        url = f"{self.config.url}/api/v1/label/{label}/values"
        try:
            # a tuple: httpx reads it as the list, and its pairs type is covariant (a list of str pairs is not one)
            response = self._client.get(url, params=tuple(params), timeout=self.config.timeout_s)
        except httpx.HTTPError as err:
            raise BackendError(f"{safe_url(url)}: {type(err).__name__}: {err}") from err
        try:
            body = orjson.loads(response.content)
        except orjson.JSONDecodeError as err:
            raise BackendError(f"{safe_url(url)}: HTTP {response.status_code}, not JSON") from err
        if not isinstance(body, dict) or body.get("status") != "success" or not isinstance(body.get("data"), list):
            raise BackendError(
                f"{safe_url(url)}: HTTP {response.status_code}: "
                f"{body.get('error', body) if isinstance(body, dict) else body}"
            )
        return [str(v) for v in body["data"]]

    # -- tables ------------------------------------------------------------------------------------

    def query(self, promql: str, *, t: float | None = None, name: str | None = None) -> pa.Table:
        """An instant query; ``name`` is the metric column for results without ``__name__``."""
        params: dict[str, Any] = {"query": promql}
        if t is not None:
            params["time"] = _ts(t)
        return result_table(self.api("query", params), name=name or promql)

    def query_range(self, promql: str, *, t0: float, t1: float, step_s: float, name: str | None = None) -> pa.Table:
        """A range query on Prometheus' evaluation grid (t0, t0+step, ... t1)."""
        if step_s <= 0 or t1 < t0:
            raise BackendError(f"query_range needs t0 <= t1 and step_s > 0, got {t0}, {t1}, {step_s}")
        data = self.api("query_range", {"query": promql, "start": _ts(t0), "end": _ts(t1), "step": step_s})
        return result_table(data, name=name or promql)

    def samples(
        self,
        metric: str | Iterable[str] | None = None,
        *,
        host: str | None = None,
        job: str | None = None,
        t0: float | None = None,
        t1: float | None = None,
        now: float | None = None,
    ) -> pa.Table:
        """The raw scraped points, like ``Store.samples()`` (same filters, same order).

        ``t1`` defaults to ``now`` (else Prometheus' own now), ``t0`` to ``DEFAULT_LOOKBACK_S``
        before ``t1``. ``metric=None`` means every metric with an ``hpc_job``, ``Hostname`` or
        ``hostname`` label: Prometheus refuses an empty selector. VictoriaMetrics answers the
        same calls (see docs/usage.md for what differs).
        """
        end = t1 if t1 is not None else now
        if end is None:
            end = float(self.query("time()")["value"][0].as_py())
        start = t0 if t0 is not None else end - DEFAULT_LOOKBACK_S
        # +1 ms: VictoriaMetrics' range m[d] is (t-d, t], Prometheus 2.42's [t-d, t]; one ms wider
        # plus the t >= start filter below gives both backends the store's closed [t0, t1].
        window_ms = max(1, int(round((end - start) * 1000))) + 1
        queries = [f"{sel}[{window_ms}ms]" for sel in _selectors(metric, host=host, job=job)]
        table = (
            pa.concat_tables(
                [result_table(self.api("query", {"query": q, "time": _ts(end)}), name="") for q in queries]
            )
            if queries
            else SAMPLE_SCHEMA.empty_table()
        )
        table = table.filter(pc.greater_equal(table["t"], start))
        # VictoriaMetrics 1.79 returns Prometheus' staleness markers (a series gone from a scrape, e.g. when
        # the prolog adds hpc_job) as NaN points; Prometheus never returns them. JSON cannot tell a marker
        # from a scraped NaN, and a NaN point only turns a mean into NaN, so neither reaches an analysis.
        table = table.filter(pc.invert(pc.is_nan(table["value"])))
        if host is not None:  # one selector per host label name: a series may match both
            table = table.filter(pc.equal(table["host"], host))
        return _sorted(_dedup(table) if len(queries) > 1 else table)

    # -- writing -----------------------------------------------------------------------------------

    def write(self, samples: Iterable[Sample]) -> int:
        """Push samples through the remote-write API (Prometheus needs --web.enable-remote-write-receiver).

        Returns the number of series sent. Prometheus refuses points older than a series' newest
        one, so send each series in time order.
        """
        body, series = encode_remote_write(samples)
        url = f"{self.config.url}/api/v1/write"
        headers = {
            "Content-Encoding": "snappy",
            "Content-Type": "application/x-protobuf",
            "X-Prometheus-Remote-Write-Version": "0.1.0",
        }
        try:
            response = self._client.post(url, content=body, headers=headers, timeout=self.config.timeout_s)
        except httpx.HTTPError as err:
            raise BackendError(f"{safe_url(url)}: {type(err).__name__}: {err}") from err
        if response.status_code // 100 != 2:
            raise BackendError(f"{safe_url(url)}: HTTP {response.status_code}: {response.text.strip()[:200]}")
        return series


# -- named questions: the PromQL the live view asks (as store/queries.py holds the SQL) -----------------


def server_time(prom: PrometheusBackend) -> float:
    """Prometheus' own clock: the cheapest call that proves the server answers PromQL."""
    return float(prom.query("time()")["value"][0].as_py())


def newest_scrape_t(prom: PrometheusBackend) -> float | None:
    """The newest scrape of any target (``up`` is written at every scrape, answered or not)."""
    table = prom.query("max(timestamp(up))", name="up")
    return float(table["value"][0].as_py()) if table.num_rows else None


def counter_rate(prom: PrometheusBackend, metric: str, *, window_s: float) -> pa.Table:
    """``rate(metric[window])`` per series (Prometheus' extrapolated rate; resets handled by it)."""
    return prom.query(f"rate({metric}[{max(1, int(window_s))}s])", name=metric)


def prefix_activity(prom: PrometheusBackend, prefixes: Iterable[str]) -> list[tuple[str, int, float]]:
    """Per metric-name prefix with series in Prometheus' look-back (5 min by default):
    ``(prefix, series, newest point's t)``. Two requests: the series per name (an aggregation, which keeps
    ``__name__``), then ``timestamp()`` of each prefix's biggest name. ``timestamp()`` and ``*_over_time``
    drop ``__name__``, so over several names they fail ("vector cannot contain metrics with the same
    labelset"): each is asked of one name, tagged with ``label_replace``, the parts joined with ``or``."""
    prefixes = list(prefixes)
    per_name = prom.query(f"count by (__name__) ({prefix_selector(prefixes)})", name="")
    series: dict[str, int] = {}
    biggest: dict[str, tuple[int, str]] = {}
    for name, n in zip(per_name["metric"].to_pylist(), per_name["value"].to_pylist()):  # __name__ is the column
        prefix = name.split("_", 1)[0]
        series[prefix] = series.get(prefix, 0) + int(n)
        biggest[prefix] = max(biggest.get(prefix, (0, "")), (int(n), name))
    if not biggest:
        return []
    parts = [
        f'label_replace(max(timestamp({name})), "prefix", "{_quote(p)}", "", "")'
        for p, (_, name) in sorted(biggest.items())
    ]
    newest = prom.query(" or ".join(parts), name="")
    last = dict(zip(_tag(newest, "prefix"), newest["value"].to_pylist()))
    return [(p, series[p], float(last[p])) for p in sorted(last) if p in series]


def prefix_selector(prefixes: Iterable[str]) -> str:
    """Every series whose name starts with one of ``prefixes`` and an underscore."""
    return '{__name__=~"(' + "|".join(_re_escape(p) for p in prefixes) + ')_.+"}'


def _tag(table: pa.Table, label: str) -> list[str]:
    return [orjson.loads(text).get(label, "") for text in table["labels"].to_pylist()]


def result_table(data: Mapping[str, Any], *, name: str = "") -> pa.Table:
    """One API ``data`` object (vector, matrix or scalar) as a ``SAMPLE_SCHEMA`` table."""
    kind = data.get("resultType")
    result = data.get("result")
    if kind == "scalar":
        result = [{"metric": {}, "value": result}]
        kind = "vector"
    if kind not in ("vector", "matrix") or not isinstance(result, list):
        raise BackendError(f"unexpected PromQL result type {kind!r}")
    per_series: dict[str, list] = {field: [] for field in ("metric", "host", "gpu", "job", "labels")}
    t: list[float] = []
    value: list[str | float] = []
    lengths: list[int] = []
    for series in result:
        labels = dict(series.get("metric") or {})
        metric = labels.pop("__name__", None) or name
        host, gpu, job = sample_keys(labels, metric)
        for column, v in (
            ("metric", metric),
            ("host", host),
            ("gpu", gpu),
            ("job", job),
            ("labels", orjson.dumps(labels, option=orjson.OPT_SORT_KEYS).decode()),
        ):
            per_series[column].append(v)
        points = series["values"] if kind == "matrix" else [series["value"]]
        lengths.append(len(points))
        t.extend([p[0] for p in points])
        value.extend([p[1] for p in points])
    import numpy as np  # here, not at the top: remote write (ingest --remote-write) needs none of it

    # Label columns are built once per series and repeated in Arrow (a scrape's series has many points);
    # values parse in numpy ("NaN", "+Inf" as float() reads them).
    row_series = pa.array(np.repeat(np.arange(len(lengths)), lengths))
    columns = {column: pa.array(values, pa.string()).take(row_series) for column, values in per_series.items()}
    columns["t"] = pa.array(np.asarray(t, dtype=float))
    columns["value"] = pa.array(np.asarray(value, dtype=float))
    return pa.table([columns[f] for f in SAMPLE_SCHEMA.names], schema=SAMPLE_SCHEMA)


def _selectors(metric: str | Iterable[str] | None, *, host: str | None, job: str | None) -> list[str]:
    """Series selectors for the filters; several when one filter can sit on several label names."""
    if metric is None:
        names = ['__name__=~".+"']
    else:
        metrics = [metric] if isinstance(metric, str) else list(metric)
        if not metrics:
            return []
        names = [f'__name__=~"{"|".join(_re_escape(m) for m in metrics)}"']
    base = names + ([f'{JOB_LABEL}="{_quote(job)}"'] if job is not None else [])
    hosts = [[f'{label}="{_quote(host)}"'] for label in (HOST_LABEL, "hostname")] if host is not None else [[]]
    if metric is None and job is None and host is None:
        hosts = [[f'{label}!=""'] for label in (JOB_LABEL, HOST_LABEL, "hostname")]
    return ["{" + ", ".join(base + extra) + "}" for extra in hosts]


def _dedup(table: pa.Table) -> pa.Table:
    """Drop rows fetched twice (a series matched by two selectors)."""
    if table.num_rows == 0:
        return table
    return table.group_by(SAMPLE_SCHEMA.names, use_threads=False).aggregate([]).select(SAMPLE_SCHEMA.names)


def _sorted(table: pa.Table) -> pa.Table:
    """Store.samples() order: metric, host, gpu, t (nulls last, as DuckDB does)."""
    keys = ("metric", "host", "gpu", "t")
    try:  # pyarrow >= 25 takes the null placement per key
        return table.sort_by([(k, "ascending", "at_end") for k in keys]).cast(SAMPLE_SCHEMA)
    except (TypeError, ValueError, pa.ArrowException):
        return table.sort_by([(k, "ascending") for k in keys], null_placement="at_end").cast(SAMPLE_SCHEMA)


def _ts(t: float) -> str:
    return f"{t:.3f}"


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _re_escape(name: str) -> str:
    # Metric names are [a-zA-Z_:][a-zA-Z0-9_:]*: nothing to escape but be safe against odd input.
    return "".join(c if c.isalnum() or c in "_:" else "\\\\" + c for c in name)


def safe_url(url: str) -> str:
    """The URL without user:password, for messages and repr."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


# -- remote write: protobuf by hand, snappy as literals ------------------------------------------
# The message is prometheus/prompb WriteRequest{timeseries=1: TimeSeries{labels=1: Label{name=1, value=2},
# samples=2: Sample{value=1 (double), timestamp=2 (int64 ms)}}}, snappy block-compressed
# (https://prometheus.io/docs/concepts/remote_write_spec/). A snappy block made only of literals is
# valid (https://github.com/google/snappy/blob/main/format_description.txt): no compressor needed.

_SNAPPY_LITERAL_MAX = 65536  # tag 61: literal length-1 in the next two bytes


def encode_remote_write(samples: Iterable[Sample]) -> tuple[bytes, int]:
    """(snappy-framed WriteRequest, number of series) for the samples, grouped into series."""
    series: dict[tuple[tuple[str, str], ...], list[tuple[float, int]]] = defaultdict(list)
    for s in samples:
        key = tuple(sorted({**{k: str(v) for k, v in s.labels.items()}, "__name__": s.metric}.items()))
        series[key].append((float(s.value), int(round(s.t * 1000))))
    message = bytearray()
    for labels, points in series.items():
        body = bytearray()
        for name, value in labels:
            body += _field(1, _field(1, name.encode()) + _field(2, value.encode()))
        for number, t_ms in sorted(points, key=lambda p: p[1]):
            body += _field(2, b"\x09" + struct.pack("<d", number) + b"\x10" + _varint(t_ms))
        message += _field(1, bytes(body))
    return _snappy_literals(bytes(message)), len(series)


def _varint(n: int) -> bytes:
    if n < 0:
        n &= (1 << 64) - 1  # int64 two's complement, as protobuf encodes negatives
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _snappy_literals(data: bytes) -> bytes:
    out = bytearray(_varint(len(data)))
    for i in range(0, len(data), _SNAPPY_LITERAL_MAX):
        chunk = data[i : i + _SNAPPY_LITERAL_MAX]
        out += bytes([61 << 2]) + struct.pack("<H", len(chunk) - 1) + chunk
    return bytes(out)
