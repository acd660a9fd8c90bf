"""CUPTI counters (analysis.counters) against HTA 0.5.0's get_cupti_counter_data_with_operators.

"Equal" here means: the same kernels in start order, each with the same top / bottom op, op stack and
counter values (tests/data/kineto/hta_counters_expected.json, written by benchmarks/hta_counters_expected.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcwatch.analysis.counters import SASS_FLOP_WEIGHTS, kernel_counters
from hpcwatch.cli.common import app
from hpcwatch.errors import InputError
from hpcwatch.sources.kineto import parse_kineto, read_kineto

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
DATA = Path(__file__).resolve().parent.parent / "data" / "kineto"
TRACE = DATA / "hta_cupti_counters.json.gz"


def test_equals_hta() -> None:
    want = json.loads((DATA / "hta_counters_expected.json").read_text())["rows"]
    report = kernel_counters(read_kineto(TRACE))
    assert report is not None and report.paired
    got = [
        [k.name, k.top_level_op, k.bottom_level_op, list(k.op_stack), {c: k.counters[c] for c in w["counters"]}]
        for k, w in zip(report.kernels, want)
    ]
    assert got == [[w["name"], w["top_level_op"], w["bottom_level_op"], w["op_stack"], w["counters"]] for w in want]
    assert len(report.kernels) == len(want) == 77


def test_flops_are_htas_weights() -> None:
    report = kernel_counters(read_kineto(TRACE))
    assert report is not None
    fft = report.kernels[5]
    assert "fft2d_r2c_32x32" in fft.name and fft.top_level_op == "aten::conv2d"
    assert fft.flops == sum(fft.counters[k] * w for k, w in SASS_FLOP_WEIGHTS.items())
    assert fft.flops == 86114304 + 2 * 61734912 + 25362432
    assert report.by_top_level_op[0].op == "aten::conv2d"
    assert sum(o.kernels for o in report.by_top_level_op) == 77


def _range(ts: float, **counters: object) -> dict:
    return {
        "ph": "X",
        "cat": "cuda_profiler_range",
        "name": "k",
        "pid": 0,
        "tid": 0,
        "ts": ts,
        "dur": 5,
        "args": counters,
    }


def test_unpaired_ranges_keep_their_counters() -> None:
    """Two ranges, one launch: HTA gives up; we keep the counters and say the ops are unknown."""
    doc = {
        "traceEvents": [
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": 0,
                "dur": 2,
                "args": {},
            },
            _range(10, a=1, flag=True, text="x"),
            _range(20, a=2.5),
        ]
    }
    report = kernel_counters(parse_kineto(doc))
    assert report is not None and not report.paired
    assert [k.counters for k in report.kernels] == [{"a": 1.0}, {"a": 2.5}]  # booleans and text are not counters
    assert all(k.top_level_op == "" and k.flops is None for k in report.kernels)


def test_cli() -> None:
    result = CliRunner().invoke(app, ["steps", str(TRACE), "--counters", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert len(doc["kernels"]) == 77 and doc["paired"]
    human = CliRunner().invoke(app, ["steps", str(TRACE), "--counters"])
    assert human.exit_code == 0 and "aten::conv2d" in human.output
    none = CliRunner().invoke(app, ["steps", str(DATA / "hta_diff_base.json.gz"), "--counters"])
    assert isinstance(none.exception, InputError) and "no CUPTI counters" in str(none.exception)
