"""Reader of ``ofed_info -s``: the InfiniBand software stack (MLNX_OFED, or DOCA-Host's OFED) a node runs.

``ofed_info -s`` prints one line, the package name and version with a trailing colon::

    MLNX_OFED_LINUX-23.07-0.5.1.2:

(the ``ofed_info`` script that mlnxofedinstall writes echoes ``MLNX_OFED_LINUX-$VERSION:``; DOCA-Host's prints
``OFED-internal-24.01-0.3.3:``). It becomes one sample ``ofed_info`` 1 with labels ``node`` (from ``--host``: the
output does not name its host) and ``version`` (the line without its colon), dated by the file's write time;
the fleet rule ``ofed_mismatch`` compares it across the nodes of a partition.

Lenient: shell prompts pasted with the capture (``$ ofed_info -s``) are skipped, and so is the colon when it
is missing. Strict: any other line is a ``ParseError`` naming file and line (``ofed_info`` without ``-s``
lists every package: capture ``-s``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

from hpcwatch import vocab
from hpcwatch.errors import ParseError
from hpcwatch.records import Sample
from hpcwatch.sources.lines import file_time, line_text, read_text

__all__ = ["parse_ofed_info", "read_ofed_info", "is_ofed_info"]

_VERSION_RE = re.compile(r"(?P<version>(?:MLNX_OFED_LINUX|OFED-internal|OFED)-\d+\.\d+[-.\w]*?):?\Z")
_PROMPT_RE = re.compile(r"(?:\[[^\]]*\]|[\w.@:~/-]*)\s*[$#]\s*(?:sudo\s+)?ofed_info(?:\s.*)?\Z")


def is_ofed_info(head: str) -> bool:
    """The first line that is not a prompt is a version line; nothing after it but blank lines or prompts."""
    lines = [line.strip() for line in head.split("\n")[:8] if line.strip() and not _PROMPT_RE.match(line.strip())]
    return len(lines) == 1 and _VERSION_RE.match(lines[0]) is not None


def parse_ofed_info(
    text: str, *, path: str | os.PathLike[str] = "<ofed_info -s>", node: str | None = None, t: float = 0.0
) -> Iterator[Sample]:
    """The one ``ofed_info`` sample of ``ofed_info -s`` output (see the module docstring)."""
    found = None
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or _PROMPT_RE.match(line):
            continue
        match = _VERSION_RE.match(line)
        if match is None or found is not None:
            what = "a second version line" if match else "not an ofed_info -s line (want MLNX_OFED_LINUX-<version>:)"
            raise ParseError(what, path=path, line=number, text=line_text(raw))
        found = match.group("version")
    if found is None:
        raise ParseError("no ofed_info -s version line", path=path, line=1)
    labels = {"node": node, "version": found} if node else {"version": found}
    yield Sample(metric=vocab.OFED_INFO, labels=labels, t=t, value=1.0)


def read_ofed_info(
    path: str | os.PathLike[str], *, node: str | None = None, t: float | None = None
) -> Iterator[Sample]:
    text = read_text(path)
    yield from parse_ofed_info(text, path=path, node=node, t=file_time(path) if t is None else t)
