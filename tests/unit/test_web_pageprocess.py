"""web/pageprocess.py: the job pages' reports computed in a process of their own, over the server's store folder.

The child's overview must be the one this process computes, page after page while the twin writes; an unknown job
is the same one-line error; a child that dies or hangs is replaced and costs one page a 503, never the server; the
child stops when told and when its parent's end of its input closes.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import pytest
from fastapi.testclient import TestClient

from hpcwatch.errors import InputError, StoreError
from hpcwatch.model import reference_cluster
from hpcwatch.reports import jobpage
from hpcwatch.reports.jobpage import job_overview, overview_dict
from hpcwatch.store import Store
from hpcwatch.web import pageprocess
from hpcwatch.web.app import create_app
from hpcwatch.web.pageprocess import PageProcess, serve_pages
from tests.conftest import reference_twin


@pytest.fixture
def live(tmp_path):
    store = Store(tmp_path / "store")
    yield store, reference_twin(store, seed=21, ticks=12)
    store.close()


@pytest.fixture
def pages(live):
    store, _ = live
    process = PageProcess(store.path).start()
    yield process
    process.stop()


def _running(store: Store) -> str:
    return next(j.id for j in store.jobs() if j.end is None and j.start is not None and j.gpus >= 8)


def test_the_child_answers_what_this_process_computes_page_after_page(live, pages) -> None:
    store, twin = live
    job = _running(store)
    for _ in range(3):
        found = pages.overview(job, price_per_gpu_hour=2.5, currency="EUR")
        assert overview_dict(found) == overview_dict(job_overview(store, job, price_per_gpu_hour=2.5, currency="EUR"))
        twin.step()  # the child reads on from what it kept of the job, the parent's commits included
    assert found.cost is not None and found.cost.currency == "EUR"


def test_an_unknown_job_is_the_same_one_line_error(live, pages) -> None:
    store, _ = live
    with pytest.raises(InputError) as here:
        job_overview(store, "999999")
    with pytest.raises(InputError) as there:
        pages.overview("999999")
    assert str(there.value) == str(here.value)
    assert pages.running  # an answer, not a crash: the same child serves the next page
    assert pages.overview(_running(store)).job is not None


def test_a_child_that_died_is_replaced_before_the_next_page(live, pages) -> None:
    store, _ = live
    job = _running(store)
    pages.overview(job)
    child = pages._child
    assert child is not None
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert pages.overview(job).job is not None
    assert pages._child is not child and pages.running


def test_a_child_that_does_not_answer_in_time_costs_that_page_a_store_error(live) -> None:
    store, _ = live
    job = _running(store)
    slow = PageProcess(store.path, answer_timeout_s=0.0).start()
    try:
        child = slow._child
        with pytest.raises(StoreError, match="did not answer"):
            slow.overview(job)
        assert child is not None and child.poll() is not None  # stopped, not left behind
        slow.answer_timeout_s = 600.0
        assert slow.overview(job).job is not None  # a new child
    finally:
        slow.stop()


def test_the_child_stops_when_told_and_when_its_input_ends(live, pages) -> None:
    store, _ = live
    pages.overview(_running(store))
    child = pages._child
    pages.stop()
    assert child is not None and child.poll() == 0 and not pages.running
    orphan = PageProcess(store.path).start()._child
    assert orphan is not None and orphan.stdin is not None
    orphan.stdin.close()  # what the parent's death does to the child's input
    assert orphan.wait(timeout=120) == 0


def _pipes():
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    return os.fdopen(r1, "rb"), os.fdopen(w1, "wb"), os.fdopen(r2, "rb"), os.fdopen(w2, "wb")


def test_the_loop_answers_a_failure_and_goes_on(live, monkeypatch, caplog) -> None:
    """A page that fails for a reason of its own (a bug) is that page's 500: the loop serves the next."""
    store, _ = live
    job = _running(store)
    requests_in, requests_out, answers_in, answers_out = _pipes()
    real = jobpage.OverviewCache.overview

    def failing_once(self, store, job_id, **kwargs):
        if job_id.endswith("boom"):
            raise ValueError("a bug\x1b[2J")
        return real(self, store, job_id, **kwargs)

    monkeypatch.setattr(jobpage.OverviewCache, "overview", failing_once)
    served: list[int] = []
    loop = threading.Thread(target=lambda: served.append(serve_pages(str(store.path), requests_in, answers_out)))
    loop.start()
    try:
        for asked in ("\x1b[31mboom", job):
            pageprocess._write_frame(requests_out, pickle.dumps((asked, None, "")))
        first = pickle.loads(pageprocess._read_frame(answers_in, timeout_s=120))
        second = pickle.loads(pageprocess._read_frame(answers_in, timeout_s=120))
    finally:
        requests_out.close()
        loop.join()
    requests_in.close()
    answers_in.close()
    answers_out.close()
    assert first == ("failed", "ValueError: a bug\\x1b[2J")  # no control character reaches a terminal raw
    assert "\\x1b[31mboom" in caplog.text and "\x1b" not in caplog.text
    assert second[0] == "ok" and second[1].id == job
    assert served == [2]


def test_a_frame_over_the_limit_is_refused_without_reading_it() -> None:
    r, w = os.pipe()
    with os.fdopen(r, "rb") as reader, os.fdopen(w, "wb") as writer:
        writer.write(pageprocess._HEADER.pack(pageprocess._MAX_FRAME + 1))
        writer.flush()
        with pytest.raises(EOFError, match="over"):
            pageprocess._read_frame(reader, timeout_s=5)


def test_the_web_job_page_reads_the_child_and_keeps_what_it_answered(live, pages, monkeypatch) -> None:
    store, _ = live
    job = _running(store)

    def here(*args, **kwargs):
        raise AssertionError("a page computed in the server's process")

    monkeypatch.setattr(jobpage, "job_overview", here)
    client = TestClient(create_app(store, reference_cluster(), pages=pages))
    first = client.get(f"/api/job/{job}").json()
    assert first["id"] == job
    assert client.get("/api/job/999999").status_code == 400
    child = pages._child
    assert child is not None
    child.kill()
    child.wait()
    assert client.get(f"/api/job/{job}").json() == first  # no commit since: the server's cache, the child not asked
    assert pages._child is child
    assert client.get(f"/job/{job}").status_code == 200


class _Silent(PageProcess):
    """A child that reads nothing and never answers."""

    def _start(self) -> subprocess.Popen[bytes]:
        code = "import time; time.sleep(600)"
        self._child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        return self._child


def test_stopping_does_not_wait_for_a_page_under_way(tmp_path) -> None:
    silent = _Silent(tmp_path).start()
    errors: list[Exception] = []

    def ask() -> None:
        try:
            silent.overview("4101")
        except StoreError as err:
            errors.append(err)

    asking = threading.Thread(target=ask)
    asking.start()
    while not silent._lock.locked():  # the page holds the child
        time.sleep(0.01)
    silent.stop()
    asking.join(timeout=120)
    assert not asking.is_alive() and len(errors) == 1 and "did not answer" in str(errors[0])
    with pytest.raises(StoreError, match="stopping"):
        silent.overview("4101")


def test_an_error_that_does_not_pickle_is_answered_as_a_failure() -> None:
    status, text = pickle.loads(pageprocess._pickled(("error", InputError(lambda: 0))))
    assert status == "failed" and "InputError" in text


@pytest.mark.parametrize(
    ("keep_read_jobs", "rounds"), [(None, ["start 3", "page", "stop"]), (2, ["start 2", "page", "stop"]), (0, [])]
)
def test_the_loop_keeps_the_running_jobs_read_until_its_input_ends(live, monkeypatch, keep_read_jobs, rounds) -> None:
    """``serve_pages`` starts the rounds of ``web.pagewarm`` over its store and the pages' kept stretches (of
    ``keep_read_jobs`` jobs, ``WARM_JOBS`` by default; none at 0), says when a page runs, and stops the rounds
    before its store closes."""
    from hpcwatch.web import pagewarm

    store, _ = live
    seen: list[str] = []
    real_page = pagewarm.JobWarmer.page

    def page(self):
        seen.append("page")
        return real_page(self)

    monkeypatch.setattr(pagewarm.JobWarmer, "start", lambda self: seen.append(f"start {self.jobs}") or self)
    monkeypatch.setattr(pagewarm.JobWarmer, "stop", lambda self, timeout_s=2.0: seen.append("stop"))
    monkeypatch.setattr(pagewarm.JobWarmer, "page", page)
    requests_in, requests_out, answers_in, answers_out = _pipes()
    loop = threading.Thread(
        target=serve_pages,
        args=(str(store.path), requests_in, answers_out),
        kwargs={"keep_read_jobs": keep_read_jobs},
    )
    loop.start()
    try:
        pageprocess._write_frame(requests_out, pickle.dumps((_running(store), None, "")))
        assert pickle.loads(pageprocess._read_frame(answers_in, timeout_s=120))[0] == "ok"
    finally:
        requests_out.close()
        loop.join()
    for f in (requests_in, answers_in, answers_out):
        f.close()
    assert seen == rounds


def test_the_child_is_told_how_many_jobs_to_keep_read(live) -> None:
    """``PageProcess(keep_read_jobs=N)`` starts its child with N (the CLI's ``--keep-read-jobs``); the child
    refuses a count that is not one, with its usage line."""
    store, _ = live
    process = PageProcess(store.path, keep_read_jobs=0).start()
    try:
        assert process._child is not None and process._child.args[-2:] == [str(store.path), "0"]
        assert process.overview(_running(store)).id == _running(store)
    finally:
        process.stop()
    assert pageprocess.main([str(store.path), "-1"]) == 2
    assert pageprocess.main([str(store.path), "3", "x"]) == 2


def test_no_collection_runs_during_a_page_and_what_it_left_is_collected_after() -> None:
    """The collector waits for the end of the block, then frees a reference cycle the block left and freezes
    what survived (later collections skip it); ``full`` first makes what an earlier page froze collectable."""
    import weakref

    class Node:
        me: object

    before = gc.isenabled()
    try:
        with pageprocess._collecting_after(full=False):
            assert not gc.isenabled()
            node = Node()
            node.me = node  # a cycle: only the collector frees it
            gone = weakref.ref(node)
            del node
            assert gone() is not None
        assert gone() is None and gc.isenabled() and gc.get_freeze_count() > 0
        kept = Node()
        kept.me = kept
        with pageprocess._collecting_after(full=False):
            pass
        frozen = weakref.ref(kept)
        del kept
        with pageprocess._collecting_after(full=False):
            pass
        assert frozen() is not None  # frozen by the page before: a page's collection does not look at it
        with pageprocess._collecting_after(full=True):
            pass
        assert frozen() is None
    finally:
        gc.unfreeze()
        (gc.enable if before else gc.disable)()


def test_the_loop_collects_after_each_page_and_everything_every_so_many_pages(live, monkeypatch) -> None:
    store, _ = live
    fulls: list[bool] = []
    real = pageprocess._collecting_after

    def recording(*, full: bool):
        fulls.append(full)
        return real(full=full)

    monkeypatch.setattr(pageprocess, "_collecting_after", recording)
    monkeypatch.setattr(pageprocess, "FULL_COLLECTION_PAGES", 2)
    requests_in, requests_out, answers_in, answers_out = _pipes()
    loop = threading.Thread(
        target=serve_pages, args=(str(store.path), requests_in, answers_out), kwargs={"keep_read_jobs": 0}
    )
    loop.start()
    try:
        for _ in range(3):
            pageprocess._write_frame(requests_out, pickle.dumps((_running(store), None, "")))
            assert pickle.loads(pageprocess._read_frame(answers_in, timeout_s=120))[0] == "ok"
    finally:
        requests_out.close()
        loop.join()
        gc.unfreeze()
    for f in (requests_in, answers_in, answers_out):
        f.close()
    assert fulls == [True, False, True]


def test_a_restarted_loop_reads_on_from_the_checkpoints_the_last_one_left(tmp_path, monkeypatch) -> None:
    """``serve_pages`` keeps each job's settled checkpoints in the store's folder (``reports.checkpointfiles``):
    the loop of a restarted server reads the job's window from there on, not from its start."""
    from hpcwatch.reports import jobstretches
    from hpcwatch.store import queries

    monkeypatch.setattr(jobstretches, "STRETCH_ROWS", 1)  # the twin's small cluster: read by stretches
    store = Store(tmp_path / "store")
    reference_twin(store, seed=21, ticks=42)
    job = _running(store)
    read, starts = queries.job_window_samples, []

    def counted(store, metrics, **window):
        starts[-1].append(window["t0"])
        return read(store, metrics, **window)

    monkeypatch.setattr(jobstretches.queries, "job_window_samples", counted)
    answers = []
    for _ in ("before the restart", "after"):
        starts.append([])
        requests_in, requests_out, answers_in, answers_out = _pipes()
        loop = threading.Thread(
            target=serve_pages, args=(str(store.path), requests_in, answers_out), kwargs={"keep_read_jobs": 0}
        )
        loop.start()
        try:
            pageprocess._write_frame(requests_out, pickle.dumps((job, None, "")))
            answers.append(pickle.loads(pageprocess._read_frame(answers_in, timeout_s=120)))
        finally:
            requests_out.close()
            loop.join()
        for f in (requests_in, answers_in, answers_out):
            f.close()
    store.close()
    assert [a[0] for a in answers] == ["ok", "ok"]
    assert overview_dict(answers[0][1]) == overview_dict(answers[1][1])
    assert [name.split("-")[0] for name in sorted(os.listdir(store.path / "checkpoints"))] == ["charts", "report"]
    assert min(starts[1]) > min(starts[0]) + 300  # the job's life, then what followed its checkpoint
