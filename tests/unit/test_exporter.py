"""exporter.py: the /metrics text a Prometheus would scrape, computed from a store the twin filled."""

from __future__ import annotations

import time

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hpcwatch.exporter import METRIC_NAMES, JobUsage, StoreCollector, registry_for
from hpcwatch.records import SEVERITIES, VECTORS, Finding, Job, Sample
from hpcwatch.store import Store
from tests.unit.stretch_fixtures import store_reads  # noqa: F401  (fixture)


def scrape(store: Store, **options) -> dict[str, list]:
    text = generate_latest(registry_for(store, **options)).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


@pytest.fixture(scope="module")
def straggler_store() -> Store:
    """Six simulated seconds of the reference cluster with the twin's straggler scenario."""
    from hpcwatch.model.cluster import reference_cluster
    from hpcwatch.twin import Twin

    twin = Twin(reference_cluster(), seed=0, scenarios=("straggler",))
    store = Store(":memory:")
    for _ in range(6):
        twin.advance(1.0)
        store.add(twin.records())
    return store


def no_usage(store: Store) -> list[JobUsage]:
    return []


def test_training_metrics_name_the_straggler(straggler_store):
    families = scrape(straggler_store, usage=no_usage)
    (step,) = families["hpcwatch_job_step_seconds"]
    assert 0.02 < step.value < 0.2  # the seed's step is ~42 ms, the straggler stretches it
    job = step.labels["hpc_job"]
    (count,) = families["hpcwatch_job_stragglers"]
    assert count.labels["hpc_job"] == job and count.value >= 1
    scores = {(s.labels["node"], s.labels["gpu"]): s.value for s in families["hpcwatch_rank_relative_score"]}
    worst = min(scores, key=scores.get)
    assert worst == ("node1", "2")  # GPU 2 of node 1, as the scenario says
    assert scores[worst] < 0.9 and max(scores.values()) == pytest.approx(1.0)
    (goodput,) = families["hpcwatch_job_goodput_ratio"]
    assert 0.0 <= goodput.value <= 1.0
    named = {(s.labels["node"], s.labels["gpu"]) for s in families["hpcwatch_rank_straggler"]}
    assert ("node1", "2") in named and len(named) == count.value  # the rank the alert names, with its node


def test_findings_are_counted_for_every_vector_and_severity():
    store = Store(":memory:")
    store.add(
        [
            Finding(
                vector="supply_chain",
                severity="high",
                target="torch==2.0.0",
                title="known CVE",
                evidence={},
                t=1.0,
                rule="osv",
            ),
            Finding(
                vector="supply_chain",
                severity="high",
                target="numpy",
                title="known CVE",
                evidence={},
                t=2.0,
                rule="osv",
            ),
            Finding(
                vector="weights_access",
                severity="critical",
                target="/lustre/ckpt",
                title="read",
                evidence={},
                t=3.0,
                rule="tetragon",
            ),
        ]
    )
    samples = scrape(store, usage=no_usage)["hpcwatch_findings"]
    assert len(samples) == len(VECTORS) * len(SEVERITIES)
    counts = {(s.labels["vector"], s.labels["severity"]): s.value for s in samples}
    assert counts[("supply_chain", "high")] == 2 and counts[("weights_access", "critical")] == 1
    assert sum(counts.values()) == 3
    by_rule = {
        (s.labels["vector"], s.labels["rule"], s.labels["severity"]): s.value
        for s in scrape(store, usage=no_usage)["hpcwatch_finding_rules"]
    }
    assert by_rule == {("supply_chain", "osv", "high"): 2.0, ("weights_access", "tetragon", "critical"): 1.0}


def test_job_metrics_carry_hpc_job_user_account():
    job = Job(id="42", user="alice", account="proj-llm", partition="gpu", gpus=4, state="RUNNING")
    usage = [JobUsage(job=job, gpu_hours=2.5, energy_j=3.6e6, mean_util_percent=61.0, idle_gpus=1)]
    families = scrape(Store(":memory:"), usage=lambda store: usage)
    labels = {"hpc_job": "42", "user": "alice", "account": "proj-llm"}
    for name, value in (
        ("hpcwatch_job_gpu_hours", 2.5),
        ("hpcwatch_job_energy_joules", 3.6e6),
        ("hpcwatch_job_gpu_utilization_percent", 61.0),
        ("hpcwatch_job_idle_gpus", 1.0),
        ("hpcwatch_job_gpus", 4.0),
    ):
        (sample,) = families[name]
        assert sample.labels == labels and sample.value == value, name
    (info,) = families["hpcwatch_job_info"]
    assert info.labels == {**labels, "partition": "gpu", "state": "RUNNING"}


def test_a_failing_part_is_counted_and_the_rest_still_served():
    from hpcwatch.errors import StoreError

    def broken(store):
        raise StoreError("disk on fire")

    collector = StoreCollector(Store(":memory:"), usage=broken)
    names = {m.name for m in collector.collect()}
    assert "hpcwatch_findings" in names and "hpcwatch_job_gpu_hours" not in names
    assert collector.errors == 1


def test_a_scrape_does_not_wait_past_its_bound_for_the_job_figures_and_serves_the_last_ones(monkeypatch):
    """The first scrape after a start reads the store's life: a scrape waits ``COMPUTE_WAIT_S`` for the per-job
    figures, then serves the rest (the health verdicts the alerts route) without them; once computed, a scrape
    serves them with the time they were computed, and the next computes them again."""
    import threading

    from hpcwatch import exporter

    release, calls = threading.Event(), []

    def slow(store):
        calls.append(1)
        release.wait(60)
        return [
            JobUsage(job=Job(id="7", user="ann"), gpu_hours=2.0, energy_j=None, mean_util_percent=None, idle_gpus=0)
        ]

    collector = StoreCollector(Store(":memory:"), usage=slow)
    monkeypatch.setattr(exporter, "COMPUTE_WAIT_S", 0.2)
    first = {m.name: m for m in collector.collect()}
    assert "hpcwatch_findings" in first and "hpcwatch_job_gpu_hours" not in first
    assert "jobs" not in {s.labels["part"] for s in first["hpcwatch_exporter_computed_timestamp_seconds"].samples}
    release.set()
    monkeypatch.setattr(exporter, "COMPUTE_WAIT_S", 60.0)
    second = {m.name: m for m in collector.collect()}
    assert [s.value for s in second["hpcwatch_job_gpu_hours"].samples] == [2.0] and len(calls) == 1
    assert {s.labels["part"] for s in second["hpcwatch_exporter_computed_timestamp_seconds"].samples} == {
        "jobs",
        "training",
    }
    list(collector.collect())
    assert len(calls) == 2  # computed again for the next scrape


def test_a_scrape_waits_once_for_both_computations(monkeypatch):
    """The per-job and the training figures are computed side by side and waited for together: a scrape whose
    two computations both hang lasts ``COMPUTE_WAIT_S`` and a little, not twice it (a 10 s scrape timeout)."""
    import threading

    from hpcwatch import exporter
    from hpcwatch.reports.training import KeptTraining

    release = threading.Event()

    def hung(*args, **kwargs):
        release.wait(60)
        return []

    monkeypatch.setattr(KeptTraining, "reports", hung)
    monkeypatch.setattr(exporter, "COMPUTE_WAIT_S", 1.0)
    collector = StoreCollector(Store(":memory:"), usage=hung)
    started = time.monotonic()
    names = {m.name for m in collector.collect()}
    elapsed = time.monotonic() - started
    release.set()
    assert "hpcwatch_findings" in names and "hpcwatch_job_gpu_hours" not in names
    assert 1.0 <= elapsed < 1.9  # one wait of 1 s, where two in turn would be 2


def test_every_emitted_family_is_declared(straggler_store):
    emitted = set(scrape(straggler_store, usage=no_usage))
    assert emitted <= set(METRIC_NAMES)


def test_job_usage_from_a_twin_store_matches_the_twin_allocation():
    """The default path: store -> attribution -> gauges, on the twin's own jobs and samples."""
    from hpcwatch.model.cluster import reference_cluster
    from hpcwatch.twin import Twin

    twin = Twin(reference_cluster(), seed=3)
    store = Store(":memory:")
    for _ in range(5):
        twin.advance(10.0)
        store.add(twin.records())
    families = scrape(store)
    hours = {s.labels["hpc_job"]: s for s in families["hpcwatch_job_gpu_hours"]}
    running = [j for j in store.jobs() if j.start is not None]
    assert running and set(hours) == {j.id for j in running}
    for job in running:
        sample = hours[job.id]
        assert sample.labels["user"] == (job.user or "") and sample.labels["account"] == (job.account or "")
        assert sample.value == pytest.approx(twin.gpu_hours(job.id), rel=1e-6)
    energy = {s.labels["hpc_job"]: s.value for s in families["hpcwatch_job_energy_joules"]}
    assert energy and all(v > 0 for v in energy.values())
    util = [s.value for s in families["hpcwatch_job_gpu_utilization_percent"]]
    assert util and all(0.0 <= u <= 100.0 for u in util)


def _gpu_samples(metric: str, values: list[float], *, host: str, gpu: int, t0: float = 1_796_000_000.0) -> list[Sample]:
    labels = {"Hostname": host, "gpu": str(gpu), "UUID": f"GPU-{host}-{gpu}"}
    return [Sample(metric=metric, labels=labels, t=t0 + 15.0 * i, value=v) for i, v in enumerate(values)]


def _health_run(store: Store) -> None:
    """One run of ``hpcwatch collect``'s health task (deploy/hpcwatch.toml: every 600 s over 900 s)."""
    from hpcwatch.collect.config import ScheduleSection
    from hpcwatch.collect.schedule import ScheduledTask

    ScheduledTask(store, ScheduleSection(name="health", task="health", interval_s=600.0, window_s=900.0)).run()


def test_health_verdicts_are_published_per_node_and_rule():
    """An uncorrectable ECC error on node2 GPU 5 drains node2 (2); node1's same rule looked and found
    nothing (0); the XID rule on node2 warns (1) for XID 13. One series per (node, rule), whatever the GPUs."""
    store = Store(":memory:")
    assert not scrape(store, usage=no_usage)["hpcwatch_health_verdict"]  # no health run stored yet
    store.add(
        _gpu_samples("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", [0, 2], host="node2", gpu=5)
        + _gpu_samples("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", [0, 0], host="node2", gpu=6)
        + _gpu_samples("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", [0, 0], host="node1", gpu=0)
        + _gpu_samples("DCGM_FI_DEV_XID_ERRORS", [0, 13], host="node2", gpu=1)
    )
    assert not scrape(store, usage=no_usage)["hpcwatch_health_verdict"]  # samples alone are not judged here
    _health_run(store)
    families = scrape(store, usage=no_usage)
    samples = families["hpcwatch_health_verdict"]
    verdicts = {(s.labels["node"], s.labels["rule"]): s.value for s in samples}
    assert verdicts[("node2", "ecc_dbe")] == 2.0 and verdicts[("node1", "ecc_dbe")] == 0.0
    assert verdicts[("node2", "xid")] == 1.0
    assert len(samples) == len(verdicts)  # no (node, rule) twice
    # what the health task stored: the node's verdict and reason as before, and each rule's verdict there
    node2 = next(e.attrs for e in store.events("health_verdict") if e.attrs["node"] == "node2")
    assert node2["verdict"] == "drain" and node2["rules"] == {"ecc_dbe": "drain", "xid": "warn"}
    assert node2["reason"].startswith("ecc_dbe: ")
    (when,) = families["hpcwatch_health_verdict_timestamp_seconds"]
    (event,) = {e.t for e in store.events("health_verdict")}
    assert when.value == event


def test_health_verdicts_are_the_newest_run_s_only():
    """The volatile ECC counter reads 0 again after the GPU was reset: the next run says ok, and the exporter
    shows that run, not the history (an older run's drain would page forever)."""
    store = Store(":memory:")
    store.add(_gpu_samples("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", [2, 2], host="node2", gpu=5))
    _health_run(store)
    (sample,) = scrape(store, usage=no_usage)["hpcwatch_health_verdict"]
    assert sample.labels == {"node": "node2", "rule": "ecc_dbe"} and sample.value == 2.0
    store.add(_gpu_samples("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", [0], host="node2", gpu=5, t0=1_796_000_060.0))
    _health_run(store)
    assert len({e.t for e in store.events("health_verdict")}) == 2
    (sample,) = scrape(store, usage=no_usage)["hpcwatch_health_verdict"]
    assert sample.value == 0.0


def test_a_scrape_reads_on_from_the_last_one_and_shows_what_a_fresh_scrape_shows(store_reads):
    """The per-job sums of a scrape 30 s of the twin after the last read only what landed since (a store read
    whole each scrape grew with its age), and are the figures of an exporter that never scraped before."""
    from tests.conftest import reference_twin

    store = Store(":memory:")
    twin = reference_twin(store, seed=21, ticks=12)
    starts = store_reads
    registry = registry_for(store)

    def jobs_of(text: bytes) -> dict:
        families = text_string_to_metric_families(text.decode())
        return {f.name: sorted(map(str, f.samples)) for f in families if f.name.startswith("hpcwatch_job_")}

    generate_latest(registry)
    end = store.time_range()[1] or 0.0
    for _ in range(3):
        twin.step()
    starts.clear()
    kept = jobs_of(generate_latest(registry))
    assert starts and min(starts) > end
    assert kept == jobs_of(generate_latest(registry_for(store)))
    store.close()


def test_a_scrape_shows_the_running_jobs_and_those_that_ended_within_its_window():
    """The training job of the straggler scenario ended 6,600 s before the store's newest sample: a scrape with a
    window of an hour shows none of its families (its usage nor its training), one of two hours shows them; the
    running jobs are in both."""
    from dataclasses import replace

    from hpcwatch.model.cluster import reference_cluster
    from hpcwatch.twin import Twin

    twin = Twin(reference_cluster(), seed=0, scenarios=("straggler",))
    store = Store(":memory:")
    for _ in range(6):
        twin.advance(1.0)
        store.add(twin.records())
    (step,) = scrape(store, usage=no_usage)["hpcwatch_job_step_seconds"]
    trained = next(j for j in store.jobs() if j.id == step.labels["hpc_job"])
    assert trained.start is not None
    newest = store.time_range()[1] or 0.0
    store.add([replace(trained, end=newest - 6_600.0, state="COMPLETED")])
    running = {j.id for j in store.jobs() if j.start is not None and j.end is None}
    assert running

    def shown(ended_within_s: float) -> tuple[set[str], set[str]]:
        families = scrape(store, ended_within_s=ended_within_s)
        return (
            {s.labels["hpc_job"] for s in families["hpcwatch_job_info"]},
            {s.labels["hpc_job"] for s in families["hpcwatch_job_step_seconds"]},
        )

    assert shown(3_600.0) == (running, set())
    assert shown(7_200.0) == (running | {trained.id}, {trained.id})
    store.close()
