"""What the page shows live, read from the store: one snapshot per second for every viewer.

This is a view's read path, not an analysis: latest values, per-second rates of
counters (difference of the last two samples of one series), counts. One
snapshot is computed at most once per ``min_interval_s`` and shared by every
SSE client and API call, so ten open tabs cost one set of queries.

"Now" is the newest sample in the store, not the wall clock, so a store
replayed from yesterday still reads as live data of its own time.

Metric names are the real collectors' (DESIGN §3):

- dcgm-exporter: ``DCGM_FI_DEV_GPU_UTIL`` (%), ``DCGM_FI_DEV_POWER_USAGE`` (W),
  ``DCGM_FI_DEV_FB_USED`` (MiB), ``DCGM_FI_DEV_GPU_TEMP`` (°C);
  https://github.com/NVIDIA/dcgm-exporter/blob/main/etc/default-counters.csv
- node-exporter: ``node_infiniband_port_data_{transmitted,received}_bytes_total``;
  perfquery as read by hpcwatch.sources: ``ib_PortXmitData_bytes``, ``ib_PortRcvData_bytes``
- Lustre job_stats: ``lustre_job_{read,write}_bytes_total`` (label ``jobid``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from hpcwatch.model.cluster import Cluster
from hpcwatch.records import VECTORS
from hpcwatch.store import Store
from hpcwatch.web.i18n import LANGUAGES, finding_text

__all__ = ["LiveView", "Collector", "COLLECTORS", "GPU_FIELDS", "RECENT_S", "DEFAULT_MIN_INTERVAL_S"]

#: Data older than this (relative to the newest sample) does not count as "arriving".
RECENT_S = 60.0
#: Latest values are searched this far back.
LATEST_WINDOW_S = 30.0
#: Counter rates use the last two samples found this far back (collectors scrape every 1-15 s).
RATE_WINDOW_S = 20.0
DEFAULT_MIN_INTERVAL_S = 0.5
MIB = 1024**2

#: dcgm-exporter metric -> (snapshot field, scale to SI units).
GPU_FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("util_pct", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_FB_USED": ("mem_used_bytes", MIB),
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1.0),
}
_IB_TX = ("node_infiniband_port_data_transmitted_bytes_total", "ib_PortXmitData_bytes")
_IB_RX = ("node_infiniband_port_data_received_bytes_total", "ib_PortRcvData_bytes")
_LUSTRE_READ = "lustre_job_read_bytes_total"
_LUSTRE_WRITE = "lustre_job_write_bytes_total"


@dataclass(frozen=True, slots=True, kw_only=True)
class Collector:
    """How to tell, from the store, that a collector's data is arriving."""

    id: str
    metric_prefixes: tuple[str, ...] = ()
    """Metric name prefixes, up to the first underscore (``DCGM`` for ``DCGM_FI_DEV_GPU_UTIL``)."""
    event_kinds: tuple[str, ...] = ()
    """Event kinds as the readers name them (``falco``, ``tetragon``, ``job_start``)."""
    spans: bool = False
    jobs: bool = False
    weights_reads: bool = False
    """Tetragon file hooks on a path under the model's weights directory (security/weights_access.py)."""


COLLECTORS: tuple[Collector, ...] = (
    Collector(id="slurm_exporter", metric_prefixes=("slurm",), event_kinds=("job_start", "job_end"), jobs=True),
    Collector(id="dcgm_exporter", metric_prefixes=("DCGM",), event_kinds=("xid",)),
    Collector(id="node_host", metric_prefixes=("node",), event_kinds=("falco", "tetragon")),
    Collector(id="torch_nccl", metric_prefixes=("train", "nccl"), event_kinds=("nccl_test",), spans=True),
    Collector(id="ib_tools", metric_prefixes=("ib",), event_kinds=("ib_write_bw",)),
    Collector(id="lustre_metrics", metric_prefixes=("lustre",)),
    Collector(id="ebpf_weights", weights_reads=True),
)
#: Tetragon hooks that reveal a file access (same list as hpcwatch.security.weights_access).
WEIGHT_HOOKS = ("security_file_permission", "security_mmap_file", "security_file_open")


class LiveView:
    """Snapshots of the store for the schematic; thread-safe, cached for ``min_interval_s``."""

    def __init__(self, store: Store, cluster: Cluster, *, min_interval_s: float = DEFAULT_MIN_INTERVAL_S,
                 exclude_jobs: Iterable[str] = ()) -> None:
        self.store = store
        self.cluster = cluster
        self.exclude_jobs = tuple(exclude_jobs)
        """Jobs whose spans are not live training (the step player's stored pair)."""
        self.min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._cached: dict[str, Any] | None = None
        self._cached_at = 0.0
        self._latest_t: float | None = None

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            if self._cached is None or time.monotonic() - self._cached_at >= self.min_interval_s:
                self._cached = self._compute()
                self._cached_at = time.monotonic()
            return self._cached

    # -- the snapshot --------------------------------------------------------------------------

    def _compute(self) -> dict[str, Any]:
        started = time.perf_counter()
        now = self._now()
        jobs = self._jobs()
        doc: dict[str, Any] = {
            "t": now,
            "gpus": self._gpus(now, jobs) if now is not None else {},
            "nodes": self._nodes(now) if now is not None else {},
            "storage": self._storage(now, jobs) if now is not None else {"jobs": [], "read_bytes_s": 0.0,
                                                                          "write_bytes_s": 0.0},
            "queue": self._queue(jobs),
            "training": self._training(),
            "collectors": self._collectors(now),
            "vectors": self._vectors(),
            "weights": self._weights(),
        }
        doc["query_ms"] = round((time.perf_counter() - started) * 1000, 2)
        return doc

    def _now(self) -> float | None:
        # Searching from the last known newest time lets DuckDB skip old row groups.
        floor = self._latest_t - 3600 if self._latest_t is not None else None
        sql = "SELECT max(t) FROM samples" + (" WHERE t >= ?" if floor is not None else "")
        (latest,), = self.store.query(sql, [floor] if floor is not None else [])
        if latest is None and floor is not None:
            (latest,), = self.store.query("SELECT max(t) FROM samples")
        self._latest_t = latest if latest is not None else self._latest_t
        return latest

    def _jobs(self) -> dict[str, Any]:
        return {job.id: job for job in self.store.jobs()}

    def _gpus(self, now: float, jobs: dict[str, Any]) -> dict[str, dict[str, Any]]:
        metrics = list(GPU_FIELDS)
        rows = self.store.query(
            f"SELECT metric, host, gpu, arg_max(value, t), arg_max(job, t), max(t) FROM samples "
            f"WHERE metric IN ({', '.join('?' * len(metrics))}) AND t >= ? AND host IS NOT NULL "
            f"AND gpu IS NOT NULL GROUP BY metric, host, gpu", [*metrics, now - LATEST_WINDOW_S])
        out: dict[str, dict[str, Any]] = {}
        for metric, host, gpu, value, job, t in rows:
            field, scale = GPU_FIELDS[metric]
            entry = out.setdefault(f"{host}/{gpu}", {"job": None, "user": None, "account": None, "t": t})
            entry[field] = value * scale
            entry["t"] = max(entry["t"], t)
            if job and (metric == "DCGM_FI_DEV_GPU_UTIL" or entry["job"] is None):
                entry["job"] = job
        for entry in out.values():
            first = (entry["job"] or "").split(",")[0]
            owner = jobs.get(first)
            if owner is not None:
                entry["user"], entry["account"], entry["job_name"] = owner.user, owner.account, owner.name
        return out

    def _rates(self, metrics: Iterable[str], now: float, group: str) -> list[tuple[str, str, float]]:
        """Per-second rate of each counter series (last two samples), summed by metric and ``group``."""
        metrics = list(metrics)
        # arg_max(value, t, 2): the two newest values of each series, newest first (no window sort needed).
        rows = self.store.query(
            f"SELECT metric, g, sum(greatest(v[1] - v[2], 0) / (ts[1] - ts[2])) FROM ("
            f"SELECT metric, {group} AS g, arg_max(value, t, 2) AS v, max(t, 2) AS ts FROM samples "
            f"WHERE metric IN ({', '.join('?' * len(metrics))}) AND t >= ? GROUP BY metric, host, {group}, labels) "
            f"WHERE len(ts) = 2 AND ts[1] > ts[2] GROUP BY metric, g",
            [*metrics, now - RATE_WINDOW_S])
        return [(m, g, float(v)) for m, g, v in rows if g is not None]

    def _nodes(self, now: float) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        rates = self._rates((*_IB_TX, *_IB_RX), now, "host")
        # node-exporter and perfquery may both report a port: prefer node-exporter, do not add them.
        by_host: dict[str, dict[str, float]] = {}
        for metric, host, value in rates:
            by_host.setdefault(host, {})[metric] = value
        for host, found in by_host.items():
            tx = next((found[m] for m in _IB_TX if m in found), 0.0)
            rx = next((found[m] for m in _IB_RX if m in found), 0.0)
            out[host] = {"ib_tx_bytes_s": tx, "ib_rx_bytes_s": rx}
        return out

    def _storage(self, now: float, jobs: dict[str, Any]) -> dict[str, Any]:
        per_job: dict[str, dict[str, Any]] = {}
        for metric, job, value in self._rates((_LUSTRE_READ, _LUSTRE_WRITE), now, "job"):
            entry = per_job.setdefault(job, {"job": job, "read_bytes_s": 0.0, "write_bytes_s": 0.0})
            entry["read_bytes_s" if metric == _LUSTRE_READ else "write_bytes_s"] += value
        for entry in per_job.values():
            owner = jobs.get(entry["job"])
            entry["user"] = owner.user if owner else None
            entry["name"] = owner.name if owner else None
        listed = sorted(per_job.values(), key=lambda e: -(e["read_bytes_s"] + e["write_bytes_s"]))
        return {"jobs": listed[:20], "read_bytes_s": sum(e["read_bytes_s"] for e in listed),
                "write_bytes_s": sum(e["write_bytes_s"] for e in listed)}

    def _queue(self, jobs: dict[str, Any]) -> dict[str, Any]:
        live = [j for j in jobs.values() if j.end is None]
        order = {"RUNNING": 0, "PENDING": 1}
        live.sort(key=lambda j: (order.get(j.state or "", 2), j.id))
        return {"running": sum(j.state == "RUNNING" for j in live),
                "pending": sum(j.state == "PENDING" for j in live),
                "jobs": [{"id": j.id, "name": j.name, "user": j.user, "account": j.account, "state": j.state,
                          "nodes": list(j.nodes), "gpus": j.gpus} for j in live[:50]]}

    def _training(self) -> dict[str, Any] | None:
        skip = f"WHERE job NOT IN ({', '.join('?' * len(self.exclude_jobs))})" if self.exclude_jobs else ""
        rows = self.store.query(f"SELECT job, max(step) FROM spans {skip} GROUP BY job "
                                f"ORDER BY max(start + dur) DESC LIMIT 1", list(self.exclude_jobs))
        if not rows:
            return None
        job, step = rows[0]
        (t0, t1), = self.store.query("SELECT min(start), max(start + dur) FROM spans WHERE job = ? AND step = ?",
                                     [job, step])
        return {"job": job, "step": step, "step_time_s": (t1 - t0) if t0 is not None else None}

    def _collectors(self, now: float | None) -> dict[str, dict[str, Any]]:
        """One grouped scan per table, then each collector sums the groups it owns."""
        since = (now if now is not None else time.time()) - RECENT_S
        by_prefix: dict[str, tuple[int, float | None]] = {}
        for metric, n, t in self.store.query("SELECT metric, count(*), max(t) FROM samples WHERE t >= ? GROUP BY 1",
                                             [since]):
            old_n, old_t = by_prefix.get(metric.split("_", 1)[0], (0, None))
            by_prefix[metric.split("_", 1)[0]] = (old_n + n, _later(old_t, t))
        events = {k: (n, t) for k, n, t in self.store.query(
            "SELECT kind, count(*), max(t) FROM events WHERE t >= ? GROUP BY 1", [since])}
        weights = self.store.query(
            f"SELECT count(*), max(t) FROM events WHERE t >= ? AND kind = 'tetragon' "
            f"AND json_extract_string(attrs, '$.function_name') IN ({', '.join('?' * len(WEIGHT_HOOKS))}) "
            f"AND starts_with(json_extract_string(attrs, '$.path'), ?)",
            [since, *WEIGHT_HOOKS, self.cluster.weights.path.rstrip("/") + "/"])[0]
        skip = f" AND job NOT IN ({', '.join('?' * len(self.exclude_jobs))})" if self.exclude_jobs else ""
        (span_n, span_t), = self.store.query(f"SELECT count(*), max(start + dur) FROM spans WHERE start >= ?{skip}",
                                             [since, *self.exclude_jobs])
        (live_jobs,), = self.store.query('SELECT count(*) FROM jobs WHERE "end" IS NULL')
        out = {}
        for c in COLLECTORS:
            count, last = 0, None
            for prefix in c.metric_prefixes:
                n, t = by_prefix.get(prefix, (0, None))
                count, last = count + n, _later(last, t)
            for kind in c.event_kinds:
                n, t = events.get(kind, (0, None))
                count, last = count + n, _later(last, t)
            if c.weights_reads:
                count, last = count + weights[0], _later(last, weights[1])
            if c.spans:
                count, last = count + span_n, _later(last, span_t)
            if c.jobs:
                count += live_jobs
            out[c.id] = {"arriving": count > 0, "count": count, "last_t": last}
        return out

    def _vectors(self) -> dict[str, dict[str, Any]]:
        """Per vector: count and latest finding; ``text`` is its title in each page language (web/i18n.py)."""
        rows = self.store.query("SELECT vector, count(*), max(t), arg_max(title, t), arg_max(severity, t), "
                                "arg_max(target, t), arg_max(rule, t), arg_max(evidence, t) FROM findings "
                                "GROUP BY vector")
        found = {v: {"findings": n, "last_t": t, "title": title, "severity": sev, "target": target, "rule": rule,
                     "text": _texts(rule, evidence, target, t)}
                 for v, n, t, title, sev, target, rule, evidence in rows}
        empty = {"findings": 0, "last_t": None, "title": None, "severity": None, "target": None, "rule": None,
                 "text": None}
        return {v: found.get(v, dict(empty)) for v in VECTORS}

    def _weights(self) -> dict[str, Any]:
        rows = self.store.query("SELECT count(*), max(t) FROM events WHERE kind LIKE '%checkpoint%'")
        (n, last), = rows
        return {"checkpoint_events": n, "last_checkpoint_t": last}


def _texts(rule: str | None, evidence: str | None, target: str | None, t: float | None) -> dict[str, str] | None:
    """A finding's title in every page language, or None when its rule has no template (the page then
    shows the detector's English ``title``)."""
    try:
        fields = orjson.loads(evidence) if evidence else {}
    except orjson.JSONDecodeError:
        fields = {}
    texts = {lang: finding_text(rule, fields if isinstance(fields, dict) else {}, target=target, t=t, lang=lang)
             for lang in LANGUAGES}
    return None if any(v is None for v in texts.values()) else texts


def _later(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else max(a, b)
