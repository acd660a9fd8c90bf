"""Readers that feed attribution: node-exporter's ``node`` label (NUMA, DRBD) is not a host, and a saved
node-exporter file gets its host from the ingest context (``--host``), on real node_exporter fixtures."""

from __future__ import annotations

import orjson
import pytest

from hpcwatch.ingest import ingest_paths
from hpcwatch.schemas import sample_keys
from hpcwatch.sources.prometheus_text import read_prometheus_columns, read_prometheus_text
from hpcwatch.store import Store
from tests.conftest import DATA

NODE_EXPORTER = DATA / "prometheus/node_exporter_e2e_numa_drbd_infiniband.prom"


@pytest.mark.parametrize(
    ("metric", "labels", "host"),
    [
        # NUMA node 0 of node_exporter's meminfo_numa collector: not a host
        ("node_memory_numa_numa_hit_total", {"node": "0"}, None),
        # zoneinfo and buddyinfo: NUMA node again
        ("node_zoneinfo_nr_free_pages", {"node": "1", "zone": "Normal"}, None),
        ("node_buddyinfo_blocks", {"node": "0", "size": "3", "zone": "DMA32"}, None),
        # DRBD peers "local"/"remote"
        ("node_drbd_node_role_is_primary", {"device": "drbd1", "node": "remote"}, None),
        # ... but the scrape's instance still names the host of those series
        ("node_memory_numa_numa_hit_total", {"node": "0", "instance": "gpu3:9100"}, "gpu3"),
        # the node label of every other series is a host (our ingest tag, Kubernetes relabelling)
        ("node_infiniband_port_data_received_bytes_total", {"node": "gpu3", "device": "mlx5_0"}, "gpu3"),
        # no metric given: the old rule (node is a host)
        (None, {"node": "0"}, "0"),
    ],
)
def test_node_label_is_a_host_except_in_numa_and_drbd_families(metric, labels, host) -> None:
    assert sample_keys(labels, metric)[0] == host


def test_real_node_exporter_fixture_has_no_fake_hosts_on_either_path() -> None:
    samples = list(read_prometheus_text(NODE_EXPORTER, t=0.0))
    assert any(s.labels.get("node") == "remote" for s in samples)  # the fixture does hold them
    assert {sample_keys(s.labels, s.metric)[0] for s in samples} == {None}
    (table,) = list(read_prometheus_columns(NODE_EXPORTER, t=0.0))
    assert table.num_rows == len(samples) and table.column("host").null_count == table.num_rows


def test_ingest_with_host_names_every_series_and_keeps_the_numa_node(tmp_path) -> None:
    with Store(tmp_path / "s") as store:
        ingest_paths(store, [NODE_EXPORTER], host="gpu7")
        table = store.samples(["node_infiniband_port_data_received_bytes_total", "node_memory_numa_numa_hit_total"])
    rows = table.to_pylist()
    assert rows and {r["host"] for r in rows} == {"gpu7"}
    numa = [orjson.loads(r["labels"]) for r in rows if r["metric"].startswith("node_memory_numa")]
    assert {lab["node"] for lab in numa} == {"0", "1", "2"}  # the NUMA node kept ...
    assert {lab["instance"] for lab in numa} == {"gpu7"}  # ... the host beside it
    ib = [orjson.loads(r["labels"]) for r in rows if "infiniband" in r["metric"]]
    assert {lab["node"] for lab in ib} == {"gpu7"} and {lab["device"] for lab in ib} == {"mlx4_0"}
