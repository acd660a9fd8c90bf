"""Reader of the kernel's EDAC memory error counters: corrected (CE) and uncorrected (UE) errors per memory controller.

Three ways of printing the same sysfs counters are read, alone or mixed in one file (each line on its own):

- the counters themselves, as ``grep -H . FILE...`` (or ``grep -r . /sys/devices/system/edac/mc``) prints
  them, ``PATH:VALUE`` (docs.kernel.org/admin-guide/ras.html, "sysfs interface")::

      /sys/devices/system/edac/mc/mc0/ce_count:0               the controller's totals (ce_count, ue_count)
      /sys/devices/system/edac/mc/mc0/rank4/dimm_ce_count:1    a DIMM or rank (dimmN/, rankN/)
      /sys/devices/system/edac/mc/mc2/csrow0/ch0_ce_count:7836 a chip-select row and its channels (legacy)

  other files of those folders (``mc_name``, ``size_mb``, ``dimm_label``...) are skipped;
- ``edac-util -v`` (edac-utils' default report; ``-v`` prints the zero counts too, without it a healthy node
  prints only ``edac-util: No errors to report.``)::

      mc0: 0 Uncorrected Errors with no DIMM info
      mc2: csrow0: 0 Uncorrected Errors
      mc2: csrow0: CPU_SrcID#0_MC#2_Chan#0_DIMM#0: 7836 Corrected Errors

- ``edac-util --report=simple`` (``mc0: Correctable errors:   0``, ``Total CE: 0``) and ``--report=full``
  (``mc0:csrow0:ch0:CE:0``, ``mc0:noinfo:all:UE:0``).

Samples (labels ``node``, from ``--host``; ``controller``: ``0`` for ``mc0``, as node_exporter's edac collector
names it, so its scrapes are judged by the same rules):

- ``node_edac_correctable_errors_total`` / ``node_edac_uncorrectable_errors_total``: the controller's count
  since the counters were last reset (boot, or a write to ``reset_counters``): its ``ce_count``/``ue_count``
  when printed, else the sum of its locations' counts (with the errors of no known location);
- ``edac_location_correctable_errors_total`` / ``edac_location_uncorrectable_errors_total``: each location's
  count (label ``location``: ``rank4``, ``dimm3``, ``csrow0``, ``csrow0/ch0``, ``noinfo``; ``dimm_label``
  where edac-util printed one), the evidence of which DIMM to replace.

What these outputs do not say: edac-util reads the legacy ``csrow`` folders, which kernels with per-DIMM
drivers (skx_edac, i10nm_edac) leave out, so on those only the ``noinfo`` lines appear and errors counted per
DIMM are missed (edac-utils issue 15), and ``--report=full`` prints no per-row UE at all (edac-util.c,
``full_report``): prefer the sysfs counters (``grep -H . /sys/devices/system/edac/mc/mc*/*e_count``).

Dated by the file's write time. Lenient: blank lines and shell prompts are skipped; a line that is none of
the forms above or longer than ``MAX_LINE_CHARS``, or a count that is not a number, is a ``ParseError`` (or goes
to ``on_bad_line``).
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from hpcwatch import vocab
from hpcwatch.errors import ParseError
from hpcwatch.records import Sample
from hpcwatch.sources.lines import OnBadLine, file_time, line_text, read_text, report_bad_line, to_int

__all__ = ["parse_edac", "read_edac", "is_edac", "MAX_LINE_CHARS"]

_SYSFS_RE = re.compile(r"(?P<path>\S*/edac/[^\s:]*):(?P<value>.*)\Z")
_COUNTER_PATH_RE = re.compile(r"/mc/mc(?P<mc>\d+)(?:/(?P<sub>(?:csrow|dimm|rank)\d+))?/(?P<file>\w+)\Z")
#: A sysfs counter file (under mcN/, csrowN/, dimmN/ or rankN/) -> (kind, channel or None).
_SYSFS_COUNT_RE = re.compile(r"(?:dimm_)?(?P<kind>ce|ue)(?P<noinfo>_noinfo)?_count\Z|ch(?P<ch>\d+)_ce_count\Z")
_NOINFO_RE = re.compile(r"mc(?P<mc>\d+): (?P<n>\S+) (?P<kind>Uncorrected|Corrected) Errors with no DIMM info\Z")
_CSROW_UE_RE = re.compile(r"mc(?P<mc>\d+): (?P<row>csrow\d+): (?P<n>\S+) Uncorrected Errors\Z")
_CHANNEL_CE_RE = re.compile(r"mc(?P<mc>\d+): (?P<row>csrow\d+): (?P<label>.+): (?P<n>\S+) Corrected Errors\Z")
_SIMPLE_RE = re.compile(r"mc(?P<mc>\d+): (?P<kind>Correctable|Uncorrectable) errors: +(?P<n>\S+)\Z")
_FULL_RE = re.compile(r"mc(?P<mc>\d+):(?P<row>csrow\d+|noinfo):(?P<label>[^:]*):(?P<kind>CE|UE):(?P<n>\S+)\Z")
#: Lines that say nothing a count does not: edac-util's totals and its all-clear.
_SKIP_RE = re.compile(r"Total (?:CE|UE): \S+\Z|edac-util: No errors to report\.\Z")
_PROMPT_RE = re.compile(r"(?:\[[^\]]*\]|[\w.@:~/-]*)\s*[$#]\s*(?:sudo\s+)?(?:edac-util|grep|cat|find)\b.*\Z")
_SNIFF_RE = re.compile(
    r"\A(?:\S*/edac/[^\s:]*:|mc\d+: (?:\d+ (?:Unc|C)orrected Errors with no DIMM info|"
    r"(?:Correctable|Uncorrectable) errors: +\d)|mc\d+:(?:csrow\d+|noinfo):[^:]*:(?:CE|UE):\d)"
)

_CE, _UE = "ce", "ue"
#: A sysfs path is at most PATH_MAX (4096, linux/limits.h) and a DIMM label 31 characters (EDAC_MC_LABEL_LEN):
#: a longer line is not one of these outputs.
MAX_LINE_CHARS = 4096 + 256


@dataclass(slots=True)
class _Controller:
    """What one memory controller's lines said: its totals where printed, each location's count."""

    total: dict[str, int] = field(default_factory=dict)
    """``ce``/``ue`` -> the controller's own ``ce_count``/``ue_count`` (or edac-util's simple report)."""
    locations: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    """(kind, location) -> (count, DIMM label or "")."""


def is_edac(head: str) -> bool:
    """The first line that is not a prompt is an EDAC counter (sysfs) or an edac-util report line."""
    for raw in head.lstrip().split("\n")[:4]:
        line = raw.strip()
        if line and not _PROMPT_RE.match(line):
            return _SNIFF_RE.match(line) is not None
    return False


class _Number:
    """Reads one line's count, naming the file and line when it is not a number."""

    def __init__(self, path: str | os.PathLike[str], number: int, line: str) -> None:
        self.path, self.number, self.line = path, number, line

    def __call__(self, token: str) -> int:
        return to_int(token, "EDAC error count", path=self.path, line=self.number, text=line_text(self.line))


def _sysfs(path: str, value: str, mcs: dict[str, _Controller], number_of: _Number) -> None:
    """A ``PATH:VALUE`` line into its controller when PATH is a counter (other attributes are skipped)."""
    where = _COUNTER_PATH_RE.search(path)
    counter = _SYSFS_COUNT_RE.match(where.group("file")) if where else None
    if where is None or counter is None:
        return  # mc_name, size_mb, dimm_label, seconds_since_reset, power/...: not a count
    count, sub = number_of(value.strip()), where.group("sub")
    kind = counter.group("kind") or _CE
    controller = mcs[where.group("mc")]
    if sub is None and not counter.group("noinfo"):
        controller.total[kind] = count
        return
    channel = counter.group("ch")
    location = "noinfo" if counter.group("noinfo") else sub if channel is None else f"{sub}/ch{channel}"
    controller.locations[(kind, location)] = (count, "")


def _edac_util(line: str, mcs: dict[str, _Controller], number_of: _Number) -> bool:
    """An edac-util report line into its controller; False when the line is not one."""
    if m := _NOINFO_RE.match(line):
        kind = _UE if m.group("kind") == "Uncorrected" else _CE
        mcs[m.group("mc")].locations[(kind, "noinfo")] = (number_of(m.group("n")), "")
    elif m := _CSROW_UE_RE.match(line):
        mcs[m.group("mc")].locations[(_UE, m.group("row"))] = (number_of(m.group("n")), "")
    elif m := _CHANNEL_CE_RE.match(line):
        label = m.group("label")
        mcs[m.group("mc")].locations[(_CE, f"{m.group('row')}/{label}")] = (number_of(m.group("n")), label)
    elif m := _SIMPLE_RE.match(line):
        mcs[m.group("mc")].total[_UE if m.group("kind") == "Uncorrectable" else _CE] = number_of(m.group("n"))
    elif m := _FULL_RE.match(line):
        kind = _UE if m.group("kind") == "UE" else _CE
        row, label = m.group("row"), m.group("label")
        location = "noinfo" if row == "noinfo" else f"{row}/{label}"
        mcs[m.group("mc")].locations[(kind, location)] = (number_of(m.group("n")), "" if row == "noinfo" else label)
    else:
        return False
    return True


def _read_line(line: str, number: int, path: str | os.PathLike[str], mcs: dict[str, _Controller]) -> None:
    if len(line) > MAX_LINE_CHARS:
        what = f"line of {len(line)} characters, longer than an EDAC counter line ({MAX_LINE_CHARS})"
        raise ParseError(what, path=path, line=number, text=line_text(line))
    number_of = _Number(path, number, line)
    if m := _SYSFS_RE.match(line):
        _sysfs(m.group("path"), m.group("value"), mcs, number_of)
        return
    if _SKIP_RE.match(line) or _edac_util(line, mcs, number_of):
        return
    raise ParseError("not an EDAC counter or edac-util line", path=path, line=number, text=line_text(line))


def parse_edac(
    text: str,
    *,
    path: str | os.PathLike[str] = "<edac>",
    node: str | None = None,
    t: float = 0.0,
    on_bad_line: OnBadLine = None,
) -> Iterator[Sample]:
    """The controllers' and locations' counts (see the module docstring)."""
    mcs: dict[str, _Controller] = defaultdict(_Controller)
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or _PROMPT_RE.match(line):
            continue
        try:
            _read_line(line, number, path, mcs)
        except ParseError as err:
            report_bad_line(err, on_bad_line)
    base = {"node": node} if node else {}
    for mc in sorted(mcs, key=int):
        yield from _samples(mcs[mc], {**base, "controller": mc}, t)


_TOTAL = {_CE: vocab.NODE_EDAC_CORRECTABLE_ERRORS_TOTAL, _UE: vocab.NODE_EDAC_UNCORRECTABLE_ERRORS_TOTAL}
_LOCATION = {_CE: vocab.EDAC_LOCATION_CORRECTABLE_ERRORS_TOTAL, _UE: vocab.EDAC_LOCATION_UNCORRECTABLE_ERRORS_TOTAL}


def _samples(controller: _Controller, labels: dict[str, str], t: float) -> Iterator[Sample]:
    for kind in (_CE, _UE):
        mine = {loc: found for (k, loc), found in controller.locations.items() if k == kind}
        if kind in controller.total:
            total = controller.total[kind]
        elif mine:
            total = _sum_of_finest(mine)
        else:
            continue
        yield Sample(metric=_TOTAL[kind], labels=labels, t=t, value=float(total))
        for location, (count, label) in sorted(mine.items()):
            extra = {"location": location, **({"dimm_label": label} if label else {})}
            yield Sample(metric=_LOCATION[kind], labels={**labels, **extra}, t=t, value=float(count))


def _sum_of_finest(locations: dict[str, tuple[int, str]]) -> int:
    """A controller's count from its locations: the errors of no known location, plus the finest level printed
    (channels when there are, rows holding them are their sum; DIMMs and ranks otherwise), counted once."""
    noinfo = locations.get("noinfo", (0, ""))[0]
    channels = [n for loc, (n, _) in locations.items() if "/" in loc]
    if channels:
        return noinfo + sum(channels)
    return noinfo + sum(n for loc, (n, _) in locations.items() if loc != "noinfo")


def read_edac(
    path: str | os.PathLike[str], *, node: str | None = None, t: float | None = None, on_bad_line: OnBadLine = None
) -> Iterator[Sample]:
    text = read_text(path)
    yield from parse_edac(text, path=path, node=node, t=file_time(path) if t is None else t, on_bad_line=on_bad_line)
