"""The live view's problems are judged in a thread of their own at a bounded share of the time
(``web.live.ProblemJudge``): a snapshot never waits for a judgement but the first."""

from __future__ import annotations

import threading

import pytest

from hpcwatch.web import live

TOOK_S = 2.0  # what each judgement "lasts" on the test's clock


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def judge(monkeypatch):
    """A ProblemJudge whose judgements are numbered, last TOOK_S on a fake clock, and wait on ``gate`` once
    ``gate.closed`` is set; ``judge.calls`` counts them."""
    clock, gate, calls = Clock(), threading.Event(), []
    gate.closed = False  # type: ignore[attr-defined]

    def problems(store, *, training_job, kept):
        calls.append(training_job)
        if gate.closed and not gate.wait(timeout=60):  # type: ignore[attr-defined]
            raise AssertionError("the gate was never opened")
        clock.now += TOOK_S
        if training_job == "fails":
            raise RuntimeError("store gone")
        return [{"n": len(calls)}]

    monkeypatch.setattr(live, "time", clock)
    monkeypatch.setattr(live, "problems", problems)
    monkeypatch.setattr(live, "alert_groups", lambda found: [])
    monkeypatch.setattr(live, "state_inputs", lambda store, found, now: {})
    made = live.ProblemJudge(store=None)  # type: ignore[arg-type]
    made.clock, made.gate, made.calls = clock, gate, calls  # type: ignore[attr-defined]
    return made


def _background_done() -> None:
    for thread in threading.enumerate():
        if thread.name == "hpcwatch-problems":
            thread.join(timeout=60)
            assert not thread.is_alive()


def test_the_first_judgement_is_made_at_once_and_kept_until_the_next_is_due(judge):
    assert judge.current(1.0, "4101").problems == [{"n": 1}]
    # it lasted 2 s: the next may begin 2 / PROBLEMS_BUSY_SHARE ≈ 13 s after the first began (more than 5 s)
    judge.clock.now = 100.0 + TOOK_S / live.PROBLEMS_BUSY_SHARE - 0.01
    assert judge.current(2.0, "4101").problems == [{"n": 1}]
    _background_done()
    assert judge.calls == ["4101"]


def test_a_due_judgement_runs_beside_the_snapshots_which_take_the_previous_one(judge):
    judge.current(1.0, "4101")
    judge.gate.closed = True
    judge.clock.now += TOOK_S / live.PROBLEMS_BUSY_SHARE
    assert judge.current(2.0, "4101").problems == [{"n": 1}]  # did not wait: the judgement waits on the gate
    assert judge.current(3.0, "4101").problems == [{"n": 1}]  # one judgement at a time
    judge.gate.set()
    _background_done()
    assert judge.calls == ["4101", "4101"]
    assert judge.current(4.0, "4101").problems == [{"n": 2}]


def test_a_judgement_that_fails_in_the_background_keeps_the_previous_and_is_tried_again(judge, caplog):
    judge.current(1.0, "4101")
    judge.clock.now += TOOK_S / live.PROBLEMS_BUSY_SHARE
    judge.current(2.0, "fails")
    _background_done()
    assert "store gone" in caplog.text
    assert judge.current(3.0, "4101").problems == [{"n": 1}]
    judge.clock.now += TOOK_S / live.PROBLEMS_BUSY_SHARE
    judge.current(4.0, "4101")
    _background_done()
    assert judge.current(5.0, "4101").problems == [{"n": 3}]


def test_a_judge_told_its_datas_period_waits_for_it_and_never_less_than_the_floor(judge):
    """The demo tells the judge each node's scrape period: a cheap judgement waits for it, not for 5 s."""
    slow = live.ProblemJudge(store=None, every_s=30.0)  # type: ignore[arg-type]
    slow.current(1.0, "4101")  # lasted TOOK_S: 13 s of rest is less than the period
    assert slow._next_at == 100.0 + 30.0
    assert live.ProblemJudge(store=None, every_s=1.0).every_s == live.PROBLEMS_INTERVAL_S  # type: ignore[arg-type]
