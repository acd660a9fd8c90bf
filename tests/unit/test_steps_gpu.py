"""Step anatomy on the GPU's clock: real traces whose GPU lags the host, GPU phases, the twin with a GPU."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from hpcwatch.analysis.steps import anatomy_from_traces
from hpcwatch.errors import ConfigError
from hpcwatch.reports.steps import trace_report
from hpcwatch.sources.kineto import parse_kineto, read_kineto
from hpcwatch.twin.exposition import GpuTraceConfig, gpu_kineto_traces

KINETO = Path(__file__).resolve().parents[1] / "data" / "kineto"


def _read(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return read_kineto(KINETO / name)


def _twin(cfg: GpuTraceConfig, steps=range(10, 16), world: int = 8):
    docs = gpu_kineto_traces(cfg, steps=list(steps), world_size=world)
    return [parse_kineto(d, path=f"rank-{r}.json") for r, d in docs.items()]


def test_step_time_of_a_gpu_that_lags_its_host_is_the_gpu_period_not_the_span_of_each_steps_work():
    # HTA's negative_queue_length trace: host steps of 0.216 s, each step's GPU work spans ~0.375 s
    # because it ends ~0.16 s after the host moved on (the next step's work overlaps it).
    report, clock, _ = trace_report([_read("hta_gpu_lags_host_rank0.json.gz")])
    assert report.step_time_s == pytest.approx(0.2156, abs=0.002)
    assert all(t < 0.23 for t in report.step_times_s)
    assert clock.host_step_s == pytest.approx(0.2161, abs=0.001)
    assert clock.gpu_lag_s == pytest.approx(0.161, abs=0.005)
    assert clock.bound == "gpu" and 0.6 < clock.queue_depth_steps < 0.9


def test_gpu_busy_plus_idle_of_each_step_is_its_gpu_period_on_a_gpu_that_lags_its_host():
    # Busy and idle used to be taken over the span of the kernels each step launched (0.368-0.375 s),
    # which overlaps the next step: busy + idle was 0.371 s per step while the period is 0.216 s.
    report, _clock, _ = trace_report([_read("hta_gpu_lags_host_rank0.json.gz")])
    for rs in report.anatomy.rank_steps:
        assert rs.gpu_busy_s + rs.gpu_idle_s == pytest.approx(rs.gpu_period_s, abs=1e-12)
        assert rs.gpu_period_s < 0.23 and 0 <= rs.gpu_idle_s <= rs.gpu_period_s


def test_a_launch_bound_trace_keeps_its_host_step(data_dir):
    _report, clock, _ = trace_report(
        [_read("hta_sampled_2ranks/rank-0.json.gz"), _read("hta_sampled_2ranks/rank-1.json.gz")]
    )
    assert clock.bound == "launch"
    assert clock.gpu_step_s == pytest.approx(clock.host_step_s, rel=0.02)


def test_gpu_phases_come_from_the_kernels_each_host_range_launched():
    # Kineto's gpu_user_annotation "backward" is 1 µs on this H200 trace: autograd launches the backward
    # kernels from its own thread. Mapped by correlation id, they fill most of the GPU's step.
    anatomy = anatomy_from_traces([_read("h200_annotated_steps.json.gz")])
    for rs in anatomy.rank_steps:
        assert rs.gpu_phases["backward"] > 0.06
        assert rs.gpu_phases["forward"] == pytest.approx(0.037, abs=0.002)
        assert sum(rs.gpu_phases.values()) <= rs.gpu_compute_s + 1e-9


def test_reader_keeps_the_group_size_of_nccl_kernels():
    trace = _read("hta_a100_nccl_rank0.json.gz")
    ev = trace.events
    sized = ev["group_size"][ev["coll_id"] >= 0]
    assert len(sized) == 48 and set(sized.tolist()) == {1, 2}  # the job's 2-rank group, and c10d's 1-rank ones
    assert (ev["group_size"][ev["coll_id"] < 0] == -1).all()


def test_twin_gpu_runs_behind_its_host_by_about_the_queue_depth():
    depth = {}
    for q in (1, 2, 3):
        _, clock, _ = trace_report(_twin(GpuTraceConfig(queue_depth=q), steps=range(1, 9)))
        depth[q] = clock.queue_depth_steps
        assert clock.bound == "gpu"
    assert depth[1] < depth[2] < depth[3]
    assert depth[2] == pytest.approx(1.8, abs=0.3)


def test_twin_gpu_traces_have_kernels_streams_correlations_and_flows():
    docs = gpu_kineto_traces(GpuTraceConfig(), steps=[1, 2], world_size=2)
    flows = [e for e in docs[0]["traceEvents"] if e["ph"] in ("s", "f")]
    trace = _twin(GpuTraceConfig(), steps=[1, 2], world=2)[0]
    ev = trace.events
    kernels = ev["stream"] >= 0
    assert set(np.unique(ev["stream"][kernels]).tolist()) == {7, 20}
    assert (ev["correlation"][kernels] >= 0).all()
    launches = trace.names.index("cudaLaunchKernel")
    assert (ev["name_id"] == launches).sum() == 2 * (40 + 80 + 20 + 1)
    assert len(flows) == 2 * kernels.sum()  # an ac2g pair a kernel, its id the kernel's correlation
    corr = set(ev["correlation"][kernels].tolist())
    assert {e["id"] for e in flows} == corr and all(e["cat"] == "ac2g" for e in flows)
    nccl = ev["comm"] & kernels
    assert (ev["group_size"][nccl] == 2).all() and np.isfinite(ev["msg_bytes"][nccl]).all()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"queue_depth": 0},  # the host never runs ahead: no GPU queue at all
        {"slow_backward_factor": 0.0},  # a GPU that takes no time
        {"jitter": -0.1},  # a negative spread
    ],
)
def test_gpu_trace_config_rejects_bad_values(kwargs):
    with pytest.raises(ConfigError):
        GpuTraceConfig(**kwargs)


def test_a_kernel_launched_where_two_steps_overlap_counts_in_both():
    # ProfilerStep#1 [0, 100) and #2 [50, 150) overlap: the launch at 60 is in both host ranges,
    # the launch at 120 only in step 2's, so step 1 has one 10 µs kernel and step 2 both (20 µs)
    def x(cat, name, ts, dur, **args):
        return {
            "ph": "X",
            "cat": cat,
            "name": name,
            "ts": ts,
            "dur": dur,
            "pid": 0 if "stream" in args else 1,
            "tid": 7 if "stream" in args else 1,
            "args": args,
        }

    events = [
        x("user_annotation", "ProfilerStep#1", 0, 100),
        x("user_annotation", "ProfilerStep#2", 50, 100),
        x("cuda_runtime", "cudaLaunchKernel", 60, 2, correlation=1),
        x("cuda_runtime", "cudaLaunchKernel", 120, 2, correlation=2),
        x("kernel", "gemm_a", 200, 10, stream=7, correlation=1),
        x("kernel", "gemm_b", 220, 10, stream=7, correlation=2),
    ]
    trace = parse_kineto({"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events})
    from hpcwatch.analysis.steps import rank_timeline

    cells = {c.step: c.gpu for c in rank_timeline(trace).cells}
    assert (cells[1].busy_s, cells[1].first_us, cells[1].last_us) == (10e-6, 200.0, 210.0)
    assert (cells[2].busy_s, cells[2].idle_s, cells[2].compute_s) == (20e-6, 10e-6, 20e-6)
