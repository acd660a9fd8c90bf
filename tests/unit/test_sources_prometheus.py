"""The Prometheus text reader: real exporter shapes, agreement with prometheus_client, the fast columnar path."""

from __future__ import annotations

import math

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.core import CollectorRegistry, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hpcwatch.errors import ParseError
from hpcwatch.sources.prometheus_text import (
    parse_prometheus_columns,
    parse_prometheus_text,
    read_prometheus_columns,
    read_prometheus_text,
)
from hpcwatch.store import SAMPLE_SCHEMA, Store
from tests.conftest import DATA

PROM = DATA / "prometheus"


def _key(value: float) -> object:
    """NaN != NaN; compare it as a marker."""
    return "NaN" if math.isnan(value) else value


def _reference(text: str) -> list[tuple]:
    """prometheus_client's view, with its counter renaming (foo -> foo_total) undone: we keep the exposed name."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name
            if family.type == "counter" and name == family.name + "_total" and f"\n{name}" not in "\n" + text:
                name = family.name
            out.append((name, dict(s.labels), _key(s.value), s.timestamp))
    return out


def _ours(text: str) -> list[tuple]:
    out = []
    for s in parse_prometheus_text(text, t=-1.0):
        out.append((s.metric, dict(s.labels), _key(s.value), None if s.t == -1.0 else s.t))
    return out


def _read_columns(path, **kw) -> pa.Table:
    """The chunks of ``read_prometheus_columns`` as one table."""
    return pa.concat_tables(read_prometheus_columns(path, **kw))


def _columns_as_rows(table: pa.Table) -> list[tuple]:
    return [
        (r["metric"], orjson.loads(r["labels"]), _key(r["value"]), r["t"], r["host"], r["gpu"], r["job"])
        for r in table.to_pylist()
    ]


def _samples_as_rows(text: str, t: float) -> list[tuple]:
    from hpcwatch.store import sample_keys

    return [
        (s.metric, dict(s.labels), _key(s.value), s.t, *sample_keys(s.labels)) for s in parse_prometheus_text(text, t=t)
    ]


def test_dcgm_exporter_scrape_gives_gpu_host_and_job_of_each_sample():
    samples = list(read_prometheus_text(PROM / "dcgm_exporter_node1.prom", t=100.0))
    util = [s for s in samples if s.metric == "DCGM_FI_DEV_GPU_UTIL"]
    assert [(s.labels["gpu"], s.labels["hpc_job"], s.value) for s in util] == [("0", "7", 97.0), ("6", "9", 41.0)]
    assert util[0].labels["modelName"] == "NVIDIA H100 80GB HBM3"
    assert all(s.t == 100.0 for s in samples)
    xid = [s for s in samples if s.metric == "DCGM_FI_DEV_XID_ERRORS"]
    assert xid[0].labels["err_msg"] == "GPU has fallen off the bus" and xid[0].value == 79.0


def test_columns_fill_host_gpu_job_from_dcgm_labels():
    table = _read_columns(PROM / "dcgm_exporter_node1.prom", t=5.0)
    assert table.schema == SAMPLE_SCHEMA
    row = table.filter(pa.compute.equal(table["metric"], "DCGM_FI_DEV_FB_USED")).to_pylist()[1]
    assert (row["host"], row["gpu"], row["job"], row["value"], row["t"]) == ("node1", "6", "9", 30112.0, 5.0)


def test_lowercase_hostname_label_is_kept_and_used_as_host():
    table = _read_columns(PROM / "dcgm_exporter_lowercase_hostname.prom", t=0.0)
    (row,) = table.to_pylist()
    assert row["host"] == "node2" and row["job"] == "8" and row["gpu"] == "2"
    assert orjson.loads(row["labels"])["hostname"] == "node2"
    assert orjson.loads(row["labels"])["GPU_I_PROFILE"] == "3g.71gb"


def test_escapes_timestamps_nan_and_infinities():
    text = (PROM / "timestamps_and_escapes.prom").read_text()
    samples = list(parse_prometheus_text(text, t=7.0))
    first = samples[0]
    assert first.labels["comment"] == 'say "hi"\\path\nnext'
    assert first.labels["tricky"] == 'a}b, c="d"'
    assert first.t == 1795991704.0 and first.value == 1.0
    assert math.isnan(samples[1].value) and samples[1].t == 1795991705.123
    assert (samples[2].metric, samples[2].value, samples[2].t) == ("up", math.inf, 7.0)
    assert samples[3].value == -math.inf


@pytest.mark.parametrize(
    "name",
    [
        "dcgm_exporter_node1.prom",
        "dcgm_exporter_lowercase_hostname.prom",
        "node_exporter_infiniband.prom",
        "timestamps_and_escapes.prom",
    ],
)
def test_agrees_with_prometheus_client_on_every_test_file(name):
    text = (PROM / name).read_text()
    assert _ours(text) == _reference(text)


@pytest.mark.parametrize(
    "name",
    [
        "dcgm_exporter_node1.prom",
        "dcgm_exporter_lowercase_hostname.prom",
        "node_exporter_infiniband.prom",
        "timestamps_and_escapes.prom",
    ],
)
def test_columns_equal_samples_on_every_test_file(name):
    text = (PROM / name).read_text()
    assert _columns_as_rows(parse_prometheus_columns(text, t=3.0)) == _samples_as_rows(text, 3.0)


def test_node_exporter_infiniband_counters_are_bytes_already():
    samples = {
        (s.metric, s.labels["device"]): s.value
        for s in parse_prometheus_text((PROM / "node_exporter_infiniband.prom").read_text(), t=0)
    }
    assert samples[("node_infiniband_port_data_transmitted_bytes_total", "mlx5_0")] == 1.45192107443712e14
    assert samples[("node_infiniband_state_id", "mlx5_1")] == 1.0


def test_columns_go_into_the_store_with_keys():
    store = Store(":memory:")
    store.add_sample_table(_read_columns(PROM / "dcgm_exporter_node1.prom", t=1.0))
    got = store.samples("DCGM_FI_DEV_GPU_UTIL", job="9").to_pylist()
    assert [(r["host"], r["gpu"], r["value"]) for r in got] == [("node1", "6", 41.0)]


def test_untimed_lines_of_a_saved_scrape_get_the_file_time(tmp_path):
    path = tmp_path / "scrape.prom"
    path.write_text("up 1\n")
    import os

    os.utime(path, (1700000000, 1700000000))
    (sample,) = read_prometheus_text(path)
    assert sample.t == 1700000000.0
    assert _read_columns(path)["t"].to_pylist() == [1700000000.0]


BAD = [
    # a word where the value should be
    ('up{a="1"} one\n', 1, "value is not a number"),
    # the label value is not quoted
    ("ok 1\nup{a=1} 1\n", 2, "bad label"),
    # two labels without a comma between them
    ('up{a="1" b="2"} 1\n', 1, "bad label"),
    # the same label twice
    ('up{a="1",a="2"} 1\n', 1, "given twice"),
    # no value at all
    ("\n\nup\n", 3, "not a sample line"),
    # a metric name may not start with a digit
    ("9lives 1\n", 1, "not a sample line"),
    # a timestamp in seconds with a fraction (the format wants integer milliseconds)
    ("up 1 1700000000.5\n", 1, "timestamp"),
    # prometheus_client refuses underscores in numbers although float() takes them
    ("up 1_000\n", 1, "value is not a number"),
    # TYPE without the type
    ("# TYPE up\nup 1\n", 1, "TYPE without a type"),
    # HELP for an invalid metric name
    ("# HELP 1up doc\n", 1, "invalid metric"),
    # an unterminated label value
    ('up{a="1} 1\n', 1, "bad label"),
    # a quoted UTF-8 metric name (OpenMetrics 2 / Prometheus 3): not supported
    ('{"my.metric"} 1\n', 1, "not a sample line"),
]


@pytest.mark.parametrize("text,line,what", BAD)
def test_bad_input_names_the_line(text, line, what):
    with pytest.raises(ParseError) as err:
        list(parse_prometheus_text(text, path="x.prom", t=0))
    assert err.value.line == line and what in err.value.what and err.value.path == "x.prom"
    with pytest.raises(ParseError) as err2:
        parse_prometheus_columns(text, path="x.prom", t=0)
    assert str(err2.value) == str(err.value)


# -- property tests ------------------------------------------------------------------------

_FIRST = "abcxyzABCXYZ_:"
_REST = _FIRST + "0189"
_names = st.builds(lambda a, b: a + b, st.sampled_from(_FIRST), st.text(_REST, max_size=10))
_label_names = st.builds(
    lambda a, b: a + b, st.sampled_from("abcxyzABCXYZ_").filter(lambda c: c != "_"), st.text("abcXYZ_019", max_size=8)
)
_label_values = st.text(st.characters(blacklist_categories=("Cs",)), max_size=10)
_values = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**15), 10**15).map(float))
_labels = st.dictionaries(_label_names, _label_values, max_size=4)


@st.composite
def _families(draw):
    families = []
    for name in draw(st.lists(_names, min_size=1, max_size=4, unique=True)):
        kind = draw(st.sampled_from(["gauge", "untyped"]))
        metric = Metric(name, draw(st.text(max_size=20)), kind)
        for labels in draw(st.lists(_labels, min_size=1, max_size=4)):
            stamp = draw(st.one_of(st.none(), st.integers(0, 4 * 10**12).map(lambda ms: ms / 1000)))
            metric.add_sample(name, labels, draw(_values), timestamp=stamp)
        families.append(metric)
    return families


class _Collector:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_families())
def test_round_trip_of_generated_metrics(families):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(families))
    text = generate_latest(registry).decode()
    expected = [
        (
            s.name,
            dict(s.labels),
            _key(float(s.value)),
            None if s.timestamp is None else int(float(s.timestamp) * 1000) / 1000.0,
        )
        for f in families
        for s in f.samples
    ]
    assert _ours(text) == expected
    assert _ours(text) == _reference(text)
    assert _columns_as_rows(parse_prometheus_columns(text, t=-1.0)) == _samples_as_rows(text, -1.0)


_line_chars = st.sampled_from(list('ab_:{}="\\, \t#\n0123456789.eE+-NaInf\r'))


@settings(max_examples=300, deadline=None)
@given(st.text(_line_chars, max_size=60))
def test_both_paths_accept_and_reject_the_same_text(text):
    try:
        rows = _samples_as_rows(text, 0.0)
    except ParseError as err:
        with pytest.raises(ParseError) as again:
            parse_prometheus_columns(text, t=0.0)
        assert str(again.value) == str(err)
        return
    assert _columns_as_rows(parse_prometheus_columns(text, t=0.0)) == rows
