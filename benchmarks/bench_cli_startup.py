"""Whole-process start-up of the command line: ``hpcwatch --help``, ``hpcwatch steps --help`` and
``hpcwatch steps TRACE --json`` on the 0.75 MB real H200 trace, each in a fresh interpreter, as a user runs it.

    flock /tmp/hpcwatch-bench.lock .venv/bin/python benchmarks/bench_cli_startup.py [--src OTHER/src] [--repeat 5]

``--src`` times another checkout's sources with this interpreter (e.g. main's, for a before/after). Each
figure is the best and the median of ``--repeat`` runs (the best is the least disturbed by other load on
the machine); the load average is printed with them because a shared machine's figures move with it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
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


def time_case(argv: list[str], *, src: Path, repeat: int) -> list[float]:
    """Wall seconds of ``repeat`` fresh processes running ``hpcwatch ARGV`` from the sources in ``src``."""
    env = dict(os.environ, PYTHONPATH=str(src))
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", _ENTRY, *argv], env=env, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="The sources to time (default: this tree's).")
    parser.add_argument("--repeat", type=int, default=5, help="Runs per command.")
    args = parser.parse_args()
    print(f"sources {args.src}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, argv in CASES.items():
        times = time_case(argv, src=args.src, repeat=args.repeat)
        print(f"{name:30s} best {min(times) * 1e3:6.0f} ms  median {statistics.median(times) * 1e3:6.0f} ms")


if __name__ == "__main__":
    main()
