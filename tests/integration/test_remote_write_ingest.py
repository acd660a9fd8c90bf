"""``hpcwatch ingest FILES --remote-write URL`` into a real Prometheus and a real VictoriaMetrics
(``promql_backend``): read back through PromQL, the points are the file's, value and timestamp.

Inputs are real scrapes (tests/data/SOURCES.md): dcgm-exporter on an H100 in MIG mode (dcgm-exporter
issue 512), on an L40S under OpenShift (DCGM issue 226), node-exporter's own e2e fixture. They carry no
timestamps, so the reader dates them by the file's write time: the copies are touched to now, inside
the window both receivers accept.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from .conftest import wait_until

pytestmark = pytest.mark.integration

PROMETHEUS_PORT = 29099
DATA = Path(__file__).resolve().parents[1] / "data" / "prometheus"
REAL_SCRAPES = (
    "dcgm_exporter_h100_mig_kubernetes_issue512.prom",
    "dcgm_exporter_l40s_kubernetes_dcgm226.prom",
    "node_exporter_e2e_numa_drbd_infiniband.prom",
)
KEY_COLUMNS = ["metric", "t", "value", "host", "gpu", "job"]
HOST = "gpu-node-7"


def test_ingest_remote_write_sends_every_point_of_real_scrapes(start_promql, tmp_path):
    from hpcwatch.promql import PrometheusBackend
    from hpcwatch.sources.registry import read_input
    from hpcwatch.store import Store

    server = start_promql("global: {scrape_interval: 15s}\nscrape_configs: []\n", port=PROMETHEUS_PORT)
    now_s = int(time.time())
    files = []
    for k, name in enumerate(REAL_SCRAPES):
        shutil.copy(DATA / name, tmp_path / name)
        os.utime(tmp_path / name, (now_s - 10 * k, now_s - 10 * k))  # whole seconds: ms-exact in both
        files.append(str(tmp_path / name))
    out = subprocess.run(
        [sys.executable, "-m", "hpcwatch", "ingest", *files, "--host", HOST, "--remote-write", server.url, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["status"] == {"sent": 3}
    want = Store(":memory:")
    for path in files:
        want.add(read_input(path, host=HOST))
    metrics = sorted(set(want.samples()["metric"].to_pylist()))
    assert doc["samples"] == want.samples().num_rows > 10
    with PrometheusBackend(server.url) as prom:
        t0, t1 = now_s - 60, now_s + 1
        wait_until(
            lambda: prom.samples(metrics, t0=t0, t1=t1).num_rows == doc["samples"],
            timeout_s=15,
            what="the written samples to be searchable",
        )
        got = prom.samples(metrics, t0=t0, t1=t1)
    # Rows equal in (metric, host, gpu, t) may come in any order (series of one node-exporter family
    # differ by zone or peer labels only): compare as sorted lists of whole rows.
    assert _rows(got) == _rows(want.samples(metrics))


def _rows(table) -> list[tuple]:
    return sorted(
        (*(row[k] for k in KEY_COLUMNS), orjson.dumps(orjson.loads(row["labels"]), option=orjson.OPT_SORT_KEYS))
        for row in table.to_pylist()
    )
