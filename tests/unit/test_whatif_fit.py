"""The what-if replay against the measured steps: S only from a model that fits, never S <= 1 as a speed-up.

Real sets: HTA's GPU-lags-host trace (the GPU's period is 2.7 times the phases' sum), our gloo job's hook
spans (host gaps between the phases the model does not know), the MI250 and H200 traces (one rank: S is 1
or a hair under), the ByteDance ST trial (fits, S as published).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from hpcwatch.analysis.whatif import FIT_TOLERANCE, whatif_anatomy, whatif_ops, whatif_spans
from hpcwatch.reports.steps import trace_report
from hpcwatch.sources.hook import read_hook_jsonl
from hpcwatch.sources.kineto import read_kineto
from hpcwatch.sources.optrace import read_optrace

DATA = Path(__file__).parent.parent / "data"


def _set(*names: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [read_kineto(DATA / "kineto" / n) for n in names]


def test_the_replay_is_compared_with_the_measured_steps_not_its_own_timeline():
    report, _, _ = trace_report(_set("hta_gpu_lags_host_rank0.json.gz"))
    w = report.whatif
    # The measured steps are the set's own step times (0.209-0.216 s on the GPU's clock)...
    assert w.step_time_actual_s == pytest.approx(report.step_times_s)
    # ...which the phases laid end to end (0.069-0.099 s) miss: it was 1.00 against the model's own timeline.
    assert w.replay_ratio == pytest.approx(2.68, abs=0.01)
    assert not w.fits and w.slowdown is None and w.model_slowdown > 1
    assert w.verdict.startswith("what-if: model does not fit: replay 0.07977 s vs measured 0.2139 s per step")


def test_a_set_that_fits_keeps_its_s(data_dir):
    report, _, _ = trace_report(_set(*(f"gloo_straggler/rank-{r}.json.gz" for r in range(4))))
    w = report.whatif
    assert w.fits and w.replay_ratio == pytest.approx(1.116, abs=0.01)  # measured 74 ms, replay 67 ms
    assert w.slowdown == w.model_slowdown > 2 and "what-if slowdown S = 5.15" in w.verdict


def test_hook_spans_with_gaps_between_phases_do_not_fit():
    spans = [
        r
        for f in sorted((DATA / "kineto" / "gloo_straggler" / "hook").glob("rank-*.jsonl"))
        for r in read_hook_jsonl(f)
        if hasattr(r, "phase")
    ]
    w = whatif_spans(spans)
    # Step 0 lasts 0.42 s on the ranks' clocks, its phases 0.17 s: S was 1.90 from a replay 35 % short.
    assert w.replay_ratio == pytest.approx(1.54, abs=0.01)
    assert not w.fits and w.slowdown is None and "model does not fit" in w.verdict


@pytest.mark.parametrize("trace", ["hta_mi250_rocm.json.gz", "h200_annotated_steps.json.gz"])
def test_s_of_one_or_under_is_no_speed_up(trace):
    report, _, _ = trace_report(_set(trace))
    w = report.whatif
    assert w.fits and w.slowdown <= 1.0  # one rank: typical is measured (MI250: 0.9999999999999998)
    assert w.verdict.startswith("what-if: no slowdown from stragglers") and "would take" not in w.verdict


def test_the_published_s_of_the_bytedance_trial_still_fits():
    w = whatif_ops(read_optrace(DATA / "bytedance" / "trace-ST.parquet"))
    reference = json.loads((DATA / "bytedance" / "result-ST.json").read_text())
    assert w.fits and abs(1 / w.replay_ratio - 1) < FIT_TOLERANCE
    assert w.slowdown == pytest.approx(reference["blocking_slowdown"], rel=1e-3)


@pytest.mark.parametrize(
    "trace, says",
    [
        ("hta_gpu_lags_host_rank0.json.gz", "model does not fit"),
        ("hta_mi250_rocm.json.gz", "no slowdown from stragglers"),
    ],
)
def test_steps_prints_and_writes_the_verdict(run_cli, trace, says):
    code, out, err = run_cli(["steps", str(DATA / "kineto" / trace)])
    assert code == 0, err
    assert says in " ".join(out.split()) and "1/S" not in out
    code, out, err = run_cli(["steps", str(DATA / "kineto" / trace), "--json"])
    doc = json.loads(out)["whatif"]
    assert says in doc["verdict"] and ("fits" in doc and "model_slowdown" in doc)


def test_the_anatomy_what_if_is_the_report_s(data_dir):
    report, _, _ = trace_report(_set("hta_gpu_lags_host_rank0.json.gz"))
    assert whatif_anatomy(report.anatomy) == report.whatif
