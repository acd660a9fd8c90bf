"""Reader of the NVIDIA driver's parameters, ``/proc/driver/nvidia/params``.

The file has one ``Name: value`` line per module parameter (``ResmanDebugLevel:
4294967295``, ``RegistryDwords: ""``...). Registry keys set through
``NVreg_RegistryDwords="Key=Value;..."`` appear inside ``RegistryDwords``; the
scrub-on-free switch ``RMDisableScrubOnFree`` may be either a line of its own or
such a key, so both are read. It becomes one ``Event`` of kind ``nvidia_params``
with attrs ``host`` and ``params`` (name -> value string, registry keys merged).

Takes a root folder (``root/proc/driver/nvidia/params``) so tests use a fixture tree.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from hpcwatch.errors import ParseError
from hpcwatch.records import Event
from hpcwatch.sources.lines import file_time, read_text
from hpcwatch.vocab import EventKind

__all__ = ["is_nvidia_params", "parse_nvidia_params", "read_nvidia_params", "PARAMS_PATH"]

PARAMS_PATH = Path("proc/driver/nvidia/params")


def parse_nvidia_params(
    lines: Iterable[str], *, path: str | os.PathLike[str] = "<params>", host: str | None = None, t: float = 0.0
) -> Iterator[Event]:
    params: dict[str, str] = {}
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        name, sep, value = raw.partition(":")
        if not sep or not name.strip() or " " in name.strip():
            raise ParseError("not a 'Name: value' parameter line", path=path, line=lineno, text=raw)
        params[name.strip()] = value.strip()
    for pair in params.get("RegistryDwords", "").strip('"').split(";"):
        key, sep, value = pair.partition("=")
        if sep and key.strip():
            params.setdefault(key.strip(), value.strip())
    yield Event(kind=EventKind.NVIDIA_PARAMS, t=t, source=str(path), attrs={"host": host, "params": params})


def read_nvidia_params(root: str | os.PathLike[str] = "/", *, host: str | None = None) -> Iterator[Event]:
    """The params of the machine whose filesystem is at ``root`` (a file path is read directly)."""
    p = Path(root)
    path = p if p.is_file() else p / PARAMS_PATH
    yield from parse_nvidia_params(read_text(path).splitlines(), path=path, host=host, t=file_time(path))


def is_nvidia_params(head: str, name: str = "") -> bool:
    """Sniff: the driver's ``Name: value`` parameter lines (ResmanDebugLevel is always there)."""
    return head.startswith("ResmanDebugLevel:") or (name == "params" and "RegistryDwords:" in head)
