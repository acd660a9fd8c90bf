"""Straggler scores and detection: the planted gloo straggler, twin-like spans, and no false alarm."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from hpcwatch.analysis.steps import anatomy_from_spans, anatomy_from_traces
from hpcwatch.analysis.stragglers import StragglerConfig, find_stragglers, modified_z
from hpcwatch.errors import ConfigError
from hpcwatch.records import PHASES, Span
from hpcwatch.sources.hook import read_hook_jsonl
from hpcwatch.sources.kineto import read_kineto


def _job_spans(
    work_s: dict[int, dict[str, float]],
    *,
    steps: int = 5,
    base: dict[str, float] | None = None,
    noise: float = 0.0,
    seed: int = 0,
) -> list[Span]:
    """Twin-like spans of a synchronous job: each rank waits in barrier_wait for the slowest rank."""
    rng = np.random.default_rng(seed)
    base = base or {"load": 0.002, "forward": 0.010, "backward": 0.020, "optimizer": 0.003}
    spans, t = [], 1000.0
    for step in range(steps):
        own = {
            r: {p: base[p] * (1 + noise * rng.standard_normal()) * work_s.get(r, {}).get(p, 1.0) for p in base}
            for r in range(8)
        }
        slowest = max(sum(v.values()) for v in own.values())
        for r, phases in own.items():
            start = t
            for p, d in phases.items():
                spans.append(
                    Span(
                        job="42",
                        rank=r,
                        step=step,
                        phase=p,
                        start=start,
                        dur=d,
                        attrs={"node": f"node{1 + r // 4}", "gpu": r % 4},
                    )
                )
                start += d
            wait = slowest - sum(phases.values())
            spans.append(Span(job="42", rank=r, step=step, phase="barrier_wait", start=start, dur=wait, attrs={}))
            spans.append(Span(job="42", rank=r, step=step, phase="allreduce", start=start + wait, dur=0.004, attrs={}))
        t += slowest + 0.004
    return spans


def test_twin_like_backward_straggler_is_named_with_node_gpu_and_phase():
    report = find_stragglers(anatomy_from_spans(_job_spans({6: {"backward": 2.0}}, noise=0.02)))
    assert len(report.stragglers) == 1
    s = report.stragglers[0]
    assert (s.rank, s.node, s.gpu, s.phase, s.signature) == (6, "node2", 2, "backward", True)
    assert s.steps_flagged == 1.0 and s.excess_s == pytest.approx(0.020, rel=0.2)
    assert s.others_wait_s == pytest.approx(0.020, rel=0.2)


def test_relative_score_is_best_over_mine_as_in_nvrx():
    # rank 3 twice as slow in everything: twice as slow as the fastest rank -> 0.5
    report = find_stragglers(
        anatomy_from_spans(_job_spans({3: dict.fromkeys(("load", "forward", "backward", "optimizer"), 2.0)}))
    )
    scores = {r.rank: r.score for r in report.ranks}
    assert scores[3] == pytest.approx(0.5) and all(scores[r] == pytest.approx(1.0) for r in scores if r != 3)
    assert all(0.0 <= r.score <= 1.0 and 0.0 <= r.individual_score <= 1.0 for r in report.ranks)


def test_individual_score_sees_a_rank_getting_slower_than_its_own_best():
    fast = _job_spans({}, steps=2)
    slow = [s for s in _job_spans({}, steps=5) if s.step >= 2]
    slow = [
        Span(
            job=s.job,
            rank=s.rank,
            step=s.step,
            phase=s.phase,
            start=s.start,
            dur=s.dur * (3.0 if s.rank == 1 and s.phase == "forward" else 1.0),
            attrs=s.attrs,
        )
        for s in slow
    ]
    report = find_stragglers(anatomy_from_spans(fast + slow))
    rank1 = next(r for r in report.ranks if r.rank == 1)
    assert rank1.individual_score < 0.7 and rank1.phase_scores["forward"] == pytest.approx(1 / 3, rel=0.05)


def test_noise_alone_names_no_one():
    for seed in range(5):
        report = find_stragglers(anatomy_from_spans(_job_spans({}, noise=0.03, seed=seed)))
        assert report.stragglers == ()


def test_the_planted_gloo_straggler_is_named_from_the_kineto_traces(data_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traces = [read_kineto(p) for p in sorted((data_dir / "kineto" / "gloo_straggler").glob("rank-*.json.gz"))]
    report = find_stragglers(anatomy_from_traces(traces))
    assert [s.rank for s in report.stragglers] == [2]
    s = report.stragglers[0]
    assert s.phase == "backward" and s.signature and s.score < 0.2 and s.excess_s > 0.03
    assert s.node == traces[2].metadata["host_name"]


def test_the_planted_gloo_straggler_is_named_from_the_hook_spans(data_dir):
    spans = [
        r
        for p in sorted((data_dir / "kineto" / "gloo_straggler" / "hook").glob("rank-*.jsonl"))
        for r in read_hook_jsonl(p)
        if isinstance(r, Span)
    ]
    report = find_stragglers(anatomy_from_spans(spans))
    assert [(s.rank, s.node, s.gpu, s.phase) for s in report.stragglers] == [(2, "node2", 0, "backward")]


def test_placement_from_the_scheduler_overrides_the_traces():
    anatomy = anatomy_from_spans(_job_spans({5: {"forward": 4.0}}))
    report = find_stragglers(anatomy, placement={5: ("gpu-node-17", 7)})
    assert [(s.rank, s.node, s.gpu, s.phase) for s in report.stragglers] == [(5, "gpu-node-17", 7, "forward")]


def test_modified_z_survives_identical_ranks():
    z = modified_z(np.array([[1.0], [1.0], [1.0], [2.0]]))
    assert np.isfinite(z).all() and z[3, 0] > 3.5 and (z[:3] == 0).all()


@pytest.mark.parametrize(
    "field, value",
    [("z_threshold", 0), ("min_step_fraction", 0), ("min_step_fraction", 1.5), ("min_excess", -1), ("mad_floor", 0)],
)
def test_straggler_config_rejects_bad_values(field, value):
    with pytest.raises(ConfigError):
        StragglerConfig(**{field: value})


def test_every_phase_is_reported_per_rank():
    report = find_stragglers(anatomy_from_spans(_job_spans({})))
    assert all(set(r.phases) == set(PHASES) for r in report.ranks)


def test_the_twins_straggler_scenario_is_named_from_its_spans():
    twin_module = pytest.importorskip("hpcwatch.twin")
    from hpcwatch.model import reference_cluster

    twin = twin_module.Twin(reference_cluster(), seed=0, scenarios=("straggler",))
    for _ in range(10):
        twin.advance(1.0)
    last = twin.spans()[0].step
    # Five steps: a verdict needs at least three (one step of the twin named a rank before).
    report = find_stragglers(anatomy_from_spans([s for step in range(last - 4, last + 1) for s in twin.spans(step)]))
    # the scenario: GPU 2 of node 1 takes twice as long for its backward
    assert [(s.node, s.gpu, s.phase, s.signature) for s in report.stragglers] == [("node1", 2, "backward", True)]


def test_a_single_slow_step_is_an_outlier_over_time_not_a_straggler():
    spans = _job_spans({}, steps=6, noise=0.01)
    spans = [
        Span(
            job=s.job,
            rank=s.rank,
            step=s.step,
            phase=s.phase,
            start=s.start,
            dur=s.dur + (0.05 if (s.rank, s.step, s.phase) == (4, 3, "load") else 0.0),
            attrs=s.attrs,
        )
        for s in spans
    ]
    report = find_stragglers(anatomy_from_spans(spans))
    assert report.stragglers == ()
    assert [(s.rank, s.step) for s in report.slow_steps] == [(4, 3)]


@pytest.mark.parametrize("seed", range(40))
def test_the_median_without_nans_is_numpys_nanmedian(seed):
    """``_nanmedian`` takes ``np.median`` when no value is NaN: the same numbers as ``np.nanmedian`` by every
    axis, with NaNs (whole rows of them too) or without, even and odd lengths."""
    from hpcwatch.analysis.stragglers import _nanmedian

    rng = np.random.default_rng(seed)
    m = rng.normal(size=(int(rng.integers(1, 7)), int(rng.integers(1, 8))))
    if seed % 3 == 1:
        m[rng.random(m.shape) < 0.3] = np.nan
    if seed % 3 == 2:
        m[0] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN row, as numpy warns of it
        for axis, keepdims in ((None, False), (0, True), (1, False), (1, True)):
            np.testing.assert_array_equal(
                _nanmedian(m, axis=axis, keepdims=keepdims), np.nanmedian(m, axis=axis, keepdims=keepdims)
            )
