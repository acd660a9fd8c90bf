"""Trace diff (analysis.trace_diff) against HTA 0.5.0's TraceDiff.compare_traces on HTA's own example traces.

"Equal" here means: the same names, and for each the same counts and total µs on both sides and the same
+/-/= category (tests/data/kineto/hta_diff_expected.json, written by benchmarks/hta_trace_diff_expected.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcwatch.analysis.trace_diff import TraceDiffError, iterations, trace_diff
from hpcwatch.cli.common import app
from hpcwatch.errors import ConfigError, InputError
from hpcwatch.sources.kineto import read_kineto

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

DATA = Path(__file__).resolve().parent.parent / "data" / "kineto"
EXPECTED = json.loads((DATA / "hta_diff_expected.json").read_text())["cases"]


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_equals_hta(case: str) -> None:
    want = EXPECTED[case]
    d = trace_diff(
        read_kineto(DATA / want["control"]),
        read_kineto(DATA / want["test"]),
        control_iterations=want["control_iterations"],
        test_iterations=want["test_iterations"],
        device=want["device"],
    )
    ours = {c.name: [c.control_counts, c.test_counts, c.control_total_us, c.test_total_us, c.change] for c in d.changes}
    assert ours == want["rows"]
    assert set(d.new) == {n for n, r in want["rows"].items() if r[0] == 0}
    assert set(d.gone) == {n for n, r in want["rows"].items() if r[1] == 0}


def test_shares_are_of_the_controls_step() -> None:
    d = trace_diff(
        read_kineto(DATA / "hta_diff_control_rank3.json.gz"), read_kineto(DATA / "hta_diff_test_rank3.json.gz")
    )
    step = next(c for c in d.changes if c.name == "ProfilerStep#1009")
    assert step.control_total_us == d.control.host_step_us  # the step annotation itself is one of HTA's rows
    assert step.share_of_step == pytest.approx(step.diff_us / d.control.host_step_us)
    kernel = next(c for c in d.changes if c.on_gpu and c.diff_us)
    assert d.control.gpu_step_us is not None
    assert kernel.share_of_step == pytest.approx(kernel.diff_us / d.control.gpu_step_us)
    assert [c.diff_us for c in d.changes] == sorted((c.diff_us for c in d.changes), reverse=True)


def test_two_step_ranges_of_one_trace() -> None:
    t = read_kineto(DATA / "hta_diff_base.json.gz")
    assert iterations(t) == [1009, 1010]
    same = trace_diff(t, t, control_iterations=[1009], test_iterations=[1009])
    assert all(c.diff_us == 0 and c.change == "=" for c in same.changes)
    with pytest.raises(TraceDiffError, match="no iteration 7"):
        trace_diff(t, t, control_iterations=[7])


def test_cli(tmp_path: Path) -> None:
    a, b = DATA / "hta_diff_base.json.gz", DATA / "hta_diff_test.json.gz"
    result = CliRunner().invoke(
        app, ["steps", str(a), "--compare", str(b), "--step", "1010", "--compare-step", "1010", "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    want = EXPECTED["base_vs_test_1010"]["rows"]
    assert {r["name"]: r["test_total_us"] for r in doc["changes"]} == {n: r[3] for n, r in want.items()}
    assert doc["control"]["iterations"] == [1010]
    human = CliRunner().invoke(app, ["steps", str(a), "--compare", str(a), "--step", "1009", "--compare-step", "1010"])
    assert human.exit_code == 0 and "Trace diff" in human.output
    bad = CliRunner().invoke(app, ["steps", str(a), "--compare", str(b), "--step", "x"])
    assert isinstance(bad.exception, ConfigError)
    missing = CliRunner().invoke(app, ["steps", str(a), "--compare", str(b), "--step", "5"])
    assert isinstance(missing.exception, InputError) and "no iteration 5" in str(missing.exception)
