"""``hpcwatch steps`` on a set large enough to be read by several processes (``reports.steps.reader_processes``): this
process reads ranks from the back of the list while a forked reader takes them from the front.

The thresholds are lowered so that small real sets fork: HTA's 2 ranks of a 128-rank NCCL job and our
real 4-rank gloo run (tests/data/SOURCES.md). The document must be the one a single process writes,
byte for byte, and a broken rank, whichever process reads it, the one-line error of a single process.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest

import hpcwatch.reports.steps as step_reports

TOOK_ONE = "reader-took-one"


def after_the_reader_took_one(read, marker: Path):
    """``read``, which this process starts only once the forked reader has taken a rank: on a loaded machine
    this process could read every rank, from the back, before the fork ran, leaving the reader none."""
    parent = os.getpid()

    def wrapped(path):
        if os.getpid() != parent:
            marker.touch()
        elif step_reports._UNTAKEN is not None:  # a reader was forked
            deadline = time.monotonic() + 120
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        return read(path)

    return wrapped


@pytest.fixture
def forking(monkeypatch, tmp_path):
    """Every set of two files or more is read by two processes, and each reduction says which process made it."""
    monkeypatch.setattr(step_reports, "PARALLEL_READ_MIN_JSON_BYTES", 0)
    monkeypatch.setattr(step_reports, "JSON_BYTES_PER_READER", 1)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    read = step_reports.reduce_trace_file

    def tagged(path):
        reduction, messages = read(path)
        return reduction, (*messages, f"read by pid {os.getpid()}")

    took = after_the_reader_took_one(tagged, tmp_path / TOOK_ONE)
    monkeypatch.setattr(step_reports, "reduce_trace_file", took)  # the forked reader inherits it
    return monkeypatch


def _pids(stderr: str) -> set[str]:
    return set(re.findall(r"read by pid (\d+)", stderr))


@pytest.mark.parametrize("which", ["hta_sampled_2ranks", "gloo_straggler"])
def test_two_processes_write_the_document_of_one(which, data_dir, run_cli, forking):
    folder = str(data_dir / "kineto" / which)
    with pytest.MonkeyPatch.context() as alone:
        alone.setattr(step_reports, "PARALLEL_READ_MIN_JSON_BYTES", 2**62)
        one = run_cli(["steps", folder, "--json"])
    two = run_cli(["steps", folder, "--json"])
    assert one[0] == two[0] == 0, two[2]
    assert two[1] == one[1]
    assert _pids(one[2]) == {str(os.getpid())}
    assert len(_pids(two[2])) == 2 and str(os.getpid()) in _pids(two[2])  # this process read a share too


@pytest.mark.parametrize("broken", [0, 3], ids=["read by the forked reader", "read by this process"])
def test_a_broken_rank_is_the_one_line_error_of_one_process(broken, tmp_path, data_dir, run_cli, forking):
    for rank, trace in enumerate(sorted((data_dir / "kineto" / "gloo_straggler").glob("rank-*.json.gz"))):
        shutil.copy(trace, tmp_path / f"rank-{rank}.json")
    (tmp_path / f"rank-{broken}.json").write_text('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1}')  # cut short
    code, out, err = run_cli(["steps", str(tmp_path), "--json"])
    assert code == 2 and out == ""
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"hpcwatch: {tmp_path / f'rank-{broken}.json'}") and "Traceback" not in err
    with pytest.MonkeyPatch.context() as alone:
        alone.setattr(step_reports, "PARALLEL_READ_MIN_JSON_BYTES", 2**62)
        assert run_cli(["steps", str(tmp_path), "--json"])[2].strip().splitlines()[-1] == last


def test_a_reader_killed_loses_no_rank(data_dir, run_cli, forking, tmp_path):
    """A forked reader that dies (the kernel's OOM killer, say) takes no rank with it: this process reads
    the ranks it had taken, says so on stderr, and writes the document of one process."""
    folder = str(data_dir / "kineto" / "gloo_straggler")
    with pytest.MonkeyPatch.context() as alone:
        alone.setattr(step_reports, "PARALLEL_READ_MIN_JSON_BYTES", 2**62)
        one = run_cli(["steps", folder, "--json"])
    parent, read = os.getpid(), step_reports.reduce_trace_file

    def dies_in_a_reader(path):
        if os.getpid() != parent:
            os._exit(9)
        return read(path)

    # The marker of `forking`'s own wrapper, which the reader dies before reaching.
    dies = after_the_reader_took_one(dies_in_a_reader, tmp_path / TOOK_ONE)
    forking.setattr(step_reports, "reduce_trace_file", dies)
    code, out, err = run_cli(["steps", folder, "--json"])
    assert code == 0 and out == one[1]
    assert "a reader process stopped" in err and "its ranks are read in this process" in err


def test_a_parse_error_crosses_processes_whole():
    """A reader's ParseError is pickled back from the process that raised it: its path and line survive."""
    import pickle

    from hpcwatch.errors import ParseError

    err = ParseError("not JSON", path="/runs/rank-3.json", line=7, text="{")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is ParseError and str(back) == str(err) == "/runs/rank-3.json:7: not JSON (found: '{')"
    assert (back.what, back.path, back.line, back.text) == ("not JSON", "/runs/rank-3.json", 7, "{")
