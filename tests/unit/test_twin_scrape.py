"""The live twin scrapes a large cluster's nodes in turn (twin/live.py ``scrape_s``), as a Prometheus spreads its
targets over its interval: each tick writes one group's rows, the groups partition the full tick exactly,
the first tick writes every node, and each node's rows come once per interval."""

from __future__ import annotations

import contextlib

import pyarrow as pa
import pytest

from hpcwatch.errors import ConfigError
from hpcwatch.twin import Twin
from hpcwatch.twin.live import LiveTwin, scrape_interval_s
from hpcwatch.web.demo import cluster_with_nodes


class _Tables:
    def __init__(self) -> None:
        self.tables: list[pa.Table] = []

    def add(self, records) -> None:
        list(records)

    def add_sample_table(self, table: pa.Table) -> None:
        if "DCGM_FI_DEV_GPU_UTIL" in table.column("metric").to_pylist():
            self.tables.append(table)

    def add_span_table(self, table: pa.Table) -> None:
        pass

    @contextlib.contextmanager
    def transaction(self):
        yield self


def _rows(table: pa.Table) -> list[tuple]:
    return sorted(
        zip(*(table.column(name).to_pylist() for name in ("metric", "host", "gpu", "job", "labels", "value")))
    )


def test_the_scrape_groups_partition_a_tick_exactly():
    twin = Twin(cluster_with_nodes(6), seed=1, scenarios=("straggler",))
    twin.advance(3.0)
    whole = _rows(twin.sample_table())
    groups = [_rows(twin.sample_table(scrape=(k, 3))) for k in range(3)]
    assert sorted(row for group in groups for row in group) == whole
    hosts = [{row[1] for row in group if row[0].startswith("DCGM")} for group in groups]
    assert hosts == [{"node1", "node4"}, {"node2", "node5"}, {"node3", "node6"}]
    assert all(any(row[0].startswith("lustre") for row in group) for group in groups)  # OSTs spread too


def test_the_live_twin_writes_every_node_first_then_a_group_a_tick():
    sink = _Tables()
    live = LiveTwin(sink, cluster_with_nodes(4), seed=0, scrape_s=2.0, start=1_796_000_000.0)
    assert live.scrape_groups == 2
    live.write_tick()
    for _ in range(4):
        live.step()
    hosts = [sorted(set(t.column("host").to_pylist()) - {None}) for t in sink.tables]
    assert hosts[0] == ["node1", "node2", "node3", "node4"]
    assert hosts[1:] == [["node2", "node4"], ["node1", "node3"], ["node2", "node4"], ["node1", "node3"]]


def test_the_default_interval_grows_with_the_cluster_and_a_fast_twin_scrapes_every_tick():
    assert [scrape_interval_s(n) for n in (2, 128, 129, 1024)] == [1.0, 1.0, 2.0, 8.0]
    fast = LiveTwin(_Tables(), cluster_with_nodes(2), seed=0, speed=20.0, scrape_s=8.0)
    assert fast.scrape_groups == 1  # a tick is 20 simulated seconds: longer than the interval
    with pytest.raises(ConfigError, match="scrape_s"):
        LiveTwin(_Tables(), cluster_with_nodes(2), seed=0, scrape_s=0.0)
