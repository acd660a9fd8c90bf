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
    assert checks[0].evidence["version"] == "NVIDIA driver 470.141.10"
    assert checks[0].evidence["partition_versions"] == {"NVIDIA driver 580.82.07": 2, "NVIDIA driver 470.141.10": 1}


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


def test_amd_nodes_on_another_gpu_driver_or_vbios_warn():
    """The real device-metrics-exporter sample of an MI300X VF (driver 6.12.12, VBIOS 022.040.003.042.000001) on
    three hosts; one of them edited in memory to an older driver, another to another VBIOS."""
    from hpcwatch.sources.amd_exporter import parse_amd_exporter_text

    real = (DATA / "amd" / "dme_issue171_mi300x_vf_edge_temperature.prom").read_text()
    line = real.splitlines()[-1].replace("gpu_edge_temperature", "gpu_gfx_activity")
    texts = {
        "mi-a": line.replace('hostname="master-1"', 'hostname="mi-a"'),
        "mi-b": line.replace('hostname="master-1"', 'hostname="mi-b"').replace("6.12.12", "6.10.5"),
        "mi-c": line.replace('hostname="master-1"', 'hostname="mi-c"').replace("022.040.003.042", "022.041.003.043"),
    }
    samples = [s for text in texts.values() for s in parse_amd_exporter_text(text + "\n", t=100.0)]
    table = pa.Table.from_pylist(
        [{"metric": s.metric, "host": s.labels["hostname"], "labels": orjson.dumps(s.labels).decode()} for s in samples]
    )
    checks = {(c.node, c.rule): c for c in version_checks(table)}
    assert sorted(checks) == [("mi-b", "driver_mismatch"), ("mi-c", "firmware_mismatch")]
    assert checks["mi-b", "driver_mismatch"].evidence["version"] == "AMD GPU driver 6.10.5"
    assert "AMD GPU VBIOS 022.041.003.043.000001 differs" in checks["mi-c", "firmware_mismatch"].title
