"""A straggler verdict needs enough ranks, steps and effect; otherwise the report says why there is none.

Real sets: HTA's 2 sampled ranks of a 128-rank NCCL job (2 steps), where rank 1 used to be named at
z = 0.25 for 0.35 % of the step; our gloo job (rank 2 sleeps 40 ms in backward), its Kineto traces and
its hook spans, whole and reduced to 2 ranks / 2 steps.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import orjson
import pytest

from hpcwatch.analysis.steps import anatomy_from_spans, anatomy_from_traces
from hpcwatch.analysis.stragglers import StragglerConfig, find_stragglers
from hpcwatch.errors import ConfigError
from hpcwatch.records import Span
from hpcwatch.sources.hook import read_hook_jsonl
from hpcwatch.sources.kineto import read_kineto

KINETO = Path(__file__).parent.parent / "data" / "kineto"


def _traces(folder: str, ranks=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        paths = sorted((KINETO / folder).glob("rank-*.json.gz"))
        return [read_kineto(p) for p in paths if ranks is None or int(p.name.split("-")[1].split(".")[0]) in ranks]


def _hook_spans(ranks=range(4), steps=range(6)) -> list[Span]:
    return [
        r
        for p in sorted((KINETO / "gloo_straggler" / "hook").glob("rank-*.jsonl"))
        for r in read_hook_jsonl(p)
        if isinstance(r, Span) and r.rank in ranks and r.step in steps
    ]


def test_two_of_128_ranks_name_no_straggler_and_say_why():
    report = find_stragglers(anatomy_from_traces(_traces("hta_sampled_2ranks")))
    assert report.stragglers == ()  # was rank 1, late arrival, z = 0.25, +2.2 ms on a 616 ms step
    assert report.no_verdict == "2 of 128 ranks seen: too few to name a straggler (at least 4)"


def test_two_ranks_have_no_robust_z_for_a_late_arrival_even_when_allowed():
    allowed = StragglerConfig(min_ranks=2, min_steps=2, min_impact=0.0)
    report = find_stragglers(anatomy_from_traces(_traces("hta_sampled_2ranks")), allowed)
    # Over two ranks every modified z is ±0.67: rank 1 reaching last in 70 % of the collectives is no outlier.
    assert report.stragglers == () and report.no_verdict is None


@pytest.mark.parametrize(
    "ranks, steps, says",
    [
        # Spans do not say the world size: the ranks they have are the job's.
        ((1, 2), (2, 3), "2 of 2 ranks seen: too few to name a straggler (at least 4)"),
        ((0, 1, 2, 3), (2, 3), "2 steps seen: too few to name a straggler (at least 3)"),
    ],
)
def test_the_real_straggler_reduced_to_too_few_ranks_or_steps_is_not_named(ranks, steps, says):
    report = find_stragglers(anatomy_from_spans(_hook_spans(ranks, steps)))
    assert report.stragglers == () and report.no_verdict == says


def test_the_planted_straggler_of_the_whole_sets_is_still_named():
    for anatomy in (anatomy_from_spans(_hook_spans()), anatomy_from_traces(_traces("gloo_straggler"))):
        report = find_stragglers(anatomy)
        assert [s.rank for s in report.stragglers] == [2] and report.no_verdict is None
        assert report.stragglers[0].impact > 0.4  # 38 ms more work on a ~74 ms step


def test_a_straggler_under_the_minimum_effect_is_not_named():
    anatomy = anatomy_from_traces(_traces("gloo_straggler"))
    (named,) = find_stragglers(anatomy).stragglers
    report = find_stragglers(anatomy, StragglerConfig(min_impact=0.6))
    assert report.stragglers == ()
    assert report.no_verdict == f"rank 2 costs {named.impact:.1%} of the step: under the 60% that names a straggler"


def test_steps_prints_and_writes_why_no_straggler_is_named(run_cli):
    folder = KINETO / "gloo_straggler"
    argv = ["steps", str(folder / "rank-0.json.gz"), str(folder / "rank-2.json.gz")]
    code, out, err = run_cli(argv)
    assert code == 0, err
    assert "no straggler: 2 of 4 ranks seen: too few to name a straggler" in " ".join(out.split())
    code, out, err = run_cli([*argv, "--json"])
    doc = orjson.loads(out)
    assert doc["stragglers"] == [] and doc["no_verdict"].startswith("2 of 4 ranks seen")
    code, out, err = run_cli(["steps", str(folder), "--json"])
    doc = orjson.loads(out)
    assert [s["rank"] for s in doc["stragglers"]] == [2] and doc["no_verdict"] is None
    assert doc["stragglers"][0]["impact"] > 0.4


@pytest.mark.parametrize("field, value", [("min_ranks", 1), ("min_steps", 0), ("min_impact", -0.1)])
def test_verdict_thresholds_are_checked(field, value):
    with pytest.raises(ConfigError, match=field):
        StragglerConfig(**{field: value})


def test_the_job_page_says_why_no_straggler_is_named(tmp_path):
    from hpcwatch.reports.jobpage import job_overview
    from hpcwatch.store import Store

    with Store(tmp_path / "store") as store:
        store.add(_hook_spans(steps=(2, 3)))
        steps = job_overview(store, "gloo-test").steps
    assert steps.straggler is None and steps.no_verdict.startswith("2 steps seen: too few")
