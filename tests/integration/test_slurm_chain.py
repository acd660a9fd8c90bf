"""The whole chain, for real: Slurm prolog -> mapping files -> twin's dcgm-exporter -> Prometheus -> PromQL -> attribution.

alice (proj-llm) and bob (proj-vision) submit GPU jobs to a real Slurm 22.05; the project's prolog
writes dcgm-exporter's mapping files; ``hpcwatch twin serve`` labels the GPUs from them on every
scrape; a real Prometheus 2.42 scrapes both nodes; ``hpcwatch jobs --prometheus URL`` attributes GPU
time and energy to the job, user and account Slurm reports (squeue --json / sacct --json, read
with hpcwatch.sources.slurm). After scancel the files, and the label, are gone.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pyarrow.compute as pc
import pytest

from .conftest import wait_until

pytestmark = pytest.mark.integration

PROMETHEUS_PORT = 29087  # its VictoriaMetrics +100, vmalert +200; collect_slurm has 29093
SCRAPES_WITH_LABELS = 4
#: Seconds back from Prometheus' now where every scrape stamped before is stored (three scrape intervals).
SETTLED_S = 3.0


@pytest.fixture(scope="module")
def chain(slurm, twin_serve, start_promql):
    """Jobs running, their GPUs labelled, Prometheus holding a few labelled scrapes."""
    from hpcwatch.twin.serve import prometheus_config

    prom = start_promql(prometheus_config(twin_serve.targets, scrape_interval_s=1), port=PROMETHEUS_PORT)
    jobs = {
        "a": slurm.sbatch("alice", "--gres=gpu:2", "-J", "chain-llm"),
        "b": slurm.sbatch("bob", "--gres=gpu:3", "-J", "chain-vision"),
        "c": slurm.sbatch("alice", "-N", "2", "--gres=gpu:1", "-J", "chain-2node"),
    }
    wait_until(
        lambda: all(slurm.job_states().get(j) == "RUNNING" for j in jobs.values()),
        timeout_s=30,
        what="the chain's jobs to run",
    )
    want = {jobs["a"]: 2, jobs["b"]: 3, jobs["c"]: 2}

    def labelled() -> bool:
        got = prom.query('count by (hpc_job) (DCGM_FI_DEV_GPU_UTIL{hpc_job!=""})')
        return {r["metric"]["hpc_job"]: int(r["value"][1]) for r in got} == want

    t0 = time.monotonic()
    wait_until(labelled, timeout_s=40, what=f"Prometheus to see hpc_job labels {want}")
    first_labelled_s = time.monotonic() - t0
    time.sleep(SCRAPES_WITH_LABELS + SETTLED_S)  # a few scrapes before the settled time, so counters have deltas
    yield {"slurm": slurm, "prom": prom, "jobs": jobs, "first_labelled_s": first_labelled_s}
    slurm.run("scancel", *jobs.values(), check=False)


def test_twin_endpoints_label_exactly_the_gpus_of_the_mapping_files(chain, twin_serve):
    from prometheus_client.parser import text_string_to_metric_families

    mapping = chain["slurm"].mapping()
    for node, target in twin_serve.targets.items():
        text = httpx.get(f"http://{target}/metrics", timeout=5).text
        util = next(f for f in text_string_to_metric_families(text) if f.name == "DCGM_FI_DEV_GPU_UTIL")
        labelled = {s.labels["gpu"]: s.labels.get("hpc_job") for s in util.samples}
        expected = {where.split("/")[1]: ids[0] for where, ids in mapping.items() if where.startswith(node + "/")}
        assert {g: j for g, j in labelled.items() if j} == expected, node


def _store_with_slurm_jobs(slurm, path) -> list:
    """Jobs as Slurm reports them, through the readers: sacct --json (if accounting), then squeue --json."""
    from hpcwatch.sources.slurm import parse_sacct_json, parse_squeue_json
    from hpcwatch.store import Store

    records = []
    if slurm.accounting == "dbd":
        sacct = slurm.run("sacct", "--json", "-X", "-S", "now-3600").stdout
        records += list(parse_sacct_json(sacct, path="sacct --json"))
    records += list(parse_squeue_json(slurm.run("squeue", "--json").stdout, path="squeue --json"))
    with Store(path) as store:
        store.add(records)
    return records


def test_promql_attribution_matches_prometheus_own_arithmetic(chain, tmp_path):
    """Samples fetched through promql.py, attributed in Python, agree with the same sums done in PromQL."""
    from hpcwatch.analysis.attribution import DCGM_METRICS, job_reports
    from hpcwatch.promql import PrometheusBackend
    from hpcwatch.store import Store

    slurm, jobs = chain["slurm"], chain["jobs"]
    _store_with_slurm_jobs(slurm, tmp_path / "jobs.duckdb")
    with Store(tmp_path / "jobs.duckdb") as store:
        slurm_jobs = [store.job(j) for j in jobs.values()]
    with PrometheusBackend(chain["prom"].url) as prom:
        # A scrape is stamped when it starts and appended when it ends: the last second may still gain a point
        # between the two reads below (PromQL once counted a point more than the samples read before it). Both
        # read up to a time whose scrapes are all in (three 1 s scrape intervals back).
        t1 = float(prom.query("time()")["value"][0].as_py()) - SETTLED_S
        window_s = 120
        table = prom.samples(DCGM_METRICS, t0=t1 - window_s, t1=t1)
        # Only the labelled series: PromQL below groups by hpc_job, so unlabelled scrapes taken in
        # the instant between allocation and the prolog must not count on either side.
        table = table.filter(pc.invert(pc.is_null(table["job"])))
        # One job's rows at a time: PromQL's max - min runs over that job's own series, so the Python side
        # must not see the delta from another job's last sample on the same GPU (an earlier test's job).
        reports = {
            j.id: next(r for r in job_reports(table.filter(pc.equal(table["job"], j.id)), [j], now=t1) if r.id == j.id)
            for j in slurm_jobs
        }
        energy = prom.query(
            f'sum by (hpc_job) (max_over_time(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{hpc_job!=""}}'
            f'[{window_s}s]) - min_over_time(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{hpc_job!=""}}'
            f"[{window_s}s]))",
            t=t1,
            name="energy_mj",
        )
        util = prom.query(
            f'sum by (hpc_job) (sum_over_time(DCGM_FI_DEV_GPU_UTIL{{hpc_job!=""}}[{window_s}s])) / '
            f'sum by (hpc_job) (count_over_time(DCGM_FI_DEV_GPU_UTIL{{hpc_job!=""}}[{window_s}s]))',
            t=t1,
            name="util",
        )
    energy_mj = dict(zip(energy["job"].to_pylist(), energy["value"].to_pylist()))
    for key, job_id in jobs.items():
        r = reports[job_id]
        assert r.energy_kwh > 0, key
        assert r.energy_kwh * 3.6e9 == pytest.approx(energy_mj[job_id], rel=1e-9), key
        assert {(g.host, g.gpu) for g in r.per_gpu} == {
            tuple(where.split("/")) for where, ids in slurm.mapping().items() if job_id in ids
        }, key
    util_by_job = dict(zip(util["job"].to_pylist(), util["value"].to_pylist()))
    for job_id in jobs.values():
        assert reports[job_id].mean_gpu_util == pytest.approx(util_by_job[job_id], rel=1e-6)


def test_hpcwatch_jobs_attributes_gpu_time_and_energy_to_job_user_account(chain, tmp_path):
    slurm, jobs = chain["slurm"], chain["jobs"]
    db = tmp_path / "chain.duckdb"
    _store_with_slurm_jobs(slurm, db)
    out = subprocess.run(
        [sys.executable, "-m", "hpcwatch", "jobs", "--db", str(db), "--prometheus", chain["prom"].url, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    rows = doc["jobs"] if isinstance(doc, dict) else doc
    by_id = {str(r["id"]): r for r in rows}
    expect = {"a": ("alice", "proj-llm", 2), "b": ("bob", "proj-vision", 3), "c": ("alice", "proj-llm", 2)}
    for key, (user, account, gpus) in expect.items():
        r = by_id[jobs[key]]
        assert (r["user"], r["account"], r["gpus"]) == (user, account, gpus), key
        assert r["gpu_hours"] > 0 and r["energy_kwh"] > 0 and r["mean_gpu_util"] is not None, key
        assert r["gpu_hours"] == pytest.approx(gpus * r["elapsed_s"] / 3600, rel=1e-6)


def test_after_scancel_the_files_and_the_label_are_gone(chain):
    slurm, prom, jobs = chain["slurm"], chain["prom"], chain["jobs"]
    slurm.run("scancel", *jobs.values())
    wait_until(lambda: slurm.mapping() == {}, timeout_s=30, what="the epilog to empty the mapping directory")
    wait_until(
        lambda: not prom.query('DCGM_FI_DEV_GPU_UTIL{hpc_job!=""}'),
        timeout_s=60,
        what="the hpc_job series to go stale in Prometheus",
    )
    # The GPUs are still there, unlabelled. Each GPU's unlabelled series starts at its next scrape, and the last
    # labelled one may go stale first: a loaded machine showed 15 of 16 in between, so wait for the 16th.
    wait_until(
        lambda: len(prom.query("DCGM_FI_DEV_GPU_UTIL")) == 16,
        timeout_s=60,
        what="all 16 GPUs' unlabelled series",
    )
    print(
        f"first labelled scrape visible {chain['first_labelled_s']:.1f}s after the jobs ran; "
        f"slurm-up took {slurm.startup_s:.1f}s ({slurm.accounting} accounting)"
    )
