"""How an NCCL debug log is recognised: its line prefix and its watchdog mark, apart from its reader.

Every file met is sniffed by every format registered before the one it is, so ``hpcwatch steps``
sniffs its traces as NCCL logs first. This module compiles one pattern; ``nccl_log``, the reader,
compiles ~20 more (4 ms of every start that would otherwise load it to say no).
"""

from __future__ import annotations

import re

__all__ = ["LINE_PREFIX", "WATCHDOG_TIMEOUT", "is_nccl_log"]

#: ``host:pid:tid [cudaDev] [file:line ]NCCL LEVEL message``, the prefix NCCL writes on every line.
#: It is searched (a launcher may write before it), so it must cost time linear in the line: the host
#: starts only where a run of host characters starts (the lookbehind), else a search from every
#: character of a long run rescans the run to its end, O(n^2) (a 30 KB line took 27 s).
LINE_PREFIX = re.compile(
    r"(?<![^\s:])(?P<host>[^\s:]*+):(?P<pid>\d++):(?P<tid>\d++) \[(?P<dev>\d++)\] "
    r"(?:(?P<src>[\w./-]+:\d+) )?NCCL (?P<level>INFO|WARN|TRACE|ABORT) ?(?P<msg>.*)"
)
#: What PyTorch's NCCL watchdog writes when a collective times out (a log without NCCL_DEBUG has only it).
WATCHDOG_TIMEOUT = "Watchdog caught collective operation timeout"
#: Lines of the head a sniff looks at.
_SNIFF_LINES = 400


def is_nccl_log(head: str) -> bool:
    """Sniff: an ``NCCL INFO`` / ``NCCL WARN`` line with its host:pid:tid [dev] prefix, or a watchdog timeout."""
    if WATCHDOG_TIMEOUT in head:
        return True
    return any(LINE_PREFIX.search(line) for line in head.split("\n")[:_SNIFF_LINES] if "NCCL " in line)
