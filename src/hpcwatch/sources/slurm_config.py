"""Reader of ``scontrol show config``: the controller's running configuration, ``Name = value`` a line.

Shape (Slurm's ``slurm_print_ctl_conf``, src/api/config_info.c): an optional first
line ``Configuration data as of <ISO time>``, then one ``Key = value`` line per
parameter, the key padded with spaces to a column (``HealthCheckProgram      =
(null)``); arrays print as ``Epilog[0] = ...``. Later sections (``Slurmctld(primary)
at host is UP``, ``Cgroup Support Configuration:``, ``MPI Plugins Configuration:``)
follow a blank line and are read the same way where they are ``Key = value``; any
other line there is skipped. Lines before the first ``Key = value`` that are not the
header (a shell prompt, ``sinfo`` above it in a saved log) are skipped too: the file
is a capture, not a config file.

Yields one ``Event`` of kind ``slurm_config``: attrs ``params`` (key -> value
string, ``(null)`` kept as written) and ``as_of`` (the header's time text, or None).
Lenient: it does not check that a key is one Slurm knows; a file with no
``Key = value`` line at all is a ParseError (it is not this format).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from hpcwatch.errors import ParseError
from hpcwatch.records import Event
from hpcwatch.sources.lines import file_time, read_text
from hpcwatch.vocab import EventKind

__all__ = ["parse_scontrol_show_config", "read_scontrol_show_config", "is_scontrol_show_config", "HEADER"]

HEADER = "Configuration data as of"
_PAIR_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?)\s+=\s?(.*?)\s*\Z")
_HEADER_RE = re.compile(r"Configuration data as of\s+(\S+)\s*\Z")


def parse_scontrol_show_config(
    text: str, *, path: str | os.PathLike[str] = "<scontrol show config>", t: float = 0.0
) -> Iterator[Event]:
    params: dict[str, str] = {}
    as_of: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        header = _HEADER_RE.match(line)
        if header:
            as_of = header.group(1)
            continue
        pair = _PAIR_RE.match(line)
        if pair:
            params.setdefault(pair.group(1), pair.group(2))
    if not params:
        raise ParseError(
            "no 'Key = value' line: not 'scontrol show config' output",
            path=path,
            line=1,
            text=text.splitlines()[0] if text.strip() else "",
        )
    yield Event(kind=EventKind.SLURM_CONFIG, t=t, source=str(path), attrs={"params": params, "as_of": as_of})


def read_scontrol_show_config(path: str | os.PathLike[str]) -> Iterator[Event]:
    """``parse_scontrol_show_config`` of a saved output, dated by the file's write time."""
    p = Path(path)
    yield from parse_scontrol_show_config(read_text(p), path=p, t=file_time(p))


def is_scontrol_show_config(head: str) -> bool:
    """Sniff: the header line, or a grep of it (``HealthCheckProgram      = ...`` among the first lines)."""
    if HEADER in head:
        return True
    lines = [line.strip() for line in head.splitlines()[:5] if line.strip()]
    return (
        bool(lines)
        and all(_PAIR_RE.match(line) for line in lines)
        and any(line.startswith(("HealthCheck", "SlurmctldHost", "ClusterName", "AccountingStorage")) for line in lines)
    )
