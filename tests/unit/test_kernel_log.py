"""The kernel log read and judged: NVRM Xid (by the existing ``xid`` rule), hung tasks, OOM kills, hardware errors.

Real captures (tests/data/SOURCES.md): ``dmesg -T`` Xid 31 and 48 lines from GCM's tests; ``dmesg -t`` hung
task and memory-cgroup OOM kill from node-problem-detector's kernel log generator; x86 machine checks, EDAC and
APEI GHES lines pasted in issue threads and notes (corrected bank 6 checks of a NUC, an uncorrected bank 4 check
logged at boot, an sbridge memory CE, a CE with its GHES record). The journal and syslog forms of the other
messages wrap those real messages in memory; the GHES fatal line and the machine-check status words of
``test_machine_check_status_bits_decide_the_verdict`` are written from the formats."""

from __future__ import annotations

import pytest

from hpcwatch.analysis.health import health_report
from hpcwatch.errors import ParseError
from hpcwatch.sources.kernel_log import parse_kernel_log, read_kernel_log
from hpcwatch.store import Store
from hpcwatch.vocab import EventKind
from tests.conftest import DATA

K = DATA / "kernel_log"
XID = K / "dmesg_T_nvrm_xid_31_48_gcm.txt"
HUNG = K / "dmesg_t_hung_task_docker_npd.txt"
OOM = K / "dmesg_t_oom_kill_memcg_npd.txt"


def _node(events, node="gpu07"):
    with Store(":memory:") as store:
        table = store.samples()
    return health_report(table, list(events)).node(node)


def _fired(node_health) -> dict[str, str]:
    return {c.rule: c.verdict for c in node_health.checks if c.verdict != "ok"}


def test_real_xid_lines_become_xid_events_the_xid_rule_judges():
    events = list(read_kernel_log(XID, node="gpu07"))
    assert [(e.kind, e.attrs["xid"], e.attrs["gpu"], e.attrs["pid"]) for e in events] == [
        (EventKind.XID, 31, "000d:00:00", 3234),
        (EventKind.XID, 48, "000d:00:00", 3234),
    ]
    assert events[0].t == 1665759409.0  # [Fri Oct 14 14:56:49 2022], read as UTC
    node = _node(events)
    xids = {c.evidence["xid"]: c.verdict for c in node.checks if c.rule == "xid"}
    assert xids == {31: "warn", 48: "drain"}  # NVIDIA's catalogue: 31 restart the app, 48 (DBE) reset the GPU


def test_real_hung_task_and_oom_kill_warn_once_each():
    hung = list(read_kernel_log(HUNG, node="gpu07"))
    assert [(e.kind, e.attrs["task"], e.attrs["pid"], e.attrs["blocked_s"]) for e in hung] == [
        (EventKind.KERNEL_HUNG_TASK, "docker", 20744, 120)
    ]
    oom = list(read_kernel_log(OOM, node="gpu07"))  # "Kill process 1012" then "Killed process 1012": one kill
    assert [(e.kind, e.attrs["pid"], e.attrs["process"], e.attrs["cgroup"]) for e in oom] == [
        (EventKind.KERNEL_OOM_KILL, 1012, "heapster", True)
    ]
    node = _node(hung + oom)
    assert _fired(node) == {"hung_task": "warn", "oom_kill": "warn"}
    assert "docker:20744" in node.reason() and "heapster:1012" in node.reason()


def test_journal_and_syslog_lines_name_their_host_and_time():
    message = HUNG.read_text().split("\n")[0]
    syslog = f"Mar  5 08:31:52 gpu09 kernel: [10359910.034733] {message}\n"
    (e,) = parse_kernel_log(syslog, node="ignored", t=1_709_600_000.0)  # 2024-03-05: the year of the file
    assert e.attrs["node"] == "gpu09" and e.t == 1709627512.0 and e.attrs["uptime_s"] == 10359910.034733
    iso = f"2024-03-05T08:31:52+0000 gpu10 kernel: {message}\n"
    (e,) = parse_kernel_log(iso)
    assert e.attrs["node"] == "gpu10" and e.t == 1709627512.0
    (e,) = parse_kernel_log(f"[ 4711.25] {message}\n", node="gpu07", t=5.0)
    assert e.t == 5.0 and e.attrs["uptime_s"] == 4711.25  # raw dmesg: seconds since boot, dated by the file


def test_hardware_errors_warn_when_corrected_and_drain_when_fatal():
    corrected = "[Mon Mar  4 10:00:00 2024] {1}[Hardware Error]: event severity: corrected\n"
    fatal = "[Mon Mar  4 10:05:00 2024] {2}[Hardware Error]: event severity: fatal\n"
    edac = "[Mon Mar  4 10:06:00 2024] EDAC MC0: 1 UE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0\n"
    assert _fired(_node(parse_kernel_log(corrected, node="gpu07"))) == {"hw_error": "warn"}
    node = _node(parse_kernel_log(corrected + fatal + edac, node="gpu07"))
    assert node.verdict == "drain" and {c.verdict for c in node.checks if c.rule == "hw_error"} == {"warn", "drain"}


def test_boot_chatter_is_skipped_and_a_huge_pid_is_one_line(tmp_path):
    assert list(parse_kernel_log("[    0.000000] Linux version 6.8.0-45-generic\nrandom text\n", node="n")) == []
    path = tmp_path / "dmesg.txt"
    path.write_text(
        "[    1.0] Linux version 6.8.0\n[    2.0] INFO: task x:" + "9" * 30 + " blocked for more than 120 seconds.\n"
    )
    with pytest.raises(ParseError) as err:
        list(read_kernel_log(path))
    assert str(err.value).startswith(f"{path}:2: pid is not a whole number within 64 bits")
    bad: list[ParseError] = []
    assert list(read_kernel_log(path, on_bad_line=bad.append)) == [] and len(bad) == 1


MLX5_TIMEOUT = K / "dmesg_pdsh_mlx5_cmd_timeout_ucx_7738.txt"
MLX5_PROBE = K / "dmesg_mlx5_probe_failed_rp_ext_129.txt"


def test_real_mlx5_command_timeouts_drain_the_node():
    events = [e for e in read_kernel_log(MLX5_TIMEOUT, node="b1360") if e.kind == EventKind.KERNEL_NIC_ERROR]
    # the three "timeout. Will cause a leak of a command resource" lines; "No done completion" alone is not judged
    assert [(e.attrs["device"], e.attrs["pattern"], e.attrs["severity"], e.attrs["line"]) for e in events] == [
        ("0000:61:00.0", "cmd_timeout", "fatal", 3),
        ("0000:61:00.0", "cmd_timeout", "fatal", 5),
        ("0000:61:00.0", "cmd_timeout", "fatal", 8),
    ]
    node = _node(events, "b1360")
    assert _fired(node) == {"nic_driver": "drain"}
    assert "3 mlx5_core driver error(s) (0000:61:00.0 cmd_timeout)" in node.reason()


def test_real_mlx5_probe_failure_drains_and_boot_chatter_is_skipped():
    events = list(read_kernel_log(MLX5_PROBE, node="nas1"))
    assert [(e.attrs["pattern"], e.attrs["line"]) for e in events] == [("load_failed", 3), ("load_failed", 4)]
    assert _fired(_node(events, "nas1")) == {"nic_driver": "drain"}


@pytest.mark.parametrize(
    "line, pattern, verdict",
    [
        ("mlx5_core 0000:b5:00.0: mlx5e_tx_timeout_work:133:(pid 0): TX timeout detected", "tx_timeout", "warn"),
        (
            "mlx5_core 0000:17:00.0: poll_health:801: device's health compromised - reached miss count",
            "health_compromised",
            "drain",
        ),
        ("mlx5_core 0000:17:00.0: Detected insufficient power on the PCIe slot (27W).", "insufficient_power", "warn"),
    ],
)
def test_mlx5_patterns_in_a_journal_line(line, pattern, verdict):
    text = f"2024-03-05T08:31:52+0000 gpu07 kernel: {line}\n"
    (event,) = parse_kernel_log(text)
    assert event.attrs["pattern"] == pattern and event.attrs["node"] == "gpu07"
    assert _fired(_node([event])) == {"nic_driver": verdict}


def test_hostile_mlx5_lines_are_bounded_and_not_judged_without_a_pattern():
    text = "mlx5_core \x1b[31m0000:zz:00.0: " + "A" * 100_000 + "\nmlx5_core: link up\nnot mlx5_core timeout\n"
    assert list(parse_kernel_log(text, node="n")) == []


MCE_CORRECTED = K / "syslog_mce_bank6_corrected_nuc6_ha_os_2989.txt"
MCE_AT_BOOT = K / "syslog_mce_bank4_uncorrected_at_boot_mcelog_70.txt"
MCE_SBRIDGE = K / "dmesg_T_mce_sbridge_edac_ce_edac_utils_10.txt"
EDAC_GHES = K / "syslog_edac_mc2_ce_ghes_corrected_liaosirui.txt"


def test_real_corrected_machine_checks_warn_with_cpu_bank_and_status():
    events = list(read_kernel_log(MCE_CORRECTED, t=1_700_000_000.0))  # the log's year, 2023, from the file
    assert [(e.attrs["cpu"], e.attrs["bank"], e.attrs["severity"], e.attrs["line"]) for e in events] == [
        (2, 6, "corrected", 1),
        (3, 6, "corrected", 4),
        (1, 6, "corrected", 7),
    ]  # the TSC / PROCESSOR lines after each are the same check, not counted again
    assert events[0].t == 1702475168.0  # Dec 13 13:46:08: the TIME the kernel printed on the PROCESSOR line
    node = _node(events, "homeassistant")
    assert _fired(node) == {"hw_error": "warn"} and "3 corrected hardware error(s)" in node.reason()


def test_real_uncorrected_machine_check_drains_from_a_log_without_its_host_name():
    events = list(read_kernel_log(MCE_AT_BOOT, node="gpu07", t=1_537_000_000.0))
    # "Sep 16 19:51:15 kernel: ..." (host name cut when pasted): dated by the line, the node from --host
    assert [(e.attrs["source"], e.attrs["severity"], e.attrs.get("status")) for e in events] == [
        ("mce", "logged", None),
        ("mce", "fatal", "a600000000020408"),  # UC (bit 61) and PCC (bit 57) set
    ]
    assert events[0].t == 1537127475.0 and events[1].attrs["uptime_s"] == 0.064265
    node = _node(events)
    assert node.verdict == "drain" and {c.verdict for c in node.checks if c.rule == "hw_error"} == {"warn", "drain"}


def test_real_edac_echo_of_a_machine_check_is_counted_once():
    events = list(read_kernel_log(MCE_SBRIDGE, node="gpu07"))
    # "events logged", then the EDAC driver's own CE line; its "Machine Check Event" echo is not a second error
    assert [(e.attrs["source"], e.attrs["severity"], e.attrs["line"]) for e in events] == [
        ("mce", "logged", 1),
        ("edac", "corrected", 8),
    ]
    assert _fired(_node(events)) == {"hw_error": "warn"}
    ghes = list(read_kernel_log(EDAC_GHES))
    assert [(e.attrs["node"], e.attrs["source"], e.attrs["severity"]) for e in ghes] == [
        ("bak-data-server-112", "edac", "corrected"),
        ("bak-data-server-112", "ghes", "corrected"),
    ]


def test_machine_check_status_bits_decide_the_verdict():
    line = "[ 9.0] mce: [Hardware Error]: CPU 12: Machine Check Exception: 5 Bank {bank}: {status}\n"
    corrected = parse_kernel_log(line.format(bank=17, status="9c20400000000000"), node="gpu07")  # UC=0
    uncorrected = parse_kernel_log(line.format(bank=17, status="bc20000000000000"), node="gpu07")  # UC=1, PCC=0
    assert [e.attrs["severity"] for e in corrected] == ["corrected"]
    assert [e.attrs["severity"] for e in uncorrected] == ["uncorrected"]
    assert _fired(_node(parse_kernel_log(line.format(bank=4, status="b200000000070f0f"), node="gpu07"))) == {
        "hw_error": "drain"
    }
