"""A job's report joined from stretches of its samples equals the report of one pass over them
(``analysis.jobpartial``), to the last digit."""

from __future__ import annotations

import math
import pickle

import orjson
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcwatch import vocab
from hpcwatch.analysis.attribution import job_reports, partial_of, report_dict, reports_of
from hpcwatch.analysis.jobpartial import Acc, Cells, Partial, _fsum, exact_plus, exact_sums, median_gap_s
from hpcwatch.records import Job
from hpcwatch.store import SAMPLE_SCHEMA

DCGM = [
    vocab.DCGM_FI_DEV_GPU_UTIL,
    vocab.DCGM_FI_DEV_POWER_USAGE,
    vocab.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,
    vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    vocab.DCGM_FI_DEV_XID_ERRORS,
    vocab.DCGM_FI_PROF_GR_ENGINE_ACTIVE,
    vocab.DCGM_FI_DEV_FB_USED,
]
IB = [vocab.NODE_INFINIBAND_PORT_DATA_TRANSMITTED_BYTES_TOTAL, vocab.NODE_INFINIBAND_PORT_DATA_RECEIVED_BYTES_TOTAL]
OTHER = [vocab.LUSTRE_JOB_READ_BYTES_TOTAL, vocab.SLURM_JOB_ELAPSED_SECONDS, vocab.SLURM_JOB_MAX_RSS_BYTES]

JOBS = [
    Job(id="a", user="u", gpus=2, gpus_by_node={"n1": (0, 1)}, start=0.0, end=30.0, nodes=("n1",)),
    Job(id="b", user="v", gpus=2, gpus_by_node={"n1": (0, 1), "n2": (0,)}, start=30.0, end=None, nodes=("n1", "n2")),
]

#: Sample times: whole seconds and odd fractions (a scrape's jitter; gaps that round to the millisecond
#: either way), several rows at one time.
_TIMES = st.sampled_from([1.0, 2.0, 3.0005, 4.0, 9.25, 10.0, 17.0, 29.9995, 30.0, 31.0, 44.0015, 58.0, 60.0])
_DCGM_SERIES = st.tuples(
    st.sampled_from(DCGM),
    st.sampled_from(["n1", "n2", None]),
    st.sampled_from(["0", "1", None]),
    st.sampled_from(["a", "b", None]),
    st.sampled_from([None, "{}", '{"GPU_I_ID": "1", "GPU_I_PROFILE": "1g.10gb"}', '{"pod": "p", "namespace": "ml"}']),
)
_DCGM_VALUES = st.sampled_from([0.0, 1.0, 43.0, 79.0, 0.61, 563.127, 1e6 + 0.5, 2e6])
_IB_SERIES = st.tuples(
    st.sampled_from(IB),
    st.sampled_from(["n1", "n2", None]),
    st.just(None),
    st.just(None),
    st.sampled_from(['{"device": "mlx5_0"}', '{"device": "mlx5_1"}', '{"device": "mlx5_1", "instance": "n2:9100"}']),
)
_IB_VALUES = st.sampled_from([0.0, 1000.0, 3400.0, 2.5e9, 7e9])
_OTHER_SERIES = st.tuples(
    st.sampled_from(OTHER),
    st.sampled_from(["n1", None]),
    st.just(None),
    st.sampled_from(["a", "b", None]),
    st.sampled_from(['{"target": "fs-OST0000"}', '{"node": "n1"}', '{"jobid": "b", "target": "fs-OST0001"}']),
)
_OTHER_VALUES = st.sampled_from([5.0, 6.0, 1e9])


def _series(key: st.SearchStrategy, values: st.SearchStrategy) -> st.SearchStrategy:
    """One series' rows: its key, then (t, value) points."""
    return st.tuples(key, st.lists(st.tuples(_TIMES, values), min_size=1, max_size=10))


_ROWS = st.lists(
    st.one_of(
        _series(_DCGM_SERIES, _DCGM_VALUES),
        _series(_DCGM_SERIES, _DCGM_VALUES),
        _series(_IB_SERIES, _IB_VALUES),
        _series(_OTHER_SERIES, _OTHER_VALUES),
    ),
    max_size=10,
).map(lambda series: [(m, t, v, host, gpu, job, lab) for (m, host, gpu, job, lab), points in series for t, v in points])
_CUTS = st.lists(st.sampled_from([2.5, 3.0005, 9.0, 10.0, 20.0, 30.0, 30.5, 45.0]), max_size=4, unique=True)


def _table(rows: list[tuple]) -> pa.Table:
    cols = list(zip(*rows)) if rows else [()] * 7
    return pa.table(
        {name: pa.array(list(col), SAMPLE_SCHEMA.field(name).type) for name, col in zip(SAMPLE_SCHEMA.names, cols)}
    )


def _store_order(rows: list[tuple]) -> list[tuple]:
    """The rows as the store reads them (by metric, host, gpu, t; equal keys in their order)."""
    return sorted(rows, key=lambda r: (r[0], r[3] is None, r[3] or "", r[4] is None, r[4] or "", r[1]))


def _joined(rows: list[tuple], cuts: list[float]) -> Partial:
    """The rows split at ``cuts`` (a stretch is [cut, next cut)), each reduced with the whole's shape, joined."""
    (shape,) = partial_of(_table(rows), JOBS).shapes or {None}  # the whole window's devices
    edges = [-math.inf, *sorted(cuts), math.inf]
    total = Partial()
    for lo, hi in zip(edges, edges[1:]):
        total.add(partial_of(_table([r for r in rows if lo <= r[1] < hi]), JOBS, shape=shape))
    return total


@settings(max_examples=300, deadline=None)
@given(_ROWS, _CUTS)
def test_stretches_joined_report_what_one_pass_reports(rows, cuts) -> None:
    """Counters across an edge (energy, IB), the XID gauge, the scrape interval's median, MIG and engine
    activity, rails, Lustre, Slurm's last figures: all as one pass says them, to the last digit."""
    rows = _store_order(rows)
    whole = [report_dict(r, per_gpu=True) for r in job_reports(_table(rows), JOBS, now=100.0)]
    joined = [report_dict(r, per_gpu=True) for r in reports_of(_joined(rows, cuts), JOBS, now=100.0)]
    assert orjson.dumps(joined) == orjson.dumps(whole)


_GRID = st.lists(_TIMES, min_size=2, max_size=8, unique=True).flatmap(
    lambda times: st.tuples(
        st.just(sorted(times)),
        st.lists(st.sampled_from(["a", "b", None]), min_size=4 * len(times), max_size=4 * len(times)),
        st.lists(_IB_VALUES, min_size=4 * len(times), max_size=4 * len(times)),
        st.lists(st.sampled_from([True, True, True, False]), min_size=8 * len(times), max_size=8 * len(times)),
    )
)


def _grid_rows(grid: tuple[list[float], list, list[float], list[bool]]) -> list[tuple]:
    """Two hosts of two GPUs and two HCAs, scraped at each time (or not: ``present``): the GPUs' utilisation
    with a job label or none (Slurm's allocation then), or only their engine activity (a MIG-like device), and
    the HCAs' transmit counters. Which devices a stretch lacks is what the window's ``Shape`` is for."""
    times, labels, counters, present = grid
    rows = []
    for k, t in enumerate(times):
        for i, (host, unit) in enumerate((("n1", "0"), ("n1", "1"), ("n2", "0"), ("n2", "1"))):
            job = labels[4 * k + i]
            lab = orjson.dumps({"hpc_job": job}).decode()
            if present[8 * k + i]:
                rows.append((vocab.DCGM_FI_DEV_GPU_UTIL, t, 50.0, host, unit, job, lab))
            else:
                rows.append((vocab.DCGM_FI_PROF_GR_ENGINE_ACTIVE, t, 0.5, host, unit, job, lab))
            if present[8 * k + 4 + i]:
                device = orjson.dumps({"device": f"mlx5_{unit}"}).decode()
                rows.append((IB[0], t, counters[4 * k + i], host, None, None, device))
    return rows


@settings(max_examples=200, deadline=None)
@given(_GRID, _CUTS)
def test_stretches_split_infiniband_bytes_as_one_pass(grid, cuts) -> None:
    """Each delta across an edge shared over its rail's GPUs, to the jobs holding them at the later sample."""
    rows = _store_order(_grid_rows(grid))
    whole = [report_dict(r, per_gpu=True) for r in job_reports(_table(rows), JOBS, now=100.0)]
    joined = [report_dict(r, per_gpu=True) for r in reports_of(_joined(rows, cuts), JOBS, now=100.0)]
    assert orjson.dumps(joined) == orjson.dumps(whole)


def test_an_energy_delta_and_an_xid_across_an_edge_are_counted_once() -> None:
    util, energy, xid = (
        vocab.DCGM_FI_DEV_GPU_UTIL,
        vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        vocab.DCGM_FI_DEV_XID_ERRORS,
    )
    rows = []
    for t in range(1, 9):
        rows.append((util, float(t), 50.0, "n1", "0", "a", "{}"))
        rows.append((energy, float(t), 1000.0 * t, "n1", "0", "a", "{}"))
        rows.append((xid, float(t), 79.0 if t >= 4 else 0.0, "n1", "0", "a", "{}"))  # one XID, at t=4, held after
    rows = _store_order(rows)
    for cuts in ([], [4.0], [2.0, 4.0, 5.0], [5.0]):
        (report,) = [r for r in reports_of(_joined(rows, cuts), JOBS, now=100.0) if r.id == "a"]
        assert report.xid_errors == 1
        assert report.energy_kwh * 3.6e9 == pytest.approx(7000.0)  # 8 samples, 7 deltas of 1,000 mJ
        assert report.per_gpu[0].observed_s == 8.0


def test_exact_sums_do_not_depend_on_the_split() -> None:
    values = [0.1, 0.2, 0.3, 1e16, -1e16, 563.127, 1 / 3] * 5
    whole = exact_sums(pa.array([0] * len(values)).to_numpy(), pa.array(values).to_numpy(), 1)[0]
    joined = (0.0, 0.0)
    for k in range(0, len(values), 4):
        joined = exact_plus(
            joined, (math.fsum(values[k : k + 4]), math.fsum([*values[k : k + 4], -math.fsum(values[k : k + 4])]))
        )
    assert joined[0] == whole[0] == math.fsum(values)


@pytest.mark.parametrize(
    "histogram, median",
    [
        ({}, 0.0),
        ({1000: 1}, 1.0),
        ({1000: 2, 1002: 1}, 1.0),
        ({1000: 1, 1002: 1}, 1.001),
        ({10: 1, 20: 1, 90: 2}, 0.055),
    ],
)
def test_median_gap_of_a_histogram(histogram, median) -> None:
    assert median_gap_s(histogram) == pytest.approx(median)


def _acc_joined(earlier: Acc, later: Acc) -> Acc:
    """One accumulator's join, field by field, as its rules are written (the oracle ``Cells.add`` and
    ``Acc.total`` are held to): sums exactly, counts and amounts added, maxima and times the larger or smaller of
    those there are, sets united, the profile that sorts first as text, energy summed by gap."""

    def pick(f, x, y):
        return y if x is None else x if y is None else f(x, y)

    energy = dict(earlier.energy_by_gap)
    for gap, delta in later.energy_by_gap.items():
        energy[gap] = exact_plus(energy.get(gap, (0.0, 0.0)), delta)
    profiles = [p for p in (earlier.profile, later.profile) if p is not None]
    return Acc(
        util_sum=exact_plus(earlier.util_sum, later.util_sum),
        util_n=earlier.util_n + later.util_n,
        tensor_sum=exact_plus(earlier.tensor_sum, later.tensor_sum),
        tensor_n=earlier.tensor_n + later.tensor_n,
        power_sum=exact_plus(earlier.power_sum, later.power_sum),
        power_n=earlier.power_n + later.power_n,
        fb_max=pick(max, earlier.fb_max, later.fb_max),
        util_max=pick(max, earlier.util_max, later.util_max),
        xid=earlier.xid + later.xid,
        ib_tx=earlier.ib_tx + later.ib_tx,
        ib_rx=earlier.ib_rx + later.ib_rx,
        first_t=pick(min, earlier.first_t, later.first_t),
        last_t=pick(max, earlier.last_t, later.last_t),
        sources=earlier.sources | later.sources,
        profile=min(profiles, key=str) if profiles else None,
        energy_by_gap=energy,
    )


#: A sum as a stretch keeps it: the ``Exact`` of some measured values (its rest below half its last digit).
_SUMS = st.lists(st.floats(-1e4, 1e4, allow_nan=False), max_size=6).map(lambda values: _fsum(values))
_MAYBE = st.none() | st.floats(0, 1e6, allow_nan=False)


def _acc(util, tensor, power, n, fb, umax, xid, tx, rx, first, span, sources, profile, energy) -> Acc:
    last = None if first is None else first + span
    return Acc(
        util_sum=util, util_n=n, tensor_sum=tensor, tensor_n=n // 2, power_sum=power, power_n=n, fb_max=fb,
        util_max=umax, xid=xid, ib_tx=tx, ib_rx=rx, first_t=first, last_t=last, sources=set(sources),
        profile=profile, energy_by_gap=energy,
    )  # fmt: skip


_ACCS = st.lists(
    st.builds(
        _acc,
        _SUMS,
        _SUMS,
        _SUMS,
        st.integers(0, 1000),
        _MAYBE,
        _MAYBE,
        st.integers(0, 3),
        st.floats(0, 1e15, allow_nan=False),
        st.floats(0, 1e15, allow_nan=False),
        _MAYBE,
        st.floats(0, 100),
        st.sets(st.sampled_from(["slurm", "label", "pod"])),
        st.none() | st.sampled_from(["1g.10gb", "3g.40gb", "7g.80gb"]),
        st.dictionaries(st.sampled_from([999, 1000, 1001, 60000]), _SUMS, max_size=3),
    ),
    max_size=12,
)


@given(_ACCS)
@settings(max_examples=150, deadline=None)
def test_the_total_of_accumulators_is_what_adding_them_in_turn_gives(accs) -> None:
    """``Acc.total`` (a job page's sums over its 1,536 GPUs, one pass per field) gives each field as ``add``ing
    them to an empty one in turn does, and each sum correctly rounded from all the parts the accumulators hold
    (``add``'s pairwise joins can lose a tie's tiny rest: adding a zero then moved a sum by one digit)."""
    chained = Acc()
    for a in accs:
        chained = _acc_joined(chained, a)
    total = Acc.total(accs)
    for name in Acc.__slots__:
        mine, theirs = getattr(total, name), getattr(chained, name)
        if name.endswith("_sum"):
            assert mine[0] == math.fsum(x for a in accs for x in getattr(a, name)), name
        elif name == "energy_by_gap":
            assert set(mine) == set(theirs)
            for gap, (value, _) in mine.items():
                assert value == math.fsum(x for a in accs for x in a.energy_by_gap.get(gap, ())), gap
        else:
            assert mine == theirs, name


def _cells(accs: list[Acc], keys: list[tuple[str, str, str]]) -> Cells:
    """``accs`` as the columns of ``Cells`` (a NaN for a maximum or time of none)."""
    arrays = {
        name: [getattr(a, name) if getattr(a, name) is not None else math.nan for a in accs]
        for name in Cells.EMPTY
        if name not in Cells.LISTS
    }
    lists = {name: [getattr(a, name) for a in accs] for name in Cells.LISTS}
    lists["sources"] = [frozenset(s) for s in lists["sources"]]
    return Cells.of(keys, arrays, lists)


@given(_ACCS, _ACCS, st.randoms(use_true_random=False))
@settings(max_examples=150, deadline=None)
def test_joining_cells_as_columns_is_adding_each_accumulator(earlier, later, random) -> None:
    """``Cells.add`` (a page's join of 1,536 GPUs, a few operations per field) gives every row what joining its
    accumulators one by one gives it, to the bit: sums with and without a rest to carry, maxima and times of none, sets, the profile,
    energy by gap; a row only one side has is kept or added as it is; ``later`` is left unchanged."""
    keys = [("j", "n1", str(k)) for k in range(12)]
    earlier_keys, later_keys = random.sample(keys, len(earlier)), random.sample(keys, len(later))
    joined = _cells(earlier, earlier_keys)
    later_cells = _cells(later, later_keys)
    before = [(key, acc) for key, acc in later_cells.items()]
    joined.add(later_cells)
    expected = dict(zip(earlier_keys, earlier))
    for key, acc in zip(later_keys, later):
        expected[key] = _acc_joined(expected[key], acc) if key in expected else acc
    assert joined.keys == list(expected)
    for (key, acc), want in zip(joined.items(), expected.values()):
        for name in Acc.__slots__:
            mine, theirs = getattr(acc, name), getattr(want, name)
            if isinstance(mine, dict):  # energy by gap: each sum to the bit, its sign of zero too
                mine, theirs = sorted(mine.items()), sorted(theirs.items())
            assert mine == theirs and (isinstance(mine, set) or repr(mine) == repr(theirs)), (key, name, mine, theirs)
    assert later_cells.items() == before


def test_a_copied_partial_shares_nothing_a_join_changes() -> None:
    """A kept checkpoint is copied, then a later stretch joined to the copy: the checkpoint's cells, ends,
    ports and gaps stay as they were (a page that changed them would change every later page's report)."""
    rows = _store_order(
        [
            (vocab.DCGM_FI_DEV_GPU_UTIL, t, 50.0 + t, "n1", "0", "a", None) for t in (1.0, 2.0, 3.0)
        ] + [
            (vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, t, 1000.0 * t, "n1", "0", "a", None) for t in (1.0, 2.0, 3.0)
        ] + [
            (IB[0], t, 4000.0 * t, "n1", None, None, '{"device": "mlx5_0"}') for t in (1.0, 2.0, 3.0)
        ]
    )  # fmt: skip
    (shape,) = partial_of(_table(rows), JOBS).shapes
    kept = partial_of(_table([r for r in rows if r[1] < 2.5]), JOBS, shape=shape)
    plain = pickle.dumps(kept.to_plain())
    page = kept.copy()
    page.add(partial_of(_table([r for r in rows if r[1] >= 2.5]), JOBS, shape=shape))
    assert pickle.dumps(kept.to_plain()) == plain
    assert page.to_plain()["cells"][1]["energy_by_gap"] != kept.to_plain()["cells"][1]["energy_by_gap"]


@settings(max_examples=200, deadline=None)
@given(_ROWS, _CUTS)
def test_a_partial_written_in_plain_form_and_read_back_joins_as_the_one_in_memory(rows, cuts) -> None:
    """What a server writes of a checkpoint (``to_plain``, pickled) and a restarted one reads back: the stretches
    joined after it report what one pass reports, to the last digit."""
    rows = _store_order(rows)
    whole = [report_dict(r, per_gpu=True) for r in job_reports(_table(rows), JOBS, now=100.0)]
    (shape,) = partial_of(_table(rows), JOBS).shapes or {None}
    edges = [-math.inf, *sorted(cuts), math.inf]
    total = Partial()
    for lo, hi in zip(edges, edges[1:]):
        total = Partial.from_plain(pickle.loads(pickle.dumps(total.to_plain(), protocol=5)))
        total.add(partial_of(_table([r for r in rows if lo <= r[1] < hi]), JOBS, shape=shape))
    joined = [report_dict(r, per_gpu=True) for r in reports_of(total, JOBS, now=100.0)]
    assert orjson.dumps(joined) == orjson.dumps(whole)


def test_a_plain_form_of_other_fields_is_refused() -> None:
    rows = _store_order([(vocab.DCGM_FI_DEV_GPU_UTIL, 1.0, 50.0, "n1", "0", "a", None)])
    plain = partial_of(_table(rows), JOBS).to_plain()
    assert Partial.from_plain(plain).cells.keys == [("a", "n1", "0")]
    keys, fields = plain["cells"]
    renamed = {("util_total" if name == "util_sum" else name): values for name, values in fields.items()}
    with pytest.raises(ValueError, match="not Cells's fields"):
        Partial.from_plain({**plain, "cells": (keys, renamed)})
    with pytest.raises(ValueError, match="not Cells's columns"):
        Partial.from_plain({**plain, "cells": (keys, {**fields, "xid": []})})
    with pytest.raises(ValueError, match="not Cells's columns"):
        Partial.from_plain({**plain, "cells": (keys * 2, {name: [*v, *v] for name, v in fields.items()})})
    with pytest.raises(ValueError, match="plain form"):
        Partial.from_plain({k: v for k, v in plain.items() if k != "ends"})
