"""Every job's report from the whole store read stretch by stretch, and read on from what a long-running reader
kept (``reports.storestretches``): always what one read of every sample reports, to the last digit, and the
kept stretches read once."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hpcwatch import vocab
from hpcwatch.analysis.attribution import REPORT_METRICS, job_reports, report_dict
from hpcwatch.records import Job, Sample
from hpcwatch.reports import storestretches
from hpcwatch.reports.jobs import jobs_report
from hpcwatch.reports.storestretches import KeptStore
from hpcwatch.store import Store, queries
from tests.unit.stretch_fixtures import live, store_reads  # noqa: F401  (fixtures)


@pytest.fixture(autouse=True)
def small_store_stretches(monkeypatch) -> None:
    """Stretches of a few hundred rows: the twin's seven minutes in dozens of stretches."""
    monkeypatch.setattr(storestretches, "STORE_STRETCH_ROWS", 200)
    monkeypatch.setattr(storestretches, "STORE_STRETCH_S", 5.0)


def _one_pass(store: Store) -> list[dict]:
    return [report_dict(r, per_gpu=True) for r in job_reports(store.samples(list(REPORT_METRICS)), store.jobs())]


def _same(store: Store, kept: KeptStore | None = None) -> list[dict]:
    """Every job's report read by stretches (``kept``: on from its checkpoints), held to one pass's."""
    found = [report_dict(r, per_gpu=True) for r in jobs_report(store, kept=kept)]
    assert found == _one_pass(store)
    return found


def _running(store: Store) -> Job:
    return next(j for j in store.jobs() if j.end is None and j.start is not None and j.gpus_by_node)


def _util(job: Job, t: float, value: float) -> Sample:
    host = job.nodes[0]
    return Sample(
        metric=vocab.DCGM_FI_DEV_GPU_UTIL,
        labels={"Hostname": host, "gpu": str(job.gpus_by_node[host][0])},
        t=t,
        value=value,
    )


def test_every_job_read_by_stretches_of_the_store_is_one_pass(live, store_reads) -> None:
    """``hpcwatch jobs`` reads the store a stretch at a time (memory: one stretch's rows, whatever the store's
    age): every job's report to the last digit what one read of every sample gives, and after a silence of
    every node."""
    store, _ = live
    _same(store)
    read_once = len(store_reads)
    assert read_once > 20
    newest = store.time_range()[1] or 0.0
    gpu = store.samples(vocab.DCGM_FI_DEV_GPU_UTIL).slice(0, 1).to_pylist()[0]
    store.add(  # ten minutes later, after a silence: one of the GPUs speaks again
        Sample(
            metric=vocab.DCGM_FI_DEV_GPU_UTIL,
            labels={"Hostname": gpu["host"], "gpu": gpu["gpu"]},
            t=newest + 600 + k,
            value=7.0,
        )
        for k in range(3)
    )
    store_reads.clear()
    _same(store)
    assert len(store_reads) <= read_once + 2  # the silence is skipped, not read five seconds at a time
    assert storestretches.store_partial(store, REPORT_METRICS, store.jobs()).newest_t == newest + 602


def test_every_job_read_by_stretches_sees_a_device_that_reports_only_late(live, monkeypatch) -> None:
    """A GPU that reports only in the last stretch (a node added; an engine-activity-only device) changes how the
    stretches before it read (``Shape``): they are read again with it, and the reports are one pass's."""
    store, _ = live
    monkeypatch.setattr(storestretches, "STORE_STRETCH_ROWS", 500)
    host = next(j for j in store.jobs() if j.nodes).nodes[0]
    newest = store.time_range()[1] or 0.0
    hca = {"device": "mlx5_9", "port": "1", "instance": f"{host}:9100"}
    store.add(
        Sample(metric=vocab.NODE_INFINIBAND_PORT_DATA_TRANSMITTED_BYTES_TOTAL, labels=hca, t=newest + k, value=1e6 * k)
        for k in (1, 2)
    )
    shapes = []
    partial_of = storestretches.partial_of

    def seeing(table, jobs, *, shape=None):
        shapes.append(shape)
        return partial_of(table, jobs, shape=shape)

    monkeypatch.setattr(storestretches, "partial_of", seeing)
    _same(store)
    assert shapes[0] is None and (host, "mlx5_9") in shapes[-1].hcas  # read again, with the late HCA


def test_a_kept_store_reads_only_what_followed_the_last_read(live, store_reads) -> None:
    """The exporter's next scrape, 30 s of the twin later: it reads on from the end of the last read, not the
    store's life, and reports what one pass does."""
    store, twin = live
    kept = KeptStore()
    end = store.time_range()[1] or 0.0
    _same(store, kept)
    first = len(store_reads)
    for _ in range(3):
        twin.step()
    store_reads.clear()
    _same(store, kept)
    assert store_reads and min(store_reads) > end and len(store_reads) < first
    store_reads.clear()
    _same(store, kept)  # nothing landed since: nothing read
    assert store_reads == []


def test_a_row_that_lands_late_is_read_from_a_checkpoint_before_it(live, store_reads) -> None:
    """A row 25 s older than the last read's end (a node scraped late): the next read starts from the newest
    checkpoint before it (the bands keep one), counts it, and does not read the store's life again."""
    store, twin = live
    kept = KeptStore()
    _same(store, kept)
    for _ in range(6):  # reads a minute apart: checkpoints in the 10-40 s and 40-160 s bands
        twin.step()
        _same(store, kept)
    newest = store.time_range()[1] or 0.0
    job = _running(store)
    store.add([_util(job, newest - 25.5, 100.0)])
    store_reads.clear()
    _same(store, kept)
    assert (store.time_range()[0] or 0.0) < min(store_reads) <= newest - 25.5


def test_a_job_end_recorded_after_the_fact_moves_the_rows_after_it(live, store_reads) -> None:
    """Slurm says a job ended 35 s before the last read's end: the rows on its GPUs since are no longer its own.
    The read goes back to a checkpoint before the end, not to the store's start."""
    store, twin = live
    kept = KeptStore()
    for _ in range(6):
        twin.step()
        _same(store, kept)
    newest = store.time_range()[1] or 0.0
    job = _running(store)
    store.add([replace(job, end=newest - 35.0, state="COMPLETED")])
    store_reads.clear()
    before = next(r for r in _same(store, kept) if r["id"] == job.id)
    assert (store.time_range()[0] or 0.0) < min(store_reads) <= newest - 35.0
    assert before["end"] == newest - 35.0


def test_a_job_recorded_late_takes_the_rows_of_its_gpus_from_its_start() -> None:
    """A job whose record lands after rows on its GPUs were read (Slurm polled late): unlabelled rows in its
    run become its own, though they lie in kept stretches."""
    store = Store(":memory:")
    mine = Job(id="1", user="u", gpus=1, nodes=("n1",), gpus_by_node={"n1": (0,)}, start=0.0, end=None)
    store.add([mine])
    store.add(_util(mine, float(t), 50.0) for t in range(5, 600, 5))
    kept = KeptStore()
    assert _same(store, kept)[0]["per_gpu"][0]["samples"] == 119
    thief = Job(id="2", user="x", gpus=1, nodes=("n1",), gpus_by_node={"n1": (0,)}, start=100.0, end=200.0)
    store.add([thief])
    assert [r["per_gpu"][0]["samples"] for r in _same(store, kept)] == [119 - 20, 20]
    store.close()


def test_another_store_is_read_whole() -> None:
    """Two stores in memory share a path: what was kept of one is never the other's."""
    job = Job(id="1", user="u", gpus=1, nodes=("n1",), gpus_by_node={"n1": (0,)}, start=0.0, end=None)
    first, second = Store(":memory:"), Store(":memory:")
    for store, value in ((first, 10.0), (second, 90.0)):
        store.add([job])
        store.add(_util(job, float(t), value) for t in range(5, 300, 5))
    kept = KeptStore()
    assert _same(first, kept)[0]["mean_gpu_util"] == 10.0
    assert _same(second, kept)[0]["mean_gpu_util"] == 90.0
    first.close()
    second.close()


def _shared_gpu_store() -> Store:
    """Job 1 on n1's GPU 0 from 0 to 100 s, job 2 from 100 s on; a scrape every 10 s (at 5, 15, ...): the
    utilisation, the energy counter (+1,000 mJ a scrape) and dcgm-exporter's "last XID" gauge, which shows
    job 1's XID 13 from 55 s on and keeps showing it after job 1 ended."""
    store = Store(":memory:")
    gpu = {"n1": (0,)}
    store.add(
        [
            Job(id="1", user="u", gpus=1, nodes=("n1",), gpus_by_node=gpu, start=0.0, end=100.0, state="FAILED"),
            Job(id="2", user="v", gpus=1, nodes=("n1",), gpus_by_node=gpu, start=100.0, end=None, state="RUNNING"),
        ]
    )
    labels = {"Hostname": "n1", "gpu": "0"}
    store.add(
        Sample(metric=metric, labels=labels, t=float(t), value=value)
        for k, t in enumerate(range(5, 300, 10))
        for metric, value in (
            (vocab.DCGM_FI_DEV_GPU_UTIL, 50.0),
            (vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, 1000.0 * k),
            (vocab.DCGM_FI_DEV_XID_ERRORS, 13.0 if t >= 55 else 0.0),
        )
    )
    return store


def test_a_job_read_from_its_first_start_counts_its_first_sample_as_every_sample_does() -> None:
    """Job 2's page reads from its first start (100 s): the energy delta across it (95 to 105 s) is job 2's, and
    the XID 13 the gauge still shows is job 1's alone, as in ``hpcwatch jobs`` and the exporter, which read every
    sample; a read of the whole store from 100 s (a digest's) says the same of job 2."""
    from hpcwatch.reports.jobpage import job_overview
    from hpcwatch.reports.jobs import job_report

    store = _shared_gpu_store()
    every = {r.id: r for r in jobs_report(store)}
    page = job_report(store, "2")
    assert report_dict(page, per_gpu=True) == report_dict(every["2"], per_gpu=True)
    assert (page.xid_errors, every["1"].xid_errors) == (0, 1)
    assert page.energy_kwh == pytest.approx(20 * 1000.0 / 3.6e9)  # 20 deltas from 95 s on, not 19
    since = {r.id: r for r in jobs_report(store, since=100.0)}
    assert report_dict(since["2"], per_gpu=True) == report_dict(every["2"], per_gpu=True)
    shown = job_overview(store, "2").job  # the page reads a short window at once (``read_short_window``)
    assert shown is not None and report_dict(shown, per_gpu=True) == report_dict(every["2"], per_gpu=True)
    store.close()


def test_the_lead_in_is_each_series_last_sample_before_the_start_and_no_older_than_its_bound() -> None:
    """Per metric, host and GPU the newest sample before ``t0``, each MIG instance of a GPU scraped at that time
    too; nothing from another host, nothing at or after ``t0``, nothing older than ``LEAD_IN_S``."""
    store = Store(":memory:")
    util = vocab.DCGM_FI_DEV_GPU_UTIL
    t0 = 1000.0
    rows = [
        (util, {"Hostname": "n1", "gpu": "0"}, [t0 - 30, t0 - 20, t0 - 10]),
        (util, {"Hostname": "n1", "gpu": "1", "GPU_I_ID": "1"}, [t0 - 15]),
        (util, {"Hostname": "n1", "gpu": "1", "GPU_I_ID": "2"}, [t0 - 25, t0 - 15]),
        (vocab.DCGM_FI_DEV_XID_ERRORS, {"Hostname": "n1", "gpu": "0"}, [t0 - 35]),
        (util, {"Hostname": "n2", "gpu": "0"}, [t0 - 11]),
        (util, {"Hostname": "n1", "gpu": "2"}, [t0 - queries.LEAD_IN_S - 1.0]),
    ]
    store.add(Sample(metric=m, labels=labels, t=t, value=1.0) for m, labels, times in rows for t in [*times, t0])
    found = queries.lead_in_samples(store, [util, vocab.DCGM_FI_DEV_XID_ERRORS], t0=t0, hosts=["n1"])
    seen = sorted((r["metric"], r["gpu"], r["t"]) for r in found.to_pylist())
    assert seen == [
        (util, "0", t0 - 10),
        (util, "1", t0 - 15),
        (util, "1", t0 - 15),  # both instances of GPU 1
        (vocab.DCGM_FI_DEV_XID_ERRORS, "0", t0 - 35),
    ]
    store.close()


# -- a reader of the recent jobs only (the exporter's window) -------------------------------------------------------

WINDOW_S = 150.0


def _node_of_jobs(end: float, store: Store | None = None) -> Store:
    """On n1's GPU 0 jobs 1-6 one after another, each 100 s (job k from 100 (k - 1) to 100 k); on GPU 1 job 10
    from 0 on; on n2's GPU 0 a workload known only by its ``hpc_job`` label "77" from 0 to 100 s. A scrape every
    5 s (utilisation, the energy counter) up to ``end``, in ``store`` (None: a new one in memory)."""
    store = store if store is not None else Store(":memory:")
    store.add(
        [
            *(
                Job(id=str(k), user="u", gpus=1, nodes=("n1",), gpus_by_node={"n1": (0,)}, start=100.0 * (k - 1),
                    end=100.0 * k, state="COMPLETED")
                for k in range(1, 7)
            ),
            Job(id="10", user="v", gpus=1, nodes=("n1",), gpus_by_node={"n1": (1,)}, start=0.0, end=None),
        ]
    )  # fmt: skip
    _scrapes(store, 5.0, end)
    store.add(
        Sample(
            metric=vocab.DCGM_FI_DEV_GPU_UTIL, labels={"Hostname": "n2", "gpu": "0", "hpc_job": "77"}, t=t, value=9.0
        )
        for t in range(5, 101, 5)
    )
    return store


def _scrapes(store: Store, first: float, last: float) -> None:
    store.add(
        Sample(metric=metric, labels={"Hostname": "n1", "gpu": gpu}, t=t, value=value)
        for t in (float(t) for t in range(int(first), int(last) + 1, 5))
        for gpu in ("0", "1")
        for metric, value in ((vocab.DCGM_FI_DEV_GPU_UTIL, 40.0), (vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, 10 * t))
    )


def _recent_as_one_pass(store: Store, kept: KeptStore, expected: set[str]) -> None:
    """The kept store's reports are those of ``expected``, each one pass's to the last digit, in one pass's
    order; the partial it keeps holds nothing of the other workloads."""
    found = [report_dict(r, per_gpu=True) for r in jobs_report(store, kept=kept)]
    assert found == [r for r in _one_pass(store) if r["id"] in expected]
    assert {r["id"] for r in found} == expected
    held = storestretches.store_partial(store, REPORT_METRICS, store.jobs(), kept=kept).workloads()
    assert held <= expected


def test_a_store_kept_for_the_recent_jobs_reports_them_as_one_pass_and_holds_no_other() -> None:
    """The exporter's window: the jobs running or ended within ``ended_within_s`` before the newest sample, each
    as one pass over every sample reports it, scrape after scrape as jobs leave the window; what is kept of the
    others is dropped, in a first read of the store's life as in the reads on."""
    store = _node_of_jobs(end=640.0)
    kept = KeptStore(ended_within_s=WINDOW_S)
    _recent_as_one_pass(store, kept, {"5", "6", "10"})  # 640 - 150 = 490: jobs 1-4 and "77" ended before
    for end, expected in ((700.0, {"6", "10"}), (760.0, {"10"})):
        _scrapes(store, end - 55.0, end)
        _recent_as_one_pass(store, kept, expected)
    _recent_as_one_pass(store, KeptStore(ended_within_s=WINDOW_S), {"10"})  # read whole at once, dropping
    assert [r.id for r in jobs_report(store, kept=KeptStore())] == [r["id"] for r in _one_pass(store)]
    assert len(_one_pass(store)) == 8
    store.close()


def test_a_job_dropped_from_the_window_that_comes_back_is_read_from_the_store_start(store_reads) -> None:
    """The workload "77", known by its label only, left the window; Slurm's record of job 77 lands later (polled
    late, started at 700 s on n2): its report counts its labelled rows of 0-100 s again, which the checkpoints
    no longer held, as one pass does."""
    store = _node_of_jobs(end=640.0)
    kept = KeptStore(ended_within_s=WINDOW_S)
    _recent_as_one_pass(store, kept, {"5", "6", "10"})
    _scrapes(store, 645.0, 700.0)
    _recent_as_one_pass(store, kept, {"6", "10"})
    store.add([Job(id="77", user="w", gpus=1, nodes=("n2",), gpus_by_node={"n2": (0,)}, start=700.0, end=None)])
    store.add(
        Sample(metric=vocab.DCGM_FI_DEV_GPU_UTIL, labels={"Hostname": "n2", "gpu": "0"}, t=float(t), value=30.0)
        for t in range(705, 751, 5)
    )
    _scrapes(store, 705.0, 750.0)
    store_reads.clear()
    _recent_as_one_pass(store, kept, {"6", "10", "77"})
    assert min(store_reads) == 5.0  # the store's first sample
    store.close()


def test_a_first_read_of_the_store_life_holds_the_recent_jobs_only_as_it_goes(monkeypatch) -> None:
    """Sixty jobs of 10 s one after another on one GPU, a window of 30 s: the first read of the store's life (the
    exporter's first scrape after a start) holds a handful of jobs' figures at any time, not sixty, and each
    checkpoint it keeps holds the jobs recent at its time only."""
    store = Store(":memory:")
    gpu = {"n1": (0,)}
    store.add(
        Job(id=str(k), gpus=1, nodes=("n1",), gpus_by_node=gpu, start=10.0 * k, end=10.0 * k + 10) for k in range(60)
    )
    _scrapes(store, 5.0, 600.0)
    held: list[int] = []
    add = storestretches.Partial.add

    def counting(self, later) -> None:
        add(self, later)
        held.append(len(self.cells))

    monkeypatch.setattr(storestretches.Partial, "add", counting)
    monkeypatch.setattr(storestretches, "STORE_STRETCH_ROWS", 8)  # 10 s a stretch
    kept = KeptStore(ended_within_s=30.0)
    assert [r.id for r in jobs_report(store, kept=kept)] == ["56", "57", "58", "59"]
    assert len(held) > 60 and max(held) <= 12
    (found,) = kept._kept.values()
    for checkpoint in found.checkpoints:
        assert {int(job) for job in checkpoint.state.workloads()} <= set(range(int(checkpoint.upto) // 10 - 4, 60))
    store.close()


def test_a_reader_that_starts_reads_on_from_the_checkpoint_in_the_store_folder(tmp_path, store_reads, caplog) -> None:
    """The exporter restarted: its first read resumes from the settled checkpoint the last process wrote in the
    store's folder, by the same checks as one kept in memory, and reports what one pass does; a file of a
    narrower window, or one that is not a checkpoint, is not read on from (the store's life again)."""
    from hpcwatch.reports.checkpointfiles import CheckpointFiles

    folder = str(tmp_path / "store")
    store = _node_of_jobs(end=640.0, store=Store(folder))
    _recent_as_one_pass(store, KeptStore(ended_within_s=WINDOW_S, on_disk=True), {"5", "6", "10"})
    store.close()
    store = Store(folder)  # another process
    _scrapes(store, 645.0, 700.0)
    store_reads.clear()
    _recent_as_one_pass(store, KeptStore(ended_within_s=WINDOW_S, on_disk=True), {"6", "10"})
    assert store_reads and min(store_reads) >= 640.0 - storestretches.SETTLE_S - 5.0
    store_reads.clear()
    _recent_as_one_pass(store, KeptStore(ended_within_s=WINDOW_S * 2, on_disk=True), {"4", "5", "6", "10"})
    assert min(store_reads) == 5.0  # the file dropped jobs 4 and 5: a wider window reads the store's life
    files = CheckpointFiles.of(store)
    assert files is not None
    (path,) = files.folder.glob("store-*")
    path.write_bytes(b"not a checkpoint")
    store_reads.clear()
    _recent_as_one_pass(store, KeptStore(ended_within_s=WINDOW_S, on_disk=True), {"6", "10"})
    assert min(store_reads) == 5.0 and "skipped" in caplog.text
    store.close()


def test_the_recent_jobs_of_a_real_sacct_capture_and_nothing_kept_of_the_others() -> None:
    """Real Slurm 22.05.8 ``sacct --json`` (tests/data/slurm/sacct.json: jobs 1-6 ended at 1795991671-704, 7-9
    running, 10 pending; its samples, CPUs, CPU time, memory and MaxRSS as sacct measured them, up to
    1795991714): a window of 15 s shows jobs 5-9, one of 30 s jobs 2-9, each as one pass reports it, and what
    sacct said of the others is not kept."""
    from hpcwatch.sources.slurm import read_sacct_records
    from tests.conftest import DATA

    store = Store(":memory:")
    store.add(read_sacct_records(DATA / "slurm/sacct.json"))
    for window, expected in ((15.0, {"5", "6", "7", "8", "9"}), (30.0, {"2", "3", "4", "5", "6", "7", "8", "9"})):
        kept = KeptStore(ended_within_s=window)
        _recent_as_one_pass(store, kept, expected)
    everything = storestretches.store_partial(store, REPORT_METRICS, store.jobs()).workloads()
    assert {"1", "2"} <= everything  # sacct's figures of the jobs out of the window, had they been kept
    store.close()
