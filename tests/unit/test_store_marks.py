"""``Store.table_mark``: the key of a result computed from some tables, and the jobs kept by it. A mark moves
with every commit that adds or drops rows of its table, from this process or another, and stays when
compaction only merges parts; ``jobs()`` is read again exactly when the jobs' mark moved."""

from __future__ import annotations

import threading

from hpcwatch.records import Event, Finding, Job
from hpcwatch.store import Store


def _job(job_id: str, state: str = "RUNNING") -> Job:
    return Job(id=job_id, user="ana", account="ml", partition="gpu", nodes=("node1",), gpus=8, start=1.0, state=state)


def _event(t: float) -> Event:
    return Event(kind="nccl_log", t=t, source="node1", attrs={"line": "NCCL INFO"})


def test_a_mark_moves_with_each_commit_of_its_table_only(tmp_path):
    with Store(tmp_path / "s") as store:
        empty = store.table_mark("events", "jobs")
        assert empty == ((0, 0), (0, 0))
        store.add([_event(1.0)])
        after_event = store.table_mark("events", "jobs")
        assert after_event[0] != empty[0] and after_event[1] == empty[1]
        store.add([_job("1")])
        assert store.table_mark("events") == after_event[:1]
        assert store.table_mark("jobs") != empty[1:]


def test_compaction_keeps_the_mark_and_a_cleared_table_moves_it(tmp_path):
    with Store(tmp_path / "s", compact_fanin=2) as store:
        marks = []
        for t in range(8):
            store.add([_event(float(t))])
            marks.append(store.table_mark("events"))
        assert store.part_counts()["events"] < 8  # eight commits of one row each, merged into fewer parts
        assert [rows for ((_, rows),) in marks] == list(range(1, 9))
        assert sorted(set(marks)) == marks  # each commit moved it forward
        mark = marks[-1]
        for job in range(8):  # commits of another table, each one merging parts too
            store.add([_job(str(job))])
        assert store.table_mark("events") == mark
        store.add(
            [
                Finding(
                    vector="rdma_blind_spot", severity="high", target="node1", title="t", evidence={}, t=1.0, rule="r"
                )
            ]
        )
        with store.transaction() as tx:
            tx.clear_findings()
        assert store.table_mark("findings") == ((0, 0),)
        assert store.table_mark("events") == mark


def test_jobs_are_read_again_when_another_writer_changed_them(tmp_path):
    with Store(tmp_path / "s") as reader, Store(tmp_path / "s") as writer:
        writer.add([_job("1")])
        assert [(j.id, j.state) for j in reader.jobs()] == [("1", "RUNNING")]
        kept = reader.jobs()
        kept.append(_job("intruder"))  # the caller's list: the store's copy is not touched
        writer.add([_job("1", state="COMPLETED"), _job("2")])
        assert [(j.id, j.state) for j in reader.jobs()] == [("1", "COMPLETED"), ("2", "RUNNING")]
        assert [j.id for j in reader.jobs(on_nodes=["node1"])] == ["1", "2"]


def test_one_job_is_answered_from_the_jobs_kept_and_read_again_after_another_writer_changed_it(tmp_path):
    """``job(id)`` answers from what ``jobs()`` keeps while the table is unchanged, and from the table once
    another process committed to it."""
    with Store(tmp_path / "s") as reader, Store(tmp_path / "s") as writer:
        writer.add([_job("1"), _job("2")])
        assert reader.job("1").state == "RUNNING"  # nothing kept yet: read from the table
        kept = {j.id: j for j in reader.jobs()}
        assert reader.job("2") is kept["2"] and reader.job("nope") is None
        writer.add([_job("2", state="COMPLETED")])
        assert reader.job("2").state == "COMPLETED"
        assert reader.job("1") == kept["1"]


def test_once_every_job_is_kept_one_job_is_read_on_from_them(tmp_path):
    """A process that asked for every job answers ``job(id)`` from them, read on to the newest commit (a job
    page asks five times a page): a job added or changed by another writer is there, the others are the same
    objects, and ``jobs()`` agrees."""
    with Store(tmp_path / "s") as reader, Store(tmp_path / "s") as writer:
        writer.add([_job("1"), _job("2")])
        before = {j.id: j for j in reader.jobs()}
        writer.add([_job("2", state="COMPLETED"), _job("3")])
        assert reader.job("2").state == "COMPLETED" and reader.job("3").state == "RUNNING"
        assert reader.job("1") is before["1"] and reader.job("nope") is None
        assert {j.id: j for j in reader.jobs()} == {"1": before["1"], "2": reader.job("2"), "3": reader.job("3")}


def test_a_result_kept_while_its_tables_hold_the_same_rows_is_computed_once(tmp_path):
    with Store(tmp_path / "s") as store:
        computed: list[int] = []

        def count_events() -> int:
            computed.append(1)
            return len(store.events())

        def kept() -> int:
            return store.kept_while(("events",), ("events", "count"), count_events)

        assert kept() == 0 and kept() == 0 and len(computed) == 1
        store.add([_job("1")])  # another table
        assert kept() == 0 and len(computed) == 1
        store.add([_event(1.0)])
        assert kept() == 1 and kept() == 1 and len(computed) == 2


class _ArrivalLock:
    """A lock that tells when a second thread is at its door (``second``), then waits its turn as a lock does."""

    def __init__(self) -> None:
        self._lock, self._arrivals, self.second = threading.Lock(), 0, threading.Event()

    def __enter__(self) -> None:
        self._arrivals += 1
        if self._arrivals == 2:
            self.second.set()
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_two_threads_asking_for_one_kept_result_at_once_compute_it_once(tmp_path):
    """A job page's two threads ask for its requeued attempts together: the second waits for the first's answer
    instead of asking the store again."""
    with Store(tmp_path / "s") as store:
        key = ("attempts", "1")
        gate = _ArrivalLock()
        store._computing[key] = gate  # type: ignore[assignment]  # the lock ``kept_while`` holds while computing
        computed: list[str] = []

        def compute() -> int:
            computed.append(threading.current_thread().name)
            assert gate.second.wait(30), "the second thread never asked"
            return 42

        answers: list[int] = []
        threads = [
            threading.Thread(target=lambda: answers.append(store.kept_while(("jobs",), key, compute)), name=f"t{i}")
            for i in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert answers == [42, 42] and len(computed) == 1


def test_a_kept_result_whose_computation_failed_is_computed_again(tmp_path):
    with Store(tmp_path / "s") as store:
        calls: list[int] = []

        def fails_once() -> int:
            calls.append(1)
            if len(calls) == 1:
                raise OSError("the store went away")
            return 7

        try:
            store.kept_while(("jobs",), ("k",), fails_once)
        except OSError:
            pass
        assert store.kept_while(("jobs",), ("k",), fails_once) == 7 and len(calls) == 2
        assert ("k",) in store._computing  # its lock kept while its result is


def test_the_newest_sample_time_is_kept_until_a_sample_is_committed_whatever_it_was_asked_from() -> None:
    """``latest_sample_t`` keeps its answer while the samples do not change: a time found from any ``since`` is
    the newest of all; a None from a later ``since`` does not answer an earlier one."""
    from hpcwatch import vocab
    from hpcwatch.records import Sample
    from hpcwatch.store import queries

    store = Store(":memory:")
    util, power = vocab.DCGM_FI_DEV_GPU_UTIL, vocab.DCGM_FI_DEV_POWER_USAGE
    labels = {"Hostname": "n1", "gpu": "0"}
    store.add([Sample(metric=util, labels=labels, t=t, value=1.0) for t in (10.0, 20.0)])
    store.add([Sample(metric=power, labels=labels, t=25.0, value=1.0)])
    assert queries.latest_sample_t(store, since=30.0, metrics=[util]) is None  # kept: none from 30 s on
    assert queries.latest_sample_t(store, since=40.0, metrics=[util]) is None
    assert queries.latest_sample_t(store, since=5.0, metrics=[util]) == 20.0  # asked again from earlier on
    assert queries.latest_sample_t(store, since=15.0, metrics=[util]) == 20.0
    assert queries.latest_sample_t(store, since=21.0, metrics=[util]) is None
    assert queries.latest_sample_t(store, metrics=[util]) == 20.0
    assert queries.latest_sample_t(store) == 25.0  # another metric set, another answer
    store.add([Sample(metric=util, labels=labels, t=50.0, value=1.0)])
    assert queries.latest_sample_t(store, since=15.0, metrics=[util]) == 50.0  # a commit: asked again
    assert queries.latest_sample_t(store, since=45.0) == 50.0
    store.close()
