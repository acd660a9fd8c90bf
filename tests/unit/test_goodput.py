"""Goodput accounting: hand-built timelines, the ideal step time, and the failure twin's ground truth."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from hpcwatch.analysis.goodput import (
    BADPUT_KINDS,
    account_goodput,
    ideal_step_time,
    steps_from_spans,
    steps_from_step_samples,
)
from hpcwatch.analysis.goodputsim import GoodputSimConfig, simulate_goodput
from hpcwatch.cli import app
from hpcwatch.records import Event, Job, Sample, Span
from hpcwatch.store import Store


def _steps(job: str, first: int, start: float, n: int, dur: float = 10.0, load: float = 1.0) -> list[Span]:
    spans = []
    for i in range(n):
        t = start + i * dur
        spans += [Span(job=job, rank=r, step=first + i, phase="load", start=t, dur=load + 0.5 * r) for r in (0, 1)]
        spans += [
            Span(job=job, rank=r, step=first + i, phase="forward", start=t + load + 0.5 * r, dur=dur - load - 0.5 * r)
            for r in (0, 1)
        ]
    return spans


def _ev(kind: str, t: float, **attrs) -> Event:
    return Event(kind=kind, t=t, source="test", attrs=attrs)


def test_one_failure_timeline_is_split_by_hand():
    # 0-100 init | steps 1-5 (100-150) | save 150-170 | steps 6-8 (170-200) | failure at 205
    # recovery 205-260 | restore 260-280 (step 5) | steps 6-10 (280-330) | end at 400
    job = Job(id="7", start=0.0, end=400.0, state="COMPLETED")
    spans = _steps("7", 1, 100.0, 5) + _steps("7", 6, 170.0, 3) + _steps("7", 6, 280.0, 5)
    events = [
        _ev("checkpoint_save", 150.0, duration_s=20.0, step=5),
        _ev("failure", 205.0, cause="faulty_gpu", step=9),
        _ev("checkpoint_restore", 260.0, duration_s=20.0, step=5),
    ]
    report = account_goodput(job, steps_from_spans(spans, breaks=[205.0]), events)
    b = report.badput_s
    assert b["init"] == pytest.approx(100.0)
    assert b["checkpoint_save"] == pytest.approx(20.0)
    assert b["lost_progress"] == pytest.approx(30.0 + 5.0)  # steps 6-8, then 5 s of step 9 in flight
    assert b["recovery"] == pytest.approx(55.0)
    assert b["checkpoint_restore"] == pytest.approx(20.0)
    assert b["data_loading"] == pytest.approx(10 * 1.0)  # 10 kept steps × the load every rank waited for
    assert b["other"] == pytest.approx(70.0)  # the tail after the last step
    assert report.productive_s == pytest.approx(10 * 9.0)
    assert report.productive_s + sum(b.values()) == pytest.approx(400.0)
    assert report.goodput == pytest.approx(90.0 / 400.0)
    assert (report.steps, report.lost_steps, report.interruptions) == (13, 3, 1)
    assert report.interruptions_by_cause == {"faulty_gpu": 1}


def test_a_save_that_overlaps_steps_is_not_badput():
    job = Job(id="a", start=0.0, end=100.0)
    report = account_goodput(
        job,
        steps_from_spans(_steps("a", 1, 0.0, 10, load=0.0)),
        [_ev("checkpoint_save", 30.0, duration_s=15.0, step=3)],
    )
    assert report.badput_s["checkpoint_save"] == 0.0 and report.overlap_s == pytest.approx(15.0)
    assert report.goodput == pytest.approx(1.0)


def test_a_save_cut_by_a_failure_does_not_protect_its_steps():
    job = Job(id="c", start=0.0, end=200.0)
    spans = _steps("c", 1, 0.0, 4, load=0.0) + _steps("c", 1, 100.0, 4, load=0.0)
    events = [_ev("checkpoint_save", 40.0, duration_s=20.0, step=4), _ev("failure", 50.0, cause="nic")]
    report = account_goodput(job, steps_from_spans(spans, breaks=[50.0]), events)
    assert report.lost_steps == 4
    assert report.badput_s["checkpoint_save"] == pytest.approx(10.0)  # clipped at the failure
    assert report.badput_s["lost_progress"] == pytest.approx(40.0)


def test_sampled_steps_are_credited_at_the_ideal_step_time():
    # Only every 4th step traced (steps 101, 105, ... of a job that began before collection at t=0).
    job = Job(id="s", start=0.0, end=1200.0)
    spans = [sp for k in range(25) for sp in _steps("s", 101 + 4 * k, 200.0 + 40.0 * k, 1)]
    report = account_goodput(job, steps_from_spans(spans), [])
    # Steps 1-100 ran before the first trace (1000 s at the ideal 10 s, but only 200 s are there: capped),
    # 3 untraced steps sit in each of the 24 gaps; the tail after the last step is 'other'.
    assert report.badput_s["init"] == pytest.approx(0.0)
    assert report.productive_s + report.badput_s["data_loading"] == pytest.approx(200.0 + 25 * 10.0 + 24 * 30.0)
    assert report.badput_s["other"] == pytest.approx(1200.0 - 1170.0)
    assert "credited at the ideal step time" in report.notes[0]


def test_storage_side_checkpoint_event_keeps_its_step():
    # The twin (and a Lustre/Tetragon view) sees a checkpoint as a write of step_N.pt, with no duration.
    job = Job(id="w", start=0.0, end=200.0)
    spans = _steps("w", 1, 0.0, 6, load=0.0) + _steps("w", 5, 100.0, 6, load=0.0)
    events = [
        Event(kind="checkpoint", t=40.0, source="twin", attrs={"job": "w", "path": "/lustre/ckpt/w/step_4.pt"}),
        _ev("failure", 60.0, cause="gpu_hbm3_memory"),
    ]
    report = account_goodput(job, steps_from_spans(spans, breaks=[60.0]), events)
    assert report.lost_steps == 2 and report.badput_s["checkpoint_save"] == 0.0


def test_ideal_step_time_drops_outliers_over_median_plus_3_mad():
    steps = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 9.0]
    assert ideal_step_time(steps) == pytest.approx(1.0)
    assert ideal_step_time([]) is None


def test_step_samples_path_uses_the_slowest_rank():
    samples = [
        Sample(
            metric="train_step_time_s",
            labels={"job": "s", "rank": str(r), "step": str(k)},
            t=10.0 * k + 10.0,
            value=9.0 + r,
        )
        for k in range(3)
        for r in (0, 1)
    ]
    steps = steps_from_step_samples(samples)
    assert steps.step.tolist() == [0, 1, 2] and steps.dur_s.tolist() == [10.0, 10.0, 10.0]


def _run(**kw):
    return simulate_goodput(
        GoodputSimConfig(**{"gpus": 16_384, "days": 0.5, "step_s": 240.0, "seed": 4, **kw}), t_origin=1.7e9
    )


def test_twin_job_through_the_store_matches_ground_truth_within_1_percent(tmp_path):
    run = _run()
    assert run.interruptions >= 5  # the test means something only with failures in it
    db = tmp_path / "g.duckdb"
    with Store(db) as store:
        store.add(run.records("llama"))
    result = CliRunner().invoke(app, ["goodput", "llama", "--db", str(db), "--json"])
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.stdout)
    truth = run.to_dict()
    assert doc["goodput"] == pytest.approx(truth["goodput"], rel=0.01)
    for kind in BADPUT_KINDS:
        assert doc["badput"][kind] == pytest.approx(truth["badput"][kind], abs=0.01 * truth["goodput"])
    assert doc["interruptions"] == run.interruptions
    assert doc["ideal_step_s"] == pytest.approx(240.0)


def test_54_day_run_compact_steps_match_ground_truth_within_1_percent():
    run = simulate_goodput(GoodputSimConfig(seed=11))
    report = account_goodput(run.job(), run.step_table(), list(run.events()))
    assert report.interruptions == run.interruptions > 300
    assert report.goodput == pytest.approx(run.goodput, rel=0.01)
    for kind in BADPUT_KINDS:
        assert report.badput_s[kind] == pytest.approx(run.badput_s[kind], abs=0.01 * run.productive_s)


def test_goodput_of_an_unknown_job_is_one_line_error(tmp_path):
    from hpcwatch.cli import main  # noqa: F401 (the error path is the CLI's)

    result = CliRunner().invoke(app, ["goodput", "nope", "--db", str(tmp_path / "e.duckdb")])
    assert result.exit_code != 0
