"""What-if slowdown: the ByteDance artifact's own trace and results, and our Spans as a data-parallel job."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from hpcwatch.analysis.whatif import spans_to_ops, whatif_ops, whatif_spans
from hpcwatch.cli.common import app
from hpcwatch.errors import InputError, ParseError
from hpcwatch.records import Span
from hpcwatch.sources.optrace import OP_TRACE_COLUMNS, read_optrace

DATA = Path(__file__).parent.parent / "data" / "bytedance"
TRACE = DATA / "trace-ST.parquet"


@pytest.fixture(scope="module")
def st_result():
    return whatif_ops(read_optrace(TRACE))


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads((DATA / "result-ST.json").read_text())


def test_reader_returns_the_documented_columns():
    table = read_optrace(TRACE)
    assert table.column_names == list(OP_TRACE_COLUMNS)
    assert table.num_rows == 6784
    assert table.schema.field("optype").type == pa.string()


def test_slowdown_matches_the_artifacts_blocking_slowdown(st_result, reference):
    assert st_result.slowdown == pytest.approx(reference["blocking_slowdown"], rel=0.05)
    # The replay follows the artifact closely, not just within the 5 % asked for.
    assert st_result.slowdown == pytest.approx(1.1787, abs=1e-3)


def test_step_times_match_the_artifact_per_step(st_result, reference):
    steps = [str(s) for s in st_result.steps]
    assert steps == list(reference["step_t_base"])
    for key, ours in (
        ("step_t_base", st_result.step_time_actual_s),
        ("step_t_nodelay", st_result.step_time_replay_s),
        ("step_t_noblk", st_result.step_time_ideal_s),
    ):
        np.testing.assert_allclose(ours, [reference[key][s] for s in steps], rtol=1e-3, err_msg=key)
    assert st_result.replay_ratio == pytest.approx(reference["launch_slowdown"], rel=1e-3)


def test_slowdown_by_optype_dp_rank_and_stage_match_the_artifact(st_result, reference):
    expected = reference["blocking_decompose_by_optype"]
    assert set(st_result.by_optype) == set(expected)
    for name, value in expected.items():
        assert st_result.by_optype[name] == pytest.approx(value, rel=1e-3), name
    assert list(st_result.by_optype)[:2] == ["forward-compute", "backward-compute"]
    for ours, key in (
        (st_result.by_dp_rank, "blocking_decompose_by_dp_rank"),
        (st_result.by_stage, "blocking_decompose_by_stage"),
    ):
        assert {str(k): pytest.approx(v, rel=1e-3) for k, v in ours.items()} == reference[key]


def test_last_stage_and_slowest_worker_shares_match_ms_and_mw():
    ms = json.loads((DATA / "ms-ST.json").read_text())
    mw = json.loads((DATA / "mw-ST.json").read_text())
    result = whatif_ops(read_optrace(TRACE))
    assert result.last_stage.removed == pytest.approx(ms["Ms"], rel=1e-3)
    assert result.last_stage.added == pytest.approx(ms["add"], rel=1e-3)
    assert result.top_workers.workers == ((1, 3),)  # rank 7: last stage of the second replica
    assert result.top_workers.removed == pytest.approx(mw["Mw"], rel=1e-2)
    assert result.top_workers.added == pytest.approx(mw["add"], rel=1e-3)
    assert result.by_worker[0].rank == 7 and {w.stage for w in result.by_worker[:2]} == {3}


def test_a_missing_operation_is_named():
    table = read_optrace(TRACE)
    mask = np.ones(table.num_rows, bool)
    mask[5] = False
    with pytest.raises(InputError, match="appears 0 times in step"):
        whatif_ops(table.filter(pa.array(mask)))


@pytest.mark.parametrize(
    "mutate, message",
    [
        # the artifact's time column renamed away: the reader must say which column is missing
        (lambda t: t.drop_columns(["duration"]), "missing column"),
        # a negative duration cannot come from a profiler
        (
            lambda t: t.set_column(
                t.column_names.index("duration"),
                "duration",
                pa.array(np.r_[-1.0, t["duration"].to_numpy()[1:]].astype(np.float32)),
            ),
            "duration",
        ),
    ],
)
def test_reader_rejects_bad_traces(tmp_path, mutate, message):
    bad = tmp_path / "bad.parquet"
    pq.write_table(mutate(pq.read_table(TRACE)), bad)
    with pytest.raises(ParseError, match=message) as err:
        read_optrace(bad)
    assert str(bad) in str(err.value)


def test_reader_rejects_a_file_that_is_not_parquet(tmp_path):
    bad = tmp_path / "trace.parquet"
    bad.write_text("dp_rank,stage\n0,0\n")
    with pytest.raises(ParseError, match="Parquet"):
        read_optrace(bad)


# ---------------------------------------------------------------------------------------------
# Our Spans: a pure data-parallel job

FWD_S, BWD_S, AR_S, OPT_S = 1.0, 2.0, 0.5, 0.2


def _dp_spans(*, slow_rank: int, slow_backward_s: float, with_barrier: bool, ranks: int = 4, steps: int = 5):
    spans = []
    for step in range(steps):
        t0 = 100.0 * step
        ends = {r: t0 + FWD_S + (slow_backward_s if r == slow_rank else BWD_S) for r in range(ranks)}
        last = max(ends.values())
        for r in range(ranks):
            spans.append(Span(job="j", rank=r, step=step, phase="forward", start=t0, dur=FWD_S))
            spans.append(Span(job="j", rank=r, step=step, phase="backward", start=t0 + FWD_S, dur=ends[r] - t0 - FWD_S))
            if with_barrier:
                spans.append(Span(job="j", rank=r, step=step, phase="barrier_wait", start=ends[r], dur=last - ends[r]))
                spans.append(Span(job="j", rank=r, step=step, phase="allreduce", start=last, dur=AR_S))
            else:
                spans.append(
                    Span(job="j", rank=r, step=step, phase="allreduce", start=ends[r], dur=last + AR_S - ends[r])
                )
            spans.append(Span(job="j", rank=r, step=step, phase="optimizer", start=last + AR_S, dur=OPT_S))
    return spans


@pytest.mark.parametrize("with_barrier", [True, False])
def test_spans_slowdown_of_one_slow_backward(with_barrier):
    result = whatif_spans(_dp_spans(slow_rank=2, slow_backward_s=4.0, with_barrier=with_barrier))
    actual = FWD_S + 4.0 + AR_S + OPT_S
    ideal = FWD_S + (3 * BWD_S + 4.0) / 4 + AR_S + OPT_S  # backward at its mean over ranks
    assert result.slowdown == pytest.approx(actual / ideal)
    assert result.step_time_actual_s == pytest.approx((actual,) * 5)
    assert result.replay_ratio == pytest.approx(1.0)
    assert result.by_worker[0].rank == 2
    assert result.by_optype["backward"] == pytest.approx(result.slowdown)
    assert result.by_optype["forward"] == pytest.approx(1.0)
    assert result.pp_size == 1 and result.last_stage is None


def test_spans_without_stragglers_have_no_slowdown():
    result = whatif_spans(_dp_spans(slow_rank=-1, slow_backward_s=BWD_S, with_barrier=True))
    assert result.slowdown == pytest.approx(1.0)


def test_spans_to_ops_drops_waiting_and_numbers_repeats():
    ops = spans_to_ops(_dp_spans(slow_rank=1, slow_backward_s=3.0, with_barrier=True, ranks=2, steps=1))
    assert "barrier_wait" not in set(ops["optype"])
    assert len(ops["step"]) == 2 * 4
    assert set(ops["seq_id"]) == {0}


def test_whatif_cli_json():
    result = CliRunner().invoke(app, ["whatif", str(TRACE), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["slowdown"] == pytest.approx(1.1787, abs=1e-3)
    assert doc["by_stage"]["3"] > doc["by_stage"]["0"]


def _with_tp(table: pa.Table, *, slow_tp_stage: int | None = None, factor: float = 1.0) -> pa.Table:
    """The ST trace as if every worker had two tensor-parallel ranks; one rank may be slower."""
    copies = []
    for tp in (0, 1):
        dur = table["dur_s"].to_numpy().copy()
        if tp == 1 and slow_tp_stage is not None:
            hit = (
                (table["stage"].to_numpy() == slow_tp_stage)
                & (table["dp_rank"].to_numpy() == 0)
                & (table["optype"].to_numpy(zero_copy_only=False) == "backward-compute")
            )
            dur[hit] *= factor
        copies.append(
            table.set_column(table.column_names.index("dur_s"), "dur_s", pa.array(dur)).append_column(
                "tp_rank", pa.array(np.full(table.num_rows, tp, np.int32))
            )
        )
    return pa.concat_tables(copies)


def test_identical_tensor_parallel_ranks_change_nothing(st_result):
    result = whatif_ops(_with_tp(read_optrace(TRACE)))
    assert result.slowdown == pytest.approx(st_result.slowdown, rel=1e-9)


def test_a_slow_tensor_parallel_rank_slows_its_whole_worker(st_result):
    result = whatif_ops(_with_tp(read_optrace(TRACE), slow_tp_stage=1, factor=3.0))
    # Tripled durations at the trace's own start times: the model's step (not the trace's) grows.
    assert result.model_slowdown > st_result.slowdown + 0.2
    assert (result.by_worker[0].dp_rank, result.by_worker[0].stage) == (0, 1)


def test_a_step_not_every_rank_finished_is_left_out():
    spans = _dp_spans(slow_rank=2, slow_backward_s=4.0, with_barrier=True)
    partial = [Span(job="j", rank=0, step=99, phase="forward", start=9900.0, dur=FWD_S)]
    result = whatif_spans(spans + partial)
    assert 99 not in result.steps and len(result.steps) == 5


def test_a_pipeline_send_without_its_receive_is_refused():
    table = read_optrace(TRACE)
    lost = pc.and_(pc.equal(table["optype"], "forward-recv"), pc.equal(table["stage"], 2))
    with pytest.raises(InputError, match="stage 1 sends 4 forward activations but stage 2 receives 0"):
        whatif_ops(table.filter(pc.invert(lost)))


def test_whatif_cli_reads_a_jobs_spans_from_the_store(tmp_path):
    from hpcwatch.store import Store

    db = tmp_path / "hpcwatch.duckdb"
    with Store(db) as store:
        store.add(_dp_spans(slow_rank=2, slow_backward_s=4.0, with_barrier=True))
    result = CliRunner().invoke(app, ["whatif", "--job", "j", "--db", str(db), "--json"])
    assert result.exit_code == 0, result.output
    ideal = FWD_S + (3 * BWD_S + 4.0) / 4 + AR_S + OPT_S
    assert json.loads(result.output)["slowdown"] == pytest.approx((FWD_S + 4.0 + AR_S + OPT_S) / ideal)
    busy = CliRunner().invoke(
        app, ["simulate", "stragglers", "--gpus", "8,64", "--job", "j", "--db", str(db), "--json"]
    )
    assert busy.exit_code == 0, busy.output
    assert json.loads(busy.output)["distribution"] == "empirical"
