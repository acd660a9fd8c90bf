"""Reader of ``lspci -vv`` (pciutils): each PCIe device's link, trained (LnkSta) against capable (LnkCap).

A device block starts with its address line (``01:00.0 VGA compatible controller: NVIDIA
Corporation ...``, ``0000:`` domain optional, ``[10de:2230]`` ids when run with ``-nn``) and
goes on over its indented lines. From the PCI Express capability we keep::

    LnkCap: Port #0, Speed 16GT/s, Width x16, ASPM L1, ...      what the device can train to
    LnkSta: Speed 2.5GT/s (downgraded), Width x16 (ok), ...     what it trained to now

as four samples per device: ``pcie_link_speed_gts`` / ``pcie_link_speed_max_gts`` (GT/s per lane)
and ``pcie_link_width`` / ``pcie_link_width_max`` (lanes). ``(ok)`` / ``(downgraded)`` are not
read (pciutils before 3.11 does not print them, later ones not always): we compare the numbers.
``Speed unknown`` (a link that is down) gives no speed sample; its width (``x0``) is kept.

Labels: ``node`` (the file does not name its host: ``--host``), ``bdf`` (the address), ``vendor``
(``10de``, ``15b3``: from ``-nn`` ids, else from the vendor's name for NVIDIA and Mellanox/NVIDIA
networking), ``device_class`` (``VGA compatible controller``, ``Infiniband controller``...), ``name``.
Samples are dated by the file's write time (lspci prints no time).

Lenient: a device without a PCI Express capability, or whose capabilities are hidden
(``Capabilities: <access denied>``: lspci run without root), gives no samples; shell prompts pasted
with the capture (``$ sudo lspci -vvv -s 01:00.0``) are skipped. A line that is neither a device
address line nor indented under one is a ``ParseError`` (or reported to ``on_bad_line``).
Reference: pciutils ``ls-caps.c`` (``cap_express_link``), https://github.com/pciutils/pciutils
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

from hpcwatch import vocab
from hpcwatch.errors import ParseError
from hpcwatch.records import Sample
from hpcwatch.sources.lines import OnBadLine, file_time, line_text, read_text, report_bad_line, to_float, to_int

__all__ = ["parse_lspci_vv", "read_lspci_vv", "is_lspci_vv", "VENDOR_IDS"]

#: Vendor names lspci prints -> PCI vendor id (the two whose devices the PCIe rules judge).
VENDOR_IDS: dict[str, str] = {"NVIDIA Corporation": "10de", "Mellanox Technologies": "15b3"}

_DEVICE_RE = re.compile(
    r"(?P<bdf>(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+(?P<cls>[^:\[]+?)(?:\s+\[[0-9a-fA-F]{4}\])?:\s+(?P<name>.*?)\s*\Z"
)
_IDS_RE = re.compile(r"\[(?P<vendor>[0-9a-fA-F]{4}):[0-9a-fA-F]{4}\]")
_PROMPT_RE = re.compile(r"(?:\[[^\]]*\]|[\w.@:~/-]*)\s*[$#](?:\s+\S+[$#])?\s*(?:sudo\s+)?(?:\+\s*)?lspci(?:\s.*)?\Z")
_SPEED_RE = re.compile(r"Speed\s+(?P<speed>[0-9.]+|unknown)\s*(?:GT/s)?")
_WIDTH_RE = re.compile(r"Width\s+x(?P<width>\d+)")


def is_lspci_vv(head: str) -> bool:
    """A device address line followed by an indented line of its (``Subsystem:``, ``Control:``...)."""
    lines = [line for line in head.lstrip().split("\n")[:12] if line.strip() and not _PROMPT_RE.match(line.strip())]
    return (
        len(lines) >= 2
        and _DEVICE_RE.match(lines[0]) is not None
        and lines[1][:1] in (" ", "\t")
        and re.match(r"\s+(Subsystem|Control|Physical Slot|DeviceName|Flags|Status|Capabilities):", lines[1])
        is not None
    )


def _vendor(name: str) -> str:
    ids = _IDS_RE.search(name)
    if ids:
        return ids.group("vendor").lower()
    return next((vid for vendor, vid in VENDOR_IDS.items() if name.startswith(vendor)), "")


def _link(line: str, *, path: str | os.PathLike[str], number: int) -> tuple[float | None, int | None]:
    speed, width = _SPEED_RE.search(line), _WIDTH_RE.search(line)
    gts = None
    if speed and speed.group("speed") != "unknown":
        gts = to_float(speed.group("speed"), "link speed (GT/s)", path=path, line=number, text=line_text(line))
    lanes = to_int(width.group("width"), "link width", path=path, line=number, text=line_text(line)) if width else None
    return gts, lanes


def parse_lspci_vv(
    text: str,
    *,
    path: str | os.PathLike[str] = "<lspci -vv>",
    node: str | None = None,
    t: float = 0.0,
    on_bad_line: OnBadLine = None,
) -> Iterator[Sample]:
    """The link samples of every PCIe device of ``lspci -vv`` output (see the module docstring)."""
    labels: dict[str, str] | None = None
    cap: tuple[float | None, int | None] = (None, None)
    base = {"node": node} if node else {}
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.rstrip()
        if not line.strip() or _PROMPT_RE.match(line.strip()):
            continue
        if line[0] not in " \t":
            device = _DEVICE_RE.match(line)
            if device is None:
                report_bad_line(
                    ParseError(
                        "not an lspci -vv line (want a device address line or a line indented under one)",
                        path=path,
                        line=number,
                        text=line_text(line),
                    ),
                    on_bad_line,
                )
                labels = None
                continue
            name = device.group("name")
            labels = {
                **base,
                "bdf": device.group("bdf").lower(),
                "vendor": _vendor(name),
                "device_class": device.group("cls").strip(),
                "name": _IDS_RE.sub("", name).strip(),
            }
            cap = (None, None)
            continue
        if labels is None:
            continue  # the rest of a block we could not start
        stripped = line.strip()
        if stripped.startswith("LnkCap:"):
            cap = _link(stripped, path=path, number=number)
        elif stripped.startswith("LnkSta:"):
            gts, lanes = _link(stripped, path=path, number=number)
            cap_gts, cap_lanes = cap
            for metric, value in (
                (vocab.PCIE_LINK_SPEED_GTS, gts),
                (vocab.PCIE_LINK_SPEED_MAX_GTS, cap_gts),
                (vocab.PCIE_LINK_WIDTH, lanes),
                (vocab.PCIE_LINK_WIDTH_MAX, cap_lanes),
            ):
                if value is not None:
                    yield Sample(metric=metric, labels=labels, t=t, value=float(value))


def read_lspci_vv(
    path: str | os.PathLike[str], *, node: str | None = None, t: float | None = None, on_bad_line: OnBadLine = None
) -> Iterator[Sample]:
    text = read_text(path)
    yield from parse_lspci_vv(
        text, path=path, node=node, t=file_time(path) if t is None else t, on_bad_line=on_bad_line
    )
