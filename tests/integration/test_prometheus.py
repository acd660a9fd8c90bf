"""A real Prometheus 2.42: it scrapes the twin's endpoints, and answers PromQL like the store answers SQL."""

from __future__ import annotations

import json
import time

import orjson
import pytest

from hpcwatch.promql import PrometheusBackend
from hpcwatch.records import Sample
from hpcwatch.sources.mapping import read_job_mapping_dir
from hpcwatch.store import Store

from .conftest import wait_until

pytestmark = pytest.mark.integration

KEY_COLUMNS = ["metric", "t", "value", "host", "gpu", "job"]
PORT_REMOTE_WRITE = 29091
PORT_SCRAPE = 29092
TWIN_PORT = 29410


@pytest.fixture(scope="module")
def twin_samples() -> list[Sample]:
    """Two minutes of the twin's reference cluster at 5 s ticks, ending now (Prometheus' head accepts them)."""
    from hpcwatch.model.cluster import reference_cluster
    from hpcwatch.twin import Twin

    twin = Twin(reference_cluster(), seed=5, start=float(int(time.time()) - 125))  # ms-exact, as Prometheus stores
    out: list[Sample] = []
    for _ in range(24):
        twin.advance(5.0)
        out.extend(r for r in twin.records() if isinstance(r, Sample) and r.metric.startswith("DCGM_FI_"))
    return out


def test_both_backends_return_the_same_samples(start_promql, twin_samples):
    """Remote write into the PromQL server (Prometheus or VictoriaMetrics), read back through promql.py."""
    prom_server = start_promql("global: {scrape_interval: 15s}\nscrape_configs: []\n", port=PORT_REMOTE_WRITE)
    store = Store(":memory:")
    store.add(twin_samples)
    with PrometheusBackend(prom_server.url) as prom:
        assert prom.write(twin_samples) > 0
        t0, t1 = store.time_range()
        metrics = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE"]
        # VictoriaMetrics makes written points searchable within about a second, Prometheus at once.
        wait_until(
            lambda: prom.samples(metrics, t0=t0, t1=t1).num_rows == store.samples(metrics).num_rows,
            timeout_s=10,
            what="the written samples to be searchable",
        )
        job = next(j for j in store.samples("DCGM_FI_DEV_GPU_UTIL").column("job").to_pylist() if j)
        for filters in ({}, {"host": "node2"}, {"job": job}, {"t0": (t0 + t1) / 2}):
            got = prom.samples(metrics, t1=t1, **{"t0": t0, **filters})
            want = store.samples(metrics, **{"t0": t0, **filters})
            assert got.num_rows == want.num_rows > 0, filters
            assert got.select(KEY_COLUMNS).to_pylist() == want.select(KEY_COLUMNS).to_pylist(), filters
            assert [orjson.loads(x) for x in got["labels"].to_pylist()] == [
                orjson.loads(x) for x in want["labels"].to_pylist()
            ]
        # The same question in PromQL and in SQL: mean utilisation per job over the window.
        promql = prom.query(
            f"avg by (hpc_job) (avg_over_time(DCGM_FI_DEV_GPU_UTIL[{int(t1 - t0) + 1}s]))", t=t1, name="util"
        )
        by_job = dict(zip(promql.column("job").to_pylist(), promql.column("value").to_pylist()))
        sql = dict(
            store.query("SELECT job, avg(value) FROM samples WHERE metric = 'DCGM_FI_DEV_GPU_UTIL' GROUP BY job")
        )
        assert by_job.keys() == sql.keys()
        for k in sql:  # every GPU has the same number of points, so mean of means = mean
            assert by_job[k] == pytest.approx(sql[k], rel=1e-9)


def test_prometheus_scrapes_the_twin_endpoints_with_mapping_labels(start_promql, tmp_path):
    from hpcwatch.model.cluster import reference_cluster
    from hpcwatch.twin import Twin
    from hpcwatch.twin.serve import ServeConfig, TwinEndpoints, prometheus_config

    (tmp_path / "node1").mkdir()
    (tmp_path / "node1" / "0").write_text("501\n")
    (tmp_path / "node1" / "1").write_text("501\n")
    (tmp_path / "node2").mkdir()
    (tmp_path / "node2" / "7").write_text("502\n")
    twin = Twin(reference_cluster(), seed=2)
    config = ServeConfig(nodes=("node1", "node2"), port=TWIN_PORT, mapping_dir=tmp_path, tick_s=1.0)
    with TwinEndpoints(twin, config, read_mapping=read_job_mapping_dir) as endpoints:
        prom_server = start_promql(prometheus_config(endpoints.targets, scrape_interval_s=1), port=PORT_SCRAPE)
        t0 = time.monotonic()

        def all_up() -> list[dict] | None:
            result = prom_server.query("up == 1")
            return result if len(result) == 4 else None

        up = wait_until(all_up, timeout_s=30, what="4 targets up (2 nodes x dcgm + node)")
        first_scrape_s = time.monotonic() - t0
        assert {r["metric"]["job"] for r in up} == {"dcgm", "node"}
        per_job = prom_server.query('count by (hpc_job, Hostname) (DCGM_FI_DEV_GPU_UTIL{hpc_job!=""})')
        assert {(r["metric"]["hpc_job"], r["metric"]["Hostname"], r["value"][1]) for r in per_job} == {
            ("501", "node1", "2"),
            ("502", "node2", "1"),
        }
        assert prom_server.query("count(DCGM_FI_DEV_GPU_UTIL)")[0]["value"][1] == "16"
        assert prom_server.query("count(node_infiniband_port_data_received_bytes_total)")[0]["value"][1] == "16"
        # The epilog removes a file: the label goes with it at the next scrape.
        (tmp_path / "node2" / "7").unlink()
        wait_until(
            lambda: not prom_server.query('DCGM_FI_DEV_GPU_UTIL{hpc_job="502"}'),
            timeout_s=10,
            what="job 502's series to go stale",
        )
    print(f"prometheus ready {prom_server.ready_s:.2f}s, first scrape visible after {first_scrape_s:.2f}s")


PORT_EXPORTER_PROM = 29094
EXPORTER_PORT = 29977


def _dashboard_exprs() -> list[str]:
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "hpcwatch.json").read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            inner = var["query"]["query"]
            exprs.append(inner[len("label_values(") : inner.rindex(",")])
    # What Grafana substitutes: "All" is .*, $__rate_interval at least 4 scrape intervals.
    return [
        e.replace("$job", ".*").replace("$user", ".*").replace("$account", ".*").replace("$__rate_interval", "4s")
        for e in exprs
    ]


def test_exporter_scraped_by_prometheus_answers_every_dashboard_query(start_promql, tmp_path):
    """hpcwatch exporter + twin endpoints scraped by a real Prometheus; each Grafana query runs and the
    job panels have data."""
    from hpcwatch.exporter import serve_metrics
    from hpcwatch.model.cluster import reference_cluster
    from hpcwatch.twin import Twin

    twin = Twin(reference_cluster(), seed=4, scenarios=("straggler",))
    store = Store(":memory:")
    for _ in range(4):
        twin.advance(5.0)
        store.add(twin.records())
    server, _ = serve_metrics(store, port=EXPORTER_PORT)
    try:
        config = {
            # Not 1 s: the timeout defaults to the interval, and a scrape that times out on a loaded machine marks
            # every series stale, so the queries after it found no data.
            "global": {"scrape_interval": "3s", "scrape_timeout": "3s"},
            "scrape_configs": [
                {"job_name": "hpcwatch", "static_configs": [{"targets": [f"127.0.0.1:{EXPORTER_PORT}"]}]}
            ],
        }
        prom_server = start_promql(json.dumps(config), port=PORT_EXPORTER_PROM)
        wait_until(
            lambda: prom_server.query("hpcwatch_job_gpu_hours"),
            timeout_s=30,
            what="Prometheus to scrape the hpcwatch exporter",
        )
        hours = {r["metric"]["hpc_job"]: r for r in prom_server.query("hpcwatch_job_gpu_hours")}
        assert {j.id for j in store.jobs() if j.start is not None} == set(hours)
        assert all("exported_job" not in r["metric"] for r in hours.values())  # hpc_job, not job: no clash
        for expr in _dashboard_exprs():
            prom_server.query(expr)  # raises on a PromQL error (HTTP 400)
        for expr in _dashboard_exprs():
            if "hpcwatch_job_" in expr and "DCGM" not in expr:
                assert prom_server.query(expr), f"no data for {expr}"
        assert prom_server.query("sum(hpcwatch_findings)")[0]["value"][1] == "0"
        assert prom_server.query("hpcwatch_job_stragglers > 0"), "the straggler scenario should show"
    finally:
        server.shutdown()
