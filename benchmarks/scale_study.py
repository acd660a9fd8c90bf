"""The scale study: the twin's exporters at 128 and 1,024 nodes, scraped by a real Prometheus and a real
VictoriaMetrics at once; writes docs/scale.md.

    flock /tmp/hpcwatch-integration.lock .venv/bin/python benchmarks/scale_study.py [--nodes 128 1024]
        [--window 60] [--interval 5] [--traces benchmarks/steps_dask.json] [--out docs/scale.md]

For each size: serve the twin (twin/serve.py, one port per node, one process), start Prometheus 2.42 and
VictoriaMetrics 1.79 (tests/integration/services.py: own ports, own data dirs, stopped by PID), let both
scrape for --window s, then measure; then extrapolate to 16k-100k GPUs from the per-node costs. Every
figure says whether it was measured or extrapolated, its unit and its window. The "traces" section reads
the JSON that benchmarks/bench_steps_dask.py --json writes (another study), or says "not measured".
The document is a list of sections; each section is one function of the measured runs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from tests.integration.services import start_prometheus, start_victoriametrics, stop_process

from hpcwatch.cli.twinserve import raise_open_files_limit, sized_cluster
from hpcwatch.errors import ConfigError, HpcwatchError
from hpcwatch.promql import PrometheusBackend
from hpcwatch.twin import Twin
from hpcwatch.twin.serve import (
    DEFAULT_MAX_CONNECTIONS_PER_NODE,
    ServeConfig,
    TwinEndpoints,
    prometheus_config,
)

TWIN_PORT = 31000
PROM_PORT, VM_PORT = 29180, 29181
GPUS_PER_NODE = 8
EXTRAPOLATE_GPUS = (16_384, 32_768, 65_536, 100_000)
DAY_S = 86_400
PRODUCTION_INTERVAL_S = 15.0
"""Scrape interval the per-day figures assume: dcgm-exporter's Helm chart and most GPU-cluster guides use 15 s
(ours to fix; the study itself scrapes every --interval s to measure in a short window)."""
PROMETHEUS_SERIES_PER_TARGET = 5
"""up, scrape_duration_seconds, scrape_samples_scraped, scrape_samples_post_metric_relabeling, scrape_series_added
(https://prometheus.io/docs/concepts/jobs_instances/#automatically-generated-labels-and-time-series)."""
REMOTE_WRITE_SCRAPES = 3
"""Scrapes of every node pushed through remote write to time it (after the scrape measurements)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Figure:
    name: str
    value: float | str
    unit: str
    window: str
    how: str = "measured"


@dataclass(slots=True, kw_only=True)
class Run:
    """What one size's measurement found (the sections format it)."""

    nodes: int
    interval_s: float
    window_s: float
    figures: dict[str, float] = field(default_factory=dict)


# -- measuring one size ------------------------------------------------------------------------------


def measure(nodes: int, *, window_s: float, interval_s: float, workdir: Path) -> Run:
    run = Run(nodes=nodes, interval_s=interval_s, window_s=window_s)
    raise_open_files_limit(nodes)
    twin = Twin(sized_cluster(nodes), seed=16, start=float(int(time.time())))
    config = ServeConfig(nodes=tuple(twin.node_names), port=TWIN_PORT, tick_s=interval_s)
    procs: list = []
    with TwinEndpoints(twin, config) as endpoints:
        text = prometheus_config(endpoints.targets, scrape_interval_s=interval_s)
        try:
            prom = start_prometheus(
                shutil.which("prometheus"), _dir(workdir, f"prom{nodes}"), text, port=PROM_PORT, on_start=procs.append
            )
            vm = start_victoriametrics(_dir(workdir, f"vm{nodes}"), text, port=VM_PORT, on_start=procs.append)
            _wait_up(prom.url, 2 * nodes)
            _wait_up(vm.url, 2 * nodes)
            before = {"prom": _appended(prom.url, "prometheus"), "vm": _appended(vm.url, "victoriametrics")}
            scrapes0, bytes0, t0 = endpoints.scrapes, endpoints.bytes_served, time.monotonic()
            _serve_for(endpoints, window_s)
            elapsed, window_end = time.monotonic() - t0, time.time()
            run.figures.update(_twin_figures(endpoints, prom.url, vm.url, nodes))
            run.figures.update(_scrape_figures(twin, endpoints, scrapes0, bytes0, nodes))
            run.figures["prom_samples_per_s"] = (_appended(prom.url, "prometheus") - before["prom"]) / elapsed
            run.figures["vm_samples_per_s"] = (_appended(vm.url, "victoriametrics") - before["vm"]) / elapsed
            run.figures["prom_series"] = _head_series(prom.url)
            run.figures["vm_series"] = _vm_series(vm.url)
            run.figures.update(_report_figures(twin, prom.url, vm.url, workdir / f"store{nodes}", t1=window_end))
            run.figures.update(_remote_write_figures(twin, prom.url, vm.url, nodes))
        finally:
            for proc in reversed(procs):
                stop_process(proc)
    run.figures.update(_store_figures(twin, workdir / f"ingest{nodes}", nodes))
    return run


def _serve_for(endpoints: TwinEndpoints, window_s: float) -> None:
    """Sleep through the window, or stop at once with the twin's own one-line failure."""
    deadline = time.monotonic() + window_s
    while time.monotonic() < deadline and endpoints.serving:
        time.sleep(0.5)
    if endpoints.failure is not None:
        raise ConfigError(endpoints.failure)


def _twin_figures(endpoints: TwinEndpoints, prom_url: str, vm_url: str, nodes: int) -> dict:
    """Did the one-process twin keep up: its open files, connections closed past the cap, targets up."""
    import resource

    return {
        "twin_open_files": len(os.listdir("/proc/self/fd")),
        "twin_open_files_soft_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "twin_connections_evicted": endpoints.connections_evicted,
        "prom_targets_up": _count(prom_url, "up == 1"),
        "vm_targets_up": _count(vm_url, "up == 1"),
    }


def _dir(workdir: Path, name: str) -> Path:
    d = workdir / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def _wait_up(url: str, targets: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _count(url, "up == 1", instant=True) < targets:
        if time.monotonic() > deadline:
            raise SystemExit(f"{url}: fewer than {targets} targets up after {timeout_s:g}s")
        time.sleep(1)


def _head_series(url: str) -> float:
    """Prometheus' series in its head block (every series since it started: the data dir is fresh)."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        s.value
        for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text)
        for s in family.samples
        if s.name == "prometheus_tsdb_head_series"
    )


def _vm_series(url: str) -> float:
    """VictoriaMetrics' series in its database (/api/v1/series/count; its data dir is fresh). /api/v1/series
    itself refuses past 30,000 series (-search.maxSeries)."""
    return float(httpx.get(f"{url}/api/v1/series/count", timeout=60).json()["data"][0])


def _count(url: str, selector: str, *, instant: bool = False) -> int:
    query = f"count({selector})"
    with PrometheusBackend(url, timeout_s=60) as prom:
        values = prom.query(query)["value"].to_pylist()
    return int(values[0]) if values else 0


def _appended(url: str, kind: str) -> float:
    """Samples the server has taken in since it started, from its own /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    # VictoriaMetrics writes no TYPE lines, so the parser keeps "_total" in the family name: match samples.
    name = "prometheus_tsdb_head_samples_appended_total" if kind == "prometheus" else "vm_rows_inserted_total"
    return sum(
        s.value
        for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text)
        for s in family.samples
        if s.name == name
    )


def _scrape_figures(twin: Twin, endpoints: TwinEndpoints, scrapes0: int, bytes0: int, nodes: int) -> dict:
    node = twin.node_names[0]
    dcgm, ib = twin.dcgm_text(node), twin.node_exporter_text(node)
    without = twin.dcgm_text(node, jobs_by_gpu={})
    lines = lambda text: sum(1 for line in text.splitlines() if line and not line.startswith("#"))  # noqa: E731
    served = endpoints.scrapes - scrapes0
    return {
        "series_per_node_dcgm": lines(dcgm),
        "series_per_node_dcgm_no_hpc_job": lines(without),
        "series_per_node_ib": lines(ib),
        "bytes_per_node_scrape": (endpoints.bytes_served - bytes0) / max(served, 1) * 2,  # dcgm + node
        "bytes_per_node_scrape_gzip": len(gzip.compress(dcgm.encode())) + len(gzip.compress(ib.encode())),
        "bytes_hpc_job_label_per_node": len(dcgm) - len(without),
        "scrapes_served": served,
        "jobs_running": sum(1 for j in twin.jobs if j.start and not j.end),
    }


def _report_figures(twin: Twin, prom_url: str, vm_url: str, store_dir: Path, *, t1: float) -> dict:
    """The per-job report for every job, samples from each backend: in-process (fetch, analysis) up to the
    window's end ``t1``, the same points from both, and as ``hpcwatch jobs --prometheus URL`` (whole process,
    up to its own now: the servers keep scraping)."""
    from hpcwatch.reports.jobs import REPORT_METRICS, jobs_report
    from hpcwatch.sources.slurm import parse_squeue_json
    from hpcwatch.store import Store

    store = Store(str(store_dir))
    store.add(parse_squeue_json(twin.squeue_json()))
    t0_jobs = min(j.start for j in store.jobs() if j.start is not None)
    out: dict[str, float] = {"jobs": len(store.jobs())}
    for name, url in (("prom", prom_url), ("vm", vm_url)):
        out[f"{name}_report_load_1m"] = os.getloadavg()[0]  # the 2 cores are shared: say how busy they were
        t = time.perf_counter()
        with PrometheusBackend(url, timeout_s=120) as prom:
            samples = prom.samples(list(REPORT_METRICS), t0=t0_jobs, t1=t1)
        fetched = time.perf_counter()
        reports = jobs_report(store, samples=samples)
        out[f"{name}_report_fetch_s"] = fetched - t
        out[f"{name}_report_analysis_s"] = time.perf_counter() - fetched
        out[f"{name}_report_rows"] = samples.num_rows
        out[f"{name}_report_jobs_seen"] = sum(1 for r in reports if r.gpu_hours_observed > 0)
        t = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "hpcwatch", "jobs", "--db", str(store_dir), "--prometheus", url, "--json"],
            check=True,
            capture_output=True,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )
        out[f"{name}_report_process_s"] = time.perf_counter() - t
    store.close()
    return out


def _remote_write_figures(twin: Twin, prom_url: str, vm_url: str, nodes: int) -> dict:
    """Push REMOTE_WRITE_SCRAPES scrapes of every node (the twin's samples) through remote write."""
    from hpcwatch.promql import encode_remote_write
    from hpcwatch.records import Sample

    batches = []
    for _ in range(REMOTE_WRITE_SCRAPES):
        twin.advance(1.0)
        batches.append([r for r in twin.records() if isinstance(r, Sample)])
    n = sum(len(b) for b in batches)
    t = time.perf_counter()
    for batch in batches:
        encode_remote_write(batch)
    out = {"remote_write_samples": n, "remote_write_encode_per_s": n / (time.perf_counter() - t)}
    for name, url in (("prom", prom_url), ("vm", vm_url)):
        t = time.perf_counter()
        with PrometheusBackend(url, timeout_s=300) as backend:
            for batch in batches:
                for k in range(0, len(batch), 10_000):
                    backend.write(batch[k : k + 10_000])
        out[f"{name}_remote_write_per_s"] = n / (time.perf_counter() - t)
    return out


def _store_figures(twin: Twin, store_dir: Path, nodes: int, ticks: int = 4) -> dict:
    """Rows/s into hpcwatch's store (one transaction of ``ticks`` scrapes of every node) and bytes per row."""
    from hpcwatch.store import Store

    tables = []
    for _ in range(ticks):
        twin.advance(PRODUCTION_INTERVAL_S)
        tables.append(twin.sample_table())
    rows = sum(t.num_rows for t in tables)
    store = Store(str(store_dir))
    t = time.perf_counter()
    with store.transaction() as tx:
        for table in tables:
            tx.add_sample_table(table)
    elapsed = time.perf_counter() - t
    store.close()
    size = sum(p.stat().st_size for p in store_dir.rglob("*.parquet"))
    return {"store_rows_per_s": rows / elapsed, "store_bytes_per_row": size / rows, "store_rows": rows}


# -- the document ---------------------------------------------------------------------------------

Section = tuple[str, Callable[[list[Run], dict], list[Figure]]]


def per_run(rows: Callable[[Run, dict], list[Figure]]) -> Callable[[list[Run], dict], list[Figure]]:
    """A section made of the same rows for each measured size (``rows(run, run.figures)``)."""
    return lambda runs, ctx: [figure for run in runs for figure in rows(run, run.figures)]


def _w(run: Run) -> str:
    return f"{run.nodes} nodes, {run.window_s:g} s of scrapes every {run.interval_s:g} s"


def series_rows(r: Run, f: dict) -> list[Figure]:
    out = []
    per_node = f["series_per_node_dcgm"] + f["series_per_node_ib"]
    churn = f["prom_series"] - per_node * r.nodes - PROMETHEUS_SERIES_PER_TARGET * 2 * r.nodes
    out += [
        Figure(
            name=f"series per scrape of all nodes ({r.nodes} nodes)",
            value=per_node * r.nodes,
            unit="series",
            window="one scrape (text lines of every node)",
        ),
        Figure(
            name="dcgm-exporter series per node, with hpc_job / without",
            unit="series",
            value=f"{f['series_per_node_dcgm']:.0f} / {f['series_per_node_dcgm_no_hpc_job']:.0f}",
            window="one scrape: hpc_job adds a label, not a series, while jobs stay put",
        ),
        Figure(
            name=f"series held by Prometheus / VictoriaMetrics ({r.nodes} nodes)",
            unit="series",
            value=f"{f['prom_series']:.0f} / {f['vm_series']:.0f}",
            window=_w(r) + f"; {f['jobs_running']:.0f} jobs running; includes up and scrape_* series "
            "(5 a target in Prometheus)",
        ),
        Figure(
            name=f"series churn from hpc_job ({r.nodes} nodes)",
            unit="series",
            value=f"{churn:.0f}",
            window=_w(r)
            + " (Prometheus head series - series per scrape - 5 per target): "
            + ("no job moved" if churn == 0 else "a GPU that changes job starts its series anew under the new hpc_job"),
        ),
    ]
    return out


def scrape_rows(r: Run, f: dict) -> list[Figure]:
    out = []
    out += [
        Figure(
            name=f"bytes per node per scrape, dcgm + node-exporter ({r.nodes} nodes)",
            value=round(f["bytes_per_node_scrape"]),
            unit="bytes (uncompressed)",
            window=_w(r),
        ),
        Figure(
            name="the same, gzip (what promhttp exporters send when asked)",
            value=f["bytes_per_node_scrape_gzip"],
            unit="bytes",
            window="one scrape of node1",
        ),
        Figure(
            name="of which the hpc_job label",
            value=f["bytes_hpc_job_label_per_node"],
            unit="bytes per node per scrape",
            window="one scrape of node1",
        ),
        Figure(
            name=f"bytes per scrape of all nodes ({r.nodes} nodes)",
            value=round(f["bytes_per_node_scrape"] * r.nodes),
            unit="bytes",
            window=_w(r),
        ),
        Figure(
            name=f"targets up at the window's end, Prometheus / VictoriaMetrics ({r.nodes} nodes)",
            value=f"{f['prom_targets_up']:.0f} / {f['vm_targets_up']:.0f} of {2 * r.nodes}",
            unit="targets",
            window=_w(r),
        ),
        Figure(
            name=f"twin process: open files / connections closed past {DEFAULT_MAX_CONNECTIONS_PER_NODE} a node "
            f"({r.nodes} nodes)",
            value=f"{f['twin_open_files']:.0f} / {f['twin_connections_evicted']:.0f}",
            unit="files / connections",
            window=_w(r) + f"; soft limit {f['twin_open_files_soft_limit']:.0f}",
        ),
    ]
    return out


def ingest_rows(r: Run, f: dict) -> list[Figure]:
    out = []
    out += [
        Figure(
            name=f"samples/s taken in by Prometheus / VictoriaMetrics from scrapes ({r.nodes} nodes)",
            value=f"{f['prom_samples_per_s']:.0f} / {f['vm_samples_per_s']:.0f}",
            unit="samples/s",
            window=_w(r) + " (the offered load: series x targets / interval)",
        ),
        Figure(
            name=f"remote write from hpcwatch into Prometheus / VictoriaMetrics ({r.nodes} nodes)",
            value=f"{f['prom_remote_write_per_s']:.0f} / {f['vm_remote_write_per_s']:.0f}",
            unit="samples/s",
            window=f"{f['remote_write_samples']:.0f} samples, 10,000 a request, one client",
        ),
        Figure(
            name="of which hpcwatch's own encoder alone (protobuf + snappy literals, pure Python)",
            value=round(f["remote_write_encode_per_s"]),
            unit="samples/s",
            window="same samples",
        ),
        Figure(
            name=f"rows/s into hpcwatch's store, one transaction ({r.nodes} nodes)",
            value=round(f["store_rows_per_s"]),
            unit="rows/s",
            window=f"{f['store_rows']:.0f} rows: 4 scrapes of every node, in process",
        ),
    ]
    return out


def promql_rows(r: Run, f: dict) -> list[Figure]:
    out = []
    for name, label in (("vm", "VictoriaMetrics"), ("prom", "Prometheus")):
        out += [
            Figure(
                name=f"per-job report, all {f['jobs']:.0f} jobs, {label} ({r.nodes} nodes): "
                f"fetch + analysis (in process)",
                value=f"{f[f'{name}_report_fetch_s']:.2f} + {f[f'{name}_report_analysis_s']:.2f}",
                unit="s",
                window=_w(r) + f"; {f[f'{name}_report_rows']:.0f} points fetched, "
                f"{f[f'{name}_report_jobs_seen']:.0f} jobs seen",
            ),
            Figure(
                name=f"`hpcwatch jobs --prometheus URL --json`, {label} ({r.nodes} nodes)",
                value=f"{f[f'{name}_report_process_s']:.2f}",
                unit="s (whole process)",
                window=_w(r) + f"; load average {f.get(f'{name}_report_load_1m', float('nan')):.1f} "
                f"on {os.cpu_count()} cores (the scrapers run meanwhile)",
            ),
        ]
    return out


def store_rows(r: Run, f: dict) -> list[Figure]:
    out = []
    per_scrape = (f["series_per_node_dcgm"] + f["series_per_node_ib"]) * r.nodes
    rows_day = per_scrape * DAY_S / PRODUCTION_INTERVAL_S
    out += [
        Figure(
            name=f"store bytes per sample row ({r.nodes} nodes)",
            value=round(f["store_bytes_per_row"], 2),
            unit="bytes (Parquet, one transaction)",
            window=f"{f['store_rows']:.0f} rows",
        ),
        Figure(
            name=f"store size per day at {PRODUCTION_INTERVAL_S:g} s scrapes ({r.nodes} nodes)",
            value=f"{rows_day * f['store_bytes_per_row'] / 1e9:.2f}",
            unit="GB/day",
            window="measured bytes/row x series x scrapes/day, before compaction",
            how="extrapolated",
        ),
    ]
    return out


def extrapolation_section(runs: list[Run], ctx: dict) -> list[Figure]:
    """Linear in nodes from the largest measured run: series, bytes, samples/s and store size are per-node
    costs; the report's fetch+analysis time is fitted as a + b x nodes through the two measured sizes."""
    big = max(runs, key=lambda r: r.nodes)
    f = big.figures
    per_node_series = f["series_per_node_dcgm"] + f["series_per_node_ib"]
    fit = _report_fit(runs)
    out = []
    for gpus in EXTRAPOLATE_GPUS:
        n = gpus // GPUS_PER_NODE
        series = per_node_series * n
        window = (
            f"{gpus:,} GPUs = {n:,} nodes, from {big.nodes}-node per-node costs, {PRODUCTION_INTERVAL_S:g} s scrapes"
        )
        out += [
            Figure(
                name=f"{gpus:,} GPUs: series per scrape",
                value=round(series),
                unit="series",
                window=window,
                how="extrapolated",
            ),
            Figure(
                name=f"{gpus:,} GPUs: scrape bytes per interval",
                unit="MB",
                value=f"{f['bytes_per_node_scrape'] * n / 1e6:.0f}",
                window=window,
                how="extrapolated",
            ),
            Figure(
                name=f"{gpus:,} GPUs: samples/s to ingest",
                value=round(series / PRODUCTION_INTERVAL_S),
                unit="samples/s",
                window=window,
                how="extrapolated",
            ),
            Figure(
                name=f"{gpus:,} GPUs: hpcwatch store per day",
                unit="GB/day",
                window=window,
                how="extrapolated",
                value=f"{series * DAY_S / PRODUCTION_INTERVAL_S * f['store_bytes_per_row'] / 1e9:.0f}",
            ),
        ]
        if fit is not None:
            a, b = fit
            out.append(
                Figure(
                    name=f"{gpus:,} GPUs: per-job report on VictoriaMetrics (fetch + analysis)",
                    value=f"{a + b * n:.1f}",
                    unit="s",
                    how="extrapolated",
                    window="fit a + b x nodes through the measured sizes, same window as measured",
                )
            )
    return out


def _report_fit(runs: list[Run]) -> tuple[float, float] | None:
    if len(runs) < 2:
        return None
    lo, hi = sorted(runs, key=lambda r: r.nodes)[0], sorted(runs, key=lambda r: r.nodes)[-1]
    t = lambda r: r.figures["vm_report_fetch_s"] + r.figures["vm_report_analysis_s"]  # noqa: E731
    b = (t(hi) - t(lo)) / (hi.nodes - lo.nodes)
    return t(lo) - b * lo.nodes, b


def traces_section(runs: list[Run], ctx: dict) -> list[Figure]:
    path: Path = ctx["traces"]
    if not path.is_file():
        return [
            Figure(
                name="trace reduction per rank and for the set on N workers",
                value="not measured",
                unit="-",
                window=f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} absent "
                "(benchmarks/bench_steps_dask.py --json writes it)",
                how="-",
            )
        ]
    doc = json.loads(path.read_text())
    ranks, workers = doc.get("ranks"), doc.get("workers")
    out = [
        Figure(
            name="reduction of one rank's trace",
            value=round(doc["per_rank_reduce_s"], 3),
            unit="s",
            window=f"{ranks} ranks, {doc.get('bytes', '?')} bytes of traces",
        ),
        Figure(name="the set, single process", value=round(doc["set_s_single"], 2), unit="s", window=f"{ranks} ranks"),
        Figure(
            name=f"the set, Dask LocalCluster ({workers} workers)",
            value=round(doc["set_s_dask_local"], 2),
            unit="s",
            window=f"{ranks} ranks; the same --json as one process: {doc.get('identical')}",
        ),
        Figure(
            name="of which the cross-rank step on the reduced tables (stragglers, waits, what-if)",
            value=round(doc["cross_rank_s"], 2),
            unit="s",
            window=f"{ranks} ranks, in the client process",
        ),
        Figure(
            name="peak memory, one process / Dask LocalCluster (process tree)",
            unit="MB",
            value=f"{doc['peak_rss_bytes_single'] / 1e6:.0f} / {doc['peak_rss_bytes_dask_local'] / 1e6:.0f}",
            window=f"{ranks} ranks, {workers} workers",
        ),
    ]
    for n, seconds in sorted(doc.get("projected", {}).items(), key=lambda kv: int(kv[0])):
        out.append(
            Figure(
                name=f"the set on {n} workers",
                value=round(seconds, 2),
                unit="s",
                window=f"{ranks} ranks",
                how="extrapolated",
            )
        )
    return out


SECTIONS: list[Section] = [
    ("Series (with and without hpc_job)", per_run(series_rows)),
    ("Scrape bytes", per_run(scrape_rows)),
    ("Ingest rate", per_run(ingest_rows)),
    ("PromQL cost of the per-job report (all jobs)", per_run(promql_rows)),
    ("Store size", per_run(store_rows)),
    ("16k-100k GPUs, extrapolated from the per-node costs", extrapolation_section),
    ("Traces (Dask)", traces_section),
]


def render(runs: list[Run], ctx: dict) -> str:
    head = [
        "# hpcwatch at scale",
        "",
        f"Regenerate: `{ctx['command']}`  ",
        f"Machine: {ctx['machine']}  ",
        f"Date: {ctx['date']} (UTC); Prometheus {ctx['versions']['prometheus']}, "
        f"VictoriaMetrics {ctx['versions']['victoriametrics']}",
        "",
        "Both servers scraped the same twin endpoints at the same time (one process, one port per node: "
        "see src/hpcwatch/twin/serve.py). *Measured* = taken on this machine in the window given; "
        "*extrapolated* = computed from measured per-node costs, never run.",
        "",
    ]
    if ctx.get("stopped"):
        head += [f"**Not measured:** {ctx['stopped']}", ""]
    body = []
    for title, section in SECTIONS:
        body += [f"## {title}", "", "| figure | value | unit | window | |", "|---|---|---|---|---|"]
        body += [f"| {f.name} | {f.value} | {f.unit} | {f.window} | {f.how} |" for f in section(runs, ctx)]
        body.append("")
    return "\n".join(head + body)


def _versions() -> dict:
    def first_line(argv: list[str]) -> str:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            return (out.stdout or out.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return "unknown"

    return {
        "prometheus": first_line(["prometheus", "--version"]).replace("prometheus, version ", "").split(" ")[0],
        "victoriametrics": first_line(["dpkg-query", "-W", "-f=${Version}", "victoria-metrics"]) + " (Debian)",
    }


def _machine() -> str:
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    return f"{platform.node()}: {os.cpu_count()} CPUs, {mem_gb:.0f} GB RAM, {platform.system()} {platform.release()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--window", type=float, default=60.0, help="seconds of scrapes per size")
    parser.add_argument("--interval", type=float, default=5.0, help="scrape interval (s) during the study")
    parser.add_argument("--traces", type=Path, default=ROOT / "benchmarks" / "steps_dask.json")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "scale.md")
    args = parser.parse_args()
    ctx = {
        "command": "flock /tmp/hpcwatch-integration.lock .venv/bin/python benchmarks/scale_study.py "
        + " ".join(sys.argv[1:]),
        "machine": _machine(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
        "versions": _versions(),
        "traces": args.traces.resolve(),
    }
    runs = []
    with tempfile.TemporaryDirectory(prefix="hpcwatch-scale-") as tmp:
        for nodes in args.nodes:
            t = time.monotonic()
            try:
                runs.append(measure(nodes, window_s=args.window, interval_s=args.interval, workdir=Path(tmp)))
            except (SystemExit, OSError, httpx.HTTPError, HpcwatchError) as err:
                ctx["stopped"] = f"{nodes} nodes: {err}"
                print(f"stopped at {nodes} nodes: {err}", file=sys.stderr)
                break
            print(
                f"{nodes} nodes measured in {time.monotonic() - t:.0f}s: {json.dumps(runs[-1].figures)}",
                file=sys.stderr,
            )
    if not runs:
        raise SystemExit("nothing measured")
    args.out.write_text(render(runs, ctx) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
