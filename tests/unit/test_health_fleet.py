"""Fleet consistency: a node whose NVIDIA driver differs from its partition's, from the driver label every
dcgm-exporter sample carries.

Real scrapes (tests/data/SOURCES.md): an RTX A4000 on 580.82.07 (dcgm-exporter issue 568) and a DGX A100 on
470.141.10 (tub.ai's README); the second RTX node is the first scrape with its Hostname label edited in memory."""

from __future__ import annotations

import orjson
import pyarrow as pa
from click.testing import CliRunner

from hpcwatch.analysis.health import health_report, version_checks
from hpcwatch.cli import app
from hpcwatch.sources.prometheus_text import parse_prometheus_columns
from tests.conftest import DATA

PROM = DATA / "prometheus"
RTX = PROM / "dcgm_exporter_rtx_a4000_580_gpu_util_issue568.prom"
DGX = PROM / "dcgm_exporter_dgx_a100_470_power_tubai.prom"


def _scrapes() -> pa.Table:
    rtx = RTX.read_text()
    return pa.concat_tables(
        [
            parse_prometheus_columns(rtx, path=str(RTX), t=100.0),
            parse_prometheus_columns(rtx.replace('Hostname="xxxxx"', 'Hostname="rtx2"'), path="rtx2", t=100.0),
            parse_prometheus_columns(DGX.read_text(), path=str(DGX), t=100.0),
        ]
    )


def test_the_node_on_another_driver_than_its_partition_warns():
    checks = version_checks(_scrapes())
    assert [(c.node, c.rule, c.verdict) for c in checks] == [("NvidiaDGXA100", "driver_mismatch", "warn")]
    assert checks[0].evidence["driver"] == "470.141.10"
    assert checks[0].evidence["partition_drivers"] == {"580.82.07": 2, "470.141.10": 1}


def test_partitions_are_compared_apart_and_a_tie_warns_every_node():
    apart = {"xxxxx": "gpu", "rtx2": "gpu", "NvidiaDGXA100": "old"}
    assert version_checks(_scrapes(), apart) == []  # one node alone in "old": nothing to compare it with
    tie = {"xxxxx": "gpu", "NvidiaDGXA100": "gpu", "rtx2": "other"}
    assert sorted(c.node for c in version_checks(_scrapes(), tie)) == ["NvidiaDGXA100", "xxxxx"]


def test_health_report_judges_it_and_the_cli_shows_it_for_one_node(tmp_path):
    node = health_report(_scrapes()).node("NvidiaDGXA100")
    assert node.verdict == "warn" and "driver_mismatch: NVIDIA driver 470.141.10" in node.reason()
    db = str(tmp_path / "store")
    files = {  # written now: a saved scrape is dated by its file, and the health window ends at the newest
        "rtx1.prom": RTX.read_text(),
        "rtx2.prom": RTX.read_text().replace('Hostname="xxxxx"', 'Hostname="rtx2"'),
        "dgx.prom": DGX.read_text(),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    runner = CliRunner()
    assert runner.invoke(app, ["ingest", "--db", db, *(str(tmp_path / n) for n in files)]).exit_code == 0
    result = runner.invoke(app, ["health", "--db", db, "--node", "NvidiaDGXA100", "--json"])
    assert result.exit_code == 0, result.output
    (one,) = orjson.loads(result.output)["nodes"]
    assert one["verdict"] == "warn" and any(c["rule"] == "driver_mismatch" for c in one["checks"])
