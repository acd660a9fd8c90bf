"""Issue 27 (the job page at scale): a job's spans read as columns give the same anatomy, step table, step
report and goodput as the ``Span`` records they replaced on the job page, to the last bit.

Real inputs: the hook files of a real 4-rank gloo job on CPU (rank 2 sleeps 40 ms in backward; no
``barrier_wait`` spans, so the waits are aligned from the all-reduces: tests/data/kineto/gloo_straggler/hook/,
see tests/data/SOURCES.md); and the twin's store as the demo writes it (every phase, a planted straggler, an
XID that fails the job so its steps are re-run).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec
import numpy as np
import orjson
import pyarrow.compute as pc
import pytest

from hpcwatch.analysis.goodput import (
    GOODPUT_EVENT_KINDS,
    account_job_steps,
    job_step_table,
    steps_from_spans,
)
from hpcwatch.analysis.stepgroups import StepGroups
from hpcwatch.analysis.steps import (
    _GPU_CELLS,
    RankStepGrid,
    anatomy_from_span_table,
    anatomy_from_spans,
    anatomy_of_pieces,
    step_pieces,
)
from hpcwatch.analysis.stragglers import find_stragglers
from hpcwatch.errors import InputError
from hpcwatch.ingest import ingest_paths
from hpcwatch.model import reference_cluster
from hpcwatch.records import PHASES, Finding, Span
from hpcwatch.reports.goodput import goodput_report, goodput_with_steps
from hpcwatch.reports.jobpage import OverviewCache, job_overview
from hpcwatch.reports.jobs import first_start, job_report, job_samples
from hpcwatch.reports.steps import step_report
from hpcwatch.store import Store, queries
from hpcwatch.twin.live import LiveTwin

HOOK = Path(__file__).resolve().parents[1] / "data" / "kineto" / "gloo_straggler" / "hook"


@pytest.fixture(scope="module")
def hook_store():
    st = Store(":memory:")
    ingest_paths(st, [HOOK])
    yield st
    st.close()


@pytest.fixture(scope="module")
def twin_store():
    st = Store(":memory:")
    live = LiveTwin(st, reference_cluster(), seed=3, scenarios=["straggler", "xid79"], start=1_796_000_000.0)
    live.write_tick()
    for _ in range(40):
        live.step()
    yield st
    st.close()


def _jobs(store: Store) -> list[str]:
    return sorted({s.job for s in store.spans()})


def _same_steps(a, b) -> bool:
    """Equal to the last bit, but the barrier waits: the store sums them exactly, the span path in order."""
    return all(
        (getattr(a, f.name) is None and getattr(b, f.name) is None)
        or (f.name == "wait_s" and np.allclose(getattr(a, f.name), getattr(b, f.name), rtol=1e-12, atol=0))
        or np.array_equal(getattr(a, f.name), getattr(b, f.name))
        for f in dataclasses.fields(a)
    )


def _same_goodput(a, b) -> bool:
    """``GoodputReport``s equal but for the last bits of the barrier wait (``_same_steps``)."""
    same_rest = dataclasses.replace(a, barrier_wait_s=0.0) == dataclasses.replace(b, barrier_wait_s=0.0)
    return same_rest and a.barrier_wait_s == pytest.approx(b.barrier_wait_s, rel=1e-12)


@pytest.mark.parametrize("which", ["hook_store", "twin_store"])
def test_anatomy_of_the_span_columns_is_the_anatomy_of_the_spans(which, request):
    store = request.getfixturevalue(which)
    for job in _jobs(store):
        old = anatomy_from_spans(store.spans(job))
        new = anatomy_from_span_table(queries.job_span_table(store, job))
        assert new == old  # every rank step, phase sum, wait, and the placement
        assert list(new.placement.items()) == list(old.placement.items())  # in the order ranks were placed
        assert find_stragglers(new) == find_stragglers(old)


@pytest.mark.parametrize("which", ["hook_store", "twin_store"])
def test_the_grid_of_rank_steps_gives_the_matrices_of_its_rank_steps(which, request):
    """``anatomy_from_span_table`` keeps its rank steps as matrices (``RankStepGrid``); every matrix a report
    asks of it is the one its ``RankStep`` objects give, to the last bit (NaN where they have None)."""
    store = request.getfixturevalue(which)
    for job in _jobs(store):
        grid = anatomy_from_span_table(queries.job_span_table(store, job))
        assert isinstance(grid.rank_steps, RankStepGrid)
        made = msgspec.structs.replace(grid, rank_steps=tuple(grid.rank_steps))
        asked = [*PHASES, "work", "step", *sorted(_GPU_CELLS), "gpu:backward", "no-such-phase"]
        for what in asked:
            np.testing.assert_array_equal(grid.matrix(what), made.matrix(what), err_msg=what, strict=True)
        assert grid.has_gpu is made.has_gpu is False
        assert len(grid.rank_steps) == len(made.rank_steps) and grid.rank_steps[-1] == made.rank_steps[-1]


def test_the_hook_spans_carry_no_barrier_wait_so_the_columns_align_the_allreduces(hook_store):
    (job,) = _jobs(hook_store)
    table = queries.job_span_table(hook_store, job)
    assert "barrier_wait" not in table.column("phase").to_pylist()
    anatomy = anatomy_from_span_table(table)
    straggler = find_stragglers(anatomy).stragglers[0]
    assert straggler.rank == 2
    # The others waited for rank 2's backward: a wait computed from the all-reduces, not read.
    waits = [rs.phases["barrier_wait"] for rs in anatomy.rank_steps if rs.rank != 2]
    assert max(waits) > 0.02


def test_twin_without_barrier_wait_spans_aligns_the_same_waits(twin_store):
    job = _jobs(twin_store)[0]
    spans = [s for s in twin_store.spans(job) if s.phase != "barrier_wait"]
    table = queries.job_span_table(twin_store, job)
    table = table.filter(pc.not_equal(table.column("phase"), "barrier_wait"))
    assert anatomy_from_span_table(table) == anatomy_from_spans(spans)


@pytest.mark.parametrize("which", ["hook_store", "twin_store"])
def test_steps_grouped_in_the_store_are_the_step_table_of_the_spans(which, request):
    store = request.getfixturevalue(which)
    for job in _jobs(store):
        spans = store.spans(job)
        middle = spans[len(spans) // 2].start
        for breaks in ((), (middle,)):  # a failure in the middle: the steps after it are another incarnation
            old = steps_from_spans(spans, breaks=breaks)
            new = StepGroups.of_rows(*queries.job_step_groups(store, job, breaks=breaks)).step_table()
            assert len(old) > 1
            assert _same_steps(new, old)


def _goodput_of_spans(store: Store, job: str):
    """``reports.goodput.goodput_with_steps`` as it read the job before the columns: ``Span`` records."""
    record = store.job(job)
    record = dataclasses.replace(record, start=first_start(store, record)) if record is not None else None
    t0, t1 = (record.start, record.end) if record is not None else (None, None)
    events = [e for kind in GOODPUT_EVENT_KINDS for e in store.events(kind, t0=t0, t1=t1)]
    steps = job_step_table(record, store.spans(job), events)
    return account_job_steps(record, steps, events), steps


def test_goodput_and_step_report_read_from_columns_equal_the_span_path(twin_store):
    for job in _jobs(twin_store):
        old, old_steps = _goodput_of_spans(twin_store, job)
        new, new_steps = goodput_with_steps(twin_store, job)
        assert _same_goodput(new, old)
        assert _same_steps(new_steps, old_steps)
        recent = step_report(twin_store, job, recent_steps=5)
        spans = twin_store.spans(job)
        kept = set(sorted({s.step for s in spans})[-5:])
        assert recent.anatomy == anatomy_from_spans([s for s in spans if s.step in kept])


def test_recent_span_table_is_recent_spans_as_columns(twin_store):
    job = _jobs(twin_store)[0]
    rows = queries.recent_span_table(twin_store, job, steps=4).to_pylist()
    spans = [Span(**{**r, "attrs": orjson.loads(r["attrs"])}) for r in rows]
    assert spans == queries.recent_spans(twin_store, job, steps=4)


def test_no_training_phase_in_the_columns_is_said(twin_store):
    table = queries.job_span_table(twin_store, _jobs(twin_store)[0])
    with pytest.raises(InputError, match="no spans with a training phase"):
        anatomy_from_span_table(table.filter(pc.equal(table.column("phase"), "no-such-phase")))


def test_job_page_document_is_unchanged_by_the_columns(twin_store):
    """The page's steps and goodput, as the Span path computed them before the columns."""
    for job in _jobs(twin_store):
        overview = job_overview(twin_store, job)
        spans = twin_store.spans(job)
        kept = set(sorted({s.step for s in spans})[-50:])
        old = find_stragglers(anatomy_from_spans([s for s in spans if s.step in kept]))
        assert overview.steps is not None
        assert overview.steps.straggler == (
            None
            if not old.stragglers
            else {
                "rank": old.stragglers[0].rank,
                "node": old.stragglers[0].node,
                "gpu": old.stragglers[0].gpu,
                "phase": old.stragglers[0].phase,
                "excess_s": old.stragglers[0].excess_s,
                "score": old.stragglers[0].score,
            }
        )
        assert overview.goodput == goodput_report(twin_store, job)


# -- the job's report (attribution): the rows of a metric, the InfiniBand bytes ----------------------------


def _ib_bytes_one_by_one(samples, report) -> dict[tuple[str, str], tuple[float, float]]:  # per GPU: (tx, rx)
    """The job's IB bytes per GPU as the report added them before (one share at a time, in time order): on
    the twin every node has as many HCAs as GPUs, so port mlx5_h is GPU h's rail, and a delta is the job's
    when the GPU reported the job at the later sample."""
    holder = {
        (r["host"], r["gpu"], r["t"]): r["job"] for r in samples.to_pylist() if r["metric"] == "DCGM_FI_DEV_GPU_UTIL"
    }
    points: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for r in samples.to_pylist():
        if r["metric"].startswith("node_infiniband_port_data_"):
            device = orjson.loads(r["labels"])["device"]
            points.setdefault((r["metric"], r["host"], device.removeprefix("mlx5_")), []).append((r["t"], r["value"]))
    out = {(g.host, g.gpu): [0.0, 0.0] for g in report.per_gpu}
    for (metric, host, gpu), series in points.items():
        series.sort()
        for (_, before), (t, after) in zip(series, series[1:]):
            if after - before >= 0 and holder.get((host, gpu, t)) == report.id and (host, gpu) in out:
                out[(host, gpu)]["received" in metric] += after - before
    return {k: (tx, rx) for k, (tx, rx) in out.items()}


def test_job_report_ib_bytes_are_the_shares_added_one_by_one(twin_store):
    job = "4101"
    samples = job_samples(twin_store, job)
    report = job_report(twin_store, job, samples=samples)
    expected = _ib_bytes_one_by_one(samples, report)
    tx, rx = sum(v[0] for v in expected.values()), sum(v[1] for v in expected.values())
    assert tx > 0 and rx > 0
    assert (report.ib_tx_bytes, report.ib_rx_bytes) == (int(tx), int(rx))


def test_job_report_of_samples_in_any_order_is_the_same(twin_store):
    """The store's samples come ordered by metric (each metric's rows are slices); shuffled, they are
    filtered row by row: the same report."""
    job = "4101"
    samples = job_samples(twin_store, job)
    shuffled = samples.take(np.random.default_rng(0).permutation(samples.num_rows))
    assert job_report(twin_store, job, samples=shuffled) == job_report(twin_store, job, samples=samples)


def test_overview_cache_answers_until_the_store_changes():
    with Store(":memory:") as store:
        ingest_paths(store, [HOOK])
        (job,) = _jobs(store)
        cache = OverviewCache(size=2)
        first = cache.overview(store, job)
        assert cache.overview(store, job) is first  # nothing committed since: the same page
        assert cache.overview(store, job, price_per_gpu_hour=2.0) is not first  # another price, another page
        store.add(
            [
                Finding(
                    vector="weights_access",
                    severity="medium",
                    target=job,
                    title="read",
                    evidence={},
                    t=1.0,
                    rule="weights.foreign_reader",
                )
            ]
        )
        again = cache.overview(store, job)
        assert again is not first
        assert len(again.findings) == len(first.findings) + 1
        assert again == job_overview(store, job)


def test_job_report_among_its_nodes_jobs_is_the_report_among_every_job(twin_store):
    """``job_report`` attributes a job's samples among the jobs of its nodes only (a store keeps months of
    others): the same report as among every job, for each job of the twin (node2 is shared)."""
    from hpcwatch.analysis.attribution import job_reports

    jobs = twin_store.jobs()
    assert any(len(j.nodes) < len(reference_cluster().nodes) for j in jobs)  # some jobs do not span the cluster
    for job in jobs:
        if job.start is None:
            continue
        samples = job_samples(twin_store, job.id)
        (among_all,) = job_reports(samples, jobs, only=job.id)
        assert job_report(twin_store, job.id, samples=samples) == among_all


def test_goodput_of_one_events_query_is_the_goodput_of_one_query_a_kind(twin_store):
    from hpcwatch.analysis.goodput import GOODPUT_EVENT_KINDS

    one = twin_store.events(kinds=GOODPUT_EVENT_KINDS)
    per_kind = [e for kind in GOODPUT_EVENT_KINDS for e in twin_store.events(kind)]
    assert one and sorted(one, key=lambda e: (e.kind, e.t)) == sorted(per_kind, key=lambda e: (e.kind, e.t))
    assert [e.t for e in one] == sorted(e.t for e in one)
    assert twin_store.events(kinds=()) == []


@pytest.mark.parametrize("which", ["hook_store", "twin_store"])
def test_live_training_read_as_columns_is_the_step_time_of_the_spans(which, request):
    from hpcwatch.analysis.steps import step_times_s
    from hpcwatch.reports.livetraining import live_training

    store = request.getfixturevalue(which)
    live = live_training(store)
    assert live is not None and live.step_time_s is not None
    anatomy = anatomy_from_spans(queries.recent_spans(store, live.job, steps=2))
    assert (live.step, live.step_time_s) == (anatomy.steps[-1], float(step_times_s(anatomy)[-1]))


@pytest.mark.parametrize("which", ["hook_store", "twin_store"])
def test_the_pieces_of_steps_read_apart_make_the_anatomy_of_one_read(which, request):
    """A server takes apart only a job's new steps and keeps the others' pieces (``reports.steps.
    recent_step_report``): pieces read in two step-disjoint tables, assembled, are the anatomy of one read of
    both, to the last bit (the hook's waits aligned from its all-reduces, the twin's measured), and a step left
    without one of the ranks is left out, as in one read."""
    store = request.getfixturevalue(which)
    for job in _jobs(store):
        whole = queries.job_span_table(store, job)
        steps = sorted(set(whole.column("step").to_pylist()))
        for split in {1, len(steps) // 2, len(steps) - 1}:
            older = step_pieces(queries.step_span_table(store, job, steps[:split]))
            newer = step_pieces(queries.step_span_table(store, job, steps[split:]))
            assert anatomy_of_pieces([*older, *newer]) == anatomy_from_span_table(whole)
            assert anatomy_of_pieces([*older, *newer]).placement == anatomy_from_span_table(whole).placement
        (last,) = step_pieces(queries.step_span_table(store, job, steps[-1:]))
        lacking = msgspec.structs.replace(last, ranks=last.ranks[1:], phase_s=last.phase_s[1:])
        older = step_pieces(queries.step_span_table(store, job, steps[:-1]))
        assert anatomy_of_pieces([*older, lacking]).steps == anatomy_from_span_table(whole).steps[: len(older)]
