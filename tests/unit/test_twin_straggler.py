"""The straggler scenario: GPU 2 of node 1 is twice as slow in backward, and everyone waits for it."""

from __future__ import annotations

import numpy as np
import pytest

from hpcwatch.model import reference_cluster
from hpcwatch.records import PHASES
from hpcwatch.twin import Twin
from hpcwatch.twin.core import DCGM_FIELDS, SPAN_ORDER

BACKWARD, BARRIER = PHASES.index("backward"), PHASES.index("barrier_wait")


def _tables(scenarios: tuple[str, ...], steps: range):
    twin = Twin(reference_cluster(), seed=7, scenarios=scenarios)
    job = twin.training_job
    ranks = twin.ranks(job)
    return ranks, [twin.step_phases(job, s)[1] for s in steps]


def test_seed_step_is_about_42_ms() -> None:
    _, tables = _tables((), range(50))
    steps = np.array([t.sum(axis=1).max() for t in tables])
    assert 0.040 <= steps.mean() <= 0.045


def test_straggler_doubles_one_backward_and_every_other_rank_waits_exactly_that_long() -> None:
    ranks, base = _tables((), range(40))
    _, slow = _tables(("straggler",), range(40))
    r_slow = next(r for r, node, gpu in ranks if node == "node1" and gpu == 2)
    growth, extra = [], []
    for b, s in zip(base, slow):
        assert s[r_slow, BACKWARD] == pytest.approx(2 * b[r_slow, BACKWARD], rel=1e-12)
        pre_b = b[:, : BACKWARD + 1].sum(axis=1)  # load + forward + backward: the work before the collective
        # The collective aligns on the straggler: it waits for nobody, the others wait for its whole lag.
        assert s[r_slow, BARRIER] == 0
        arrive = s[:, : BACKWARD + 1].sum(axis=1) + s[:, BARRIER]
        assert np.allclose(arrive, arrive[r_slow])
        for r in range(len(ranks)):
            if r == r_slow:
                continue
            # barrier_wait = (straggler's nominal arrival + its extra backward) - own arrival.
            assert s[r, BARRIER] == pytest.approx(pre_b[r_slow] + b[r_slow, BACKWARD] - pre_b[r], abs=1e-12)
            growth.append(s[r, BARRIER] - b[r, BARRIER])
        extra.append(b[r_slow, BACKWARD])
    # On average the others' barrier grows by the extra time, less the straggler's usual lead/lag (1 % jitter).
    assert np.mean(growth) == pytest.approx(np.mean(extra), rel=0.05)
    # And the others' barrier_wait itself is the straggler's extra backward time, within 1 %.
    waits = [s[r, BARRIER] for s in slow for r in range(len(ranks)) if r != r_slow]
    assert np.mean(waits) == pytest.approx(np.mean(extra), rel=0.01)


def test_spans_of_a_step_are_contiguous_per_rank_and_the_allreduce_ends_together() -> None:
    twin = Twin(reference_cluster(), seed=7, scenarios=["straggler"])
    twin.advance(10.0)
    spans = twin.spans()
    assert {s.phase for s in spans} == set(PHASES) and len({s.step for s in spans}) == 1
    by_rank: dict[int, list] = {}
    for s in spans:
        by_rank.setdefault(s.rank, []).append(s)
    ends = set()
    for rank_spans in by_rank.values():
        assert [s.phase for s in rank_spans] == list(SPAN_ORDER)
        for a, b in zip(rank_spans, rank_spans[1:]):
            assert b.start == pytest.approx(a.start + a.dur, abs=2e-6)
        allreduce = next(s for s in rank_spans if s.phase == "allreduce")
        ends.add(round(allreduce.start + allreduce.dur, 5))
    assert len(ends) == 1
    slow = next(s for s in spans if s.attrs == {"node": "node1", "gpu": 2} and s.phase == "backward")
    fast = next(s for s in spans if s.attrs == {"node": "node1", "gpu": 1} and s.phase == "backward")
    assert slow.dur == pytest.approx(2 * fast.dur, rel=0.05)


def test_waiting_ranks_show_less_tensor_activity_and_power_than_the_straggler() -> None:
    twin = Twin(reference_cluster(), seed=7, scenarios=["straggler"])
    twin.advance(10.0)
    g_slow, g_fast = twin.gpu_row("node1", 2), twin.gpu_row("node1", 1)
    tensor = twin.fields[:, DCGM_FIELDS.index("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")]
    power = twin.fields[:, DCGM_FIELDS.index("DCGM_FI_DEV_POWER_USAGE")]
    # The others spend a third of each step waiting: their tensor pipes idle and they draw less.
    assert tensor[g_fast] < 0.8 * tensor[g_slow]
    assert power[g_fast] < power[g_slow]


def test_kineto_traces_of_a_run_give_the_same_anatomy_as_the_spans(tmp_path) -> None:
    from hpcwatch.analysis.steps import anatomy_from_spans, anatomy_from_traces
    from hpcwatch.sources.kineto import read_kineto
    from hpcwatch.twin.run import write_run

    twin = Twin(reference_cluster(), seed=7, scenarios=["straggler"])
    write_run(twin, tmp_path / "run", duration_s=60.0, step_s=10.0, spans=True, traces_dir=tmp_path / "traces")
    traces = [read_kineto(p) for p in sorted((tmp_path / "traces").glob("rank-*.json"))]
    assert len(traces) == twin.training_job.gpus
    from_traces = anatomy_from_traces(traces)
    assert from_traces.world_size == 12 and len(from_traces.steps) == 6
    for rank_step in from_traces.rank_steps:
        waited = rank_step.phases["barrier_wait"]
        if rank_step.rank == 2:
            assert waited == pytest.approx(0.0, abs=1e-6)
        else:
            assert waited == pytest.approx(0.020, rel=0.1)  # the straggler's extra backward
    # The same steps as spans agree with the traces, phase by phase.
    import json

    from hpcwatch.records import Span

    spans = [
        Span(**{k: v for k, v in json.loads(line).items() if k != "kind"})
        for line in (tmp_path / "run" / "spans.jsonl").read_text().splitlines()
    ]
    from_spans = anatomy_from_spans(spans)
    a = {(r.rank, r.step): r.phases for r in from_traces.rank_steps}
    b = {(r.rank, r.step): r.phases for r in from_spans.rank_steps}
    assert a.keys() == b.keys()
    for key in a:
        for phase in ("load", "forward", "backward", "optimizer", "barrier_wait"):
            assert a[key][phase] == pytest.approx(b[key][phase], abs=2e-6), (key, phase)
