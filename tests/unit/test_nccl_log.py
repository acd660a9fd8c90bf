"""The NCCL_DEBUG=INFO reader on real logs from NCCL's, nccl-tests' and users' public issues (tests/data/nccl/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcwatch.errors import ParseError
from hpcwatch.sources.nccl_log import is_nccl_log, parse_nccl_log, read_nccl_log
from hpcwatch.sources.registry import detect
from hpcwatch.vocab import EventKind

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"
LOGS = sorted(DATA.glob("*.log"))


def _ranks(name: str) -> list[dict]:
    return [dict(e.attrs) for e in read_nccl_log(DATA / name) if e.kind == EventKind.NCCL_RANK]


def _one(name: str, host: str, dev: int = 0) -> dict:
    return next(r for r in _ranks(name) if r["host"] == host and r["cuda_dev"] == dev)


def test_there_are_at_least_five_real_logs():
    assert len(LOGS) >= 5


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_every_real_log_is_recognised_and_read_strictly(path):
    assert detect(path).name == "nccl-log"
    events = list(read_nccl_log(path))  # strict: any bad line would raise
    assert events


def test_h200_log_gives_version_driver_network_channels_bus_id():
    r = _one("h200_socket_1gpu_v2.28.9.log", "vm")
    assert (r["version"], r["cuda_runtime"], r["cuda_driver"]) == ("2.28.9", "13.0", 13000)
    assert (r["rank"], r["nranks"], r["bus_id"]) == (0, 1, "60")
    assert r["network"] == "Socket" and r["ib_none"] and r["socket_ifs"] == ["eth0"]
    assert (r["coll_channels"], r["pattern_channels"], r["rings"], r["trees"]) == (64, 32, 64, 64)
    assert r["net_speed_gbs"] == {"0": 1.2}
    assert r["comm_ids"] == {"0xea9d5be195da064d": 0}


def test_roce_two_node_log_gives_devices_per_host_and_bare_version_line():
    a = _one("nccl_tests_185_roce_2node_v2.19.3.log", "dgxh100-4")
    b = _one("nccl_tests_185_roce_2node_v2.19.3.log", "dgxh100-3")
    assert a["version"] == "2.19.3" and a["cuda_runtime"] == "12.3"  # printed bare, after dgxh100-4's line
    assert b["version"] is None
    assert [(d["name"], d["link"]) for d in b["ib_devices"]] == [("mlx5_10", "RoCE"), ("mlx5_11", "RoCE")]
    assert a["network"] == b["network"] == "IB"
    assert (b["rings"], b["trees"]) == (4, 4)


def test_sharp_plugin_and_four_ib_devices():
    r = _one("nccl_1357_ib_sharp_plugin_2node.log", "qh100-gpu19", 3)
    assert r["network"] == "IBext" and all(d["sharp"] for d in r["ib_devices"]) and len(r["ib_devices"]) == 4
    assert _one("nccl_1357_ib_sharp_plugin_2node.log", "qh100-gpu20")["net_plugin"] == "NCCL RDMA Plugin v6 (v6)"


def test_transports_are_counted_per_kind():
    socket = _one("nccl_952_ib_plugin_p2p_socket.log", "<cluster_name>", 7)
    assert socket["transports"] == {"NET/Socket": 2, "P2P": 2}
    shm = _one("nccl_1027_1node_8gpu_p2p_shm.log", "UIBE-DC-GPUSVR-01", 3)
    assert shm["transports"] == {"SHM": 1}
    old = _one("nccl_226_aws_socket_64rank_v2.4.7.log", "ip-172-31-11-92")
    assert old["transports"] == {"NET/Socket": 1} and old["rings"] == 1


def test_ranks_and_bus_ids_from_init_lines_of_two_nccl_generations():
    new = {r["rank"]: r["bus_id"] for r in _ranks("nccl_1412_ib_16rank_init_complete.log") if r["rank"] is not None}
    assert new == {6: "c8000", 4: "88000", 0: "7000", 1: "b000", 5: "8b000"}
    old = {
        r["rank"]: (r["nranks"], r["bus_id"])
        for r in _ranks("deepspeedexamples_310_ib_async_warn.log")
        if r["rank"] is not None
    }
    assert old[7] == (8, "d6000") and len(old) == 8


def test_channel_line_with_nvls_counts():
    r = _one("nccl_1609_h800_nvls_channels.log", "tj5-sc-ai-h800r-dev01", 2)
    assert (r["coll_channels"], r["nvls_channels"], r["collnet_channels"], r["p2p_channels"]) == (16, 16, 0, 16)


def test_environment_variables_set():
    assert _one("nv_peer_memory_56_ib_2node_v2.4.7.log", "master_node")["env"] == {"NCCL_IB_DISABLE": "0"}
    env = [r["env"] for r in _ranks("nccl_367_docker_socket_tree_threshold.log") if r["env"]]
    assert env and all(e == {"NCCL_TREE_THRESHOLD": "0"} for e in env)


def test_warn_lines_are_events_with_their_source_line():
    warns = [
        e.attrs
        for e in read_nccl_log(DATA / "deepspeedexamples_310_ib_async_warn.log")
        if e.kind == EventKind.NCCL_WARN
    ]
    assert len(warns) == 4
    assert warns[0]["where"] == "transport/net_ib.cc:93"
    assert warns[0]["message"] == "NET/IB : Got async event : client reregistration"


def test_watchdog_timeouts_name_rank_seq_op():
    out = [
        e.attrs
        for e in read_nccl_log(DATA / "llamafactory_7396_watchdog_timeout.log")
        if e.kind == EventKind.NCCL_TIMEOUT
    ]
    assert [(o["rank"], o["seq"], o["op"], o["timeout_ms"]) for o in out] == [
        (0, 1580, "ALLREDUCE", 600000),
        (4, 1580, "ALLREDUCE", 600000),
    ]
    assert out[0]["numel_in"] == 466119168 and out[0]["ran_ms"] == 600060


def test_lines_it_does_not_know_are_skipped_not_errors():
    assert list(parse_nccl_log(["hello", "vm:1:1 [0] NCCL INFO something new in 2.99"])) != []
    assert list(parse_nccl_log(["no nccl here", ""])) == []


BAD = [
    # rank is not a number
    "h:1:1 [0] NCCL INFO comm 0x1 rank x nranks 8 cudaDev 0 busId 1000 - Init COMPLETE",
    # a watchdog line cut before its WorkNCCL(...)
    "[rank0]:[E1 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: WorkNC",
]


@pytest.mark.parametrize("line", BAD)
def test_bad_lines_raise_when_strict_and_are_reported_when_lenient(line):
    with pytest.raises(ParseError) as err:
        list(parse_nccl_log([line], path="x.log"))
    assert "x.log:1" in str(err.value)
    seen: list[ParseError] = []
    list(parse_nccl_log(["h:1:1 [0] NCCL INFO Using network IB", line], path="x.log", on_bad_line=seen.append))
    assert len(seen) == 1 and seen[0].line == 2


def test_sniff_does_not_take_nccl_tests_output_or_plain_text():
    health = Path(__file__).resolve().parents[1] / "data" / "health" / "nccl_all_reduce_perf_2node_wrong.out"
    assert detect(health).name == "nccl-tests"
    assert not is_nccl_log("NCCL is a library\nINFO: nothing\n")
