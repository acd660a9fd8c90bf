"""The NCCL log rules fire on their case and stay quiet on clean real logs; the views agree with the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcwatch.analysis.health import nccl_log_checks
from hpcwatch.analysis.nccl import NcclConfig, nccl_rules, summarize_nccl
from hpcwatch.cli import app
from hpcwatch.reports.nccl import nccl_report
from hpcwatch.sources.nccl_log import parse_nccl_log
from hpcwatch.vocab import EventKind

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"
CLEAN = [
    "h200_socket_1gpu_v2.28.9.log",
    "nccl_tests_185_roce_2node_v2.19.3.log",
    "nccl_447_gcp_socket_2node_v2.7.8.log",
    "nccl_983_ib_4hca_v2.13.4.log",
    "nccl_1357_ib_sharp_plugin_2node.log",
    "nccl_1027_1node_8gpu_p2p_shm.log",
    "nccl_1609_h800_nvls_channels.log",
    "nccl_1412_ib_16rank_init_complete.log",
]


def _lines(name: str) -> list[str]:
    return (DATA / name).read_text().splitlines()


def _rules(lines: list[str], **config) -> dict[str, list]:
    ranks = [dict(e.attrs) for e in parse_nccl_log(lines) if e.kind == EventKind.NCCL_RANK]
    out: dict[str, list] = {}
    for r in nccl_rules(summarize_nccl(ranks), config=NcclConfig(**config)):
        out.setdefault(r.rule, []).append(r)
    return out


@pytest.mark.parametrize("name", CLEAN)
def test_no_rule_fires_on_a_clean_real_log(name):
    fired = {rule: rs for rule, rs in _rules(_lines(name)).items() if any(r.verdict != "ok" for r in rs)}
    assert fired == {}


def test_socket_fallback_fires_on_a_real_log_with_an_ib_plugin_and_socket_transports():
    fired = _rules(_lines("nccl_952_ib_plugin_p2p_socket.log"))
    assert list(fired) == ["nccl_socket_fallback"]


def test_socket_fallback_fires_on_a_socket_log_only_when_the_nodes_have_ib():
    (noted,) = _rules(_lines("nccl_447_gcp_socket_2node_v2.7.8.log"))["nccl_socket_fallback"]
    assert noted.verdict == "ok"  # TCP between the two nodes is noted, not warned, without IB in sight
    fired = _rules(_lines("nccl_447_gcp_socket_2node_v2.7.8.log"), expect_ib=True)
    assert fired["nccl_socket_fallback"][0].hosts == ("slurm-train-compute-0-0", "slurm-train-compute-0-1")


def test_socket_fallback_fires_when_one_host_of_an_ib_job_uses_sockets():
    # The real RoCE log, with dgxh100-3's NET/IB line replaced by what a host without its HCAs prints.
    lines = [
        ln.replace(
            "NET/IB : Using [0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]; OOB enp220s0np0:11.1.128.128<0>",
            "NET/IB : No device found.",
        ).replace("2152299 [0] NCCL INFO Using network IB", "2152299 [0] NCCL INFO Using network Socket")
        for ln in _lines("nccl_tests_185_roce_2node_v2.19.3.log")
    ]
    fired = _rules(lines)
    assert fired["nccl_socket_fallback"][0].hosts == ("dgxh100-3",)
    assert fired["nccl_ib_missing"][0].hosts == ("dgxh100-3",) and fired["nccl_ib_missing"][0].verdict == "drain"


def test_ib_missing_fires_when_a_host_lists_fewer_hcas():
    lines = [
        ln.replace(
            "[0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]; OOB enp220s0np0:11.1.128.128",
            "[0]mlx5_10:1/RoCE [RO]; OOB enp220s0np0:11.1.128.128",
        )
        for ln in _lines("nccl_tests_185_roce_2node_v2.19.3.log")
    ]
    assert list(_rules(lines)) == ["nccl_ib_missing"]


def test_forced_tuning_fires_on_a_real_tree_threshold_log_and_on_nccl_algo():
    fired = _rules(_lines("nccl_367_docker_socket_tree_threshold.log"))
    assert fired["nccl_forced_tuning"][0].evidence["variables"] == {"NCCL_TREE_THRESHOLD": "0"}
    lines = _lines("h200_socket_1gpu_v2.28.9.log") + [
        "vm:607:607 [0] NCCL INFO NCCL_ALGO set by environment to Ring",
        "vm:607:607 [0] NCCL INFO NCCL_PROTO set by environment to Simple",
    ]
    assert _rules(lines)["nccl_forced_tuning"][0].evidence["variables"] == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}
    # a variable that only names the system (the interface) is not forcing tuning
    assert "nccl_forced_tuning" not in _rules(_lines("nv_peer_memory_56_ib_2node_v2.4.7.log"))


def test_few_channels_fires_below_the_topology_search_and_below_other_ranks():
    lines = [ln.replace("64 coll channels,", "4 coll channels,") for ln in _lines("h200_socket_1gpu_v2.28.9.log")]
    assert "fewer coll channels than the topology search found (4 < 32)" in _rules(lines)["nccl_few_channels"][0].title
    h800 = _lines("nccl_1609_h800_nvls_channels.log")
    h800 = [h800[0]] + [
        ln.replace("16 coll channels", "8 coll channels") if "1764 [1]" in ln else ln for ln in h800[1:]
    ]
    fired = _rules(h800)["nccl_few_channels"]
    assert fired[0].hosts == ("tj5-sc-ai-h800r-dev01",) and "8 < 16" in fired[0].title


def test_version_mismatch_fires_when_two_real_logs_of_different_versions_form_one_job():
    fired = _rules(_lines("nccl_447_gcp_socket_2node_v2.7.8.log") + _lines("nccl_983_ib_4hca_v2.13.4.log"))
    assert "2.13.4, 2.7.8" in fired["nccl_version_mismatch"][0].title
    assert "nccl_version_mismatch" not in _rules(_lines("nccl_226_aws_socket_64rank_v2.4.7.log"))


def test_health_checks_put_each_rule_on_its_hosts():
    lines = _lines("nccl_447_gcp_socket_2node_v2.7.8.log") + _lines("nccl_983_ib_4hca_v2.13.4.log")
    checks = nccl_log_checks(list(parse_nccl_log(lines)))
    assert {(c.node, c.rule) for c in checks} >= {
        ("slurm-train-compute-0-0", "nccl_version_mismatch"),
        ("slurm-train-compute-0-1", "nccl_socket_fallback"),
    }
    assert nccl_log_checks(list(parse_nccl_log(_lines("h200_socket_1gpu_v2.28.9.log")))) == []


def test_cli_json_agrees_with_the_report():
    path = DATA / "nccl_952_ib_plugin_p2p_socket.log"
    result = CliRunner().invoke(app, ["nccl", str(path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["rules"] == json.loads(json.dumps(nccl_report([path]).to_dict()["rules"]))
    human = CliRunner().invoke(app, ["nccl", str(path)])
    assert "nccl_socket_fallback" in human.stdout


def test_cli_refuses_a_file_of_another_format():
    other = Path(__file__).resolve().parents[1] / "data" / "health" / "ib_write_bw_ndr_gbits.out"
    result = CliRunner().invoke(app, ["nccl", str(other)])
    assert result.exit_code != 0
