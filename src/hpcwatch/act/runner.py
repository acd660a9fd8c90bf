"""The one way a policy runs a Slurm command: argv (never a shell), a timeout, what it printed, bounded.

``Runner(commands, timeout_s=)`` maps a command's key (``scontrol``, ``sbatch``, ``scancel``, ``squeue``) to the
program the config names, so tests give stand-ins that record their argv. A program that is missing or times
out is an answer (``rc`` 127 / 124 and a note), not an exception: the policy records it in the audit and goes on.
``in_process`` answers the argv in this process instead of running it: ``hpcwatch demo`` gives the twin's Slurm
(``twin/slurmctl.py``), which sits below ``act`` and so speaks in plain (exit status, stdout, stderr) triples.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hpcwatch.reports.text import visible

__all__ = ["Ran", "Runner", "InProcess", "OUTPUT_MAX_CHARS"]

#: What the audit keeps of a command's output (a Slurm error is one line; a runaway program is not kept whole).
OUTPUT_MAX_CHARS = 2000


@dataclass(frozen=True, slots=True, kw_only=True)
class Ran:
    argv: tuple[str, ...]
    rc: int
    """The exit status; 124 when it ran past the timeout, 127 when the program could not be started."""
    stdout: str
    stderr: str
    duration_s: float
    """Wall clock (monotonic), seconds."""

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def note(self) -> str:
        """The output the audit keeps: visible (no control characters), bounded."""
        text = visible((self.stderr or self.stdout).strip())
        return text if len(text) <= OUTPUT_MAX_CHARS else text[: OUTPUT_MAX_CHARS - 1] + "…"


#: Programs played in this process: argv in, (exit status, stdout, stderr) out.
InProcess = Callable[[Sequence[str]], tuple[int, str, str]]


class Runner:
    def __init__(
        self,
        commands: Mapping[str, str],
        *,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        in_process: InProcess | None = None,
    ) -> None:
        self.commands, self.timeout_s, self.env = dict(commands), timeout_s, dict(env) if env is not None else None
        self.in_process = in_process

    def argv(self, command: str, args: Sequence[str]) -> tuple[str, ...]:
        """The full argv of ``command`` (a key of ``commands``) with ``args``: what the audit records."""
        return (self.commands[command], *args)

    def run(self, argv: Sequence[str]) -> Ran:
        t0 = time.monotonic()
        if self.in_process is not None:
            rc, stdout, stderr = self.in_process(argv)
            return Ran(argv=tuple(argv), rc=rc, stdout=stdout, stderr=stderr, duration_s=time.monotonic() - t0)
        try:
            done = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                errors="replace",
                timeout=self.timeout_s,
                env=self.env,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return Ran(
                argv=tuple(argv),
                rc=124,
                stdout="",
                stderr=f"timed out after {self.timeout_s:g} s",
                duration_s=time.monotonic() - t0,
            )
        except OSError as err:
            return Ran(
                argv=tuple(argv),
                rc=127,
                stdout="",
                stderr=f"cannot run {argv[0]}: {err.strerror or err}",
                duration_s=time.monotonic() - t0,
            )
        return Ran(
            argv=tuple(argv),
            rc=done.returncode,
            stdout=done.stdout[:65536],
            stderr=done.stderr[:65536],
            duration_s=time.monotonic() - t0,
        )
