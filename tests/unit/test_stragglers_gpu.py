"""Stragglers on GPU evidence: a GPU-only slowdown the host cannot see, a balanced run, the JSON contract."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from hpcwatch.analysis.reduce import reduce_trace
from hpcwatch.analysis.steps import anatomy_from_traces
from hpcwatch.analysis.stragglers import (
    EVIDENCE_GPU_COMPUTE,
    EVIDENCE_HOST,
    EVIDENCE_LATE_ARRIVAL,
    WORK_PHASES,
    StragglerConfig,
    find_stragglers,
    modified_z,
)
from hpcwatch.errors import ConfigError
from hpcwatch.reports.steps import reduced_report, steps_document
from hpcwatch.sources.kineto import parse_kineto, read_kineto
from hpcwatch.twin.exposition import GpuTraceConfig, gpu_kineto_traces
from hpcwatch.twin.straggler import GPU_STRAGGLER_BACKWARD_FACTOR

KINETO = Path(__file__).resolve().parents[1] / "data" / "kineto"


def _twin(cfg: GpuTraceConfig, world: int = 8):
    docs = gpu_kineto_traces(cfg, steps=list(range(20, 28)), world_size=world)
    return [parse_kineto(d, path=f"rank-{r}.json") for r, d in docs.items()]


@pytest.fixture(scope="module")
def gpu_only():
    return anatomy_from_traces(_twin(GpuTraceConfig(slow_rank=5, slow_backward_factor=GPU_STRAGGLER_BACKWARD_FACTOR)))


def test_gpu_only_slowdown_of_8_percent_is_named_from_gpu_evidence(gpu_only):
    report = find_stragglers(gpu_only)
    assert [s.rank for s in report.stragglers] == [5]
    s = report.stragglers[0]
    assert s.evidence == (EVIDENCE_GPU_COMPUTE, EVIDENCE_LATE_ARRIVAL) and not s.host_only
    assert s.phase == "backward"
    step = float(np.median(gpu_only.matrix("step")))
    assert 0.06 < s.gpu_excess_s / step < 0.10
    assert s.last_fraction == 1.0
    # every other rank waits about the excess at the all-reduce: 7 ranks together
    assert s.others_lost_s == pytest.approx(7 * s.gpu_excess_s, rel=0.1)


def test_gpu_only_slowdown_leaves_the_host_timelines_alike(gpu_only):
    work = np.nanmedian(gpu_only.matrix("work"), axis=1)
    assert work.max() - work.min() < 0.002 * work.mean()
    host = find_stragglers(gpu_only).ranks
    assert max(r.score for r in host) - min(r.score for r in host) < 0.01  # host scores cannot tell
    assert min(r.gpu_score for r in host) < 0.95


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_balanced_8_rank_gpu_run_raises_nothing(seed):
    report = find_stragglers(anatomy_from_traces(_twin(GpuTraceConfig(seed=seed, jitter=0.02))))
    assert report.stragglers == ()


def test_cpu_only_traces_name_their_straggler_from_the_host_only():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traces = [read_kineto(p) for p in sorted((KINETO / "gloo_straggler").glob("rank-*.json.gz"))]
    (s,) = find_stragglers(anatomy_from_traces(traces)).stragglers
    assert s.rank == 2 and s.evidence == (EVIDENCE_HOST,) and not s.host_only


@pytest.mark.parametrize(("run", "planted_ms"), [("slow20ms", 20.0), ("slow5ms", 5.0)])
def test_a_gpu_only_spin_on_a_real_h200_is_named_from_gpu_evidence(run, planted_ms):
    """Four gloo ranks sharing one NVIDIA H200 (benchmarks/gpu_steps_capture.py, torch 2.11, CUDA 13.0), rank 2
    spinning ``planted_ms`` in its backward with one GPU kernel (``torch.cuda._sleep``): its host backward takes
    as long as the others', its GPU's does not."""
    traces = [read_kineto(p) for p in sorted((KINETO / "h200_gloo4_gpu_straggler" / run).glob("rank-*.json.gz"))]
    anatomy = anatomy_from_traces(traces)
    (s,) = find_stragglers(anatomy).stragglers
    assert s.rank == 2 and EVIDENCE_GPU_COMPUTE in s.evidence and not s.host_only and s.phase == "backward"
    assert s.gpu_excess_s == pytest.approx(planted_ms / 1000, rel=0.15)
    backward = np.nanmedian(anatomy.matrix("backward"), axis=1)
    assert backward[2] < 1.5 * np.median(backward)  # what the host saw: no straggler


def test_real_two_rank_nccl_set_raises_no_gpu_verdict():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traces = [read_kineto(KINETO / "hta_sampled_2ranks" / f"rank-{r}.json.gz") for r in (0, 1)]
    report = find_stragglers(anatomy_from_traces(traces))
    assert all(EVIDENCE_GPU_COMPUTE not in s.evidence for s in report.stragglers)


def test_steps_json_keeps_the_straggler_contract_and_adds_the_gpu_fields():
    traces = _twin(GpuTraceConfig(slow_rank=2, slow_backward_factor=GPU_STRAGGLER_BACKWARD_FACTOR), world=4)
    reductions = [reduce_trace(t) for t in traces]
    report, clock, per_rank = reduced_report(reductions)
    doc = steps_document(report, breakdowns=[r.breakdown for r in reductions], clock=clock, per_rank=per_rank)
    (s,) = doc["stragglers"]
    assert {"rank", "score", "evidence", "phase", "excess_s", "others_wait_s", "others_lost_s"} <= set(s)
    assert s["rank"] == 2 and s["evidence"] == ["gpu_compute", "late_arrival"]
    assert doc["clock"] == "gpu" and doc["gpu_clock"]["bound"] == "gpu"
    assert doc["steps"][0]["host_time_s"] is not None
    assert {g["rank"] for g in doc["gpu"]} == {0, 1, 2, 3}
    coll = doc["gpu"][2]["collectives"][0]
    assert coll["collective"] == "allreduce" and coll["group_size"] == 4


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_gpu_excess": -0.01},  # a negative excess would flag every rank
        {"min_last_fraction": 0.0},  # "last in none of the collectives" is no evidence
        {"min_last_fraction": 1.5},  # more than all of them
    ],
)
def test_straggler_config_rejects_bad_gpu_thresholds(kwargs):
    with pytest.raises(ConfigError):
        StragglerConfig(**kwargs)


def test_a_step_with_no_gpu_work_on_record_warns_nobody():
    """The real MI250 trace (HTA's tests) has a step whose GPU column is all NaN: its median is NaN by design,
    and numpy's "All-NaN slice" RuntimeWarning must not reach the user's terminal."""
    import subprocess
    import sys
    from pathlib import Path

    trace = Path(__file__).resolve().parents[1] / "data" / "kineto" / "hta_mi250_rocm.json.gz"
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", "hpcwatch", "steps", str(trace), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "RuntimeWarning" not in done.stderr and "All-NaN" not in done.stderr


def _ratio(best: float, mine: float) -> float:
    """A score as defined, one rank at a time: the best over this rank's, within [0, 1]; 1 when this rank's is
    not a positive number."""
    if not np.isfinite(mine) or mine <= 0:
        return 1.0
    return float(min(max(best / mine, 0.0), 1.0))


def _per_rank_definition(anatomy):
    """Each rank's score fields as the definition reads them: every reduction made for that rank alone."""
    cfg = StragglerConfig()
    work = anatomy.matrix("work")
    med_work = np.nanmedian(work, axis=1)
    out = []
    for i, rank in enumerate(anatomy.ranks):
        med_phase = {p: np.nanmedian(anatomy.matrix(p), axis=1) for p in WORK_PHASES}
        fields = {
            "rank": rank,
            "work_s": float(med_work[i]),
            "score": _ratio(float(np.nanmin(med_work)), float(med_work[i])),
            "individual_score": _ratio(float(np.nanmin(work[i])), float(med_work[i])),
            "phase_scores": {p: _ratio(float(np.nanmin(med_phase[p])), float(med_phase[p][i])) for p in WORK_PHASES},
            "z": float(np.nanmedian(modified_z(work, mad_floor=cfg.mad_floor, axis=0)[i])),
        }
        if anatomy.has_gpu:
            med_gpu = np.nanmedian(anatomy.matrix("gpu_compute_s"), axis=1)
            fields["gpu_score"] = _ratio(float(np.nanmin(med_gpu)), float(med_gpu[i]))
            fields["gpu_compute_s"] = float(med_gpu[i])
        out.append(fields)
    return out


@pytest.mark.parametrize("run", ["slow20ms", "slow5ms"])
def test_the_rank_scores_reduced_by_axis_are_the_per_rank_definition_on_the_real_h200_traces(run):
    anatomy = anatomy_from_traces(
        [read_kineto(p) for p in sorted((KINETO / "h200_gloo4_gpu_straggler" / run).iterdir())]
    )
    report = find_stragglers(anatomy)
    got = [
        {key: getattr(r, key) for key in ("rank", "work_s", "score", "individual_score", "phase_scores", "z")}
        | {"gpu_score": r.gpu_score, "gpu_compute_s": r.gpu_compute_s}
        for r in report.ranks
    ]
    assert got == _per_rank_definition(anatomy)
