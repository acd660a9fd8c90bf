"""Who used what: every GPU sample to a job, a user and an account, and a per-job efficiency report.

Attribution, in order of trust:

1. the sample's ``hpc_job`` label (dcgm-exporter's job mapping; the store's ``job`` column);
2. else the Slurm allocation: the job whose ``gpus_by_node`` holds that host's GPU and that ran
   at the sample's time. A sample at t stands for the interval (t - dt, t] before it, so the
   test is ``start < t <= end`` (``end`` None: still running).

The job report follows Princeton's jobstats (GPU utilisation per GPU, memory high-water mark,
energy) and adds what a training cluster needs: InfiniBand bytes, Lustre bytes, XID errors and
GPUs held but never used::

    GPU util  |####|####|####|        job 4101, node1/0  -> busy
              |    |    |    |        job 4104, node2/7  -> allocated but idle (max util < 1 %)
              t0   t1   t2   t3       each sample covers the interval ending at it

Counters (energy, IB bytes) are turned into deltas between consecutive samples of one series; a
delta belongs to the job of the later sample. The first sample of a series has no delta, so a
job's energy is what was measured, not what it may have used before monitoring began. GPU-hours
come from the allocation (GPUs x elapsed), as Slurm and jobstats count them.

Input: a pyarrow table with the store's sample columns (``hpcwatch.store.SAMPLE_SCHEMA``:
metric, t [UTC s], value, host, gpu, job, labels [JSON]) and ``records.Job``s. Pure: no store,
no printing.

jobstats: https://github.com/PrincetonUniversity/jobstats
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import orjson
import pyarrow as pa

from hpcwatch.records import Job
from hpcwatch import vocab

__all__ = [
    "GpuReport",
    "JobReport",
    "attribute",
    "job_reports",
    "report_dict",
    "DCGM_METRICS",
    "IB_METRICS",
    "LUSTRE_METRICS",
    "REPORT_METRICS",
    "IDLE_UTIL_PCT",
]

UTIL, FB, POWER, ENERGY, XID, TENSOR = (
    vocab.DCGM_FI_DEV_GPU_UTIL, vocab.DCGM_FI_DEV_FB_USED, vocab.DCGM_FI_DEV_POWER_USAGE,
    vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, vocab.DCGM_FI_DEV_XID_ERRORS, vocab.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)
#: dcgm-exporter fields the report reads (https://github.com/NVIDIA/dcgm-exporter/blob/main/etc/default-counters.csv).
DCGM_METRICS = (UTIL, FB, POWER, ENERGY, XID, TENSOR)
IB_TX = vocab.NODE_INFINIBAND_PORT_DATA_TRANSMITTED_BYTES_TOTAL
IB_RX = vocab.NODE_INFINIBAND_PORT_DATA_RECEIVED_BYTES_TOTAL
#: node-exporter's InfiniBand data counters (octets).
IB_METRICS = (IB_TX, IB_RX)
LUSTRE_READ, LUSTRE_WRITE = vocab.LUSTRE_JOB_READ_BYTES_TOTAL, vocab.LUSTRE_JOB_WRITE_BYTES_TOTAL
#: Lustre job_stats as the readers name them (labels jobid, target).
LUSTRE_METRICS = (LUSTRE_READ, LUSTRE_WRITE)
REPORT_METRICS = DCGM_METRICS + IB_METRICS + LUSTRE_METRICS
#: A GPU whose utilisation never reached 1 % during the job was allocated but idle (jobstats flags 0 %).
IDLE_UTIL_PCT = 1.0
MIB = 1024**2
MJ_PER_KWH = 3.6e9


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuReport:
    host: str
    gpu: str
    samples: int
    mean_util_pct: float | None
    max_util_pct: float | None
    mean_tensor_active: float | None
    max_fb_used_bytes: int | None
    mean_power_w: float | None
    energy_kwh: float
    xid_errors: int
    idle: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class JobReport:
    id: str
    user: str | None
    account: str | None
    partition: str | None
    name: str | None
    state: str | None
    nodes: tuple[str, ...]
    gpus: int
    start: float | None
    end: float | None
    elapsed_s: float
    gpu_hours: float
    """GPUs x elapsed (allocation), hours."""
    energy_kwh: float
    """Measured: sum of the GPUs' energy-counter deltas while the job held them."""
    mean_gpu_util: float | None
    mean_tensor_active: float | None
    max_fb_used_bytes: int | None
    mean_power_w: float | None
    ib_tx_bytes: int
    ib_rx_bytes: int
    lustre_read_bytes: int
    lustre_write_bytes: int
    xid_errors: int
    idle_gpus: int
    """GPUs the job held whose utilisation never reached IDLE_UTIL_PCT."""
    per_gpu: tuple[GpuReport, ...]

    @property
    def ib_bytes(self) -> int:
        return self.ib_tx_bytes + self.ib_rx_bytes

    @property
    def lustre_bytes(self) -> int:
        return self.lustre_read_bytes + self.lustre_write_bytes


# -- columnar helpers -----------------------------------------------------------------------------

def _column(table: pa.Table, name: str) -> np.ndarray:
    return np.asarray(table.column(name).to_pylist(), dtype=object)


def _host_of(host: object, labels: str) -> str | None:
    """host column, else node-exporter's target labels (node, or instance without the port)."""
    if host:
        return str(host)
    try:
        parsed = orjson.loads(labels) if labels else {}
    except orjson.JSONDecodeError:
        return None
    if parsed.get("node"):
        return str(parsed["node"])
    instance = parsed.get("instance")
    return str(instance).rsplit(":", 1)[0] if instance else None


def attribute(host: np.ndarray, gpu: np.ndarray, t: np.ndarray, job: np.ndarray,
              jobs: Sequence[Job]) -> np.ndarray:
    """Job id per sample: the ``job`` (hpc_job) value when set, else the Slurm allocation (see module doc).

    ``host``, ``gpu``, ``job`` are object arrays (None where unknown), ``t`` UTC seconds.
    """
    out = np.array(job, dtype=object, copy=True)
    missing = np.array([v is None or v == "" for v in out.tolist()], dtype=bool)
    if not missing.any():
        return out
    index: dict[tuple[str, str], list[int]] = {}
    for i in np.flatnonzero(missing).tolist():
        index.setdefault((host[i], gpu[i]), []).append(i)
    for j in jobs:
        if j.start is None:
            continue
        end = np.inf if j.end is None else j.end
        for node, gpus in j.gpus_by_node.items():
            for g in gpus:
                rows = index.get((node, str(g)))
                if not rows:
                    continue
                rows_a = np.array(rows)
                hit = rows_a[(t[rows_a] > j.start) & (t[rows_a] <= end)]
                out[hit] = j.id
    return out


# -- the report ------------------------------------------------------------------------------------

@dataclass(slots=True)
class _Acc:
    energy_mj: float = 0.0
    util_sum: float = 0.0
    util_n: int = 0
    tensor_sum: float = 0.0
    tensor_n: int = 0
    power_sum: float = 0.0
    power_n: int = 0
    fb_max: float | None = None
    util_max: float | None = None
    xid: int = 0
    ib_tx: float = 0.0
    ib_rx: float = 0.0


def _dcgm_frame(samples: pa.Table, jobs: Sequence[Job]) -> dict[str, np.ndarray]:
    metric = _column(samples, "metric")
    keep = np.isin(metric.astype(str), np.array(DCGM_METRICS))
    sub = samples.filter(pa.array(keep)) if len(keep) else samples
    f = {name: _column(sub, name) for name in ("metric", "host", "gpu", "job")}
    f["t"] = np.asarray(sub.column("t").to_numpy(zero_copy_only=False), dtype=float)
    f["value"] = np.asarray(sub.column("value").to_numpy(zero_copy_only=False), dtype=float)
    f["job"] = attribute(f["host"], f["gpu"], f["t"], f["job"], jobs)
    order = np.lexsort((f["t"], f["gpu"].astype(str), f["host"].astype(str), f["metric"].astype(str)))
    return {k: v[order] for k, v in f.items()}


def _codes(values: np.ndarray) -> tuple[np.ndarray, list]:
    """Integer code per row (-1 for None) and the distinct values, by pyarrow's dictionary encoding."""
    encoded = pa.array(values.tolist(), type=pa.string()).dictionary_encode()
    codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, encoded.dictionary.to_pylist()


def _accumulate_dcgm(f: dict[str, np.ndarray],
                     acc: dict[tuple[str, str, str], _Acc]) -> dict[tuple[str, str, float], str | None]:
    """Fill per (job, host, gpu) accumulators, vectorised; return the job (or None) holding (host, gpu) at
    each utilisation sample time (the IB attribution looks jobs up there)."""
    if not len(f["t"]):
        return {}
    series_of = np.array([f"{h}\x1f{g}" for h, g in zip(f["host"].tolist(), f["gpu"].tolist())], dtype=object)
    series, series_names = _codes(series_of)
    job, job_names = _codes(f["job"])
    metric = f["metric"]
    # Rows are sorted by (metric, host, gpu, t): a row starts a series when its metric or series changes.
    first = np.ones(len(series), dtype=bool)
    first[1:] = (series[1:] != series[:-1]) | (metric[1:] != metric[:-1])
    held = job >= 0
    cell_of = np.where(held, job * max(len(series_names), 1) + series, -1)
    cells, inverse = np.unique(cell_of[held], return_inverse=True)
    cell = np.full(len(series), -1, dtype=np.int64)
    cell[held] = inverse
    n = len(cells)
    value = f["value"]

    def rows(name: str) -> np.ndarray:
        return np.flatnonzero((metric == name) & held)

    def total(name: str, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        r = rows(name)
        return (np.bincount(cell[r], weights=value[r] if weights is None else weights[r], minlength=n),
                np.bincount(cell[r], minlength=n))

    def highest(name: str) -> np.ndarray:
        out = np.full(n, np.nan)
        r = rows(name)
        np.fmax.at(out, cell[r], value[r])
        return out

    util_sum, util_n = total(UTIL)
    tensor_sum, tensor_n = total(TENSOR)
    power_sum, power_n = total(POWER)
    util_max, fb_max = highest(UTIL), highest(FB)
    # Energy: deltas of the counter inside a series; a negative one is a reset (driver reload): skipped.
    delta = np.diff(value, prepend=np.nan)
    energy_ok = ~first & (delta >= 0)
    energy, _ = total(ENERGY, np.where(energy_ok, delta, 0.0))
    # XID: a new non-zero value of the "last XID" gauge is one more error.
    previous = np.where(first, 0.0, np.concatenate([[0.0], value[:-1]]))
    xid, _ = total(XID, ((value != 0) & (value != previous)).astype(float))
    for k, code in enumerate(cells.tolist()):
        job_id = job_names[code // max(len(series_names), 1)]
        host, gpu = series_names[code % max(len(series_names), 1)].split("\x1f")
        acc[(job_id, host, gpu)] = _Acc(
            energy_mj=float(energy[k]), util_sum=float(util_sum[k]), util_n=int(util_n[k]),
            tensor_sum=float(tensor_sum[k]), tensor_n=int(tensor_n[k]), power_sum=float(power_sum[k]),
            power_n=int(power_n[k]), fb_max=None if np.isnan(fb_max[k]) else float(fb_max[k]),
            util_max=None if np.isnan(util_max[k]) else float(util_max[k]), xid=int(xid[k]))
    u = np.flatnonzero(metric == UTIL)
    # Free GPUs too (job None): the rail map needs every GPU of a host.
    return dict(zip(zip(f["host"][u].tolist(), f["gpu"][u].tolist(), f["t"][u].tolist()), f["job"][u].tolist()))


def _accumulate_ib(samples: pa.Table, holder: dict[tuple[str, str, float], str | None],
                   acc: dict[tuple[str, str, str], _Acc]) -> None:
    """IB deltas of port mlx5_h go to the jobs on the GPUs of rail h (g * H // G == h), split equally."""
    metric = _column(samples, "metric").astype(str)
    keep = np.isin(metric, np.array(IB_METRICS))
    if not keep.any():
        return
    sub = samples.filter(pa.array(keep))
    hosts = [_host_of(h, lab) for h, lab in zip(sub.column("host").to_pylist(), sub.column("labels").to_pylist())]
    devices = [orjson.loads(lab).get("device", "") if lab else "" for lab in sub.column("labels").to_pylist()]
    ts = sub.column("t").to_pylist()
    values = sub.column("value").to_pylist()
    names = sub.column("metric").to_pylist()
    gpus_of_host: dict[str, set[str]] = {}
    for host, gpu, t in holder:
        gpus_of_host.setdefault(host, set()).add(gpu)
    hcas_of_host: dict[str, set[str]] = {}
    for host, dev in zip(hosts, devices):
        if host:
            hcas_of_host.setdefault(host, set()).add(dev)
    series: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for name, host, dev, t, v in zip(names, hosts, devices, ts, values):
        if host:
            series.setdefault((name, host, dev), []).append((t, v))
    for (name, host, dev), points in series.items():
        rails = _rail_gpus(dev, len(hcas_of_host.get(host, ())), sorted(gpus_of_host.get(host, ()), key=_num))
        if not rails:
            continue
        points.sort()
        for (t_prev, v_prev), (t, v) in zip(points, points[1:]):
            delta = v - v_prev
            if delta < 0:
                continue
            share = delta // len(rails)
            for gpu in rails:
                job = holder.get((host, gpu, t))
                if job is None:
                    continue
                a = acc.setdefault((job, host, gpu), _Acc())
                if name == IB_TX:
                    a.ib_tx += share
                else:
                    a.ib_rx += share


def _num(text: str) -> tuple[int, str]:
    m = re.match(r"\d+", text)
    return (int(m.group()), text) if m else (1 << 30, text)


def _rail_gpus(device: str, hcas: int, gpus: list[str]) -> list[str]:
    m = re.search(r"(\d+)$", device)
    if not m or not hcas or not gpus:
        return []
    h = int(m.group(1))
    return [g for g in gpus if _num(g)[0] * hcas // len(gpus) == h]


def _lustre_bytes(samples: pa.Table) -> dict[str, tuple[int, int]]:
    """Per Lustre jobid: sum over targets of the largest cumulative read / write sum seen."""
    metric = _column(samples, "metric").astype(str)
    keep = np.isin(metric, np.array(LUSTRE_METRICS))
    best: dict[tuple[str, str, str], float] = {}
    if keep.any():
        sub = samples.filter(pa.array(keep))
        for name, job, lab, v in zip(sub.column("metric").to_pylist(), sub.column("job").to_pylist(),
                                     sub.column("labels").to_pylist(), sub.column("value").to_pylist()):
            labels = orjson.loads(lab) if lab else {}
            jid = job or labels.get("jobid")
            if not jid:
                continue
            key = (name, str(jid), str(labels.get("target", "")))
            best[key] = max(best.get(key, 0.0), v)
    out: dict[str, list[int]] = {}
    for (name, jid, _), v in best.items():
        slot = out.setdefault(jid, [0, 0])
        slot[0 if name == LUSTRE_READ else 1] += int(v)
    return {k: (v[0], v[1]) for k, v in out.items()}


def _mean(total: float, n: int) -> float | None:
    return total / n if n else None


def job_reports(samples: pa.Table, jobs: Sequence[Job], *, now: float | None = None) -> list[JobReport]:
    """One report per job that ran (``start`` set), in job order; ``now`` ends still-running jobs
    (default: the latest sample time)."""
    if now is None:
        ts = samples.column("t").to_pylist() if samples.num_rows else []
        now = max(ts) if ts else max((j.end or j.start or 0.0 for j in jobs), default=0.0)
    acc: dict[tuple[str, str, str], _Acc] = {}
    holder = _accumulate_dcgm(_dcgm_frame(samples, jobs), acc) if samples.num_rows else {}
    if samples.num_rows:
        _accumulate_ib(samples, holder, acc)
    lustre = _lustre_bytes(samples) if samples.num_rows else {}
    by_job: dict[str, list[tuple[str, str, _Acc]]] = {}
    for (job, host, gpu), a in acc.items():
        by_job.setdefault(job, []).append((host, gpu, a))
    return [_report(j, by_job.get(j.id, []), lustre.get(j.id, (0, 0)), now) for j in jobs if j.start is not None]


def _report(job: Job, cells: list[tuple[str, str, _Acc]], lustre: tuple[int, int], now: float) -> JobReport:
    cells = sorted(cells, key=lambda c: (c[0], _num(c[1])))
    per_gpu = tuple(GpuReport(
        host=host, gpu=gpu, samples=a.util_n, mean_util_pct=_mean(a.util_sum, a.util_n), max_util_pct=a.util_max,
        mean_tensor_active=_mean(a.tensor_sum, a.tensor_n),
        max_fb_used_bytes=int(a.fb_max * MIB) if a.fb_max is not None else None,
        mean_power_w=_mean(a.power_sum, a.power_n), energy_kwh=a.energy_mj / MJ_PER_KWH, xid_errors=a.xid,
        idle=a.util_max is not None and a.util_max < IDLE_UTIL_PCT) for host, gpu, a in cells)
    end = job.end if job.end is not None else now
    elapsed = max(0.0, end - job.start) if job.start is not None else 0.0
    total = _Acc()
    for _, _, a in cells:
        for name in ("energy_mj", "util_sum", "util_n", "tensor_sum", "tensor_n", "power_sum", "power_n", "xid",
                     "ib_tx", "ib_rx"):
            setattr(total, name, getattr(total, name) + getattr(a, name))
    fbs = [a.fb_max for _, _, a in cells if a.fb_max is not None]
    return JobReport(
        id=job.id, user=job.user, account=job.account, partition=job.partition, name=job.name, state=job.state,
        nodes=tuple(job.nodes), gpus=job.gpus, start=job.start, end=job.end, elapsed_s=elapsed,
        gpu_hours=job.gpus * elapsed / 3600.0, energy_kwh=total.energy_mj / MJ_PER_KWH,
        mean_gpu_util=_mean(total.util_sum, total.util_n), mean_tensor_active=_mean(total.tensor_sum, total.tensor_n),
        max_fb_used_bytes=int(max(fbs) * MIB) if fbs else None, mean_power_w=_mean(total.power_sum, total.power_n),
        ib_tx_bytes=int(total.ib_tx), ib_rx_bytes=int(total.ib_rx), lustre_read_bytes=lustre[0],
        lustre_write_bytes=lustre[1], xid_errors=total.xid, idle_gpus=sum(g.idle for g in per_gpu), per_gpu=per_gpu)


def report_dict(report: JobReport, *, per_gpu: bool = False) -> dict:
    """The JSON shape of ``hpcwatch jobs --json`` (and ``job ID --json`` with ``per_gpu``)."""
    doc = {
        "id": report.id, "user": report.user, "account": report.account, "partition": report.partition,
        "name": report.name, "state": report.state, "nodes": list(report.nodes), "gpus": report.gpus,
        "start": report.start, "end": report.end, "elapsed_s": report.elapsed_s,
        "gpu_hours": report.gpu_hours, "energy_kwh": report.energy_kwh, "mean_gpu_util": report.mean_gpu_util,
        "mean_tensor_active": report.mean_tensor_active, "max_fb_used_bytes": report.max_fb_used_bytes,
        "mean_power_w": report.mean_power_w, "ib_bytes": report.ib_bytes, "ib_tx_bytes": report.ib_tx_bytes,
        "ib_rx_bytes": report.ib_rx_bytes, "lustre_bytes": report.lustre_bytes,
        "lustre_read_bytes": report.lustre_read_bytes, "lustre_write_bytes": report.lustre_write_bytes,
        "xid_errors": report.xid_errors, "idle_gpus": report.idle_gpus,
    }
    if per_gpu:
        doc["per_gpu"] = [{
            "host": g.host, "gpu": g.gpu, "samples": g.samples, "mean_util_pct": g.mean_util_pct,
            "max_util_pct": g.max_util_pct, "mean_tensor_active": g.mean_tensor_active,
            "max_fb_used_bytes": g.max_fb_used_bytes, "mean_power_w": g.mean_power_w, "energy_kwh": g.energy_kwh,
            "xid_errors": g.xid_errors, "idle": g.idle} for g in report.per_gpu]
    return doc
