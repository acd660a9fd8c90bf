"""reports/: each question answered once, and every view (CLI, exporter, web) giving the same numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hpcwatch.errors import InputError
from hpcwatch.exporter import registry_for
from hpcwatch.model.cluster import reference_cluster
from hpcwatch.records import VECTORS, Event, Finding, Job, Sample
from hpcwatch.reports import (
    finding_counts,
    findings_summary,
    goodput_report,
    gpu_table,
    job_report,
    jobs_report,
    live_snapshot,
    live_training,
    node_health,
    player_step,
    step_report,
)
from hpcwatch.store import Store
from hpcwatch.web.app import create_app


def _scrape(store: Store, **options) -> dict[str, list]:
    text = generate_latest(registry_for(store, **options)).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


@pytest.fixture(scope="module")
def straggler_db(tmp_path_factory) -> str:
    """Six simulated seconds of the reference cluster with the straggler scenario (GPU 2 of node1)."""
    from hpcwatch.twin import Twin

    twin = Twin(reference_cluster(), seed=0, scenarios=("straggler",))
    path = str(tmp_path_factory.mktemp("straggler") / "s.duckdb")
    with Store(path) as store:
        for _ in range(6):
            twin.advance(1.0)
            store.add(twin.records())
    return path


@pytest.fixture(scope="module")
def failures_db(tmp_path_factory) -> str:
    """Half a day of a 16,384-GPU job under Llama 3's failure rates: four failures, saves and restores."""
    from hpcwatch.analysis.goodputsim import GoodputSimConfig, simulate_goodput

    run = simulate_goodput(GoodputSimConfig(gpus=16384, days=0.5, step_s=5.0, seed=0))
    path = str(tmp_path_factory.mktemp("failures") / "g.duckdb")
    with Store(path) as store:
        store.add(run.records("g1"))
    return path


def _training_job(store: Store) -> str:
    (job,) = {s.job for s in store.spans()}
    return job


# -- one number, every view ----------------------------------------------------------------------


def test_goodput_is_the_same_in_the_cli_the_exporter_and_the_report(failures_db, run_cli):
    code, out, _ = run_cli(["goodput", "g1", "--db", failures_db, "--json"])
    assert code == 0
    cli = json.loads(out)
    with Store(failures_db) as store:
        report = goodput_report(store, "g1")
        (exported,) = _scrape(store)["hpcwatch_job_goodput_ratio"]
    assert report.interruptions == cli["interruptions"] >= 1  # failures split re-runs: the case that differed
    assert cli["goodput"] == report.goodput == exported.value
    assert cli["steps"] == report.steps


def test_step_time_and_straggler_agree_in_the_cli_the_exporter_and_the_web(straggler_db, run_cli):
    with Store(straggler_db) as store:
        job = _training_job(store)
        families = _scrape(store, recent_steps=10**6)  # the CLI reads every step; so does this scrape
        with TestClient(create_app(store, reference_cluster())) as client:
            web = client.get("/api/steps", params={"job": job}).json()
    code, out, _ = run_cli(["steps", "--job", job, "--db", straggler_db, "--json"])
    assert code == 0
    cli = json.loads(out)
    (step_s,) = families["hpcwatch_job_step_seconds"]
    assert step_s.value == pytest.approx(cli["step_time_s"], rel=1e-12)
    shown = next(s for s in cli["steps"] if s["step"] == web["step"])
    assert web["step_time_s"] == pytest.approx(shown["time_s"], rel=1e-12)
    (straggler,) = cli["stragglers"]
    scores = {int(s.labels["rank"]): s.value for s in families["hpcwatch_rank_relative_score"]}
    assert min(scores, key=scores.get) == straggler["rank"] == web["straggler"]["rank"]
    assert (web["straggler"]["node"], web["straggler"]["gpu"]) == ("node1", 2) == (straggler["node"], straggler["gpu"])
    assert web["straggler"]["phase"] == straggler["phase"] == "backward"
    assert web["reference_rank"] != straggler["rank"]


# -- each report ---------------------------------------------------------------------------------


def test_step_report_names_the_straggler_and_its_step_time(straggler_db):
    with Store(straggler_db) as store:
        job = _training_job(store)
        full = step_report(store, job)
        recent = step_report(store, job, recent_steps=1)  # the last step number only
        with pytest.raises(InputError, match="no step spans"):
            step_report(store, "nope")
    assert full.straggler is not None and full.straggler.gpu == 2
    assert len(full.step_times_s) == len(full.anatomy.steps) > len(recent.anatomy.steps) == 1
    assert recent.anatomy.steps[-1] == full.anatomy.steps[-1]
    assert 0.02 < full.step_time_s < 0.2


def test_player_step_carries_the_servers_verdict(straggler_db):
    with Store(straggler_db) as store:
        doc = player_step(store, _training_job(store))
        with pytest.raises(InputError):
            player_step(store, "nope")
    assert doc.straggler is not None and doc.straggler.phase_s > 0
    others = [r for r in doc.ranks if r.rank != doc.straggler.rank]
    assert doc.straggler.others_wait_s > 0 and doc.max_wait_s >= doc.straggler.others_wait_s
    assert doc.reference_rank in {r.rank for r in others}


def test_player_step_of_an_even_job_has_no_straggler():
    from hpcwatch.twin import Twin

    twin, store = Twin(reference_cluster(), seed=0), Store(":memory:")
    twin.advance(1.0)
    store.add(twin.records())
    doc = player_step(store, _training_job(store))
    assert doc.straggler is None and doc.step_time_s > 0


def test_live_training_is_the_newest_complete_step(straggler_db):
    with Store(straggler_db) as store:
        job = _training_job(store)
        live = live_training(store)
        report = step_report(store, job, recent_steps=2)
        assert live_training(store, exclude_jobs=[job]) is None
    assert live.job == job and live.step == report.anatomy.steps[-1]
    assert live.step_time_s == pytest.approx(report.step_times_s[-1])


def _small_store() -> Store:
    store = Store(":memory:")
    store.add(
        [
            Job(
                id="1",
                user="ann",
                account="a",
                nodes=("n1",),
                gpus=1,
                gpus_by_node={"n1": (0,)},
                start=0.0,
                end=100.0,
                state="COMPLETED",
            ),
            Job(id="2", user="bob", account="b", gpus=1, state="PENDING"),
            *[
                Sample(
                    metric="DCGM_FI_DEV_GPU_UTIL",
                    labels={"Hostname": "n1", "gpu": "0", "hpc_job": "1"},
                    t=float(t),
                    value=80.0,
                )
                for t in range(0, 100, 10)
            ],
            Event(kind="xid", t=95.0, source="dcgm", attrs={"node": "n1", "xid": 79, "gpu": "0"}),
            Finding(
                vector="rdma_blind_spot",
                severity="high",
                target="n1",
                title="t",
                evidence={"a": 1},
                t=5.0,
                rule="rdma.x",
            ),
        ]
    )
    return store


def test_jobs_report_filters_and_job_report_refuses_unknown_jobs():
    store = _small_store()
    assert [r.id for r in jobs_report(store, user="ann")] == ["1"]
    assert jobs_report(store, account="nobody") == []
    assert job_report(store, "1").mean_gpu_util == pytest.approx(80.0)
    with pytest.raises(InputError, match="no job 9"):
        job_report(store, "9")
    with pytest.raises(InputError, match="never started"):
        job_report(store, "2")


def test_goodput_report_refuses_a_job_with_nothing_stored():
    with pytest.raises(InputError, match="neither the job nor its steps"):
        goodput_report(_small_store(), "9")


def test_node_health_judges_the_window_and_one_node():
    store = _small_store()
    report = node_health(store, node="n1")
    assert [n.node for n in report.nodes] == ["n1"]
    assert report.verdict == "drain"  # XID 79: the GPU fell off the bus
    (unknown,) = node_health(store, node="n9").nodes
    assert unknown.verdict == "ok" and unknown.checks == ()  # nothing looked at: no check, not a pass


def test_findings_summary_and_counts_cover_every_vector():
    store = _small_store()
    summary = findings_summary(store)
    assert list(summary) == list(VECTORS)
    assert summary["rdma_blind_spot"].findings == 1 and summary["rdma_blind_spot"].evidence == {"a": 1}
    counts = finding_counts(store)
    assert counts[("rdma_blind_spot", "high")] == 1 and sum(counts.values()) == 1


def test_live_snapshot_and_gpu_table():
    store = _small_store()
    doc = live_snapshot(store, weights_path="/weights", now=90.0)
    assert doc["gpus"]["n1/0"]["util_pct"] == 80.0 and doc["gpus"]["n1/0"]["user"] == "ann"
    assert doc["queue"]["pending"] == 1 and doc["training"] is None
    assert doc["collectors"]["dcgm_exporter"]["arriving"] and not doc["collectors"]["ebpf_weights"]["arriving"]
    assert doc["vectors"]["rdma_blind_spot"]["rule"] == "rdma.x"
    (gpu,) = gpu_table(store)
    assert (gpu["host"], gpu["gpu"], gpu["user"], gpu["util_pct"]) == ("n1", "0", "ann", 80.0)


def test_no_sql_outside_the_store():
    """Views format, reports and detectors ask store/queries.py: only store/ writes a query."""
    from pathlib import Path

    import hpcwatch

    root = Path(hpcwatch.__file__).parent
    # store/ writes SQL; promql.py is the other backend, whose .query() speaks PromQL
    files = [f for f in root.rglob("*.py") if f.relative_to(root).parts[0] not in ("store", "promql.py")]
    offenders = [
        f.relative_to(root).as_posix()
        for f in files
        if any(call in f.read_text() for call in (".query(", ".query_arrow(", "SELECT "))
    ]
    assert len(files) > 20 and offenders == []


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_a_large_step_is_drawn_by_its_slowest_ranks_the_straggler_and_the_reference(limit):
    """A real 4-process torch gloo job, one rank made slow (tests/data/kineto/gloo_straggler/hook): with fewer
    ranks drawn than it has, the drawn ones are the straggler, the reference rank and those that worked longest;
    the verdict and the waits stay the whole step's."""
    from hpcwatch.ingest import ingest_paths

    hook = Path(__file__).resolve().parents[1] / "data" / "kineto" / "gloo_straggler" / "hook"
    with Store(":memory:") as store:
        ingest_paths(store, [hook])
        job = _training_job(store)
        whole = player_step(store, job, ranks_shown=0)
        drawn = player_step(store, job, ranks_shown=limit)
    assert whole.ranks_total == drawn.ranks_total == len(whole.ranks) == 4
    assert whole.straggler is not None and drawn.straggler == whole.straggler and drawn.max_wait_s == whole.max_wait_s
    kept = {whole.straggler.rank, whole.reference_rank}
    work = {r.rank: sum(p.dur_s for p in r.phases if p.phase != "barrier_wait") for r in whole.ranks}
    others = sorted((r for r in work if r not in kept), key=lambda r: -work[r])
    want = kept | set(others[: max(0, limit - len(kept))])
    assert [r.rank for r in drawn.ranks] == sorted(want)
    assert all(r in whole.ranks for r in drawn.ranks)  # the same rows, not rebuilt
