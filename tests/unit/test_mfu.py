"""MFU against the run measured on a real H200 (tests/data/h200)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcwatch.analysis.mfu import compute_mfu
from hpcwatch.cli.common import app
from hpcwatch.errors import ConfigError

DATA = Path(__file__).parent.parent / "data" / "h200"


@pytest.fixture(scope="module")
def run() -> dict:
    return json.loads((DATA / "results.json").read_text())["single_gpu"]


def _mfu_of(run: dict, **extra):
    c = run["config"]
    return compute_mfu(
        params=run["n_params_nonembedding"],
        layers=c["L"],
        d_model=c["d"],
        seq=c["T"],
        tokens_per_step=c["B"] * c["T"],
        step_time_s=run["step_s_median"],
        gpus=1,
        gpu="h200",
        **extra,
    )


def test_mfu_of_the_h200_run_is_40_4_percent(run):
    result = _mfu_of(run)
    assert round(result.mfu * 100, 1) == 40.4
    assert result.flops_per_token == run["flops_per_token"]
    assert result.achieved_flops == pytest.approx(run["achieved_tflops"] * 1e12, rel=1e-9)
    assert result.tokens_per_s == pytest.approx(run["tokens_per_s"], rel=1e-9)
    assert result.hfu is None


def test_hfu_counts_the_recomputed_forward(run):
    result = _mfu_of(run, recompute=True)
    assert result.hfu == pytest.approx(result.mfu * 4 / 3)


def test_mfu_of_the_h200_model_sweep():
    sweep = json.loads((DATA / "results_sweep_remanence.json").read_text())["mfu_sweep"]
    assert len(sweep) == 4
    for point in sweep:
        result = compute_mfu(
            params=point["params_nonemb"],
            layers=point["layers"],
            d_model=point["d"],
            seq=point["seq"],
            tokens_per_step=point["batch"] * point["seq"],
            step_time_s=point["step_s"],
            gpus=1,
            gpu="h200",
        )
        # The capture divided by 989 TFLOP/s; the catalog says 989.4.
        assert result.mfu == pytest.approx(point["mfu"], rel=1e-3), point["model"]
        assert result.achieved_flops == pytest.approx(point["tflops"] * 1e12, rel=1e-6), point["model"]
    assert [round(p["mfu"], 3) for p in sweep] == sorted(round(p["mfu"], 3) for p in sweep)


def test_gpus_share_the_step():
    one = compute_mfu(params=1e9, layers=24, d_model=2048, seq=2048, tokens_per_step=1e6, step_time_s=1.0, gpus=8)
    two = compute_mfu(params=1e9, layers=24, d_model=2048, seq=2048, tokens_per_step=1e6, step_time_s=1.0, gpus=16)
    assert two.mfu == pytest.approx(one.mfu / 2)
    assert one.gpu == "h100-sxm"


@pytest.mark.parametrize(
    "change, field",
    [
        ({"gpu": "tpu-v5"}, "gpu"),  # unknown device: no borrowed peak
        ({"step_time_s": 0.0}, "step_time_s"),  # a step takes time
        ({"gpus": 0}, "gpus"),  # nobody to do the work
        ({"params": -1.0}, "params"),  # a model has weights
    ],
)
def test_bad_inputs_name_the_field(change, field):
    kwargs = dict(params=1e9, layers=24, d_model=2048, seq=2048, tokens_per_step=1e6, step_time_s=1.0, gpus=8)
    kwargs.update(change)
    with pytest.raises(ConfigError, match=f"^{field}:"):
        compute_mfu(**kwargs)


def test_mfu_cli_json(run):
    c = run["config"]
    args = [
        "mfu",
        "--params",
        str(run["n_params_nonembedding"]),
        "--layers",
        str(c["L"]),
        "--d-model",
        str(c["d"]),
        "--seq",
        str(c["T"]),
        "--tokens-per-step",
        str(c["B"] * c["T"]),
        "--step-time",
        str(run["step_s_median"]),
        "--gpus",
        "1",
        "--gpu",
        "h200",
        "--json",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert set(doc) == {"mfu", "achieved_tflops", "flops_per_token"}
    assert round(doc["mfu"] * 100, 1) == 40.4
    assert doc["achieved_tflops"] == pytest.approx(399.58, abs=0.01)
    with_hfu = json.loads(CliRunner().invoke(app, [*args, "--recompute"]).output)
    assert with_hfu["hfu"] == pytest.approx(doc["mfu"] * 4 / 3)
