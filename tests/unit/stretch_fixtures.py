"""Fixtures of the tests that read a job's window stretch by stretch (``reports.jobstretches``): a growing twin's
store, stretches of a minute, and the reads of the window counted; and the reads of the whole store's stretches
(``reports.storestretches``) counted. Imported by those test modules."""

from __future__ import annotations

import pytest

from hpcwatch.reports import jobstretches, storestretches
from hpcwatch.store import Store, queries
from tests.conftest import reference_twin


@pytest.fixture
def live():
    """Seven minutes of the reference twin (seven stretches), then more on demand."""
    store = Store(":memory:")
    yield store, reference_twin(store, seed=21, ticks=42)
    store.close()


@pytest.fixture(autouse=True)
def small_stretches(monkeypatch):
    """Stretches of a minute (the shortest) whatever their rows: the twin's cluster is small."""
    monkeypatch.setattr(jobstretches, "STRETCH_ROWS", 1)


@pytest.fixture
def reads(monkeypatch):
    """The first time of each read of the window: ``job_window_samples`` (a stretch) and ``job_window_samples_within``
    (the whole window at once, when it did not give up)."""
    seen: list[float] = []
    read, read_within = queries.job_window_samples, queries.job_window_samples_within

    def counting(store, metrics, **window):
        seen.append(window["t0"])
        return read(store, metrics, **window)

    def counting_within(store, metrics, limit, **window):
        found = read_within(store, metrics, limit, **window)
        if found is not None:  # a window given up past the limit was not read
            seen.append(window["t0"])
        return found

    monkeypatch.setattr(jobstretches.queries, "job_window_samples", counting)
    monkeypatch.setattr(jobstretches.queries, "job_window_samples_within", counting_within)
    return seen


@pytest.fixture
def store_reads(monkeypatch):
    """The first time of each read of a stretch of the whole store (``queries.window_samples`` as
    ``reports.storestretches`` calls it: ``hpcwatch jobs``, the exporter, digests)."""
    seen: list[float] = []
    read = queries.window_samples

    def counting(store, metrics, **bounds):
        seen.append(bounds["t0"])
        return read(store, metrics, **bounds)

    monkeypatch.setattr(storestretches.queries, "window_samples", counting)
    return seen
