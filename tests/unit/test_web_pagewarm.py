"""web/pagewarm.py: the largest running jobs kept read in the job pages' process, so that their first page reads
only what landed since the last round, never the job's life; the rounds bounded, waiting for pages, and never
stopping on a failure."""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

import pytest

from hpcwatch.errors import InputError
from hpcwatch.reports.jobpage import job_overview, overview_dict
from hpcwatch.reports.jobstretches import KeptStretches
from hpcwatch.store import Store, queries
from hpcwatch.web import pagewarm
from hpcwatch.web.pagewarm import JobWarmer, jobs_to_warm
from tests.unit.stretch_fixtures import live, reads, small_stretches  # noqa: F401  (fixtures)


def _largest(store: Store):
    return store.job(jobs_to_warm(store, 1, min_gpu_s=0.0)[0])


def test_the_jobs_to_warm_are_the_running_ones_with_the_most_gpu_seconds(live) -> None:
    store, _ = live
    newest = queries.latest_sample_t(store) or 0.0
    running = [j for j in store.jobs() if j.end is None and j.start is not None and j.nodes]
    gpu_s = {j.id: j.gpus * (newest - (j.start or 0.0)) for j in running}
    assert len(set(gpu_s.values())) >= 2  # an order to get right
    picked = jobs_to_warm(store, len(running), min_gpu_s=0.0)
    assert sorted(picked) == sorted(gpu_s) and [gpu_s[i] for i in picked] == sorted(gpu_s.values(), reverse=True)
    assert jobs_to_warm(store, 1, min_gpu_s=0.0) == picked[:1]
    floor = sorted(gpu_s.values())[1]  # the job with the fewest is left out
    assert jobs_to_warm(store, len(running), min_gpu_s=floor) == picked[:-1]
    # Started first, with more GPUs than any, but ended: never warmed.
    ended = replace(store.job(picked[0]), id="99999", start=newest - 1e6, end=newest, state="COMPLETED", gpus=10**4)
    store.add([ended])
    assert ended.id not in jobs_to_warm(store, 100, min_gpu_s=0.0)
    # One started long before the others, on fewer GPUs, comes first: its first page would read the most.
    old = replace(store.job(picked[-1]), id="99998", start=newest - 1e6, end=None, state="RUNNING")
    store.add([old])
    assert jobs_to_warm(store, 1, min_gpu_s=0.0) == [old.id]


def test_a_warmed_job_s_first_page_reads_only_what_landed_after_the_round(live, reads) -> None:
    store, twin = live
    job, kept = _largest(store), KeptStretches()
    life = len(reads)
    job_overview(store, job.id)  # a page with nothing kept: the job's life
    life = len(reads) - life
    assert life >= 5
    warmer = JobWarmer(store, kept, min_gpu_s=0.0)
    assert job.id in warmer.warm()
    for _ in range(3):
        twin.step()
    reads.clear()
    page = job_overview(store, job.id, kept=kept)
    assert len(reads) <= 3 < life and min(reads) > (job.start or 0.0)
    _same_page(page, job_overview(store, job.id))  # what a fresh read says


def _same_page(page, fresh) -> None:
    """Two pages the same; the charts' buckets to rounding (a kept cell is a sum of sums)."""
    mine, whole = overview_dict(page), overview_dict(fresh)
    mine_series, whole_series = mine.pop("series"), whole.pop("series")
    assert mine == whole
    assert mine_series.keys() == whole_series.keys()
    for key, value in mine_series.items():
        if key != "series":
            assert value == whole_series[key]
    assert mine_series["series"] and len(mine_series["series"]) == len(whole_series["series"])
    for ours, theirs in zip(mine_series["series"], whole_series["series"]):
        assert ours.keys() == theirs.keys()
        for key, value in ours.items():
            assert value == (pytest.approx(theirs[key]) if key == "values" else theirs[key]), key


def test_pages_of_other_jobs_do_not_push_the_warmed_jobs_out(live, reads) -> None:
    store, twin = live
    kept = KeptStretches(size=1)
    warmer = JobWarmer(store, kept, min_gpu_s=0.0, jobs=1)
    job = _largest(store)
    warmer.warm()
    others = [j.id for j in store.jobs() if j.start is not None and j.nodes and j.id != job.id][:3]
    assert len(others) == 3
    for other in others:  # three jobs' pages through a kept of one job
        job_overview(store, other, kept=kept)
    twin.step()
    reads.clear()
    job_overview(store, job.id, kept=kept)
    assert len(reads) <= 3 and min(reads) > (job.start or 0.0)
    assert kept.pinned(store) == {job.id}
    kept.pin(store, [])  # no longer warmed: the least recently read of the others again
    job_overview(store, others[0], kept=kept)
    reads.clear()
    job_overview(store, job.id, kept=kept)
    assert len(reads) >= 5  # its life read again


def test_a_round_reads_nothing_from_a_store_not_written_since(live, monkeypatch) -> None:
    store, twin = live
    warmer = JobWarmer(store, KeptStretches(), min_gpu_s=0.0)
    assert warmer.warm() and warmer.rounds == 1
    assert warmer.warm() == [] and warmer.rounds == 1
    twin.step()
    assert warmer.warm() and warmer.rounds == 2


def test_a_job_that_cannot_be_read_is_skipped(live, monkeypatch) -> None:
    store, _ = live
    wanted = jobs_to_warm(store, 2, min_gpu_s=0.0)
    calls: list[str] = []

    def first_unknown(store, job_id, **kwargs):
        calls.append(job_id)
        if job_id == wanted[0]:
            raise InputError(f"job {job_id}: nothing recorded")

    monkeypatch.setattr(pagewarm, "job_overview", first_unknown)
    assert JobWarmer(store, KeptStretches(), min_gpu_s=0.0, jobs=2).warm() == wanted[1:]
    assert calls == wanted


def _round_beside(monkeypatch, warmer: JobWarmer) -> tuple[threading.Thread, list[str]]:
    """A round of ``warmer`` started in a thread, the jobs it reads recorded (not read)."""
    warmed: list[str] = []
    monkeypatch.setattr(pagewarm, "job_overview", lambda store, job_id, **kwargs: warmed.append(job_id))
    round_ = threading.Thread(target=warmer.warm)
    round_.start()
    return round_, warmed


def test_a_round_waits_for_the_page_under_way(live, monkeypatch) -> None:
    store, _ = live
    warmer = JobWarmer(store, KeptStretches(), min_gpu_s=0.0, quiet_s=0.0)
    with warmer.page():
        round_, warmed = _round_beside(monkeypatch, warmer)
        round_.join(0.2)
        assert round_.is_alive() and warmed == []  # however far the round got, it read no job
    round_.join(60)
    assert not round_.is_alive() and warmed == jobs_to_warm(store, min_gpu_s=0.0)


def test_a_round_waits_until_no_page_came_for_a_while_and_stops_when_told(live, monkeypatch) -> None:
    store, _ = live
    warmer = JobWarmer(store, KeptStretches(), min_gpu_s=0.0, quiet_s=3600.0)
    with warmer.page():
        pass
    round_, warmed = _round_beside(monkeypatch, warmer)
    round_.join(0.2)
    assert round_.is_alive() and warmed == []  # the page ended less than an hour ago
    warmer.stop()
    round_.join(60)
    assert not round_.is_alive() and warmed == []


def test_the_rounds_go_on_after_a_failure_and_stop_when_told(live, monkeypatch, caplog) -> None:
    store, twin = live
    second = threading.Event()
    calls: list[str] = []

    def failing_first(store, job_id, **kwargs):
        calls.append(job_id)
        if len(calls) == 1:
            raise ValueError("a bug\x1b[2J")
        second.set()

    monkeypatch.setattr(pagewarm, "job_overview", failing_first)
    warmer = JobWarmer(store, KeptStretches(), min_gpu_s=0.0, every_s=0.01, share=1.0, jobs=1)
    with caplog.at_level(logging.ERROR, logger=pagewarm.__name__):
        warmer.start()
        twin.step()  # the failed round read version v; this one is new
        assert second.wait(60)
        warmer.stop(timeout_s=60)
    assert warmer._thread is not None and not warmer._thread.is_alive()
    assert "ValueError: a bug\\x1b[2J" in caplog.text and "\x1b" not in caplog.text


def test_a_round_of_d_seconds_waits_at_least_d_times_the_rest_of_its_share(live) -> None:
    store, _ = live
    warmer = JobWarmer(store, KeptStretches(), min_gpu_s=0.0, every_s=30.0, share=0.1)
    assert warmer.next_round_in(0.5) == 29.5  # a short round: every 30 s
    assert warmer.next_round_in(10.0) == pytest.approx(90.0)  # a long one: a tenth of the time at most


def test_the_rounds_come_faster_while_pages_are_read(live) -> None:
    """Nobody reading pages: a round every 30 s. A page within the last ten minutes: every 5 s, so that the next
    page of an incident's jobs reads seconds, not up to half a minute; the share still bounds them."""
    store, _ = live
    warmer = JobWarmer(store, KeptStretches(), min_gpu_s=0.0, every_s=30.0, active_every_s=5.0, active_s=600.0)
    assert warmer.next_round_in(0.5) == 29.5
    with warmer.page():
        pass
    assert warmer.next_round_in(0.5) == 4.5
    assert warmer.next_round_in(2.0) == pytest.approx(18.0)  # the share: a tenth of the time at most
    warmer._page_ended -= 601.0  # the page ten minutes ago
    assert warmer.next_round_in(0.5) == 29.5


def test_a_page_wakes_a_warmer_resting_for_the_slow_pace(live, monkeypatch) -> None:
    """A round done, the warmer rests for the slow pace (an hour here); a page then brings the next round at the
    fast one, not an hour later."""
    store, twin = live
    rounds = threading.Semaphore(0)
    monkeypatch.setattr(pagewarm, "job_overview", lambda store, job_id, **kwargs: rounds.release())
    warmer = JobWarmer(
        store, KeptStretches(), min_gpu_s=0.0, every_s=3600.0, active_every_s=0.01, quiet_s=0.0, share=1.0, jobs=1
    )
    warmer.start()
    try:
        assert rounds.acquire(timeout=60)  # the first round, at once
        twin.step()  # a round reads only a store written since the last
        with warmer.page():
            pass
        assert rounds.acquire(timeout=60)
    finally:
        warmer.stop(timeout_s=60)
