"""Reader of the kernel log (``dmesg``, ``dmesg -T``, ``dmesg -t``, ``journalctl -k``, syslog's kernel lines).

The lines the health rules judge become events; every other line (boot chatter, call traces) is skipped:

- ``NVRM: Xid (PCI:0000:18:00): 79, pid=..., <text>`` -> an ``xid`` event (attrs ``xid``, ``gpu``: the PCI
  address the driver names, ``pid``, ``message``): the existing ``xid`` rule judges it by NVIDIA's catalogue;
- ``INFO: task <comm>:<pid> blocked for more than <N> seconds.`` (kernel/hung_task.c) -> ``kernel_hung_task``;
- ``Killed process <pid> (<comm>) total-vm:...`` and ``Memory cgroup out of memory: Kill(ed) process ...``
  (mm/oom_kill.c) -> ``kernel_oom_kill`` (attrs ``pid``, ``process``, ``cgroup``: a memory cgroup's limit,
  as Slurm's, rather than the whole node);
- ``[Hardware Error]: event severity: corrected|recoverable|fatal`` (APEI GHES, UEFI CPER) and EDAC's
  ``EDAC MC<n>: <k> CE|UE ...`` / ``CE memory read error`` -> ``kernel_hw_error`` (attrs ``severity``:
  ``corrected``, ``recoverable``, ``fatal``/``uncorrected``; ``source``: ``ghes`` or ``edac``).
- x86 machine checks (arch/x86/kernel/cpu/mce/core.c, ``print_mce`` and ``mce_notify_irq``):
  ``mce: [Hardware Error]: CPU <n>: Machine Check[ Exception]: <mcgstatus> Bank <b>: <MCi_STATUS>`` ->
  ``kernel_hw_error`` with ``source`` ``mce``, ``cpu``, ``bank``, ``status`` and a ``severity`` read from the
  status word's bits (Intel SDM vol. 3B, "IA32_MCi_STATUS MSRs"; AMD's MCA_STATUS has the same bits): PCC
  (bit 57, processor context corrupt) ``fatal``, else UC (bit 61) ``uncorrected``, else ``corrected``;
  ``mce: [Hardware Error]: Machine check events logged`` (errors went to the MCE log, their kind not said)
  -> severity ``logged``. The ``TSC``/``ADDR``/``PROCESSOR`` lines that follow, the EDAC drivers' echo of the
  same check (``EDAC sbridge MC0: CPU 0: Machine Check Event: ...``) and AMD's decoder lines are not counted
  again.
- ``mlx5_core <pci>: ...`` lines of ConnectX HCAs that NVIDIA's NVSentinel NIC monitor names (docs/
  nic-health-monitor.md, "Syslog Detection") -> ``kernel_nic_error`` (attrs ``device``: the PCI address,
  ``pattern``, ``severity``: ``fatal`` — a command that timed out "Will cause a leak of a command resource",
  "device's health compromised - reached miss count", "unrecoverable hardware error", and (ours) a probe or
  ``mlx5_load_one`` that failed: the HCA is not there for jobs — or ``degraded`` — TX/RX timeouts, "Detected
  insufficient power on the PCIe slot", a port module at high temperature, a cable unplugged, ACCESS_REG
  failed). Other mlx5_core lines (firmware version, link up) are boot chatter.

Which lines and what they mean: kubernetes/node-problem-detector's ``config/kernel-monitor.json`` (the same
OOM, hung-task and CPER patterns) and the kernel's format strings (files named above).

Times: a journal or syslog line carries its wall-clock time (``Mar  5 08:31:52``, the year taken from the
file's write time; a line whose host name was cut out when it was pasted, ``Mar  5 08:31:52 kernel: ...``,
is read too; ``2024-03-05T08:31:52+0000`` as written); ``dmesg -T`` its ``[Tue Mar  5 08:31:52 2024]``
(dmesg prints local time: read as UTC, say ``TZ=UTC dmesg -T``). Raw ``dmesg`` counts seconds since boot
(kept as ``uptime_s``) and ``dmesg -t`` nothing: both are dated by the file's write time. The node is the
line's host name when the journal gives one, else ``--host``.

Lenient: a kernel log is free text, so no line is refused; a number past 64 bits in a line we read is a
``ParseError`` (or goes to ``on_bad_line``).
"""

from __future__ import annotations

import calendar
import os
import re
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from hpcwatch.errors import ParseError
from hpcwatch.records import Event
from hpcwatch.sources.lines import OnBadLine, file_time, line_text, read_text, report_bad_line, to_int
from hpcwatch.vocab import EventKind

__all__ = ["parse_kernel_log", "read_kernel_log", "is_kernel_log", "MCI_STATUS_UC", "MCI_STATUS_PCC"]

SOURCE = "kernel"

_MONTHS = {m: i for i, m in enumerate(calendar.month_abbr) if m}
_SYSLOG_RE = re.compile(
    r"(?P<mon>[A-Z][a-z]{2}) +(?P<day>\d{1,2}) (?P<hms>\d\d:\d\d:\d\d) (?:(?P<host>\S+) )?kernel: ?(?P<rest>.*)\Z"
)
_ISO_RE = re.compile(
    r"(?P<iso>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?) (?P<host>\S+) kernel: ?(?P<rest>.*)\Z"
)
_CTIME_RE = re.compile(r"\[(?P<ctime>[A-Z][a-z]{2} [A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d \d{4})\] ?(?P<rest>.*)\Z")
_UPTIME_RE = re.compile(r"\[ *(?P<uptime>\d+\.\d+)\] ?(?P<rest>.*)\Z")

_XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[^)]*)\): (?P<xid>\d+)(?:, pid=(?P<pid>[^,\s]+))?,?\s*(?P<text>.*)")
_HUNG_RE = re.compile(r"INFO: task (?P<comm>.+):(?P<pid>\d+) blocked for more than (?P<secs>\d+) seconds\.")
_OOM_KILLED_RE = re.compile(
    r"(?P<memcg>Memory cgroup out of memory: )?Kill(?:ed)? process (?P<pid>\d+) \((?P<comm>[^)]*)\)"
)
_GHES_RE = re.compile(r"\[Hardware Error\]: event severity: (?P<severity>corrected|recoverable|fatal)\s*\Z")
_EDAC_RE = re.compile(r"EDAC (?P<mc>MC\d+|\S+): (?:(?P<count>\d+) )?(?P<kind>CE|UE)\b")
_CE_READ_RE = re.compile(r"CE memory read error")
_MCE_RE = re.compile(
    r"\[Hardware Error\]: CPU (?P<cpu>\d+): Machine Check(?: Exception)?: [0-9a-fA-F]+ Bank (?P<bank>\d+): "
    r"(?P<status>[0-9a-fA-F]{1,16})\b"
)
_MCE_LOGGED_RE = re.compile(r"\[Hardware Error\]: Machine check events logged")
#: IA32_MCi_STATUS bits (Intel SDM vol. 3B, section 16.3.2.2): uncorrected error, processor context corrupt.
MCI_STATUS_UC = 1 << 61
MCI_STATUS_PCC = 1 << 57
_MLX5_RE = re.compile(r"\bmlx5_core(?: (?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]))?:? ")
#: (pattern name, what it matches in an mlx5_core line, severity): NVSentinel's fatal and non-fatal patterns.
_MLX5_PATTERNS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("cmd_timeout", re.compile(r"timeout\. Will cause a leak of a command resource"), "fatal"),
    ("health_compromised", re.compile(r"device's health compromised - reached miss count"), "fatal"),
    ("unrecoverable", re.compile(r"unrecoverable hardware error", re.I), "fatal"),
    ("load_failed", re.compile(r"mlx5_load_one failed with error|probe of \S+ failed with error"), "fatal"),
    ("tx_timeout", re.compile(r"TX timeout detected|NETDEV WATCHDOG"), "degraded"),
    ("rx_timeout", re.compile(r"RX timeout on channel"), "degraded"),
    ("insufficient_power", re.compile(r"Detected insufficient power on the PCIe slot"), "degraded"),
    ("module_high_temperature", re.compile(r"Port module event.*High Temperature", re.I), "degraded"),
    ("cable_unplugged", re.compile(r"Cable unplugged"), "degraded"),
    ("access_reg_failed", re.compile(r"ACCESS_REG failed"), "degraded"),
)
_SNIFF_RE = re.compile(
    r"NVRM: Xid \(|blocked for more than \d+ seconds|Killed process \d+ \(|out of memory: Kill|mlx5_core[ :]|"
    r"\[Hardware Error\]: event severity|\[Hardware Error\]: (?:CPU \d+: )?Machine [Cc]heck|EDAC MC\d+: |"
    r"\] Linux version \d|kernel: Linux version \d"
)


def is_kernel_log(head: str) -> bool:
    """A line the reader judges (or the boot banner) near the top, and nothing of Prometheus' text."""
    lines = head.split("\n")[:400]
    return not any(line.startswith(("# HELP", "# TYPE")) for line in lines[:20]) and any(
        _SNIFF_RE.search(line) for line in lines
    )


def _with_uptime(rest: str) -> tuple[float | None, str]:
    inner = _UPTIME_RE.match(rest)
    return (float(inner.group("uptime")), inner.group("rest")) if inner else (None, rest)


def _when(line: str, year: int) -> tuple[float | None, float | None, str | None, str]:
    """(UTC seconds or None, uptime seconds or None, host or None, the message) of one line; a prefix that is
    not a real date is left in the message (the line is then dated by the file)."""
    m = _SYSLOG_RE.match(line)
    if m and m.group("mon") in _MONTHS:
        hms = [int(x) for x in m.group("hms").split(":")]
        t = calendar.timegm((year, _MONTHS[m.group("mon")], int(m.group("day")), *hms, 0, 0, 0))
        uptime, rest = _with_uptime(m.group("rest"))
        return float(t), uptime, m.group("host"), rest
    m = _ISO_RE.match(line)
    if m:
        try:
            stamp = datetime.fromisoformat(m.group("iso").replace(",", ".").replace("Z", "+00:00"))
        except ValueError:
            return None, None, None, line.strip()
        utc = stamp.timestamp() if stamp.tzinfo else calendar.timegm(stamp.timetuple()) + stamp.microsecond / 1e6
        uptime, rest = _with_uptime(m.group("rest"))
        return utc, uptime, m.group("host"), rest
    m = _CTIME_RE.match(line)
    if m:
        try:
            return (
                float(calendar.timegm(time.strptime(m.group("ctime"), "%a %b %d %H:%M:%S %Y"))),
                None,
                None,
                m.group("rest"),
            )
        except ValueError:
            return None, None, None, line.strip()
    uptime, rest = _with_uptime(line)
    return None, uptime, None, rest.strip()


def _hw_error(message: str, num: Callable[[str, str], int]) -> dict[str, Any] | None:
    """The attrs of a hardware-error line (a machine check, APEI GHES, EDAC), or None."""
    if m := _MCE_RE.search(message):
        status = int(m.group("status"), 16)
        severity = "fatal" if status & MCI_STATUS_PCC else "uncorrected" if status & MCI_STATUS_UC else "corrected"
        return {
            "severity": severity,
            "source": "mce",
            "cpu": num(m.group("cpu"), "CPU"),
            "bank": num(m.group("bank"), "bank"),
            "status": m.group("status").lower(),
            "message": message[m.start() :],
        }
    if m := _MCE_LOGGED_RE.search(message):
        return {"severity": "logged", "source": "mce", "message": message[m.start() :]}
    if m := _GHES_RE.search(message):
        return {"severity": m.group("severity"), "source": "ghes", "message": message}
    if m := _EDAC_RE.search(message):
        count = m.group("count")
        return {
            "severity": "corrected" if m.group("kind") == "CE" else "uncorrected",
            "source": "edac",
            "count": num(count, "EDAC error count") if count else 1,
            "message": message[m.start() :],
        }
    if _CE_READ_RE.search(message):
        return {"severity": "corrected", "source": "edac", "message": message}
    return None


def _event(message: str, *, path: str | os.PathLike[str], number: int) -> tuple[str, dict[str, Any]] | None:
    def num(token: str, what: str) -> int:
        return to_int(token, what, path=path, line=number, text=line_text(message))

    if m := _XID_RE.search(message):
        pid = m.group("pid")
        return EventKind.XID, {
            "xid": num(m.group("xid"), "Xid"),
            "gpu": m.group("pci"),
            "pci": m.group("pci"),
            "pid": num(pid, "pid") if pid and pid.isdigit() else pid,
            "message": message[m.start() :],
        }
    if m := _HUNG_RE.search(message):
        return EventKind.KERNEL_HUNG_TASK, {
            "task": m.group("comm"),
            "pid": num(m.group("pid"), "pid"),
            "blocked_s": num(m.group("secs"), "blocked seconds"),
            "message": message[m.start() :],
        }
    if m := _OOM_KILLED_RE.search(message):
        return EventKind.KERNEL_OOM_KILL, {
            "pid": num(m.group("pid"), "pid"),
            "process": m.group("comm"),
            "cgroup": m.group("memcg") is not None,
            "message": message[m.start() :],
        }
    if found := _hw_error(message, num):
        return EventKind.KERNEL_HW_ERROR, found
    if m := _MLX5_RE.search(message):
        for name, pattern, severity in _MLX5_PATTERNS:
            if pattern.search(message, m.start()):
                device = m.group("pci")
                return EventKind.KERNEL_NIC_ERROR, {
                    "device": device,
                    "pattern": name,
                    "severity": severity,
                    "message": message[m.start() :],
                }
    return None


def parse_kernel_log(
    text: str,
    *,
    path: str | os.PathLike[str] = "<kernel log>",
    node: str | None = None,
    t: float = 0.0,
    on_bad_line: OnBadLine = None,
) -> Iterator[Event]:
    """The judged events of a kernel log (see the module docstring); ``t``: when the log was saved."""
    year = time.gmtime(t).tm_year
    seen_oom: set[tuple[str | None, int]] = set()
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.rstrip()
        if not line.strip():
            continue
        when, uptime, host, message = _when(line, year)
        try:
            found = _event(message, path=path, number=number)
        except ParseError as err:
            report_bad_line(err, on_bad_line)
            continue
        if found is None:
            continue
        kind, attrs = found
        who = host or node
        if kind == EventKind.KERNEL_OOM_KILL:  # "Memory cgroup out of memory: Kill process N" then "Killed process N"
            if (who, attrs["pid"]) in seen_oom:
                continue
            seen_oom.add((who, attrs["pid"]))
        attrs = {**({"node": who} if who else {}), **attrs, **({"uptime_s": uptime} if uptime is not None else {})}
        yield Event(kind=kind, t=when if when is not None else t, source=SOURCE, attrs={**attrs, "line": number})


def read_kernel_log(
    path: str | os.PathLike[str], *, node: str | None = None, t: float | None = None, on_bad_line: OnBadLine = None
) -> Iterator[Event]:
    text = read_text(path)
    yield from parse_kernel_log(
        text, path=path, node=node, t=file_time(path) if t is None else t, on_bad_line=on_bad_line
    )
