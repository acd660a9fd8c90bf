"""A job's report read stretch by stretch, and what a server keeps of it between pages (``reports.jobstretches``):
always the report a fresh read gives, and the kept stretches read once."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hpcwatch import vocab
from hpcwatch.analysis.attribution import report_dict
from hpcwatch.records import Job, Sample
from hpcwatch.reports import jobstretches
from hpcwatch.reports.jobpage import job_overview, overview_dict
from hpcwatch.reports.jobs import job_report
from hpcwatch.reports.jobstretches import KeptStretches
from hpcwatch.reports.timeline import job_timeline
from hpcwatch.store import Store, queries
from tests.unit.stretch_fixtures import live, reads, small_stretches  # noqa: F401  (fixtures)


def _running(store: Store) -> Job:
    return next(j for j in store.jobs() if j.end is None and j.start is not None and j.gpus >= 8)


def _same(store: Store, job_id: str, kept: KeptStretches, reads: list[float] | None = None) -> dict:
    """The report with ``kept``, held to a fresh read's; ``reads``: left with the stretches the first read."""
    found = report_dict(job_report(store, job_id, kept=kept), per_gpu=True)
    kept_reads = list(reads) if reads is not None else []
    assert found == report_dict(job_report(store, job_id), per_gpu=True)
    if reads is not None:
        reads[:] = kept_reads
    return found


def _same_series(page, fresh) -> None:
    """The charts of a page held to a fresh read's: the same grid, series, gaps and values."""
    assert page is not None and fresh is not None
    assert (page.t0, page.t1, page.bucket_s, page.buckets) == (fresh.t0, fresh.t1, fresh.bucket_s, fresh.buckets)
    for mine, whole in zip(page.series, fresh.series, strict=True):
        assert mine.key == whole.key
        assert [v is None for v in mine.values] == [v is None for v in whole.values]
        assert [v for v in mine.values if v is not None] == pytest.approx([v for v in whole.values if v is not None])


def test_the_next_page_reads_only_the_stretches_after_the_kept_ones(live, reads) -> None:
    store, twin = live
    job, kept = _running(store), KeptStretches()
    _same(store, job.id, kept)
    first_read = len(reads)
    assert first_read >= 5
    for _ in range(3):
        twin.step()
    reads.clear()
    _same(store, job.id, kept, reads)
    assert len(reads) <= 3 < first_read  # the unsettled stretches and the new one, not the job's life
    assert min(reads) > (job.start or 0.0)


def test_a_page_seconds_after_the_last_reads_only_what_followed_its_read(live, reads) -> None:
    """A page 3 s after the last reads on from the end of the last page's read; a row that landed before that
    end since (a node scraped late) makes the next page read from the settled checkpoint, ``SETTLE_S`` before
    the newest sample of the first page."""
    store, _ = live
    job, kept = _running(store), KeptStretches()
    _same(store, job.id, kept)
    host = job.nodes[0]
    newest = store.time_range()[1] or 0.0

    def scrape(t: float) -> None:
        labels = {"Hostname": host, "gpu": str(job.gpus_by_node[host][0]), "hpc_job": job.id}
        store.add([Sample(metric=vocab.DCGM_FI_DEV_GPU_UTIL, labels=labels, t=t, value=90.0)])

    scrape(newest + 3.0)
    reads.clear()
    _same(store, job.id, kept, reads)
    assert reads == [jobstretches.read_end(newest)]
    reads.clear()
    _same(store, job.id, kept, reads)
    assert reads == []  # nothing new since the end of the last read: nothing read
    scrape(newest + 1.0)  # late for the second page's end, not for the first's (kept: the newest of its age)
    reads.clear()
    _same(store, job.id, kept, reads)
    assert reads == [jobstretches.read_end(newest)]
    scrape(newest - 1.0)  # late for both ends
    reads.clear()
    _same(store, job.id, kept, reads)
    assert reads == [newest - jobstretches.SETTLE_S]
    scrape(newest + 3.0 + jobstretches.SETTLE_S)
    reads.clear()
    _same(store, job.id, kept, reads)
    assert reads == [jobstretches.read_end(newest + 3.0)]


def test_checkpoint_cuts_leave_a_settled_stretch_before_each() -> None:
    cuts = jobstretches.checkpoint_cuts
    assert cuts(100.0, 115.0, resumed=True) == []  # a cut at 105 would leave 5 s before it
    assert cuts(100.0, 120.0, resumed=False) == [110.0]
    assert cuts(100.0, 300.0, resumed=False) == [290.0]
    # Resumed from a checkpoint, no band is cut that the checkpoint is in already (ages 10-40 s, 40-160 s, ...):
    # 20 s old, it is the settled checkpoint of its band; 200 s old, the 160-640 s band's.
    assert cuts(100.0, 120.0, resumed=True) == []
    assert cuts(100.0, 139.0, resumed=True) == []
    assert cuts(100.0, 141.0, resumed=True) == [131.0]  # 41 s old: the 10-40 s band is cut
    assert cuts(100.0, 300.0, resumed=True) == [260.0, 290.0]
    assert cuts(100.0, 900.0, resumed=True) == [740.0, 860.0, 890.0]  # 800 s old: no cut at 260, in its band


def test_a_page_of_a_kept_job_does_not_try_to_read_its_window_at_once_again(live, monkeypatch) -> None:
    """Whether a window fits one read is asked once: a window a page kept checkpoints of did not."""
    store, _ = live
    job, kept = _running(store), KeptStretches()
    answers = []
    read = queries.job_window_samples_within

    def recording(*args, **kwargs):
        answers.append(read(*args, **kwargs))
        return answers[-1]

    monkeypatch.setattr(queries, "job_window_samples_within", recording)
    job_overview(store, job.id, kept=kept)
    job_overview(store, job.id, kept=kept)
    assert answers == [None]  # more than a stretch's rows (one, here): given up, and not asked again


def test_late_rows_in_a_kept_stretch_are_read(live) -> None:
    store, _ = live
    job, kept = _running(store), KeptStretches()
    before = _same(store, job.id, kept)
    host = job.nodes[0]
    gpu = str(job.gpus_by_node[host][0])
    late = (job.start or 0.0) + 5.5  # in the first stretch, which is kept
    store.add(
        [
            Sample(
                metric=vocab.DCGM_FI_DEV_GPU_UTIL,
                labels={"Hostname": host, "gpu": gpu, "hpc_job": job.id},
                t=late,
                value=100.0,
            )
        ]
    )
    after = _same(store, job.id, kept)
    assert sum(g["samples"] for g in after["per_gpu"]) == sum(g["samples"] for g in before["per_gpu"]) + 1


def test_rows_that_land_late_cost_a_read_of_what_follows_them(live, reads) -> None:
    """A page, another 50 s later (it leaves a checkpoint 10 s before the newest sample; the one it resumed from,
    50 s old, is the 40-160 s band's), then a row 25 s late: the next page starts from that 50 s checkpoint, not
    from the job's start."""
    store, twin = live
    job, kept = _running(store), KeptStretches()
    _same(store, job.id, kept, reads)
    first_stretch = min(reads)
    for _ in range(5):
        twin.step()
    _same(store, job.id, kept)
    newest = store.time_range()[1] or 0.0
    host = job.nodes[0]
    late = Sample(
        metric=vocab.DCGM_FI_DEV_GPU_UTIL,
        labels={"Hostname": host, "gpu": str(job.gpus_by_node[host][0]), "hpc_job": job.id},
        t=newest - 25.5,
        value=100.0,
    )
    store.add([late])
    reads.clear()
    _same(store, job.id, kept, reads)
    assert first_stretch < min(reads) <= late.t


def test_a_neighbour_job_that_takes_gpus_in_a_kept_stretch_is_seen() -> None:
    """Rows without an ``hpc_job`` label go to the job Slurm allocated the GPU to then: a job added later on
    the GPU takes them from the kept stretches too."""
    store = Store(":memory:")
    mine = Job(id="1", user="u", gpus=1, nodes=("n1",), gpus_by_node={"n1": (0,)}, start=0.0, end=None)
    store.add([mine])
    store.add(
        Sample(metric=vocab.DCGM_FI_DEV_GPU_UTIL, labels={"Hostname": "n1", "gpu": "0"}, t=float(t), value=50.0)
        for t in range(5, 600, 5)
    )
    kept = KeptStretches()
    assert _same(store, "1", kept)["per_gpu"][0]["samples"] == 119
    thief = Job(id="2", user="x", gpus=1, nodes=("n1",), gpus_by_node={"n1": (0,)}, start=100.0, end=200.0)
    store.add([thief])
    assert _same(store, "1", kept)["per_gpu"][0]["samples"] == 119 - 20
    store.close()


def test_a_new_device_reads_every_stretch_again(live, reads) -> None:
    store, _ = live
    job, kept = _running(store), KeptStretches()
    _same(store, job.id, kept, reads)
    first_stretch = min(reads)
    host = job.nodes[0]
    newest = store.time_range()[1] or 0.0
    hca = {"device": "mlx5_9", "port": "1", "instance": f"{host}:9100"}
    store.add(
        [
            Sample(
                metric=vocab.NODE_INFINIBAND_PORT_DATA_TRANSMITTED_BYTES_TOTAL, labels=hca, t=newest + k, value=1e6 * k
            )
            for k in (1, 2)
        ]
    )
    reads.clear()
    _same(store, job.id, kept, reads)
    assert min(reads) == first_stretch


def test_a_kept_report_is_one_per_store_and_job(live) -> None:
    store, _ = live
    job, kept = _running(store), KeptStretches(size=1)
    _same(store, job.id, kept)
    other = next(j for j in store.jobs() if j.start is not None and j.id != job.id and j.nodes)
    _same(store, other.id, kept)
    _same(store, job.id, kept)


def test_the_charts_from_checkpoints_draw_what_a_fresh_read_draws(live, reads) -> None:
    """The job page's charts (``reports.jobseries``) resumed from the checkpoints of the page before, the window
    grown since and its grid coarser: every bucket as a fresh read of the whole window draws it."""
    store, twin = live
    job, kept = _running(store), KeptStretches()
    job_overview(store, job.id, kept=kept)
    for _ in range(25):  # the window grows past a grid step: the kept cells are added up two by two
        twin.step()
    reads.clear()
    resumed = job_overview(store, job.id, kept=kept).series
    resumed_reads = len(reads)
    fresh = job_overview(store, job.id).series
    assert resumed_reads < len(reads) - resumed_reads  # fewer stretches read than the fresh page's
    _same_series(resumed, fresh)


def _scrapes(t_from: int, t_to: int) -> list[Sample]:
    """Node n1's two GPUs and one port, scraped every 2 s: utilisation varying, the port's counter rising."""
    out = []
    for t in range(t_from, t_to, 2):
        for gpu in ("0", "1"):
            labels = {"Hostname": "n1", "gpu": gpu}
            out.append(Sample(metric=vocab.DCGM_FI_DEV_GPU_UTIL, labels=labels, t=float(t), value=float(t % 97)))
        port = {"node": "n1", "device": "mlx5_0", "port": "1"}
        out.append(
            Sample(metric=vocab.NODE_INFINIBAND_PORT_DATA_TRANSMITTED_BYTES_TOTAL, labels=port, t=float(t), value=t * t)
        )
    return out


def test_kept_charts_are_added_up_into_a_coarser_grid() -> None:
    """400 s of a job drawn in 4 s buckets; 400 s later the grid is 8 s: the kept cells two by two, the rates
    across the checkpoint's edge, as a fresh read draws them."""
    store = Store(":memory:")
    store.add([Job(id="1", user="u", gpus=2, nodes=("n1",), gpus_by_node={"n1": (0, 1)}, start=0.0)])
    store.add(_scrapes(2, 402))
    kept = KeptStretches()
    first = job_overview(store, "1", kept=kept).series
    store.add(_scrapes(402, 802))
    resumed = job_overview(store, "1", kept=kept).series
    fresh = job_overview(store, "1").series
    store.close()
    assert first is not None and resumed is not None and fresh is not None
    assert (first.bucket_s, resumed.bucket_s) == (4.0, 8.0)
    for mine, whole in zip(resumed.series, fresh.series, strict=True):
        assert mine.key == whole.key
        assert [v is None for v in mine.values] == [v is None for v in whole.values]
        assert [v for v in mine.values if v is not None] == pytest.approx([v for v in whole.values if v is not None])


def _xid(job: Job, t: float, value: float) -> Sample:
    host = job.nodes[0]
    labels = {"Hostname": host, "gpu": str(job.gpus_by_node[host][0]), "hpc_job": job.id}
    return Sample(metric=vocab.DCGM_FI_DEV_XID_ERRORS, labels=labels, t=t, value=value)


def test_the_xid_onsets_kept_between_pages_are_those_of_a_fresh_read(live, monkeypatch) -> None:
    """The job's story from dcgm-exporter's XID gauge: a page groups only the samples since its checkpoint, and
    an XID that lands late, before the checkpoint, is in the next story."""
    store, twin = live
    job, kept = _running(store), KeptStretches()
    newest = store.time_range()[1] or 0.0
    store.add([_xid(job, newest - 30.0, 79.0), _xid(job, newest - 20.0, 79.0), _xid(job, newest - 10.0, 48.0)])
    grouped: list[float] = []
    groups = queries.gauge_onset_groups

    def recording(store, metric, **kwargs):
        grouped.append(kwargs["since"])
        return groups(store, metric, **kwargs)

    monkeypatch.setattr(queries, "gauge_onset_groups", recording)

    def story() -> list:
        found = job_timeline(store, job.id, kept=kept)
        assert found == job_timeline(store, job.id)
        return [(e["t"], e["detail"]["xid"]) for e in found if e["what"] == "xid"]

    assert story() == [(newest - 30.0, 79), (newest - 10.0, 48)]
    twin.step()
    store.add([_xid(job, newest + 5.0, 79.0)])  # the same XID again, after the checkpoint: not a new onset
    grouped.clear()
    assert story() == [(newest - 30.0, 79), (newest - 10.0, 48)]
    assert grouped[0] > (job.start or 0.0)  # from the checkpoint, not the first start
    store.add([_xid(job, newest - 40.0, 79.0)])  # late: before the checkpoint, and earlier than the onset kept
    assert story() == [(newest - 40.0, 79), (newest - 10.0, 48)]


def test_pages_every_ten_seconds_keep_a_checkpoint_in_each_band_they_reached(live) -> None:
    """Each page leaves a checkpoint 10 s old; the oldest of each band is kept as it ages, so that a row 40 s
    late still finds one before it (the newest of each band was replaced before it aged into the next)."""
    store, twin = live
    job, kept = _running(store), KeptStretches()
    for _ in range(20):  # 200 s of pages: bands 10 s, 40 s and 160 s reached
        _same(store, job.id, kept)
        twin.step()
    (report,) = [entry for (_, kind, _), entry in kept._entries.items() if kind == "report"]
    newest = store.time_range()[1] or 0.0
    ages = sorted(newest - c.upto for c in report.checkpoints)
    assert any(40 <= age < 160 for age in ages) and any(age >= 160 for age in ages)


def test_a_running_job_ends_where_every_job_report_ends_it() -> None:
    """``hpcwatch job ID`` and ``hpcwatch jobs`` give a running job the same elapsed time when another node was
    scraped after the job's own (at 1,024 nodes an eighth of the nodes is scraped each second)."""
    from hpcwatch.reports.jobs import jobs_report

    store = Store(":memory:")
    mine = Job(id="1", user="u", gpus=1, nodes=("n1",), gpus_by_node={"n1": (0,)}, start=0.0, end=None)
    other = Job(id="2", user="v", gpus=1, nodes=("n2",), gpus_by_node={"n2": (0,)}, start=0.0, end=None)
    store.add([mine, other])
    util = vocab.DCGM_FI_DEV_GPU_UTIL
    store.add(
        Sample(metric=util, labels={"Hostname": "n1", "gpu": "0"}, t=float(t), value=50.0) for t in range(5, 100, 5)
    )
    store.add([Sample(metric=util, labels={"Hostname": "n2", "gpu": "0"}, t=103.0, value=50.0)])
    every = {r.id: report_dict(r, per_gpu=True) for r in jobs_report(store)}
    assert every["1"]["elapsed_s"] == 103.0
    for kept in (None, KeptStretches()):
        assert report_dict(job_report(store, "1", kept=kept), per_gpu=True) == every["1"]
    assert overview_dict(job_overview(store, "1"))["job"] == every["1"]  # the page's one read of a short window
    store.close()


def test_a_page_takes_apart_only_the_steps_with_spans_landed_since_the_last(live, monkeypatch) -> None:
    """The last 50 steps' spans are read only from the lowest step that gained a span since the last page: the
    steps below are the last page's pieces, and the steps equal a fresh page's."""
    store, _ = live
    job, kept = _running(store), KeptStretches()
    read: list[list[int]] = []
    table = queries.step_span_table

    def recording(store, job_id, steps, **kwargs):
        read.append(list(steps))
        return table(store, job_id, steps, **kwargs)

    monkeypatch.setattr(queries, "step_span_table", recording)
    first = job_overview(store, job.id, kept=kept)
    assert first.steps is not None and len(read[0]) == first.steps.steps  # every rank of each step had spans
    store.add(
        [Sample(metric=vocab.DCGM_FI_DEV_GPU_UTIL, labels={"Hostname": job.nodes[0], "gpu": "0"}, t=1.0, value=1)]
    )
    assert job_overview(store, job.id, kept=kept).steps == first.steps
    assert len(read) == 1  # a sample is no span: nothing read
    spans = queries.recent_spans(store, job.id, steps=2)
    newest = max(s.step for s in spans)
    store.add([replace(s, step=s.step + 1, start=s.start + 60.0) for s in spans if s.step == newest])
    store.add([replace(spans[0], dur=spans[0].dur + 1.0)])  # one span more in an older step
    again = job_overview(store, job.id, kept=kept)
    assert read[1] == [spans[0].step, newest, newest + 1]  # from the lowest step that gained a span, no lower
    assert again.steps == job_overview(store, job.id).steps
    assert again.steps is not None and again.steps.last_step == newest + 1


def test_a_window_read_at_once_leaves_the_checkpoint_the_next_page_reads_on_from(live, reads, monkeypatch) -> None:
    """A window of one stretch is read once, for the report and the charts together; the page keeps its end,
    so that the next one reads only what followed (a young job's pages were each a read of its whole life) and
    says what a fresh read of the whole window says."""
    monkeypatch.setattr(jobstretches, "STRETCH_ROWS", 10**9)
    store, twin = live
    job, kept = _running(store), KeptStretches()
    job_overview(store, job.id, kept=kept)
    assert len(reads) == 1
    newest = store.time_range()[1] or 0.0
    twin.step()
    reads.clear()
    page = job_overview(store, job.id, kept=kept)
    assert reads and min(reads) >= jobstretches.read_end(newest) - jobstretches.SETTLE_S
    assert min(reads) > (job.start or 0.0) + 60.0
    fresh = job_overview(store, job.id)
    assert page.job is not None and fresh.job is not None
    assert report_dict(page.job, per_gpu=True) == report_dict(fresh.job, per_gpu=True)
    _same_series(page.series, fresh.series)


def test_a_row_landing_late_in_a_window_read_at_once_is_counted(live, monkeypatch) -> None:
    monkeypatch.setattr(jobstretches, "STRETCH_ROWS", 10**9)
    store, _ = live
    job, kept = _running(store), KeptStretches()
    before = report_dict(job_report(store, job.id), per_gpu=True)
    job_overview(store, job.id, kept=kept)
    assert kept.holds(store, "report", job, job.start or 0.0)
    host = job.nodes[0]
    labels = {"Hostname": host, "gpu": str(job.gpus_by_node[host][0]), "hpc_job": job.id}
    newest = store.time_range()[1] or 0.0
    store.add([Sample(metric=vocab.DCGM_FI_DEV_GPU_UTIL, labels=labels, t=newest - 0.5, value=3.0)])
    page = job_overview(store, job.id, kept=kept)
    assert page.job is not None
    assert report_dict(page.job, per_gpu=True) == report_dict(job_report(store, job.id), per_gpu=True) != before


def test_the_charts_take_what_follows_their_checkpoint_from_the_reports_read(live, reads) -> None:
    """A page seconds after the last: the report reads what followed its checkpoint in one query, and the
    charts, whose checkpoint is the same time, draw from those rows instead of reading them again."""
    store, twin = live
    job, kept = _running(store), KeptStretches()
    job_overview(store, job.id, kept=kept)
    for _ in range(2):
        twin.step()
    reads.clear()
    page = job_overview(store, job.id, kept=kept)
    assert len(reads) == 1  # the report's; the charts' read of the same rows was a second query
    fresh = job_overview(store, job.id)
    assert page.job is not None and fresh.job is not None
    assert report_dict(page.job, per_gpu=True) == report_dict(fresh.job, per_gpu=True)
    _same_series(page.series, fresh.series)


def test_a_row_committed_after_the_reports_read_is_drawn_by_the_next_page(live, monkeypatch) -> None:
    """The charts drew from the report's read, which a commit followed before the charts were drawn: they keep
    the report's version, so the next page reads that row (had they kept their own, later one, it would never be
    drawn: it lies before their end checkpoint)."""
    store, twin = live
    job, kept = _running(store), KeptStretches()
    job_overview(store, job.id, kept=kept)
    twin.step()
    host = job.nodes[0]
    labels = {"Hostname": host, "gpu": str(job.gpus_by_node[host][0]), "hpc_job": job.id}
    newest = store.time_range()[1] or 0.0
    read = jobstretches.queries.job_window_samples

    def read_then_commit(store_, metrics, **window):
        found = read(store_, metrics, **window)
        monkeypatch.setattr(jobstretches.queries, "job_window_samples", read)  # once
        store.add([Sample(metric=vocab.DCGM_FI_DEV_GPU_UTIL, labels=labels, t=newest - 0.25, value=1.0)])
        return found

    monkeypatch.setattr(jobstretches.queries, "job_window_samples", read_then_commit)
    page = job_overview(store, job.id, kept=kept)
    fresh = job_overview(store, job.id)
    assert page.series is not None and fresh.series is not None
    assert page.series.series != fresh.series.series  # the row came after the page's read
    _same_series(job_overview(store, job.id, kept=kept).series, fresh.series)


def test_a_pages_held_read_is_lent_only_for_rows_it_holds_all_of() -> None:
    """``PageReads.rows_from``: the held rows from the asked start to the asked end, of the same job and nodes;
    nothing when the held read started later, lacked a metric, or ended sooner."""
    import pyarrow as pa

    table = pa.table({"metric": ["a", "b", "a", "b"], "t": [10.0, 11.0, 12.0, 13.0], "value": [1.0, 2.0, 3.0, 4.0]})
    job = Job(id="7", nodes=("n1", "n2"))
    reads = jobstretches.PageReads()
    assert reads.rows_from(["a"], job, 10.0, None) is None  # nothing held
    reads.hold(jobstretches.SharedRows(5, job, 10.0, frozenset({"a", "b"}), table))
    reads.hold(jobstretches.SharedRows(6, job, 12.0, frozenset({"a"}), table.slice(2)))  # the first read stays
    lent = reads.rows_from(["a"], job, 11.0, 12.5)
    assert lent is not None and lent.version == 5
    assert lent.table.column("t").to_pylist() == [11.0, 12.0]  # the other metric's rows too: the reader selects
    assert reads.rows_from(["a"], job, 9.0, None) is None  # before the held read's start
    assert reads.rows_from(["a", "c"], job, 11.0, None) is None  # a metric it did not read
    assert reads.rows_from(["a"], replace(job, id="8"), 11.0, None) is None
    assert reads.rows_from(["a"], replace(job, nodes=("n1",)), 11.0, None) is None
    ended = jobstretches.PageReads()
    ended.hold(jobstretches.SharedRows(5, replace(job, end=12.0), 10.0, frozenset({"a"}), table))
    assert ended.rows_from(["a"], job, 10.0, 13.0) is None  # read up to 12 s only
    assert ended.rows_from(["a"], job, 10.0, None) is None
    assert ended.rows_from(["a"], job, 10.0, 11.5) is not None


def test_what_was_written_since_is_asked_before_the_newest_checkpoint_only() -> None:
    """``job_window_written`` and ``job_spans_written`` with ``before``: the oldest row committed since the
    version among those before it (a row after the newest checkpoint leaves every checkpoint true)."""
    from hpcwatch.records import Span

    store = Store(":memory:")
    labels = {"Hostname": "n1", "gpu": "0", "hpc_job": "5"}
    store.add([Sample(metric=vocab.DCGM_FI_DEV_GPU_UTIL, labels=labels, t=100.0, value=1.0)])
    store.add([Span(job="5", rank=0, step=1, phase="forward", start=100.0, dur=1.0)])
    version = store.version
    store.add([Sample(metric=vocab.DCGM_FI_DEV_GPU_UTIL, labels=labels, t=t, value=2.0) for t in (130.0, 120.0)])
    store.add([Span(job="5", rank=0, step=s, phase="forward", start=t, dur=1.0) for s, t in ((3, 130.0), (2, 120.0))])

    def samples(before: float | None) -> float | None:
        metrics = [vocab.DCGM_FI_DEV_GPU_UTIL]
        return queries.job_window_written(store, version, metrics, hosts=["n1"], job="5", t0=0.0, before=before)

    assert samples(None) == 120.0
    assert samples(125.0) == 120.0
    assert samples(120.0) is None  # the row at 120 s is not before 120 s
    assert queries.job_spans_written(store, version, "5") == 120.0
    assert queries.job_spans_written(store, version, "5", before=125.0) == 120.0
    assert queries.job_spans_written(store, version, "5", before=110.0) is None
    store.close()


def test_charts_resumed_twice_from_one_checkpoint_draw_what_a_fresh_read_draws(live) -> None:
    """A checkpoint's charts are joined to many pages: the second page adds what followed the first page's end
    to a copy, and a third, after a row that landed late for the second page's end only, resumes from the first
    page's end again and must find it as it was left."""
    store, _ = live
    job, kept = _running(store), KeptStretches()
    job_overview(store, job.id, kept=kept)
    host = job.nodes[0]
    newest = store.time_range()[1] or 0.0

    def scrape(t: float, value: float) -> None:
        labels = {"Hostname": host, "gpu": str(job.gpus_by_node[host][0]), "hpc_job": job.id}
        store.add([Sample(metric=vocab.DCGM_FI_DEV_GPU_UTIL, labels=labels, t=t, value=value)])

    scrape(newest + 3.0, 7.0)
    job_overview(store, job.id, kept=kept)
    scrape(newest + 1.0, 11.0)  # late for the second page's end, not for the first's
    page = job_overview(store, job.id, kept=kept)
    _same_series(page.series, job_overview(store, job.id).series)
