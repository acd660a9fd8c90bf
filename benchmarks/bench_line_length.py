"""Time each line reader takes on one line of 10 KB, 100 KB, 1 MB, 4 MB: linear readers scale by ~10x a step.

A reader whose patterns backtrack over a long line (the NCCL line prefix, searched unanchored, was
O(n^2): 27 s for 30 KB) shows it here as a column that grows 100x a step. The readers are every
format the registry marks line-oriented, the NCCL log's streaming parser (``collect``'s follower), and
``detect`` (every format's sniff, on the file's 64 KiB head). Each reads files of one line of each
shape below; a reader that takes over ``--give-up`` seconds on a length is not run on longer ones.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/bench_line_length.py [--sizes 10e3,100e3,1e6,4e6]``
Goal: each row grows ~10x from one length to the next (~4x for the last), never ~100x.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hpcwatch.errors import ParseError
from hpcwatch.sources.nccl_log import NcclLogStream
from hpcwatch.sources.registry import ReadContext, detect, formats

WATCHDOG = "Watchdog caught collective operation timeout: WorkNCCL("
#: name -> (head, unit repeated to the length); every line ends in `` NCCL INFO x`` (the sniff looks at it).
SHAPES = {
    "host-run": ("", "a"),
    "prefix-repeated": ("", "h:1:1 [0] "),
    "socket-ifs": ("h:1:1 [0] NCCL INFO NET/Socket : Using ", "[0]a:"),
    "watchdog-repeated": ("", WATCHDOG),
    "json-ish": ('{"a": "', 'x\\"{[:, '),
}


def _readers() -> dict[str, Callable[[Path], object]]:
    def by_format(name: str) -> Callable[[Path], object]:
        fmt = next(f for f in formats() if f.name == name)
        return lambda p: list(fmt.read(p, ReadContext(on_bad_line=lambda e: None)))

    def stream(p: Path) -> object:
        s = NcclLogStream(path=p)
        s.feed(p.read_bytes().split(b"\n"), on_bad_line=lambda e: None)
        return s.finish()

    readers = {f.name: by_format(f.name) for f in formats() if f.line_oriented}
    readers["nccl-log (stream)"] = stream
    readers["detect (all sniffs)"] = detect
    return readers


def _seconds(read: Callable[[Path], object], path: Path) -> float:
    start = time.perf_counter()
    try:
        read(path)
    except ParseError:  # refusing the line is an answer too: only its time counts
        pass
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10e3,100e3,1e6,4e6", help="line lengths in bytes, comma-separated")
    ap.add_argument("--give-up", type=float, default=20.0, help="seconds after which longer lines are skipped")
    args = ap.parse_args()
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    print(f"{'reader':22} {'shape':18} " + " ".join(f"{f'{n / 1e3:g} KB':>10}" for n in sizes))
    with tempfile.TemporaryDirectory() as tmp:
        for name, read in _readers().items():
            for shape, (head, unit) in SHAPES.items():
                cells = []
                for n in sizes:
                    if cells and cells[-1] > args.give_up:
                        break
                    path = Path(tmp) / f"{shape}-{n}.log"
                    path.write_text(head + unit * ((n - len(head)) // len(unit)) + " NCCL INFO x\n")
                    cells.append(_seconds(read, path))
                print(f"{name:22} {shape:18} " + " ".join(f"{c:>9.4f}s" for c in cells), flush=True)


if __name__ == "__main__":
    main()
