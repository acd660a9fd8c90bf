"""What a live tick makes once and keeps (the port and Lustre rows of twin/exposition.py) must not change a byte
of what it writes: each test holds the kept rows to the samples made anew."""

from __future__ import annotations

import orjson
import pyarrow as pa

from hpcwatch.schemas import sample_keys
from hpcwatch.twin import Twin
from hpcwatch.twin.exposition import perfquery_samples, perfquery_table
from hpcwatch.web.demo import cluster_with_nodes

START = 1_800_000_000.0
_COLUMNS = ("metric", "t", "value", "host", "gpu", "job", "labels")


def _table_rows(table: pa.Table) -> list[tuple]:
    return list(zip(*(table.column(name).to_pylist() for name in _COLUMNS)))


def _sample_rows(samples) -> list[tuple]:
    return [
        (s.metric, s.t, s.value, *sample_keys(s.labels, s.metric), orjson.dumps(s.labels).decode()) for s in samples
    ]


def test_the_sample_table_holds_the_samples_while_jobs_come_and_go_and_a_gpu_falls_off():
    twin = Twin(cluster_with_nodes(8), seed=2, scenarios=("xid79", "straggler"), start=START)
    listed = []
    for _ in range(40):
        twin.advance(60.0)
        rows = _table_rows(twin.sample_table())
        assert rows == _sample_rows(twin.samples())
        groups = [row for k in range(3) for row in _table_rows(twin.sample_table(scrape=(k, 3)))]
        assert sorted(groups, key=repr) == sorted(rows, key=repr)
        listed.append(set(twin.lustre_counters()))
    # The cases the kept rows must follow happened: jobs joined the Lustre listing, and left it.
    assert any(now - before for before, now in zip(listed, listed[1:]))
    assert any(before - now for before, now in zip(listed, listed[1:]))


def test_the_perfquery_table_holds_the_samples_poll_after_poll():
    twin = Twin(cluster_with_nodes(4), seed=0, scenarios=("ib_flap",), start=START)
    for _ in range(3):
        twin.advance(10.0)
        assert _table_rows(perfquery_table(twin)) == _sample_rows(perfquery_samples(twin))
