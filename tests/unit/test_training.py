"""Each job's recent steps and goodput kept from one ask to the next (``reports.training``, the exporter's training
families): the figures a fresh computation gives, computed again only for a job whose spans, goodput events or
record changed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hpcwatch.records import Event
from hpcwatch.reports import training
from hpcwatch.reports.goodput import goodput_report
from hpcwatch.reports.steps import step_report
from hpcwatch.reports.training import KeptTraining
from hpcwatch.store import Store
from hpcwatch.vocab import EventKind


@pytest.fixture
def twin_store():
    """Six simulated seconds of the reference cluster with the twin's straggler, and the twin to write more."""
    from hpcwatch.model.cluster import reference_cluster
    from hpcwatch.twin import Twin

    twin = Twin(reference_cluster(), seed=0, scenarios=("straggler",))
    store = Store(":memory:")
    for _ in range(6):
        twin.advance(1.0)
        store.add(twin.records())
    yield store, twin
    store.close()


@pytest.fixture
def computed(monkeypatch) -> list[str]:
    """The jobs whose steps were computed (``training.step_report`` called)."""
    seen: list[str] = []

    def counting(store, job, **kw):
        seen.append(job)
        return step_report(store, job, **kw)

    monkeypatch.setattr(training, "step_report", counting)
    return seen


def _fresh(store: Store) -> list[tuple[str, float | None, float]]:
    jobs = sorted({j for (j,) in store.query("SELECT DISTINCT job FROM spans WHERE job IS NOT NULL")})
    return [(j, step_report(store, j, recent_steps=50).step_time_s, goodput_report(store, j).goodput) for j in jobs]


def _kept(kept: KeptTraining, store: Store) -> list[tuple[str, float | None, float]]:
    return [(t.job, t.steps.step_time_s, t.goodput) for t in kept.reports(store, recent_steps=50)]


def test_kept_figures_are_a_fresh_computations_and_are_computed_again_only_when_the_job_changed(
    twin_store, computed
) -> None:
    store, twin = twin_store
    kept = KeptTraining()
    first = _kept(kept, store)
    assert first == _fresh(store) and len(first) == 1
    (job,) = [j for j, *_ in first]
    computed.clear()
    assert _kept(kept, store) == first and computed == []  # nothing landed: nothing computed
    twin.advance(2.0)
    store.add(twin.records())
    assert _kept(kept, store) == _fresh(store) and computed == [job]  # its spans landed
    computed.clear()
    store.add(
        [Event(kind=EventKind.CHECKPOINT_SAVE, t=store.time_range()[1] or 0.0, source="t", attrs={"job": "other"})]
    )
    assert _kept(kept, store) == _fresh(store) and computed == []  # another job's event
    store.add([Event(kind=EventKind.FAILURE, t=store.time_range()[1] or 0.0, source="t", attrs={"cause": "power"})])
    assert _kept(kept, store) == _fresh(store) and computed == [job]  # an event without a job is every job's


def test_a_job_whose_record_changed_is_computed_again(twin_store, computed) -> None:
    store, _ = twin_store
    kept = KeptTraining()
    (found,) = kept.reports(store, recent_steps=50)
    record = store.job(found.job)
    assert record is not None
    computed.clear()
    store.add([replace(record, end=(store.time_range()[1] or 0.0) + 1.0, state="COMPLETED")])
    assert _kept(kept, store) == _fresh(store) and computed == [found.job]
