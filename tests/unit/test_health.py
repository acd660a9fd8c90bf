"""Health rules: each fires on a real-format input, and stays quiet on a healthy one."""

from __future__ import annotations

import pytest

from hpcwatch.analysis.health import HealthConfig, active_checks, judge, passive_checks
from hpcwatch.records import Event, Sample
from hpcwatch.sources.healthtools import read_dcgmi_diag, read_ib_write_bw, read_nccl_tests
from hpcwatch.sources.infiniband import parse_perfquery
from hpcwatch.sources.prometheus_text import parse_prometheus_text
from hpcwatch.store import Store

T0 = 1_700_000_000.0
_BUS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")


def dcgm_line(
    metric: str,
    value: float,
    t: float,
    *,
    node: str = "node1",
    gpu: int = 0,
    job: str | None = None,
    model: str = "NVIDIA H100 80GB HBM3",
) -> str:
    """One dcgm-exporter sample line, labels as dcgm-exporter 3.x writes them, with a ms timestamp."""
    labels = (
        f'gpu="{gpu}",UUID="GPU-0f1e2d3c-4b5a-6978-8899-aabbccdd{gpu:04x}",'
        f'pci_bus_id="00000000:{_BUS[gpu]}:00.0",device="nvidia{gpu}",modelName="{model}",'
        f'Hostname="{node}",DCGM_FI_DRIVER_VERSION="550.90.07"'
    )
    if job:
        labels += f',hpc_job="{job}"'
    return f"{metric}{{{labels}}} {value:g} {int(t * 1000)}"


def node_ib_line(metric: str, value: float, t: float, *, node: str = "node1", device: str = "mlx5_1") -> str:
    """One node-exporter infiniband line as a Prometheus federating the node returns it."""
    return f'{metric}{{device="{device}",instance="{node}:9100",node="{node}",port="1"}} {value:g} {int(t * 1000)}'


def health_of(
    lines: list[str] = (), samples: list[Sample] = (), events: list[Event] = (), config: HealthConfig = HealthConfig()
):
    """Lines -> real parser -> store -> passive rules -> verdicts: the CLI's path."""
    with Store(":memory:") as store:
        store.add(parse_prometheus_text("\n".join(lines) + "\n", path="scrape.prom"))
        store.add(samples)
        table = store.samples()
    checks = passive_checks(table, events, config=config)
    return judge(checks, samples=table, events=events)


def verdict(report, node: str, rule: str) -> str:
    return next(c.verdict for c in report.node(node).checks if c.rule == rule)


def series(metric: str, values: list[float], *, step_s: float = 15.0, **kw) -> list[str]:
    return [dcgm_line(metric, v, T0 + i * step_s, **kw) for i, v in enumerate(values)]


# -- XID -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code, expected", [(79, "drain"), (48, "drain"), (95, "drain"), (13, "warn"), (94, "warn"), (999, "warn")]
)
def test_xid_verdict_follows_the_catalogue(code, expected):
    report = health_of(series("DCGM_FI_DEV_XID_ERRORS", [0, 0, code, code]))
    assert report.node("node1").verdict == expected
    (check,) = [c for c in report.node("node1").checks if c.rule == "xid"]
    assert check.evidence["xid"] == code and check.evidence["first_seen"] == T0 + 30


def test_no_xid_is_ok_and_says_it_looked():
    report = health_of(series("DCGM_FI_DEV_XID_ERRORS", [0, 0, 0]))
    assert report.node("node1").verdict == "ok" and verdict(report, "node1", "xid") == "ok"


def test_xid_from_the_kernel_log_event():
    events = [Event(kind="xid", t=T0, source="kernel", attrs={"node": "node7", "gpu": 1, "xid": 74})]
    report = health_of(events=events)
    assert report.node("node7").verdict == "drain"


# -- memory: ECC, row remapping --------------------------------------------------------------------


@pytest.mark.parametrize(
    "metric, values, rule, expected",
    [
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", [0, 2], "ecc_dbe", "drain"),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", [0, 0], "ecc_dbe", "ok"),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", [0, 1], "row_remap", "drain"),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", [0, 0], "row_remap", "ok"),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", [3, 4], "row_remap", "warn"),  # grew during the window
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", [3, 3], "row_remap", "ok"),  # old, already handled
        ("DCGM_FI_DEV_ROW_REMAP_PENDING", [1, 1], "row_remap", "warn"),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", [100, 180], "pcie_replay", "warn"),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", [100, 103], "pcie_replay", "ok"),  # a few replays: tolerated
    ],
)
def test_memory_and_pcie_counters(metric, values, rule, expected):
    report = health_of(series(metric, values, gpu=6))
    assert verdict(report, "node1", rule) == expected


# -- throttling --------------------------------------------------------------------------------


def test_thermal_throttling_warns_with_decoded_reasons():
    report = health_of(series("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", [0x4, 0x44, 0x44, 0x4]))
    (check,) = [c for c in report.node("node1").checks if c.rule == "throttle"]
    assert check.verdict == "warn" and check.evidence["reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]


def test_power_cap_alone_is_normal_under_load():
    report = health_of(series("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", [0x4, 0x4, 0x1, 0x4]))
    assert verdict(report, "node1", "throttle") == "ok"


# -- InfiniBand --------------------------------------------------------------------------------


@pytest.mark.parametrize("downs, expected", [([0, 0, 1], "warn"), ([0, 1, 3], "drain"), ([5, 5, 5], "ok")])
def test_node_exporter_link_downed(downs, expected):
    lines = [node_ib_line("node_infiniband_link_downed_total", v, T0 + 15 * i) for i, v in enumerate(downs)]
    assert verdict(health_of(lines), "node1", "ib_link") == expected


def test_perfquery_flap_and_symbol_errors(data_dir):
    text = (data_dir / "health" / "perfquery_hca_0x7cfe9003003b4b96.out").read_text()
    later = text.replace("LinkDownedCounter:...............0", "LinkDownedCounter:...............2").replace(
        "SymbolErrorCounter:..............0", "SymbolErrorCounter:..............57"
    )
    samples = [
        *parse_perfquery(text, path="a.out", node="node2", device="mlx5_0", t=T0),
        *parse_perfquery(later, path="b.out", node="node2", device="mlx5_0", t=T0 + 600),
    ]
    report = health_of(samples=samples)
    assert report.node("node2").verdict == "drain"
    assert verdict(report, "node2", "ib_link") == "drain" and verdict(report, "node2", "ib_errors") == "warn"
    quiet = health_of(
        samples=[
            *parse_perfquery(text, path="a.out", node="node2", t=T0),
            *parse_perfquery(text, path="a.out", node="node2", t=T0 + 600),
        ]
    )
    assert quiet.node("node2").verdict == "ok"
    assert {c.rule for c in quiet.node("node2").checks} == {"ib_link", "ib_errors"}


@pytest.mark.parametrize("symbols, expected", [([0, 40], "warn"), ([0, 3], "ok")])
def test_symbol_errors_need_more_than_a_few(symbols, expected):
    lines = [node_ib_line("node_infiniband_symbol_error_total", v, T0 + 60 * i) for i, v in enumerate(symbols)]
    assert verdict(health_of(lines), "node1", "ib_errors") == expected


# -- stalled collective, idle allocation, missing GPU -----------------------------------------------


def _util_power(util: list[float], power: list[float], **kw) -> list[str]:
    return series("DCGM_FI_DEV_GPU_UTIL", util, **kw) + series("DCGM_FI_DEV_POWER_USAGE", power, **kw)


def test_busy_gpu_at_idle_power_is_a_stalled_collective():
    report = health_of(_util_power([97, 100, 100, 100, 100, 100, 100, 100], [650, 80, 79, 80, 81, 80, 80, 79]))
    (check,) = [c for c in report.node("node1").checks if c.rule == "stalled_nccl"]
    assert check.verdict == "warn" and check.evidence["to"] - check.evidence["from"] == 90.0


@pytest.mark.parametrize(
    "util, power",
    [
        ([97] * 8, [650] * 8),  # busy and hot: training
        ([100, 100, 100, 100, 97, 97, 97, 97], [80, 80, 80, 650, 650, 650, 650, 650]),  # 45 s only
        ([0] * 8, [70] * 8),  # idle and cold: idle
    ],
)
def test_no_stall_when_power_follows_utilisation(util, power):
    assert verdict(health_of(_util_power(util, power)), "node1", "stalled_nccl") == "ok"


def test_unknown_gpu_model_is_not_judged_with_another_models_idle_power():
    report = health_of(_util_power([100] * 8, [80] * 8, model="NVIDIA Mystery X"))
    assert verdict(report, "node1", "stalled_nccl") == "ok"


def test_allocated_gpu_idle_for_ten_minutes():
    lines = series("DCGM_FI_DEV_GPU_UTIL", [0] * 45, job="4242")
    (check,) = [c for c in health_of(lines).node("node1").checks if c.rule == "idle_allocated"]
    assert check.evidence["job"] == "4242" and check.verdict == "warn"
    assert verdict(health_of(series("DCGM_FI_DEV_GPU_UTIL", [0] * 45)), "node1", "idle_allocated") == "ok"


def test_gpu_that_stops_reporting_drains_its_node():
    lines = series("DCGM_FI_DEV_GPU_UTIL", [97] * 20, gpu=0) + series("DCGM_FI_DEV_GPU_UTIL", [97] * 5, gpu=3)
    report = health_of(lines)
    (check,) = [c for c in report.node("node1").checks if c.rule == "gpu_missing"]
    assert check.verdict == "drain" and check.evidence["gpu"] == "3"
    assert verdict(health_of(series("DCGM_FI_DEV_GPU_UTIL", [97] * 20)), "node1", "gpu_missing") == "ok"


def test_missing_gpus_are_judged_against_their_own_node_in_host_then_gpu_order():
    """node10 went quiet as a whole (nothing missing there: its own GPUs are its newest); node2's GPU 5 and
    node1's GPUs 7 and 2 stopped while their nodes went on. Found in host, then GPU, text order."""
    util = "DCGM_FI_DEV_GPU_UTIL"
    lines = [
        *series(util, [97] * 20, node="node2", gpu=0),
        *series(util, [97] * 6, node="node2", gpu=5),
        *series(util, [97] * 5, node="node10", gpu=0),
        *series(util, [97] * 5, node="node10", gpu=1),
        *series(util, [97] * 4, node="node1", gpu=7),
        *series(util, [97] * 20, node="node1", gpu=1),
        *series(util, [97] * 3, node="node1", gpu=2),
    ]
    checks = [c for c in passive_checks(_table(lines), []) if c.rule == "gpu_missing"]
    assert [(c.node, c.evidence["gpu"]) for c in checks] == [("node1", "2"), ("node1", "7"), ("node2", "5")]
    newest = T0 + 19 * 15.0
    assert [c.evidence["node_last_seen"] for c in checks] == [newest] * 3
    assert [c.evidence["last_seen"] for c in checks] == [T0 + 2 * 15.0, T0 + 3 * 15.0, T0 + 5 * 15.0]
    assert checks[0].title == "GPU 2 stopped reporting 255 s ago"


def _table(lines: list[str]):
    with Store(":memory:") as store:
        store.add(parse_prometheus_text("\n".join(lines) + "\n", path="scrape.prom"))
        return store.samples()


# -- active checks ---------------------------------------------------------------------------------


def test_dcgmi_diag_failure_drains_and_warning_warns(data_dir):
    events = list(read_dcgmi_diag(data_dir / "health" / "dcgmi_diag_r3_dcgm4_fail.json", node="node2"))
    report = judge(active_checks(events), events=events)
    checks = [c for c in report.node("node2").checks if c.rule == "dcgm_diag"]
    assert report.node("node2").verdict == "drain"
    assert sorted((c.verdict, c.evidence["gpu"]) for c in checks) == [("drain", "5"), ("warn", "2")]


def test_dcgmi_diag_pass_and_skip_are_ok(data_dir):
    events = list(read_dcgmi_diag(data_dir / "health" / "dcgmi_diag_r1_dcgm3_pass.json", node="node1"))
    report = judge(active_checks(events), events=events)
    assert report.node("node1").verdict == "ok" and verdict(report, "node1", "dcgm_diag") == "ok"


def test_nccl_tests_at_nvlink_speed_are_ok(data_dir):
    events = list(read_nccl_tests(data_dir / "health" / "nccl_all_reduce_perf_1node_8xh100.out"))
    assert active_checks(events) == []


def test_nccl_tests_wrong_results_drain_and_slow_bus_warns(data_dir):
    events = list(read_nccl_tests(data_dir / "health" / "nccl_all_reduce_perf_2node_wrong.out"))
    checks = active_checks(events)
    assert sorted(c.verdict for c in checks) == ["drain", "warn"]
    slow = next(c for c in checks if c.verdict == "warn")
    assert slow.evidence["expected_gbs"] == pytest.approx(50.0)  # one NDR port per GPU across nodes


def test_ib_write_bw_near_ndr_is_ok_and_half_speed_drains(data_dir):
    good = list(read_ib_write_bw(data_dir / "health" / "ib_write_bw_ndr_gbits.out", node="node1"))
    bad = list(read_ib_write_bw(data_dir / "health" / "ib_write_bw_degraded_mbs.out", node="node2"))
    assert active_checks(good) == []
    (check,) = active_checks(bad)
    assert check.verdict == "drain" and check.node == "node2"
    assert active_checks(bad, link="hdr") == []  # the same 197 Gb/s is full speed on HDR


def test_each_node_verdict_event_names_its_own_rules_worst_first_by_name():
    from hpcwatch.reports.health import rule_verdicts, verdict_event_attrs

    lines = [
        *series("DCGM_FI_DEV_XID_ERRORS", [0, 0, 79, 79], node="node1", gpu=0),
        *series("DCGM_FI_DEV_XID_ERRORS", [0, 0, 13, 13], node="node1", gpu=1),
        *series("DCGM_FI_DEV_XID_ERRORS", [0, 0, 0, 0], node="node2", gpu=0),
    ]
    report = health_of(lines)
    attrs = {a["node"]: a for a in verdict_event_attrs(report)}
    assert attrs["node1"]["verdict"] == "drain" and attrs["node1"]["rules"]["xid"] == "drain"
    assert attrs["node2"]["verdict"] == "ok" and attrs["node2"]["rules"].get("xid", "ok") == "ok"
    for node, a in attrs.items():
        mine = {rule: v for (n, rule), v in rule_verdicts(report).items() if n == node}
        assert a["rules"] == mine and list(a["rules"]) == sorted(mine)
