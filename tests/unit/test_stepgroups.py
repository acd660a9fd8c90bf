"""A job's steps grouped from its spans, split at any time and joined, equal one pass over them to the last bit
(``analysis.stepgroups``); a server's job page groups only the spans after what it kept, and gives the goodput
a fresh read gives (``reports.goodput.step_groups``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcwatch.analysis.goodput import StepTable
from hpcwatch.analysis.stepgroups import StepGroups
from hpcwatch.records import Span
from hpcwatch.reports import goodput as goodput_reports
from hpcwatch.reports import jobstretches
from hpcwatch.reports.goodput import goodput_with_steps
from hpcwatch.reports.jobstretches import SETTLE_S, KeptStretches
from hpcwatch.reports.steps import step_report
from hpcwatch.store import Store, queries
from tests.conftest import reference_twin

#: Durations with many digits (their sum in floats depends on its order), a 0 s wait, a missing phase.
_SPANS = st.lists(
    st.tuples(
        st.integers(0, 3),  # rank
        st.integers(0, 5),  # step
        st.sampled_from(["load", "forward", "backward", "barrier_wait", "optimizer"]),
        st.sampled_from([0.0, 1.0, 1.25, 2.000001, 3.3, 4.7, 5.0, 9.999999]),  # start
        st.sampled_from([0.0, 0.1, 0.2, 0.3, 1e-9, 0.123456789, 2.5, 1 / 3]),  # dur
    ),
    min_size=1,
    max_size=40,
)


def _same(a: StepTable, b: StepTable) -> None:
    for f in dataclasses.fields(StepTable):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert (x is None and y is None) or (x.dtype == y.dtype and np.array_equal(x, y)), f.name


def _split(store: Store, breaks: tuple[float, ...], cut: float) -> StepGroups:
    groups, ranks = queries.job_step_groups(store, "j", breaks=breaks, cut=cut)

    def side(later: bool) -> StepGroups:
        return StepGroups.of_rows(
            groups.filter(pc.equal(groups["later"], later)), ranks.filter(pc.equal(ranks["later"], later))
        )

    return side(False).join(side(True))


@settings(max_examples=80, deadline=None)
@given(
    spans=_SPANS, cut=st.sampled_from([0.5, 1.0, 2.0, 3.3, 4.9, 7.0]), breaks=st.sampled_from([(), (3.3,), (1.0, 5.0)])
)
def test_steps_split_at_any_time_and_joined_are_one_pass(spans, cut, breaks) -> None:
    store = Store(":memory:")
    store.add([Span(job="j", rank=r, step=s, phase=p, start=t, dur=d) for r, s, p, t, d in spans])
    groups = StepGroups.of_rows(*queries.job_step_groups(store, "j", breaks=breaks))
    whole = groups.step_table()
    split = _split(store, breaks, cut)
    _same(split.step_table(), whole)
    # The waits' sums are the same integers (of 1e-18 s), not floats that a split rounds otherwise.
    assert [type(w) for w in split.wait] == [int] * len(split) and split.wait.tolist() == groups.wait.tolist()
    # In three: what a checkpoint kept, then the spans since it read apart (``since``) and split again.
    first = _split(store, breaks, cut)
    since = StepGroups.of_rows(*queries.job_step_groups(store, "j", breaks=breaks, since=cut))
    before = queries.job_step_groups(store, "j", breaks=breaks, cut=cut)
    kept = StepGroups.of_rows(
        before[0].filter(pc.equal(before[0]["later"], False)), before[1].filter(pc.equal(before[1]["later"], False))
    )
    _same(kept.join(since).step_table(), whole)
    assert len(first.step_table()) == len(whole)
    store.close()


def test_the_waits_are_the_exact_sum_whatever_the_split() -> None:
    """A third of a second ten times: float additions in two orders differ in the last bit; the kept sum not."""
    store = Store(":memory:")
    store.add(
        [Span(job="j", rank=r, step=1, phase="barrier_wait", start=float(r), dur=1 / 3 + r * 1e-17) for r in range(10)]
    )
    whole = StepGroups.of_rows(*queries.job_step_groups(store, "j")).step_table()
    assert whole.wait_s is not None
    assert whole.wait_s[0] == pytest.approx(1 / 3)
    for cut in (0.5, 3.0, 7.5):
        _same(_split(store, (), cut).step_table(), whole)
    store.close()


@pytest.fixture
def live():
    """The reference twin, 10 s ticks: a running job with spans every tick (a straggler)."""
    store = Store(":memory:")
    yield store, reference_twin(store, seed=3, ticks=12)
    store.close()


@pytest.fixture
def grouped(monkeypatch):
    """The ``since`` of each grouping of a job's spans."""
    seen: list[float | None] = []
    group = queries.job_step_groups

    def recording(store, job, **kwargs):
        seen.append(kwargs.get("since"))
        return group(store, job, **kwargs)

    monkeypatch.setattr(queries, "job_step_groups", recording)
    return seen


def _job_with_spans(store: Store) -> str:
    return next(j.id for j in store.jobs() if j.end is None and queries.newest_span_start(store, j.id) is not None)


def test_a_kept_page_groups_only_the_spans_since_its_checkpoint(live, grouped) -> None:
    store, twin = live
    job, kept = _job_with_spans(store), KeptStretches()
    found, steps = goodput_with_steps(store, job, kept=kept)
    fresh, fresh_steps = goodput_with_steps(store, job)
    assert found == fresh
    _same(steps, fresh_steps)
    assert grouped == [None, None]
    newest = queries.newest_span_start(store, job)
    assert newest is not None
    for _ in range(3):
        twin.step()
        grouped.clear()
        found, steps = goodput_with_steps(store, job, kept=kept)
        fresh, fresh_steps = goodput_with_steps(store, job)
        assert grouped[0] is not None and grouped[0] >= newest - SETTLE_S  # the tail only
        assert found == fresh
        _same(steps, fresh_steps)


def test_a_span_that_lands_before_the_checkpoint_is_grouped_again(live, grouped) -> None:
    store, twin = live
    job, kept = _job_with_spans(store), KeptStretches()
    goodput_with_steps(store, job, kept=kept)
    twin.step()
    goodput_with_steps(store, job, kept=kept)
    oldest = store.query("SELECT min(start), min(step) FROM spans WHERE job = ?", [job])[0]
    store.add([Span(job=job, rank=0, step=int(oldest[1]), phase="barrier_wait", start=float(oldest[0]), dur=0.5)])
    grouped.clear()
    found, steps = goodput_with_steps(store, job, kept=kept)
    assert grouped[0] is None  # from the start: every checkpoint was after the late span
    fresh, fresh_steps = goodput_with_steps(store, job)
    assert found == fresh
    _same(steps, fresh_steps)


def test_a_failure_break_regroups_every_span(live, monkeypatch, grouped) -> None:
    """The incarnations are split at the failures: new breaks are another grouping, not the kept one's."""
    store, _ = live
    job, kept = _job_with_spans(store), KeptStretches()
    goodput_with_steps(store, job, kept=kept)
    backward = sorted(t for (t,) in store.query("SELECT start FROM spans WHERE job = ? AND phase = 'backward'", [job]))
    middle = backward[len(backward) // 2]  # inside a step: its earlier phases one incarnation, the rest the next
    monkeypatch.setattr(goodput_reports, "job_failure_breaks", lambda record, events: [middle])
    grouped.clear()
    found, steps = goodput_with_steps(store, job, kept=kept)
    assert grouped[0] is None
    assert found == goodput_with_steps(store, job)[0]
    assert len(np.unique(steps.step)) < len(steps)  # the step the break cut: one row an incarnation


def test_the_recent_steps_read_from_their_first_start_are_those_of_every_span(live) -> None:
    store, _ = live
    job = _job_with_spans(store)
    _, steps = goodput_with_steps(store, job)
    for recent in (1, 3, 50):
        since = steps.first_start_of_last(recent)
        assert since is not None
        bounded = queries.recent_span_table(store, job, steps=recent, since=since)
        assert bounded.equals(queries.recent_span_table(store, job, steps=recent))
        assert step_report(store, job, recent_steps=recent, since=since) == step_report(store, job, recent_steps=recent)


def test_the_kept_steps_hold_two_age_bands(live) -> None:
    """A fold's state grows with the job's steps: it keeps ``FOLD_LAGS``' bands only, each filled as pages come."""
    store, twin = live
    job, kept = _job_with_spans(store), KeptStretches()
    for _ in range(20):  # 200 s of pages, one every 10 s: checkpoints 10 s apart, old enough for three bands
        goodput_with_steps(store, job, kept=kept)
        twin.step()
    (steps,) = [entry for (_, kind, _), entry in kept._entries.items() if kind == "steps"]
    newest = queries.newest_span_start(store, job) or 0.0
    ages = [newest - c.upto for c in steps.checkpoints]
    # The oldest of 40 s and more, the oldest of 10-40 s, the newest settled one, the end of the last page's read
    # (a step of the twin ago); no other.
    assert len(ages) == len(jobstretches.FOLD_LAGS) + 2
    assert ages[0] >= 40 > ages[1] > ages[2] >= 10 >= ages[3] > 0


def test_the_next_page_groups_only_the_spans_since_the_end_of_the_last_read(live, monkeypatch) -> None:
    """A page leaves a checkpoint at the end of what it grouped: the next one groups the spans that started
    since, and its steps are a fresh page's."""
    store, twin = live
    job, kept = _job_with_spans(store), KeptStretches()
    grouped: list[tuple[float | None, float | None]] = []
    groups = queries.job_step_groups

    def recording(store, job_id, **kwargs):
        grouped.append((kwargs.get("since"), kwargs.get("until")))
        return groups(store, job_id, **kwargs)

    monkeypatch.setattr(queries, "job_step_groups", recording)
    goodput_with_steps(store, job, kept=kept)
    end = jobstretches.read_end(queries.newest_span_start(store, job) or 0.0)
    assert grouped == [(None, end)]
    twin.step()
    grouped.clear()
    found, steps = goodput_with_steps(store, job, kept=kept)
    assert grouped[0] == (end, jobstretches.read_end(queries.newest_span_start(store, job) or 0.0))
    fresh, fresh_steps = goodput_with_steps(store, job)
    assert found == fresh
    _same(steps, fresh_steps)
    end = grouped[0][1]
    for _ in range(2):  # no span since: the pages read on from the same end, and keep it
        grouped.clear()
        goodput_with_steps(store, job, kept=kept)
        assert grouped == [(end, None)]
