"""What every collector kind shares: the result of one run, and the shape the daemon drives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["RunResult", "Collector"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    records: int = 0
    """Records the run stored."""
    lag_s: float | None = None
    """How far behind its source the collector is after the run (None: it cannot tell)."""
    note: str = ""
    """What the run saw that is worth a line in the status (a rotation, a truncation, bad lines)."""


class Collector(Protocol):
    def run(self) -> RunResult: ...
    def close(self) -> None: ...
