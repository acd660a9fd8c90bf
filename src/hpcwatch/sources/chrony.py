"""Reader of ``chronyc tracking``: how far this node's clock is from NTP time, and whether chrony is synchronised.

The output is one ``Key : value`` line per field (chronyc.adoc, "tracking")::

    Reference ID    : CB00710F (ntp1.example.net)
    Stratum         : 3
    System time     : 0.000006523 seconds slow of NTP time
    Last offset     : -0.000006747 seconds
    Leap status     : Normal

Samples (labels ``node``, from ``--host``: the output does not name its host; ``reference``, the
reference ID and name):

- ``chrony_tracking_system_time_seconds``: the system clock's offset from the NTP clock, signed
  (``fast`` positive, ``slow`` negative), seconds;
- ``chrony_tracking_last_offset_seconds``: the offset estimated at the last clock update, seconds;
- ``chrony_tracking_stratum``;
- ``chrony_tracking_leap_status``: 0 Normal, 1 Insert second, 2 Delete second, 3 Not synchronised (the
  NTP leap indicator's values, which chrony's ``Leap status`` names), label ``leap`` the words printed.

Dated by the file's write time (``Ref time`` is when the last measurement was processed, not now).
Lenient: fields we do not read are skipped, as are shell prompts pasted with the capture; a line that is
not ``Key : value``, or a number that is not one, is a ``ParseError`` (or goes to ``on_bad_line``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

from hpcwatch import vocab
from hpcwatch.errors import ParseError
from hpcwatch.records import Sample
from hpcwatch.sources.lines import OnBadLine, file_time, line_text, read_text, report_bad_line, to_float

__all__ = ["parse_chronyc_tracking", "read_chronyc_tracking", "is_chronyc_tracking", "LEAP_STATUS"]

#: ``Leap status`` words -> the NTP leap indicator value (RFC 5905 LI; chrony's NTP_Leap order).
LEAP_STATUS: dict[str, int] = {"Normal": 0, "Insert second": 1, "Delete second": 2, "Not synchronised": 3}

_LINE_RE = re.compile(r"(?P<key>[A-Za-z][A-Za-z ()]*?)\s*:\s*(?P<value>.*?)\s*\Z")
_SYSTEM_TIME_RE = re.compile(r"(?P<seconds>[-+0-9.eE]+)\s+seconds\s+(?P<dir>fast|slow)\s+of\s+NTP\s+time")
_SECONDS_RE = re.compile(r"(?P<seconds>[-+0-9.eE]+)\s+seconds")
_PROMPT_RE = re.compile(r"(?:\[[^\]]*\]|[\w.@:~/-]*)\s*[$#]\s*(?:sudo\s+)?chronyc(?:\s.*)?\Z")


def is_chronyc_tracking(head: str) -> bool:
    """The first line that is not a prompt is ``Reference ID : ...``."""
    for raw in head.lstrip().split("\n")[:4]:
        line = raw.strip()
        if line and not _PROMPT_RE.match(line):
            return re.match(r"Reference ID\s+:", line) is not None
    return False


def parse_chronyc_tracking(
    text: str,
    *,
    path: str | os.PathLike[str] = "<chronyc tracking>",
    node: str | None = None,
    t: float = 0.0,
    on_bad_line: OnBadLine = None,
) -> Iterator[Sample]:
    """The tracking samples (see the module docstring)."""
    fields: dict[str, tuple[str, int]] = {}
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or _PROMPT_RE.match(line):
            continue
        match = _LINE_RE.match(line)
        if match is None:
            report_bad_line(
                ParseError(
                    "not a chronyc tracking line (want 'Key : value')", path=path, line=number, text=line_text(raw)
                ),
                on_bad_line,
            )
            continue
        fields.setdefault(match.group("key"), (match.group("value"), number))
    labels = {**({"node": node} if node else {}), "reference": fields.get("Reference ID", ("", 0))[0]}
    yield from _samples(fields, labels, t, path=path, on_bad_line=on_bad_line)


def _samples(
    fields: dict[str, tuple[str, int]],
    labels: dict[str, str],
    t: float,
    *,
    path: str | os.PathLike[str],
    on_bad_line: OnBadLine,
) -> Iterator[Sample]:
    def bad(what: str, key: str) -> None:
        value, number = fields[key]
        report_bad_line(ParseError(what, path=path, line=number, text=line_text(value)), on_bad_line)

    if "System time" in fields:
        value, number = fields["System time"]
        match = _SYSTEM_TIME_RE.match(value)
        if match is None:
            bad("System time is not 'N seconds fast|slow of NTP time'", "System time")
        else:
            seconds = to_float(match.group("seconds"), "System time", path=path, line=number, text=line_text(value))
            sign = 1.0 if match.group("dir") == "fast" else -1.0
            yield Sample(metric=vocab.CHRONY_TRACKING_SYSTEM_TIME_SECONDS, labels=labels, t=t, value=sign * seconds)
    if "Last offset" in fields:
        value, number = fields["Last offset"]
        match = _SECONDS_RE.match(value)
        if match is None:
            bad("Last offset is not 'N seconds'", "Last offset")
        else:
            seconds = to_float(match.group("seconds"), "Last offset", path=path, line=number, text=line_text(value))
            yield Sample(metric=vocab.CHRONY_TRACKING_LAST_OFFSET_SECONDS, labels=labels, t=t, value=seconds)
    if "Stratum" in fields:
        value, number = fields["Stratum"]
        stratum = to_float(value, "Stratum", path=path, line=number, text=line_text(value))
        yield Sample(metric=vocab.CHRONY_TRACKING_STRATUM, labels=labels, t=t, value=stratum)
    if "Leap status" in fields:
        value, _ = fields["Leap status"]
        if value not in LEAP_STATUS:
            bad(f"Leap status is not one of {', '.join(LEAP_STATUS)}", "Leap status")
        else:
            yield Sample(
                metric=vocab.CHRONY_TRACKING_LEAP_STATUS,
                labels={**labels, "leap": value},
                t=t,
                value=float(LEAP_STATUS[value]),
            )


def read_chronyc_tracking(
    path: str | os.PathLike[str], *, node: str | None = None, t: float | None = None, on_bad_line: OnBadLine = None
) -> Iterator[Sample]:
    text = read_text(path)
    yield from parse_chronyc_tracking(
        text, path=path, node=node, t=file_time(path) if t is None else t, on_bad_line=on_bad_line
    )
