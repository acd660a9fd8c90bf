"""Whole-process start-up of the command line: ``hpcwatch --help``, ``hpcwatch steps --help`` and
``hpcwatch steps TRACE --json`` on the 0.75 MB real H200 trace, each in a fresh interpreter, as a user runs it.

    flock /tmp/hpcwatch-bench.lock .venv/bin/python benchmarks/bench_cli_startup.py [--src OTHER/src] [--repeat 5]

``--src`` times another checkout's sources with this interpreter (e.g. main's, for a before/after). Each
figure is the best and the median of ``--repeat`` runs (the best is the least disturbed by other load on
the machine); the load average is printed with them because a shared machine's figures move with it.

An installed package has its bytecode compiled (pip writes the .pyc files at install); a checkout run
with ``PYTHONDONTWRITEBYTECODE=1`` recompiles every one of our modules on every start (60 ms of
``hpcwatch --help`` here). So the runs use a bytecode cache of their own (``PYTHONPYCACHEPREFIX``, a
temporary folder, filled by one untimed run per command), the same for every tree timed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["CASES", "time_case", "main"]

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests/data/kineto/h200_annotated_steps.json.gz"
#: What a user types after ``hpcwatch``.
CASES = {
    "hpcwatch --help": ["--help"],
    "hpcwatch steps --help": ["steps", "--help"],
    "hpcwatch steps TRACE --json": ["steps", str(TRACE), "--json"],
}
#: The console script's own lines (pip's entry-point wrapper), so the process does what `hpcwatch` does.
_ENTRY = "import sys; sys.argv[0] = 'hpcwatch'; from hpcwatch.cli import main; sys.exit(main())"


def time_case(argv: list[str], *, env: dict[str, str], repeat: int) -> list[float]:
    """Wall seconds of ``repeat`` fresh processes running ``hpcwatch ARGV`` in ``env``, after one untimed run
    (it fills the bytecode cache and the page cache)."""
    times = []
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", _ENTRY, *argv],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        times.append(time.perf_counter() - t0)
    return times[1:]


def _env(src: Path, pycache: str) -> dict[str, str]:
    """The children's environment: bytecode written to and read from ``pycache`` only, for every module."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return dict(env, PYTHONPATH=str(src), PYTHONPYCACHEPREFIX=pycache)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="The sources to time (default: this tree's).")
    parser.add_argument("--repeat", type=int, default=5, help="Runs per command.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpcwatch-pycache-") as pycache:
        env = _env(args.src, pycache)
        print(f"sources {args.src}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for name, argv in CASES.items():
            times = time_case(argv, env=env, repeat=args.repeat)
            print(f"{name:30s} best {min(times) * 1e3:6.0f} ms  median {statistics.median(times) * 1e3:6.0f} ms")


if __name__ == "__main__":
    main()
