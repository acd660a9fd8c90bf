"""reports/livetraining.py: the live page's training card, kept from the spans committed since the last question.

After every commit, in any order of arrival, ``FollowedTraining`` must answer what the spans as a whole say:
the job whose spans end last, its largest step number, and the time of the newest complete step of its last
two step numbers (computed here from ``Span`` records, independently of the SQL). Inputs: the hook files of a
real 4-rank gloo job on CPU (tests/data/kineto/gloo_straggler/hook/, tests/data/SOURCES.md) committed in
shuffled batches, and the twin's store tick by tick through an XID that requeues its job (its steps restart).
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from hpcwatch.analysis.steps import anatomy_from_spans, step_times_s
from hpcwatch.errors import InputError
from hpcwatch.ingest import ingest_paths
from hpcwatch.model import reference_cluster
from hpcwatch.records import Span
from hpcwatch.reports.livetraining import KEEP_SPANS_S, LIVE_STEPS, FollowedTraining, LiveTraining, live_training
from hpcwatch.store import Store
from hpcwatch.twin.live import LiveTwin

HOOK = Path(__file__).resolve().parents[1] / "data" / "kineto" / "gloo_straggler" / "hook"


def _expected(spans: list[Span], exclude: tuple[str, ...] = ()) -> LiveTraining | None:
    """The card from the spans as a whole, in Python."""
    mine = [s for s in spans if s.job not in exclude]
    if not mine:
        return None
    ends: dict[str, float] = {}
    for s in mine:
        ends[s.job] = max(ends.get(s.job, s.start + s.dur), s.start + s.dur)
    job = max(ends, key=lambda j: (ends[j], j))
    own = [s for s in mine if s.job == job]
    numbers = sorted({s.step for s in own})
    try:
        anatomy = anatomy_from_spans([s for s in own if s.step in numbers[-LIVE_STEPS:]])
    except InputError:  # no training phase among them yet
        anatomy = None
    if anatomy is None or not anatomy.steps:
        return LiveTraining(job=job, step=numbers[-1], step_time_s=None)
    return LiveTraining(job=job, step=anatomy.steps[-1], step_time_s=float(step_times_s(anatomy)[-1]))


@pytest.fixture(scope="module")
def hook_spans() -> list[Span]:
    st = Store(":memory:")
    ingest_paths(st, [HOOK])
    spans = st.spans()
    st.close()
    assert len({s.step for s in spans}) > 3
    return spans


@pytest.mark.parametrize("seed", range(4))
def test_real_spans_committed_in_shuffled_batches_give_the_card_of_them_all(hook_spans, seed):
    spans = list(hook_spans)
    random.Random(seed).shuffle(spans)
    store = Store(":memory:")
    followed = FollowedTraining(store)
    assert followed.current() is None
    committed: list[Span] = []
    for i in range(0, len(spans), 37):
        batch = spans[i : i + 37]
        store.add(batch)
        committed += batch
        assert followed.current() == _expected(committed)
    assert followed.current() == live_training(store)
    store.close()


def test_the_newest_of_two_jobs_and_an_excluded_one(hook_spans):
    """Two jobs from the same real spans (the second 1 ms later, so it ends last), and a third left out."""
    store = Store(":memory:")
    base = [dataclasses.replace(s, job="a") for s in hook_spans]
    later = [dataclasses.replace(s, job="b", start=s.start + 0.001) for s in base]
    excluded = [dataclasses.replace(s, job="player", start=s.start + 10.0) for s in base]
    followed = FollowedTraining(store, exclude_jobs=("player",))
    committed: list[Span] = []
    newest = []
    for batch in (base[: len(base) // 2], later[: len(later) // 2], excluded, base[len(base) // 2 :]):
        store.add(batch)
        committed += batch
        found = followed.current()
        assert found is not None and found == _expected(committed, exclude=("player",))
        newest.append(found.job)
    assert newest == ["a", "b", "b", "a"]  # a's second half ends after b's first
    store.close()


def test_the_twin_tick_by_tick_through_a_requeue():
    store = Store(":memory:")
    live = LiveTwin(store, reference_cluster(), seed=3, scenarios=["straggler", "xid79"], start=1_796_000_000.0)
    followed = FollowedTraining(store)
    live.write_tick()
    answers = set()
    for _ in range(45):
        live.step()
        found = followed.current()
        assert found == _expected(store.spans())
        answers.add(found)
    assert len(answers) > 10  # the card moved with the steps
    store.close()


def test_steps_still_arriving_show_the_largest_step_number_seen(hook_spans):
    """No step every rank finished yet (the newest step from one rank, the one before from another): the card
    names the largest step number committed, even when an older step's spans come after it."""
    ranks = sorted({s.rank for s in hook_spans})
    numbers = sorted({s.step for s in hook_spans})
    newer = [s for s in hook_spans if s.rank == ranks[0] and s.step == numbers[-1]]
    older = [s for s in hook_spans if s.rank == ranks[1] and s.step == numbers[-2]]
    store = Store(":memory:")
    followed = FollowedTraining(store)
    store.add(newer)
    assert followed.current() == _expected(newer)
    store.add(older)
    found = followed.current()
    assert found == _expected(newer + older)
    assert found == LiveTraining(job=newer[0].job, step=numbers[-1], step_time_s=None)
    store.close()


def test_the_spans_of_a_job_silent_for_an_hour_are_not_kept(hook_spans):
    """Memory stays the size of the jobs training now: a job whose spans ended ``KEEP_SPANS_S`` before the
    newest keeps its end and step only; the newest job's card is unchanged."""
    store = Store(":memory:")
    followed = FollowedTraining(store)
    old = [dataclasses.replace(s, job="old") for s in hook_spans]
    new = [dataclasses.replace(s, job="new", start=s.start + KEEP_SPANS_S + 60.0) for s in hook_spans]
    store.add(old)
    assert followed.current() == _expected(old)
    store.add(new)
    assert followed.current() == _expected(old + new)
    assert set(followed._recent) == {"new"} and set(followed._ends) == {"old", "new"}
    store.close()
