"""Reader of ``ipmitool sel elist`` / ``ipmitool sel list``: the BMC's System Event Log, one event per entry.

Each entry is one ``|``-separated line::

       2 | 01/18/2023 | 14:49:30 | Critical Interrupt #0x90 | Bus Fatal Error | Asserted

(record id, date, time, the sensor -- its type and name or number --, the event, whether it was
``Asserted`` or ``Deasserted`` -- ``sel list`` may omit it -- and, on some BMCs, a detail such as the DIMM:
kept as ``detail``). Each becomes a ``ipmi_sel`` event
(attrs ``node`` from ``--host``, ``record``, ``sensor``, ``sensor_type``: the sensor before its ``#0x..``
number or name, ``event``, ``direction``). The BMC's clock is read as UTC; an entry without a real date
(``Pre-Init``, ``00/00/0000``) is dated by the file's write time. ``analysis.health`` judges them.

Lenient: blank lines and shell prompts are skipped; a line that is not 5 to 7 ``|`` columns is a
``ParseError`` (or goes to ``on_bad_line``); a record id past 64 bits too.
"""

from __future__ import annotations

import calendar
import os
import re
import time
from collections.abc import Iterator

from hpcwatch.errors import ParseError
from hpcwatch.records import Event
from hpcwatch.sources.lines import OnBadLine, file_time, line_text, read_text, report_bad_line, to_int
from hpcwatch.vocab import EventKind

__all__ = ["parse_ipmitool_sel", "read_ipmitool_sel", "is_ipmitool_sel"]

SOURCE = "ipmitool"
_ENTRY_RE = re.compile(r"\s*[0-9a-fA-F]+\s*\|\s*(\d\d/\d\d/\d{4}|Pre-Init)\s*\|")
_PROMPT_RE = re.compile(r"(?:\[[^\]]*\]|[\w.@:~/-]*)\s*[$#]\s*(?:sudo\s+)?ipmitool(?:\s.*)?\Z")
_SENSOR_TYPE_RE = re.compile(r"\s*(?:#0x[0-9a-fA-F]+|\S+)\s*\Z")


def is_ipmitool_sel(head: str) -> bool:
    """The first line that is not a prompt is a SEL entry (id | mm/dd/yyyy | ...)."""
    for raw in head.lstrip().split("\n")[:4]:
        line = raw.strip()
        if line and not _PROMPT_RE.match(line):
            return _ENTRY_RE.match(line) is not None
    return False


def _when(date: str, clock: str, fallback: float) -> float:
    try:
        return float(calendar.timegm(time.strptime(f"{date} {clock}", "%m/%d/%Y %H:%M:%S")))
    except ValueError:
        return fallback


def parse_ipmitool_sel(
    text: str,
    *,
    path: str | os.PathLike[str] = "<ipmitool sel elist>",
    node: str | None = None,
    t: float = 0.0,
    on_bad_line: OnBadLine = None,
) -> Iterator[Event]:
    """One ``ipmi_sel`` event per SEL entry (see the module docstring); ``t``: when the log was saved."""
    base = {"node": node} if node else {}
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or _PROMPT_RE.match(line):
            continue
        cols = [c.strip() for c in line.split("|")]
        if len(cols) not in (5, 6, 7) or not cols[0]:
            report_bad_line(
                ParseError(
                    "not an ipmitool sel line (want id | date | time | sensor | event [| Asserted])",
                    path=path,
                    line=number,
                    text=line_text(raw),
                ),
                on_bad_line,
            )
            continue
        try:
            record = to_int(str(int(cols[0], 16)), "record id", path=path, line=number, text=line_text(raw))
        except ValueError:
            report_bad_line(
                ParseError("record id is not hexadecimal", path=path, line=number, text=line_text(raw)), on_bad_line
            )
            continue
        except ParseError as err:
            report_bad_line(err, on_bad_line)
            continue
        sensor = cols[3]
        yield Event(
            kind=EventKind.IPMI_SEL,
            t=_when(cols[1], cols[2], t),
            source=SOURCE,
            attrs={
                **base,
                "record": record,
                "sensor": sensor,
                "sensor_type": _SENSOR_TYPE_RE.sub("", sensor) or sensor,
                "event": cols[4],
                "direction": cols[5] if len(cols) >= 6 else "",
                "detail": cols[6] if len(cols) == 7 else "",
                "line": number,
            },
        )


def read_ipmitool_sel(
    path: str | os.PathLike[str], *, node: str | None = None, t: float | None = None, on_bad_line: OnBadLine = None
) -> Iterator[Event]:
    text = read_text(path)
    yield from parse_ipmitool_sel(
        text, path=path, node=node, t=file_time(path) if t is None else t, on_bad_line=on_bad_line
    )
