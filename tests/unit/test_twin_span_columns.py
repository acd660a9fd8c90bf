"""twin/training.py ``finished_span_columns``: the training job's finished step as the store's span columns,
built in numpy, is the table the store makes of ``finished_spans()`` (``Span`` records), to the last bit;
and the live twin's one commit a tick stores the same spans."""

from __future__ import annotations

from hpcwatch.model import reference_cluster
from hpcwatch.records import Span
from hpcwatch.store import Store
from hpcwatch.store.core import _ROW_WRITERS
from hpcwatch.twin.live import LiveTwin


def test_span_columns_are_the_store_rows_of_the_spans():
    store = Store(":memory:")
    live = LiveTwin(store, reference_cluster(), seed=5, scenarios=["straggler", "xid79"], start=1_796_000_000.0)
    live.write_tick()
    compared = 0
    for _ in range(50):
        live.step()
        columns = live.twin.finished_span_columns()
        spans = live.twin.finished_spans()
        if columns is None:
            assert spans == []
            continue
        assert columns.equals(_ROW_WRITERS[Span].table(spans))
        compared += 1
    assert compared > 20
    store.close()


def test_the_live_twin_stores_each_finished_step_once():
    store = Store(":memory:")
    live = LiveTwin(store, reference_cluster(), seed=5, start=1_796_000_000.0)
    live.write_tick()
    expected: list[Span] = []
    for _ in range(20):
        live.step()
        expected += live.twin.finished_spans()  # the step the tick just wrote
    stored = store.spans()
    assert expected and sorted(stored, key=_key) == sorted(expected, key=_key)
    store.close()


def _key(s: Span) -> tuple:
    return (s.job, s.step, s.rank, s.phase, s.start)
