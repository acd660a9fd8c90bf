"""Reader of the BMC's sensor readings: ``ipmitool sdr list`` / ``sdr elist`` and ``ipmitool sensor``.

Three ``|``-separated shapes, told apart line by line by their number of columns (ipmitool(1), "sdr" and
"sensor")::

    Fan3B            | 0 RPM             | cr                                     sdr list: name, reading, status
    Power Supply 1   | 06h | ok  | 10.1 | 0 Watts, Presence detected, Failure detected
                                     sdr elist: name, sensor number, status, entity id.instance, reading / states
    FAN2   | 700.000 | RPM | nc | na | 500.000 | 700.000 | na | na | na
                                     sensor: name, value, unit, status, lnr, lcr, lnc, unc, ucr, unr

The status is the BMC's own verdict against its own thresholds (IPMI v2.0, section 36.3 "Sensor Reading and
Event Status": lower/upper non-critical, critical, non-recoverable): ``ok``; ``nc`` (non-critical), ``cr``
(critical), ``nr`` (non-recoverable); ``ns`` (no reading: disabled, not present); ``na`` (no reading in
``sensor``); some BMCs name the threshold crossed instead (``unc``, ``lcr``, ``unr``...), read as its level. A discrete sensor in ``sensor`` shows its state bits instead (``0x0180``): kept as ``state``.

One ``ipmi_sensor_status`` sample per sensor (``IPMI_STATUS`` codes below; labels ``node`` from ``--host``,
``sensor``, ``unit``, ``entity`` (elist: entity id.instance, 10.x a power supply, 29.x a fan), the thresholds
``lnr`` ... ``unr`` that ``sensor`` printed as numbers, ``status`` as printed and ``states`` (elist: the
asserted discrete states, such as ``Presence detected, Failure detected``)), an ``ipmi_sensor_reading``
sample (same labels but the last two) where the reading is a number, and for a discrete sensor of
``sensor`` an ``ipmi_sensor_state`` sample (label ``state``, its bits as printed). Dated by the file's write time. ``analysis.health`` judges them (rules ``bmc_sensor``,
``bmc_psu_fan``).

Lenient: blank lines and shell prompts are skipped; any other line that is not one of the three shapes, or a
reading or threshold that is not a number, is a ``ParseError`` (or goes to ``on_bad_line``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator

from hpcwatch import vocab
from hpcwatch.errors import ParseError
from hpcwatch.records import Sample
from hpcwatch.sources.lines import OnBadLine, file_time, line_text, read_text, report_bad_line, to_float

__all__ = ["parse_ipmitool_sdr", "read_ipmitool_sdr", "is_ipmitool_sdr", "IPMI_STATUS", "THRESHOLDS"]

#: The BMC's status -> the sample's value (worse is larger; no reading is apart).
IPMI_STATUS: dict[str, int] = {
    "ok": 0,
    "nc": 1,
    "lnc": 1,
    "unc": 1,
    "cr": 2,
    "lcr": 2,
    "ucr": 2,
    "nr": 3,
    "lnr": 3,
    "unr": 3,
    "ns": -1,
    "na": -1,
}
#: ``ipmitool sensor``'s threshold columns, in order (lower non-recoverable ... upper non-recoverable).
THRESHOLDS = ("lnr", "lcr", "lnc", "unc", "ucr", "unr")

_STATUS = r"(?:ok|nc|cr|nr|ns|na|lnc|lcr|lnr|unc|ucr|unr)"
_SDR_LIST_RE = re.compile(rf"[^|]+\|[^|]*\|\s*{_STATUS}\s*\Z")
_SDR_ELIST_RE = re.compile(rf"[^|]+\|\s*[0-9a-fA-F]+h\s*\|\s*{_STATUS}\s*\|\s*[0-9]+\.[0-9]+\s*\|")
_SENSOR_RE = re.compile(rf"[^|]+\|[^|]*\|[^|]*\|\s*(?:{_STATUS}|0x[0-9a-fA-F]+)\s*(?:\|[^|]*){{6}}\Z")
_PROMPT_RE = re.compile(r"(?:\[[^\]]*\]|[\w.@:~/-]*)\s*[$#]\s*(?:sudo\s+)?ipmitool(?:\s.*)?\Z")
_NUMBER_RE = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_DISCRETE_RE = re.compile(r"0x[0-9a-fA-F]+")
_ELIST_ID_RE = re.compile(r"[0-9a-fA-F]+h")
_ENTITY_RE = re.compile(r"[0-9]+\.[0-9]+")


def is_ipmitool_sdr(head: str) -> bool:
    """The first line that is not a prompt is an ``sdr list``, ``sdr elist`` or ``sensor`` line."""
    for raw in head.lstrip().split("\n")[:4]:
        line = raw.strip()
        if line and not _PROMPT_RE.match(line):
            return any(p.match(line) for p in (_SDR_ELIST_RE, _SENSOR_RE, _SDR_LIST_RE))
    return False


def parse_ipmitool_sdr(
    text: str,
    *,
    path: str | os.PathLike[str] = "<ipmitool sdr>",
    node: str | None = None,
    t: float = 0.0,
    on_bad_line: OnBadLine = None,
) -> Iterator[Sample]:
    """The sensor samples (see the module docstring); ``t``: when the output was saved."""
    base = {"node": node} if node else {}
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or _PROMPT_RE.match(line):
            continue
        try:
            yield from _line_samples([c.strip() for c in line.split("|")], base, t, path=path, number=number)
        except ParseError as err:
            report_bad_line(err, on_bad_line)


def _line_samples(
    cols: list[str], base: dict[str, str], t: float, *, path: str | os.PathLike[str], number: int
) -> Iterator[Sample]:
    text = line_text(" | ".join(cols))
    if len(cols) == 3 and cols[0] and cols[2] in IPMI_STATUS:
        value, unit = _reading(cols[1])
        yield from _samples({**base, "sensor": cols[0]} | _unit(unit), cols[2], value, t)
    elif len(cols) == 5 and cols[0] and _ELIST_ID_RE.fullmatch(cols[1]) and cols[2] in IPMI_STATUS:
        if not _ENTITY_RE.fullmatch(cols[3]):
            raise ParseError("sdr elist entity is not 'N.N'", path=path, line=number, text=text)
        value, unit = _reading(cols[4])
        states = cols[4] if value is None else cols[4].partition(",")[2].strip()
        labels = {**base, "sensor": cols[0], "entity": cols[3]} | _unit(unit)
        yield from _samples(labels, cols[2], value, t, states=states)
    elif len(cols) == 10 and cols[0] and (cols[3] in IPMI_STATUS or _DISCRETE_RE.fullmatch(cols[3])):
        labels = {**base, "sensor": cols[0]} | _unit(cols[2])
        for name, token in zip(THRESHOLDS, cols[4:]):
            if token != "na":
                labels[name] = f"{_finite(token, f'threshold {name}', path=path, line=number, text=text):g}"
        if _DISCRETE_RE.fullmatch(cols[3]):
            yield Sample(metric=vocab.IPMI_SENSOR_STATE, labels=labels | {"state": cols[3]}, t=t, value=0.0)
            return
        value = None
        if cols[1] != "na" and not _DISCRETE_RE.fullmatch(cols[1]):
            value = _finite(cols[1], "sensor reading", path=path, line=number, text=text)
        yield from _samples(labels, cols[3], value, t)
    else:
        raise ParseError(
            "not an ipmitool sdr/sensor line (want 3 columns: name | reading | status; 5: sdr elist; 10: sensor)",
            path=path,
            line=number,
            text=text,
        )


def _unit(unit: str) -> dict[str, str]:
    return {"unit": unit} if unit and unit != "discrete" else {}


def _finite(token: str, what: str, *, path: str | os.PathLike[str], line: int, text: str) -> float:
    value = to_float(token, what, path=path, line=line, text=text)
    if not math.isfinite(value):
        raise ParseError(f"{what} is not a finite number", path=path, line=line, text=text)
    return value


def _reading(token: str) -> tuple[float | None, str]:
    """``'7560 RPM'`` -> (7560.0, 'RPM'); a reading that is not a number first (``no reading``,
    ``Device Present``, ``0x01``) -> (None, '')."""
    first = token.partition(",")[0].strip()
    match = _NUMBER_RE.match(first)
    if match is None or _DISCRETE_RE.match(first) or not math.isfinite(value := float(match.group())):
        return None, ""
    return value, first[match.end() :].strip()


def _samples(
    labels: dict[str, str], status: str, value: float | None, t: float, *, states: str = ""
) -> Iterator[Sample]:
    """The status (labels ``status`` as printed and the asserted ``states``) and, if a number, the reading."""
    shown = labels | {"status": status} | ({"states": states} if states else {})
    yield Sample(metric=vocab.IPMI_SENSOR_STATUS, labels=shown, t=t, value=float(IPMI_STATUS[status]))
    if value is not None:
        yield Sample(metric=vocab.IPMI_SENSOR_READING, labels=labels, t=t, value=value)


def read_ipmitool_sdr(
    path: str | os.PathLike[str], *, node: str | None = None, t: float | None = None, on_bad_line: OnBadLine = None
) -> Iterator[Sample]:
    text = read_text(path)
    yield from parse_ipmitool_sdr(
        text, path=path, node=node, t=file_time(path) if t is None else t, on_bad_line=on_bad_line
    )
