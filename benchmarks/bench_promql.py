"""Scrape -> PromQL -> attribution for a 128-node twin, against a real Prometheus 2.42.

What it does (run by hand: `.venv/bin/python benchmarks/bench_promql.py [--nodes 128] [--seconds 30]`):

1. writes the hpc_job mapping files of every node with the project's real prolog
   (deploy/slurm/prolog, one job per 4 nodes x 8 GPUs, a few GPUs left free),
2. serves the twin's 128 dcgm-exporter + 128 node-exporter endpoints (twin/serve.py, in this process),
3. starts Prometheus (Debian 2.42) scraping those 256 targets every 2 s, waits for every target to be up,
4. lets it scrape for --seconds, then times: PromQL raw samples -> SAMPLE_SCHEMA table
   (promql.PrometheusBackend.samples), the attribution analysis on it, and the same per-job sums done
   by Prometheus itself (one aggregated PromQL query),
5. reports the series cardinality that carries hpc_job (count by metric), and stops everything by PID.

Prints one line per number. Needs the `prometheus` binary; nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hpcwatch.cli.twinserve import sized_cluster
from hpcwatch.promql import PrometheusBackend
from hpcwatch.twin import Twin
from hpcwatch.twin.serve import ServeConfig, TwinEndpoints, prometheus_config

PROM_PORT = 29190
TWIN_PORT = 29500
SCRAPE_INTERVAL_S = 2.0
METRICS = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]


def write_mapping(root: Path, nodes: list[str], *, nodes_per_job: int = 4) -> dict[str, list[str]]:
    """Allocations through the real prolog: job 1000+k on nodes 4k..4k+3, all 8 GPUs (the last node: 0-5)."""
    from concurrent.futures import ThreadPoolExecutor

    def prolog(i: int) -> None:
        env = {
            "PATH": os.environ["PATH"],
            "SLURM_JOB_ID": str(1000 + i // nodes_per_job),
            "SLURM_JOB_GPUS": "0-5" if i == len(nodes) - 1 else "0-7",
            "SLURMD_NODENAME": nodes[i],
            "DCGM_HPC_JOB_MAPPING_DIR": str(root / nodes[i]),
        }
        subprocess.run([str(ROOT / "deploy" / "slurm" / "prolog")], env=env, check=True)

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(prolog, range(len(nodes))))
    jobs: dict[str, list[str]] = {}
    for i, node in enumerate(nodes):
        jobs.setdefault(str(1000 + i // nodes_per_job), []).append(node)
    return jobs


def start_prometheus(workdir: Path, config: str) -> subprocess.Popen:
    (workdir / "prometheus.yml").write_text(config)
    return subprocess.Popen(
        [
            shutil.which("prometheus") or "prometheus",
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{PROM_PORT}",
            "--log.level=warn",
        ],
        stdout=open(workdir / "prometheus.log", "wb"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def wait_targets_up(prom: PrometheusBackend, want: int, timeout_s: float = 120.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            up = prom.query("sum(up)")
            if up.num_rows and up["value"][0].as_py() >= want:
                return time.monotonic() - t0
        except Exception:
            pass
        time.sleep(0.25)
    raise SystemExit(f"targets not up after {timeout_s}s")


def attribute(table, jobs: dict[str, list[str]], t_start: float) -> list:
    """The attribution analysis (analysis/attribution.job_reports) on the fetched table."""
    from hpcwatch.analysis.attribution import job_reports
    from hpcwatch.records import Job

    records = [
        Job(
            id=job,
            user=f"user{k % 7}",
            account=f"proj-{k % 3}",
            nodes=tuple(nodes),
            gpus=8 * len(nodes),
            gpus_by_node={n: tuple(range(8)) for n in nodes},
            start=t_start,
            state="RUNNING",
        )
        for k, (job, nodes) in enumerate(jobs.items())
    ]
    return job_reports(table, records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="hpcwatch-bench-promql-"))
    cluster = sized_cluster(args.nodes)
    names = [n.name for n in cluster.nodes]
    t = time.perf_counter()
    jobs = write_mapping(workdir / "mapping", names)
    print(f"prolog wrote mapping for {len(jobs)} jobs on {len(names)} nodes: {time.perf_counter() - t:.2f} s")

    twin = Twin(cluster, seed=1)
    endpoints = TwinEndpoints(
        twin, ServeConfig(nodes=tuple(names), port=TWIN_PORT, mapping_dir=workdir / "mapping", tick_s=1.0)
    ).start()
    t_start = time.monotonic()
    proc = start_prometheus(workdir, prometheus_config(endpoints.targets, scrape_interval_s=SCRAPE_INTERVAL_S))
    try:
        with PrometheusBackend(f"http://127.0.0.1:{PROM_PORT}", timeout_s=60) as prom:
            up_s = wait_targets_up(prom, 2 * len(names))
            print(
                f"prometheus start -> all {2 * len(names)} targets up: {time.monotonic() - t_start:.2f} s "
                f"(waited {up_s:.2f} s)"
            )
            time.sleep(args.seconds)
            t1 = float(prom.query("time()")["value"][0].as_py())
            t0 = t1 - args.seconds
            report(prom, t0, t1, jobs, t_start=time.time() - (time.monotonic() - t_start))
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        endpoints.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def report(prom: PrometheusBackend, t0: float, t1: float, jobs: dict[str, list[str]], *, t_start: float) -> None:
    t = time.perf_counter()
    table = prom.samples(METRICS, t0=t0, t1=t1)
    fetch_s = time.perf_counter() - t
    print(
        f"PromQL raw samples -> SAMPLE_SCHEMA table: {table.num_rows} rows, {fetch_s:.3f} s "
        f"({table.num_rows / fetch_s:,.0f} rows/s)"
    )
    t = time.perf_counter()
    reports = attribute(table, jobs, t_start)
    attribute_s = time.perf_counter() - t
    print(
        f"attribution (job_reports) over the table: {attribute_s:.3f} s for {len(reports)} jobs; "
        f"scrape -> attributed total {fetch_s + attribute_s:.3f} s; "
        f"{sum(r.energy_kwh for r in reports):.2f} kWh attributed"
    )
    window = f"{int(t1 - t0)}s"
    t = time.perf_counter()
    per_job = prom.query(
        f'sum by (hpc_job) (count_over_time(DCGM_FI_DEV_GPU_UTIL{{hpc_job!=""}}[{window}]))', t=t1, name="points"
    )
    energy = prom.query(
        f'sum by (hpc_job) (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{hpc_job!=""}}[{window}])) / 1000',
        t=t1,
        name="energy_j",
    )
    print(
        f"per-job sums done by Prometheus (2 aggregated queries): {time.perf_counter() - t:.3f} s, "
        f"{per_job.num_rows} jobs, {sum(energy['value'].to_pylist()) / 3.6e6:.2f} kWh in the window"
    )
    with_job = prom.query('count by (__name__) ({hpc_job!=""})', t=t1, name="series")
    total = prom.query('count({__name__=~".+"})', t=t1, name="series")["value"][0].as_py()
    print(
        f"series with hpc_job: {int(sum(with_job['value'].to_pylist()))} "
        f"({len(with_job)} metrics x {int(max(with_job['value'].to_pylist()))} GPUs-with-a-job); "
        f"all series: {int(total)}"
    )
    head = httpx.get(f"{prom.config.url}/api/v1/status/tsdb", timeout=30).json()["data"]["headStats"]
    print(f"TSDB head: {head['numSeries']} series, {head['chunkCount']} chunks")


if __name__ == "__main__":
    main()
