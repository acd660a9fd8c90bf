"""A line of megabytes costs the NCCL readers (and every line-oriented reader) time linear in its length.

The NCCL line prefix was searched with a pattern that rescans a long run of host characters from
each of its characters: O(n^2), 27 s for a 30 KB line, past 90 s in ``ingest`` for 2 MB. The time
is bounded as a ratio to the time per byte of a real log read in the same process (the machine is
loaded; an absolute bound would flake). Each hostile read runs in a child process killed at the
bound, so the old, quadratic code fails in seconds instead of running for hours.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from hpcwatch.errors import ParseError
from hpcwatch.sources.nccl_log import parse_nccl_log

DATA = Path(__file__).parent.parent / "data" / "nccl"
REAL_LOG = DATA / "h200_socket_1gpu_v2.28.9.log"
LINE_BYTES = 2 << 20
#: How many times a real log's time per byte a hostile line may take (measured: 0.2-0.7x).
RATIO = 25
WATCHDOG = "Watchdog caught collective operation timeout: WorkNCCL("

#: Hostile lines, each a shape that made a pattern of the NCCL reader backtrack: name -> (head, unit
#: repeated to the line's length). Each ends in `` NCCL INFO x``, so the sniff looks at it too.
SHAPES = {
    "host-run": ("", "a"),
    "marked-host-run": ("NCCL INFO ", "a"),  # the sniff's 64 KiB head has the mark
    "prefix-repeated": ("", "h:1:1 [0] "),
    "socket-ifs": ("h:1:1 [0] NCCL INFO NET/Socket : Using ", "[0]a:"),
    "watchdog-repeated": ("", WATCHDOG),
    "colon-digits": ("", ":1"),
}

_CHILD = r"""
import json, sys, time
from pathlib import Path
from hpcwatch.errors import ParseError
from hpcwatch.sources.registry import ReadContext, detect, formats
from hpcwatch.sources.nccl_log import NcclLogStream, read_nccl_log

real, hostile, which = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
def read(path):
    if which == "nccl-stream":
        stream = NcclLogStream(path=path)
        stream.feed(path.read_bytes().split(b"\n"), on_bad_line=lambda e: None)
        return stream.finish()
    try:
        if which == "sniff":  # every format's sniff, on the file's head
            return detect(path)
        fmt = next(f for f in formats() if f.name == which)
        return list(fmt.read(path, ReadContext(on_bad_line=lambda e: None)))
    except ParseError as err:  # a reader may refuse the line: only its time counts here
        return err
start, n = time.process_time(), 0
while n < 20 or time.process_time() - start < 0.3:
    read(real)
    n += 1
print(json.dumps({"per_byte": (time.process_time() - start) / n / real.stat().st_size}), flush=True)
# a short line of the same shape first: the sniffers the real log never reached import their modules on
# first use (0.18 s, a constant), which is not the cost of the line's length
warm = hostile.with_name("warm-" + hostile.name)
warm.write_bytes(hostile.read_bytes()[:4096] + b" NCCL INFO x\n")
read(warm)
start = time.process_time()
read(hostile)
print(json.dumps({"seconds": time.process_time() - start}), flush=True)
"""


def _line_oriented_formats() -> list[str]:
    from hpcwatch.sources.registry import formats

    return [f.name for f in formats() if f.line_oriented]


def _hostile_file(tmp_path: Path, shape: str) -> Path:
    head, unit = SHAPES[shape]
    path = tmp_path / f"{shape}.log"
    path.write_text(head + unit * (LINE_BYTES // len(unit)) + " NCCL INFO x\n")
    return path


def _read_time_over_bound(real: Path, hostile: Path, which: str) -> tuple[float, float]:
    """(seconds the hostile read took, the bound): the child is killed at the bound."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(real), str(hostile), which], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        per_byte = json.loads(child.stdout.readline())["per_byte"]
        bound = RATIO * per_byte * hostile.stat().st_size
        started = time.perf_counter()
        try:
            # CPU seconds are compared (other processes do not count); the wall-clock kill only stops a read
            # that went quadratic, with room for a loaded machine
            child.wait(timeout=10 * bound + 10.0)
        except subprocess.TimeoutExpired:
            return time.perf_counter() - started, bound
        return json.loads(child.stdout.readline())["seconds"], bound
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("which", ["nccl-log", "nccl-stream", "sniff"])
def test_a_line_of_megabytes_costs_the_nccl_readers_linear_time(tmp_path: Path, shape: str, which: str) -> None:
    seconds, bound = _read_time_over_bound(REAL_LOG, _hostile_file(tmp_path, shape), which)
    assert seconds <= bound, f"{which}: a {LINE_BYTES >> 20} MB line took {seconds:.1f} s, bound {bound:.1f} s"


@pytest.mark.parametrize("which", [n for n in _line_oriented_formats() if n != "nccl-log"])
def test_a_line_of_megabytes_costs_every_line_reader_linear_time(tmp_path: Path, which: str) -> None:
    seconds, bound = _read_time_over_bound(REAL_LOG, _hostile_file(tmp_path, "host-run"), which)
    assert seconds <= bound, f"{which}: a {LINE_BYTES >> 20} MB line took {seconds:.1f} s, bound {bound:.1f} s"


@pytest.mark.parametrize("digits", ["18446744073709551616", "9" * 5000])
def test_a_number_beyond_64_bits_is_a_bad_line_naming_file_and_line(digits: str) -> None:
    lines = [
        "node1:42:42 [0] NCCL INFO NCCL version 2.19.3+cuda12.3",
        f"node1:42:42 [0] NCCL INFO comm 0x55d1 rank 0 nranks {digits} cudaDev 0 busId 7000 - Init COMPLETE",
    ]
    with pytest.raises(ParseError) as caught:
        list(parse_nccl_log(lines, path="job.log"))
    message = str(caught.value)
    assert message.startswith("job.log:2:") and "beyond 64 bits" in message and "\n" not in message


def test_a_number_beyond_64_bits_is_skipped_with_its_line_when_lenient() -> None:
    bad: list[ParseError] = []
    lines = [
        f"node1:{2**64}:42 [0] NCCL INFO NCCL version 2.19.3+cuda12.3",
        "node1:42:42 [0] NCCL INFO cudaDriverVersion 184467440737095516160",
        "node1:42:42 [0] NCCL INFO + NET[1.2.3] - NET/0",
        "node1:42:42 [0] NCCL INFO comm 0x55d1 rank 0 nranks 8 cudaDev 0 busId 7000 - Init COMPLETE",
        f"[Rank 0] {WATCHDOG}SeqNum={2**70}, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600060 milliseconds",
    ]
    events = list(parse_nccl_log(lines, path="job.log", on_bad_line=bad.append))
    assert [e.line for e in bad] == [1, 2, 3, 5]
    (rank,) = [e for e in events if e.kind == "nccl_rank"]
    assert rank.attrs["nranks"] == 8 and rank.attrs["cuda_driver"] is None
    orjson.dumps([e.attrs for e in events])  # what the store writes: no int beyond 64 bits left
