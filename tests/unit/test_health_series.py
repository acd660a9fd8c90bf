"""The passive health rules' series (``analysis.health._series``) against a row-by-row reading of the same table.

``_series`` groups by sorting codes, for the millions of rows of a 15-minute window at 128 nodes; this test
holds it to what a plain loop over the rows gives: one series per host and GPU (or label set when there is
no GPU), in the order of the host's text then the key's, points in time order (equal times in table order), the
labels of its first point and the job of its last, rows without a host skipped.
"""

from __future__ import annotations

from collections import defaultdict

import orjson
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcwatch.analysis.health import HealthConfig, _increase, _runs, _series, _Window
from hpcwatch.errors import ConfigError
from hpcwatch.store import SAMPLE_SCHEMA

rows = st.lists(
    st.fixed_dictionaries(
        {
            "metric": st.sampled_from(["a", "b", "c"]),
            "t": st.integers(0, 6).map(float),
            "value": st.floats(-10, 10),
            "host": st.sampled_from(["node1", "node2", None]),
            "gpu": st.sampled_from(["0", "1", None]),
            "job": st.sampled_from(["41", "42", None]),
            "labels": st.sampled_from(['{"gpu":"0"}', '{"device":"mlx5_0","port":"1"}', "{}", None]),
        }
    ),
    max_size=40,
)


def _by_row(table: pa.Table, names: list[str]) -> list[tuple]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in table.to_pylist():
        if row["metric"] in names and row["host"] is not None:
            groups[(row["host"], row["gpu"] if row["gpu"] is not None else row["labels"])].append(row)
    out = []
    for (host, key), members in sorted(groups.items(), key=lambda item: (item[0][0], item[0][1] is None, item[0][1])):
        timed = sorted(members, key=lambda r: r["t"])  # sorted() is stable: equal times stay in table order
        labels = orjson.loads(timed[0]["labels"] or "{}")
        out.append((host, key, labels, timed[-1]["job"], [r["t"] for r in timed], [r["value"] for r in timed]))
    return out


@settings(max_examples=300, deadline=None)
@given(rows=rows, names=st.sampled_from([["a"], ["a", "b"], ["c", "b", "a"]]), split=st.integers(0, 40))
def test_series_are_those_a_row_by_row_reading_gives(rows, names, split):
    table = pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA)
    if 0 < split < table.num_rows:  # the store answers in several record batches
        table = pa.concat_tables([table.slice(0, split), table.slice(split)])
    got = [(s.host, s.key, s.labels, s.job, s.t.tolist(), s.v.tolist()) for s in _series(table, names)]
    assert got == _by_row(table, names)


@settings(max_examples=300, deadline=None)
@given(
    rows=rows,
    names=st.sampled_from([["a"], ["a", "b"], ["c", "b", "a"], ["b", "d"]]),
    grouped=st.booleans(),
    splits=st.lists(st.integers(1, 39), max_size=3),
)
def test_a_window_cut_by_metric_gives_the_same_series(rows, names, grouped, splits):
    """``_Window`` slices a table grouped by metric (the store's order) instead of filtering it: same series,
    whatever record batches the table comes in (a metric's rows may span several)."""
    if grouped:
        rows = sorted(rows, key=lambda r: r["metric"])  # stable: the rows of a metric keep their order
    table = pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA)
    cuts = sorted({c for c in splits if c < table.num_rows})
    if cuts:
        edges = [0, *cuts, table.num_rows]
        table = pa.concat_tables([table.slice(a, b - a) for a, b in zip(edges, edges[1:])])
    window = _Window(table)
    assert (window._blocks is not None) >= grouped  # a grouped table is cut, never filtered
    expected = [(s.host, s.key, s.labels, s.job, s.t.tolist(), s.v.tolist()) for s in _series(table, names)]
    for _ in range(2):  # the second answer is the kept one
        got = [(s.host, s.key, s.labels, s.job, s.t.tolist(), s.v.tolist()) for s in window.series(names)]
        assert got == expected


@settings(max_examples=300, deadline=None)
@given(
    rows=rows,
    names=st.sampled_from([["a"], ["a", "b"], ["c", "b", "a"]]),
    grouped=st.booleans(),
    zeros=st.booleans(),
)
def test_nonzero_series_are_the_series_holding_a_value_other_than_zero(rows, names, grouped, zeros):
    """``_Window.nonzero_series`` (the XID gauges) picks the series holding a value other than 0, in order; a
    window all 0 makes none (and is not grouped)."""
    if zeros:
        rows = [r | {"value": 0.0} if r["value"] == r["value"] and abs(r["value"]) < 5 else r for r in rows]
    if grouped:
        rows = sorted(rows, key=lambda r: r["metric"])
    table = pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA)
    expected = [(s.host, s.key, s.t.tolist(), s.v.tolist()) for s in _series(table, names) if (s.v != 0).any()]
    assert [(s.host, s.key, s.t.tolist(), s.v.tolist()) for s in _Window(table).nonzero_series(names)] == expected


@settings(max_examples=300, deadline=None)
@given(rows=rows, names=st.sampled_from([["a"], ["a", "b"], ["c", "b", "a"]]), grouped=st.booleans())
def test_rising_series_are_the_series_whose_increase_is_above_zero(rows, names, grouped):
    """``_Window.rising_series`` (every group's rise at once) picks the series ``_increase`` says rose, in order:
    steps up, resets to a value above 0, flat series and series of one point, from any window."""
    if grouped:
        rows = sorted(rows, key=lambda r: r["metric"])
    table = pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA)
    expected = [(s.host, s.key, s.t.tolist(), s.v.tolist()) for s in _series(table, names) if _increase(s.v) > 0]
    got = [(s.host, s.key, s.t.tolist(), s.v.tolist()) for s in _Window(table).rising_series(names)]
    assert got == expected
    window = _Window(table)
    window.series(names)  # made already: picked from those
    assert [(s.host, s.key, s.t.tolist(), s.v.tolist()) for s in window.rising_series(names)] == expected


@pytest.mark.parametrize("count", ["symbol_error_warn", "link_down_drain", "edac_ce_warn"])
def test_an_error_count_that_judges_must_be_at_least_one(count):
    """0 would warn on every healthy port (the IB rules judge only the counters that rose)."""
    with pytest.raises(ConfigError, match=count):
        HealthConfig(**{count: 0})
    assert getattr(HealthConfig(**{count: 1}), count) == 1


times = st.lists(st.integers(0, 8).map(float), max_size=8).map(sorted)


@settings(max_examples=300, deadline=None)
@given(util_t=times, power_t=times, same=st.booleans())
def test_aligned_series_are_those_at_the_times_both_hold(util_t, power_t, same):
    """The stalled-collective rule pairs utilisation with power at the times both series hold; series that
    hold the same times (dcgm-exporter's usual case) are taken as they are, and give what the intersection
    of their times gives, repeated times included."""
    import numpy as np

    from hpcwatch.analysis.health import _aligned, _Series

    power_t = list(util_t) if same else power_t
    util = _Series("node1", "0", {}, None, np.array(util_t), np.arange(len(util_t), dtype=float))
    power = _Series("node1", "0", {}, None, np.array(power_t), 100 + np.arange(len(power_t), dtype=float))
    t, u, p = _aligned(util, power)
    common, iu, ip = np.intersect1d(util.t, power.t, return_indices=True)
    assert t.tolist() == common.tolist()
    assert u.tolist() == util.v[iu].tolist()
    assert p.tolist() == power.v[ip].tolist()


@settings(max_examples=200, deadline=None)
@given(
    codes=st.lists(st.integers(0, 5), max_size=60),
    scale=st.sampled_from([1, 2**16 - 6, 2**20, 2**40]),
)
def test_the_grouping_order_is_a_stable_argsort_whatever_the_codes_range(codes, scale):
    """``_stable_order`` sorts small codes by radix and large ones joined to their row: numpy's stable argsort."""
    import numpy as np

    from hpcwatch.analysis.health import _stable_order

    array = np.array(codes, dtype=np.int64) * scale
    assert _stable_order(array).tolist() == np.argsort(array, kind="stable").tolist()


def _activity_of_every_series(window: _Window, config: HealthConfig) -> list[tuple]:
    """``_check_gpu_activity`` as it was, judging every GPU's series: the oracle of the one that makes only the
    series that may fire."""
    from hpcwatch.analysis.health import POWER, UTIL, _aligned, _runs
    from hpcwatch.model.catalog import gpu_spec

    power = {(s.host, s.key): s for s in window.series(POWER)}
    out = []
    for u in window.series(UTIL):
        p = power.get((u.host, u.key))
        spec = gpu_spec(u.labels.get("modelName", "")) if u.labels.get("modelName") else None
        if p is not None and spec is not None:
            t, util, watts = _aligned(u, p)
            cold = watts <= config.stall_power_factor * spec.idle_power_w
            runs = [(a, b) for a, b in _runs((util >= config.stall_util_pct) & cold, t) if b - a >= config.stall_min_s]
            if runs:
                a, b = runs[0]
                out.append(("stalled_nccl", u.host, u.key, a, b, float(watts[(t >= a) & (t <= b)].max())))
        if u.job:
            runs = [(a, b) for a, b in _runs(u.v <= config.idle_util_pct, u.t) if b - a >= config.idle_min_s]
            if runs:
                out.append(("idle_allocated", u.host, u.key, *runs[0], u.job))
    return out


activity_rows = st.lists(
    st.fixed_dictionaries(
        {
            "metric": st.sampled_from(["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE"]),
            "t": st.integers(0, 12).map(lambda i: i * 10.0),
            "value": st.sampled_from([0.0, 3.0, 50.0, 95.0, 100.0, 60.0, 110.0, 400.0, float("nan")]),
            "host": st.sampled_from(["node1", "node2"]),
            "gpu": st.sampled_from(["0", "1"]),
            "job": st.sampled_from(["41", "", None]),
            "labels": st.sampled_from(
                [
                    '{"modelName":"NVIDIA H100 80GB HBM3"}',
                    '{"modelName":"NVIDIA A100-SXM4-80GB"}',
                    '{"modelName":"x"}',
                    "{}",
                ]
            ),
        }
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(rows=activity_rows, stall_min_s=st.sampled_from([0.0, 20.0]), idle_min_s=st.sampled_from([0.0, 30.0]))
def test_gpu_activity_made_only_where_it_may_fire_finds_what_every_series_finds(rows, stall_min_s, idle_min_s):
    from hpcwatch.analysis.health import _check_gpu_activity

    config = HealthConfig(stall_min_s=stall_min_s, idle_min_s=idle_min_s)
    window = _Window(pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA))
    got = []
    for c in _check_gpu_activity(window, config):
        e = c.evidence
        if c.rule == "stalled_nccl":
            got.append((c.rule, c.node, e["gpu"], e["from"], e["to"], e["max_power_w"]))
        else:
            got.append((c.rule, c.node, e["gpu"], e["from"], e["to"], e["job"]))
    assert got == _activity_of_every_series(_Window(pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA)), config)


@settings(max_examples=300, deadline=None)
@given(rows=rows, limit=st.floats(-10, 10), min_s=st.sampled_from([0.0, 1.0, 2.5, 6.0]))
def test_first_long_runs_are_each_series_first_long_run(rows, limit, min_s):
    """``_Grouped.first_long_runs`` (the idle GPUs of ``_check_gpu_activity``, all series at once) gives, for each
    series in which there is one, its first run of points at or under ``limit`` lasting ``min_s`` at least, as
    ``_runs`` over that series alone does; and ``names``/``last_jobs`` its host, key and job."""
    table = pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA)
    grouped = _Window(table).grouped(["a", "b"])
    if grouped is None:
        return
    series = grouped.series_of(range(len(grouped.starts)))
    expected = {}
    for g, s in enumerate(series):
        long = [(a, b) for a, b in _runs(s.v <= limit, s.t) if b - a >= min_s]
        if long:
            expected[g] = long[0]
    assert grouped.first_long_runs(grouped.v <= limit, min_s) == expected
    assert grouped.names() == [(s.host, s.key) for s in series]
    assert grouped.last_jobs() == [s.job for s in series]
