"""``store.queries.window_samples`` (the health rules' window) and ``job_window_samples`` (a job's report):
reads with the label text once per label set.

They must give what a read with the text per row gives, row for row and in the same order, whatever the rows:
label sets shared or not, rows without labels, without a host or a GPU, one host or all, any start time, rows
committed in several parts.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcwatch.schemas import SAMPLE_SCHEMA
from hpcwatch.store import Store, queries

rows = st.lists(
    st.fixed_dictionaries(
        {
            "metric": st.sampled_from(["a", "b", "c"]),
            "t": st.integers(0, 9).map(float),
            "value": st.floats(-10, 10),
            "host": st.sampled_from(["node1", "node2", None]),
            "gpu": st.sampled_from(["0", "1", None]),
            "job": st.sampled_from(["41", None]),
            "labels": st.sampled_from(
                ['{"gpu":"0"}', '{"device":"mlx5_0","port":"1"}', '{"gpu":"1","é":"ü"}', "{}", None]
            ),
        }
    ),
    max_size=30,
)


def _as_text(table: pa.Table) -> pa.Table:
    labels = table["labels"]
    if pa.types.is_dictionary(labels.type):
        table = table.set_column(table.schema.get_field_index("labels"), "labels", labels.cast(pa.string()))
    return table


def _stored(parts: list[list[dict]]) -> Store:
    """A store of ``parts``' rows, each part its own commit (a read spans parts)."""
    store = Store()
    for part in parts:
        if part:
            store.add_sample_table(pa.Table.from_pylist(part, schema=SAMPLE_SCHEMA))
    return store


def _assert_same_rows(read: pa.Table, plain: pa.Table) -> None:
    """The same rows in the same (metric, host, gpu, t) order; rows that tie on those come in either order from
    either query, so the whole rows are compared as sorted."""
    got, want = _as_text(read).to_pylist(), plain.to_pylist()
    order = ("metric", "host", "gpu", "t")
    assert [tuple(r[k] for k in order) for r in got] == [tuple(r[k] for k in order) for r in want]
    key = lambda r: tuple(str(r[k]) for k in SAMPLE_SCHEMA.names)  # noqa: E731
    assert sorted(got, key=key) == sorted(want, key=key)


@settings(max_examples=120, deadline=None)
@given(
    parts=st.lists(rows, min_size=1, max_size=3),
    metrics=st.sampled_from([["a"], ["a", "b"], ["c", "b", "a"]]),
    host=st.sampled_from([None, "node1"]),
    t0=st.sampled_from([None, 0.0, 4.5]),
)
def test_the_window_read_gives_the_rows_of_store_samples(parts, metrics, host, t0):
    with _stored(parts) as store:
        window = queries.window_samples(store, metrics, host=host, t0=t0)
        plain = store.samples(metrics, host=host, t0=t0)
        assert window.column_names == SAMPLE_SCHEMA.names
        if window.num_rows:
            assert pa.types.is_dictionary(window["labels"].type)
        _assert_same_rows(window, plain)


@settings(max_examples=60, deadline=None)  # each example commits a store's parts: ~0.1 s
@given(
    parts=st.lists(rows, min_size=1, max_size=3),
    hosts=st.sampled_from([["node1"], ["node1", "node2"], ["node9"]]),
    window=st.sampled_from([(0.0, None), (4.5, None), (2.0, 6.0)]),
)
def test_the_job_window_read_gives_the_rows_read_with_their_text(parts, hosts, window):
    t0, t1 = window
    with _stored(parts) as store:
        found = queries.job_window_samples(store, ["a", "b"], hosts=hosts, job="41", t0=t0, t1=t1)
        where = "metric IN ('a', 'b') AND t >= ?" + (" AND t <= ?" if t1 is not None else "")
        where += f" AND (host IN ({', '.join('?' for _ in hosts)}) OR job = '41')"
        plain = store.query_arrow(
            f"SELECT * FROM samples WHERE {where} ORDER BY metric, host, gpu, t",
            [t0, *([t1] if t1 is not None else []), *hosts],
        )
        assert found.column_names == SAMPLE_SCHEMA.names
        _assert_same_rows(found, plain)


@settings(max_examples=60, deadline=None)
@given(
    parts=st.lists(rows, min_size=1, max_size=3),
    hosts=st.sampled_from([["node1"], ["node1", "node2"], ["node9"]]),
    window=st.sampled_from([(0.0, None), (4.5, None), (2.0, 6.0)]),
    room=st.integers(-2, 2),
)
def test_the_job_window_read_within_a_limit_gives_every_row_or_none(parts, hosts, window, room):
    """``job_window_samples_within``: the rows of ``job_window_samples`` (the same order, label sets encoded)
    when they are ``limit`` at most, None past it."""
    t0, t1 = window
    with _stored(parts) as store:
        whole = queries.job_window_samples(store, ["a", "b"], hosts=hosts, job="41", t0=t0, t1=t1)
        limit = max(0, whole.num_rows + room)
        found = queries.job_window_samples_within(store, ["a", "b"], limit, hosts=hosts, job="41", t0=t0, t1=t1)
        if whole.num_rows > limit:
            assert found is None
            return
        assert found is not None and found.column_names == SAMPLE_SCHEMA.names
        assert pa.types.is_dictionary(found["labels"].type)
        _assert_same_rows(found, _as_text(whole))


def test_two_label_sets_with_one_hash_are_read_as_text(monkeypatch):
    """Should DuckDB's hash ever give two label sets one value, the window is read with its text per row."""
    with Store() as store:
        store.add_sample_table(
            pa.Table.from_pylist(
                [
                    {
                        "metric": "a",
                        "t": 1.0,
                        "value": 1.0,
                        "host": "n1",
                        "gpu": "0",
                        "job": None,
                        "labels": '{"x":"1"}',
                    },
                    {
                        "metric": "a",
                        "t": 2.0,
                        "value": 2.0,
                        "host": "n1",
                        "gpu": "1",
                        "job": None,
                        "labels": '{"x":"2"}',
                    },
                ],
                schema=SAMPLE_SCHEMA,
            )
        )
        real_unique = queries.np.unique
        monkeypatch.setattr(queries.np, "unique", lambda values: real_unique(values)[:1])  # as if they collided
        window = queries.window_samples(store, ["a"], t0=None)
        assert window["labels"].type == pa.string()
        assert window.to_pylist() == store.samples(["a"]).to_pylist()
        of_job = queries.job_window_samples(store, ["a"], hosts=["n1"], job="41", t0=0.0, t1=None)
        assert of_job["labels"].type == pa.string() and of_job.to_pylist() == window.to_pylist()


@pytest.mark.parametrize("t0", [None, 100.0])
def test_an_empty_window_has_the_samples_columns(t0):
    with Store() as store:
        window = queries.window_samples(store, ["a"], t0=t0)
        assert window.num_rows == 0 and window.column_names == SAMPLE_SCHEMA.names
