"""The per-rank reduce (analysis/reduce.py): the seam the one-process and the Dask paths of ``steps`` share.

Every check compares whole ``steps --json`` documents: a reduction that lost or changed a value shows there.
Real traces: HTA's 2 ranks of a 128-rank NCCL job, our real 4-rank gloo run, an H200 and an MI250 trace.
"""

from __future__ import annotations

import warnings

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hpcwatch.analysis.reduce import (
    from_table,
    read_parquet,
    reduce_trace,
    table_of_ipc,
    to_ipc,
    to_table,
    write_parquet,
)
from hpcwatch.errors import ParseError
from hpcwatch.reports.steps import reduced_report, steps_document
from hpcwatch.sources.kineto import parse_kineto, read_kineto
from hpcwatch.twin.exposition import GpuTraceConfig, gpu_kineto_traces, with_kernels_per_step, write_gpu_kineto_traces

SETS = {
    "hta_sampled_2ranks": ["hta_sampled_2ranks/rank-0.json.gz", "hta_sampled_2ranks/rank-1.json.gz"],
    "gloo_straggler": [f"gloo_straggler/rank-{r}.json.gz" for r in range(4)],
    "h200_annotated_steps": ["h200_annotated_steps.json.gz"],
    "hta_mi250_rocm": ["hta_mi250_rocm.json.gz"],
}


def _traces(data_dir, name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [read_kineto(data_dir / "kineto" / f) for f in SETS[name]]


def _doc(reductions) -> dict:
    report, clock, per_rank = reduced_report(reductions)
    return steps_document(
        report, breakdowns=[r.breakdown for r in reductions if r.breakdown is not None], clock=clock, per_rank=per_rank
    )


@pytest.mark.parametrize("name", sorted(SETS))
def test_a_reduction_survives_arrow_and_parquet_unchanged(data_dir, name, tmp_path):
    reductions = [reduce_trace(t) for t in _traces(data_dir, name)]
    shipped = from_table(table_of_ipc(to_ipc([r]) for r in reductions))  # as Dask workers send them
    write_parquet(to_table(reductions), tmp_path / "reduced.parquet")
    kept = read_parquet(tmp_path / "reduced.parquet")
    assert _doc(shipped) == _doc(reductions) == _doc(kept)
    assert [r.rank for r in kept] == [r.rank for r in reductions]


def test_a_reduced_rank_is_small_beside_its_trace(data_dir):
    (trace,) = _traces(data_dir, "h200_annotated_steps")
    size = (data_dir / "kineto" / SETS["h200_annotated_steps"][0]).stat().st_size
    assert len(to_ipc([reduce_trace(trace)])) < size / 10


@pytest.mark.parametrize(
    "make, says",
    [
        # Parquet of another producer: no hpcwatch.reduced version in its metadata
        (lambda p: pq.write_table(pa.table({"rank": [0]}), p), "not a reduced trace table of version 2 (found none)"),
        # a newer version of ours: refused, not misread
        (lambda p: pq.write_table(to_table([]).replace_schema_metadata({"hpcwatch.reduced": "9"}), p), "(found 9)"),
        # not Parquet at all
        (lambda p: p.write_text('{"traceEvents": []}'), "not a Parquet file"),
    ],
)
def test_a_file_that_is_not_a_reduced_table_is_one_parse_error(tmp_path, make, says):
    path = tmp_path / "reduced.parquet"
    make(path)
    with pytest.raises(ParseError, match=r"reduced\.parquet: ") as err:
        read_parquet(path)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_the_streamed_twin_writer_writes_the_documents_of_the_in_memory_one(tmp_path):
    cfg = with_kernels_per_step(GpuTraceConfig(slow_rank=1, slow_backward_factor=2.0, seed=3), 7)
    nodes = {r: f"node{r // 2 + 1}" for r in range(4)}
    docs = gpu_kineto_traces(cfg, steps=[1, 2, 3], world_size=4, nodes_of_rank=nodes, base_s=1_700_000_000)
    assert (
        write_gpu_kineto_traces(tmp_path, cfg, steps=[1, 2, 3], world_size=4, nodes_of_rank=nodes, base_s=1_700_000_000)
        == 4
    )
    for r, doc in docs.items():
        assert orjson.loads((tmp_path / f"rank-{r}.json").read_bytes()) == doc


def test_fewer_kernels_a_step_keep_the_step_s_gpu_time_per_phase():
    base = GpuTraceConfig()
    small = with_kernels_per_step(base, 28)
    assert small.kernels == (8, 16, 4)
    for n, us, n2, us2 in zip(base.kernels, base.kernel_us, small.kernels, small.kernel_us):
        assert n * us == pytest.approx(n2 * us2)


def test_a_twin_rank_set_numbers_gpus_per_node_and_names_the_slow_rank(tmp_path):
    cfg = with_kernels_per_step(GpuTraceConfig(slow_rank=11, slow_backward_factor=1.5), 14)
    write_gpu_kineto_traces(
        tmp_path,
        cfg,
        steps=list(range(1, 6)),
        world_size=16,
        nodes_of_rank={r: f"node{r // 8 + 1}" for r in range(16)},
        gpus_per_node=8,
    )
    doc = _doc(
        [
            reduce_trace(parse_kineto((tmp_path / f"rank-{r}.json").read_bytes(), path=f"rank-{r}.json"))
            for r in range(16)
        ]
    )
    (s,) = doc["stragglers"]
    assert (s["rank"], s["node"], s["gpu"]) == (11, "node2", 3)


def test_twin_traces_writes_a_set_steps_reads_with_its_straggler(run_cli, tmp_path):
    code, out, err = run_cli(
        ["twin", "traces", "--out", str(tmp_path), "--ranks", "24", "--steps", "4", "--slow-rank", "13", "--json"]
    )
    assert code == 0, err
    summary = orjson.loads(out)
    assert summary["files"] == 24 == len(list(tmp_path.glob("rank-*.json")))
    assert summary["bytes"] == sum(p.stat().st_size for p in tmp_path.glob("rank-*.json"))
    code, out, err = run_cli(["steps", str(tmp_path), "--json"])
    doc = orjson.loads(out)
    assert doc["world_size"] == 24 and len(doc["steps"]) == 4
    assert [(s["rank"], s["node"], s["gpu"]) for s in doc["stragglers"]] == [(13, "node2", 5)]


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--ranks", "0"], "--ranks, --steps and --gpus-per-node must be >= 1"),  # an empty job
        (["--ranks", "8", "--slow-rank", "8"], "--slow-rank must be a rank in 0..7"),  # a rank the job lacks
        (["--kernels", "2"], "kernels per step must be >= 3"),  # a phase without a kernel
    ],
)
def test_twin_traces_refuses_a_set_it_cannot_write(run_cli, tmp_path, argv, says):
    code, _, err = run_cli(["twin", "traces", "--out", str(tmp_path), *argv])
    assert code == 2 and says in err


@pytest.mark.parametrize(
    "name, slow_rank",
    [
        ("hta_sampled_2ranks", None),  # HTA's 2 ranks: no straggler, a what-if near 1
        ("gloo_straggler", 2),  # our real gloo run, rank 2 slowed: it explains the slowdown
    ],
)
def test_the_what_if_runs_on_the_reduced_tables_and_names_the_straggler(data_dir, name, slow_rank, tmp_path):
    reductions = [reduce_trace(t) for t in _traces(data_dir, name)]
    write_parquet(to_table(reductions), tmp_path / "reduced.parquet")
    doc = _doc(read_parquet(tmp_path / "reduced.parquet"))
    whatif = doc["whatif"]
    assert whatif == _doc(reductions)["whatif"] and whatif["dp_size"] == len(SETS[name])
    # The replay against the set's measured steps (not against its own timeline): within the 25 % it must fit.
    measured = [s["time_s"] for s in doc["steps"] if s["step"] in whatif["steps"]]
    assert whatif["replay_ratio"] == pytest.approx(sum(measured) / sum(whatif["step_time_replay_s"]))
    assert whatif["fits"] and 0.75 < whatif["replay_ratio"] < 1.25
    if slow_rank is None:
        assert whatif["slowdown"] < 1.1
    else:
        assert whatif["slowdown"] > 2 and next(iter(whatif["by_dp_rank"])) == str(slow_rank)


def test_the_twin_s_slow_rank_leads_the_what_if(tmp_path):
    cfg = with_kernels_per_step(GpuTraceConfig(slow_rank=5, slow_backward_factor=2.0), 14)
    write_gpu_kineto_traces(
        tmp_path,
        cfg,
        steps=list(range(1, 5)),
        world_size=8,
        nodes_of_rank={r: f"node{r // 4 + 1}" for r in range(8)},
        gpus_per_node=4,
    )
    whatif = _doc(
        [
            reduce_trace(parse_kineto((tmp_path / f"rank-{r}.json").read_bytes(), path=f"rank-{r}.json"))
            for r in range(8)
        ]
    )["whatif"]
    # The model's ratio: the twin's host waits in ``load`` for the GPU queue (32 ms in steps 3-4), which the
    # phases laid end to end add to the GPU's, so the replay misses the measured step and gives no S.
    assert whatif["model_slowdown"] > 1.05 and next(iter(whatif["by_dp_rank"])) == "5"


def test_steps_on_reduced_tables_gives_the_json_of_the_traces(run_cli, data_dir, tmp_path):
    folder = data_dir / "kineto" / "gloo_straggler"
    code, from_traces, err = run_cli(["steps", str(folder), "--json", "--reduced", str(tmp_path / "set.parquet")])
    assert code == 0, err
    code, from_tables, err = run_cli(["steps", str(tmp_path / "set.parquet"), "--json"])
    assert code == 0, err
    assert from_tables == from_traces and orjson.loads(from_tables)["whatif"] is not None
    code, _, err = run_cli(["steps", str(tmp_path / "set.parquet"), "--dask", "local"])
    assert code == 2 and "already reduced" in err
