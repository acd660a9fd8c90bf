"""collect's ``task = "assess"``: the assessment run on schedule, its verdict stored, shown without recomputing."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hpcwatch.assess import AssessConfig
from hpcwatch.collect.config import ScheduleSection, parse_config
from hpcwatch.collect.schedule import ScheduledTask
from hpcwatch.errors import ConfigError
from hpcwatch.exporter import registry_for
from hpcwatch.model.cluster import reference_cluster
from hpcwatch.reports.assess import OVERALL, TIER_NUMBERS, assessment_document, assessment_report, latest_assessment
from hpcwatch.store import Store
from hpcwatch.twin import Twin
from hpcwatch.vocab import EventKind
from hpcwatch.web.app import create_app


@pytest.fixture(scope="module")
def twin_store(tmp_path_factory) -> Store:
    """Six simulated seconds of the reference cluster (the well-kept scenario), in a store on disk."""
    twin = Twin(reference_cluster(), seed=0, scenarios=("well_kept",))
    store = Store(tmp_path_factory.mktemp("assess") / "store")
    for _ in range(6):
        twin.advance(1.0)
        store.add(twin.records())
    return store


@pytest.fixture(scope="module")
def assessed(twin_store):
    task = ScheduledTask(twin_store, ScheduleSection(name="assess", task="assess", interval_s=600))
    result = task.run()
    return twin_store, result


def test_the_scheduled_assessment_stores_the_tier_the_report_gives(assessed):
    store, result = assessed
    expected = assessment_document(assessment_report(store, AssessConfig(cluster=reference_cluster())))
    events = store.events(EventKind.ASSESSMENT)
    assert result.records == 1 and len(events) == 1
    assert f"tier {expected['tier']}" == result.note
    attrs = events[0].attrs
    assert attrs["tier"] == expected["tier"]
    assert attrs["categories"] == {c["name"]: c["tier"] for c in expected["categories"]}
    assert sum(attrs["statuses"].values()) == sum(len(c["criteria"]) for c in expected["categories"])


def test_metrics_show_the_stored_tier_per_category_as_a_number(assessed):
    store, _ = assessed
    latest = latest_assessment(store)
    text = generate_latest(registry_for(store)).decode()
    samples = {
        s.labels["category"]: s.value
        for f in text_string_to_metric_families(text)
        if f.name == "hpcwatch_assessment_tier"
        for s in f.samples
    }
    assert samples[OVERALL] == TIER_NUMBERS[latest.tier]
    assert set(samples) == {OVERALL, *latest.categories}
    assert min(samples.values()) == samples[OVERALL]  # the overall tier is the lowest category's


def test_tier_numbers_rank_best_highest():
    assert [TIER_NUMBERS[t] for t in ("Platinum", "Gold", "Silver", "Bronze", "Underperform")] == [4, 3, 2, 1, 0]


def test_no_stored_assessment_means_no_sample_and_a_null_answer(tmp_path):
    store = Store(tmp_path / "empty")
    text = generate_latest(registry_for(store)).decode()
    assert "hpcwatch_assessment_tier{" not in text
    with TestClient(create_app(store, reference_cluster())) as c:
        assert c.get("/api/assess/latest").json() is None


def test_serve_reads_the_stored_verdict_without_assessing(assessed, monkeypatch):
    store, _ = assessed
    import hpcwatch.web.api as api

    def refuse(*a, **k):
        raise AssertionError("assessed again")

    monkeypatch.setattr(api, "assessment_report", refuse)
    with TestClient(create_app(store, reference_cluster())) as c:
        doc = c.get("/api/assess/latest").json()
    assert doc["tier"] == latest_assessment(store).tier and doc["categories"]


def test_config_accepts_task_assess_and_names_a_wrong_task():
    config = parse_config('[[schedule]]\nname = "assess"\ntask = "assess"\ninterval_s = 900.0\n')
    (section,) = config.collectors
    assert section.task == "assess" and section.interval_s == 900.0
    with pytest.raises(ConfigError, match="task"):
        parse_config('[[schedule]]\ntask = "asses"\n')  # a typo: refused at start, not ignored
