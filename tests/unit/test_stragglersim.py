"""Straggler simulator: known order statistics, exact against Monte-Carlo, edge cases."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from hpcwatch.analysis.stragglersim import busy_times_from_spans, efficiency_curve, expected_max_normal, sample_step_max
from hpcwatch.cli.common import app
from hpcwatch.errors import ConfigError
from hpcwatch.records import Span

SIZES = [8, 1024, 16384, 100_000]


def test_expected_max_of_standard_normals_matches_the_tables():
    e = expected_max_normal([8, 1024, 16384])
    np.testing.assert_allclose(e, [1.424, 3.248, 3.971], atol=5e-4)
    assert expected_max_normal([1, 2]) == pytest.approx([0.0, 1 / np.sqrt(np.pi)], abs=1e-7)


def test_one_gpu_is_fully_efficient():
    curve = efficiency_curve([1], cv=0.05, p_slow=0.01, slow_factor=2.0, steps=1000)
    assert curve.points[0].efficiency == pytest.approx(1.0, abs=1e-7)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(cv=0.05),  # healthy GPUs only
        dict(cv=0.05, p_slow=0.002, slow_factor=2.0),  # rare GPUs twice as slow
        dict(cv=0.02, p_slow=0.05, slow_factor=1.3),  # common, mildly slow GPUs
        dict(sample=np.random.default_rng(7).gamma(400.0, 1e-3, 2000)),  # a measured sample
        dict(sample=np.random.default_rng(7).gamma(400.0, 1e-3, 2000), p_slow=0.001, slow_factor=1.5),
    ],
)
def test_exact_and_monte_carlo_agree_within_half_a_percent(kwargs):
    curve = efficiency_curve(SIZES, steps=20_000, seed=3, **kwargs)
    for point in curve.points:
        assert point.efficiency_mc == pytest.approx(point.efficiency, rel=5e-3), point.gpus


def test_efficiency_falls_with_job_size():
    curve = efficiency_curve(
        [8, 64, 512, 4096, 32768, 100_000], cv=0.05, p_slow=1e-4, slow_factor=2.0, monte_carlo=False
    )
    eff = [p.efficiency for p in curve.points]
    assert eff == sorted(eff, reverse=True)
    assert curve.steps == 0 and curve.points[0].efficiency_mc is None
    # cv 5 %, 16,384 GPUs: the step is 1 + 0.05·3.971 of a GPU's mean.
    assert efficiency_curve([16384], cv=0.05, monte_carlo=False).points[0].efficiency == pytest.approx(
        1 / (1 + 0.05 * 3.971), rel=1e-4
    )


def test_empirical_expectation_is_exact_on_small_supports():
    # max of two draws from {1, 2}: 1 only if both are 1.
    assert efficiency_curve([2], sample=[1.0, 2.0], monte_carlo=False).points[0].expected_step == pytest.approx(1.75)
    # one point, slow with probability 1/2 at twice the time: the same law.
    curve = efficiency_curve([2], sample=[1.0], p_slow=0.5, slow_factor=2.0, monte_carlo=False)
    assert curve.points[0].expected_step == pytest.approx(1.75)
    assert curve.points[0].efficiency == pytest.approx(1.5 / 1.75)
    assert curve.points[0].p_any_slow == pytest.approx(0.75)


@pytest.mark.parametrize("kwargs", [dict(cv=0.05), dict(cv=0.05, p_slow=0.02, slow_factor=2.0)])
def test_order_statistic_draws_follow_the_naive_draws(kwargs):
    exact = efficiency_curve([64], monte_carlo=False, **kwargs).points[0].expected_step
    for method, seed in (("order", 1), ("naive", 2)):
        draws = sample_step_max(64, steps=20_000, seed=seed, method=method, **kwargs)
        standard_error = draws.std() / np.sqrt(draws.size)
        assert abs(draws.mean() - exact) < 4 * standard_error, method
    fast = sample_step_max(64, steps=20_000, seed=1, **kwargs)
    naive = sample_step_max(64, steps=20_000, seed=2, method="naive", **kwargs)
    np.testing.assert_allclose(np.quantile(fast, [0.1, 0.5, 0.9]), np.quantile(naive, [0.1, 0.5, 0.9]), rtol=1e-2)


def test_busy_times_leave_out_waiting_and_collectives():
    spans = [
        Span(job="j", rank=0, step=1, phase="forward", start=0.0, dur=1.0),
        Span(job="j", rank=0, step=1, phase="backward", start=1.0, dur=2.0),
        Span(job="j", rank=0, step=1, phase="barrier_wait", start=3.0, dur=5.0),
        Span(job="j", rank=0, step=1, phase="allreduce", start=8.0, dur=0.5),
        Span(job="j", rank=1, step=1, phase="forward", start=0.0, dur=1.5),
    ]
    assert sorted(busy_times_from_spans(spans)) == [1.5, 3.0]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(gpus=[0], cv=0.05), "gpus"),  # a job has GPUs
        (dict(gpus=[8], cv=0.0), "cv"),  # a normal needs a spread
        (dict(gpus=[8], cv=0.05, p_slow=1.5), "p_slow"),  # a probability
        (dict(gpus=[8], cv=0.05, slow_factor=-2.0), "slow_factor"),  # a time factor
        (dict(gpus=[8], cv=0.05, sample=[1.0, 2.0]), "cv"),  # one distribution, not two
        (dict(gpus=[8], sample=[]), "sample"),  # nothing measured
        (dict(gpus=[8], cv=0.05, steps=0), "steps"),  # Monte-Carlo needs steps
    ],
)
def test_bad_inputs_name_the_field(kwargs, field):
    gpus = kwargs.pop("gpus")
    with pytest.raises(ConfigError, match=f"^{field}:"):
        efficiency_curve(gpus, **kwargs)


def test_simulate_stragglers_cli_json():
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "stragglers",
            "--gpus",
            "8,64,1024",
            "--cv",
            "0.05",
            "--p-slow",
            "0.001",
            "--slow-factor",
            "2",
            "--steps",
            "5000",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    points = json.loads(result.output)["points"]
    assert [p["gpus"] for p in points] == [8, 64, 1024]
    for p in points:
        assert 0 < p["efficiency"] < 1 and p["efficiency_mc"] == pytest.approx(p["efficiency"], rel=1e-2)


def test_simulate_stragglers_cli_reads_a_sample(tmp_path):
    sample = tmp_path / "steps.txt"
    sample.write_text("0.041\n0.043\n\n0.042\n0.080\n")
    result = CliRunner().invoke(app, ["simulate", "stragglers", "--gpus", "8", "--sample", str(sample), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["distribution"] == "empirical" and doc["mean_step"] == pytest.approx(0.0515)
