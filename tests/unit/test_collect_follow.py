"""The tail -F follower: every line of a growing, rotated, truncated log stored once, across restarts.

Lines are the Falco documentation's JSON alert (tests/data/security/falco_docs_alert.jsonl) with
its time moved one second per line, so each stored event says which line it came from.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hpcwatch.collect.config import FollowSection
from hpcwatch.collect.cursor import CURSOR_FORMAT
from hpcwatch.collect.follow import LogFollower
from hpcwatch.store import Store

DATA = Path(__file__).resolve().parents[1] / "data" / "security" / "falco_docs_alert.jsonl"
BASE = json.loads(DATA.read_text())
T0 = 1507591916.746609


def alert(i: int) -> bytes:
    when = datetime.fromtimestamp(1507591916 + i, UTC).strftime("%Y-%m-%dT%H:%M:%S.746609046Z")
    doc = dict(BASE, time=when)
    return (json.dumps(doc) + "\n").encode()


def lines(path: Path, rng: range) -> None:
    with open(path, "ab") as f:
        for i in rng:
            f.write(alert(i))


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "store") as s:
        yield s


def follower(store, path: Path, **kw) -> LogFollower:
    return LogFollower(store, FollowSection(name="falco", path=str(path), **kw))


def stored(store) -> list[float]:
    return sorted(round(e.t - T0) for e in store.events("falco"))


def test_follow_stores_appended_lines_once(store, tmp_path):
    log = tmp_path / "events.json"
    lines(log, range(0, 5))
    f = follower(store, log)
    assert f.run().records == 5
    assert f.run().records == 0  # nothing new: nothing stored again
    lines(log, range(5, 8))
    assert f.run().records == 3
    assert stored(store) == list(range(8))


def test_follow_waits_for_a_line_still_being_written(store, tmp_path):
    log = tmp_path / "events.json"
    lines(log, range(0, 2))
    with open(log, "ab") as fh:
        fh.write(alert(2)[:40])  # half a line: the writer is mid-write
    f = follower(store, log)
    assert f.run().records == 2
    with open(log, "ab") as fh:
        fh.write(alert(2)[40:])
    assert f.run().records == 1
    assert stored(store) == [0, 1, 2]


def test_follow_finishes_a_rotated_file_then_reads_the_new_one(store, tmp_path):
    log = tmp_path / "events.json"
    lines(log, range(0, 3))
    f = follower(store, log)
    f.run()
    lines(log, range(3, 5))  # written before the rotation, not yet read
    os.rename(log, tmp_path / "events.json.1")  # logrotate's create mode
    lines(log, range(5, 7))
    result = f.run()
    assert "rotated" in result.note
    assert stored(store) == list(range(7))


def test_follow_reads_the_copy_of_a_copytruncated_file(store, tmp_path):
    log = tmp_path / "events.json"
    lines(log, range(0, 3))
    f = follower(store, log)
    f.run()
    lines(log, range(3, 6))  # the writer goes on before logrotate copies
    lines(tmp_path / "events.json.0", range(50, 60))  # an older rotation beside it: long enough, wrong head
    (tmp_path / "events.json.1").write_bytes(log.read_bytes())
    os.truncate(log, 0)
    lines(log, range(6, 8))
    result = f.run()
    assert "copy events.json.1" in result.note
    assert stored(store) == list(range(8))


def test_follow_plain_truncation_starts_over_and_says_so(store, tmp_path):
    log = tmp_path / "events.json"
    lines(log, range(0, 4))
    f = follower(store, log)
    f.run()
    os.truncate(log, 0)
    lines(log, range(10, 11))  # shorter than before: a truncation, not growth
    result = f.run()
    assert "truncated" in result.note and f.truncations == 1
    assert stored(store) == [0, 1, 2, 3, 10]


def test_follow_truncated_and_regrown_past_the_offset_is_told_by_its_head(store, tmp_path):
    log = tmp_path / "events.json"
    lines(log, range(0, 2))
    f = follower(store, log)
    f.run()
    with open(log, "wb") as fh:  # rewritten in place, longer than before
        for i in range(20, 24):
            fh.write(alert(i))
    f.run()
    assert stored(store) == [0, 1, 20, 21, 22, 23]


def test_follow_resumes_after_a_restart_without_reading_twice(store, tmp_path):
    log = tmp_path / "events.json"
    lines(log, range(0, 3))
    follower(store, log).run()
    lines(log, range(3, 6))
    again = follower(store, log)  # a new process: the position comes from the store
    assert again.run().records == 3
    assert stored(store) == list(range(6))


def test_follow_restart_after_rotation_finishes_the_rotated_file_first(store, tmp_path):
    log = tmp_path / "events.json"
    lines(log, range(0, 2))
    follower(store, log).run()
    lines(log, range(2, 4))
    os.rename(log, tmp_path / "events.json-20240101")
    lines(log, range(4, 5))
    restarted = follower(store, log)  # killed before it saw the rotation
    assert "finishing rotated events.json-20240101" in restarted.run().note
    assert stored(store) == list(range(5))


def test_follow_keeps_one_cursor_mark_however_many_commits(store, tmp_path):
    log = tmp_path / "events.json"
    f = follower(store, log.with_name("events.json"), max_batch_bytes=600)
    lines(log, range(0, 10))  # 10 lines of ~400 bytes: 10 commits of one line
    f.run()
    marks = [m for m in store.sources() if m.format == CURSOR_FORMAT]
    assert len(marks) == 1 and '"offset":' in marks[0].key
    assert stored(store) == list(range(10))


def test_follow_bad_lines_are_counted_with_their_file_line(store, tmp_path):
    log = tmp_path / "events.json"
    lines(log, range(0, 2))
    f = follower(store, log)
    f.run()
    with open(log, "ab") as fh:
        fh.write(b"{not json\n")
    lines(log, range(2, 3))
    f.run()
    assert f.bad_lines == 1 and f.last_bad.startswith(f"{log}:3:")
    assert stored(store) == [0, 1, 2]


def test_follow_a_missing_log_is_an_error_not_an_empty_answer(store, tmp_path):
    from hpcwatch.errors import BackendError

    with pytest.raises(BackendError, match="cannot open"):
        follower(store, tmp_path / "absent.json").run()


# -- NCCL_DEBUG=INFO logs: one nccl_rank per process, whatever the pieces the follower read ------------------

NCCL_DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"
#: 8 processes of one host, no Init COMPLETE (an excerpt): their events come when the file is over.
NCCL_NO_COMPLETE = (NCCL_DATA / "nccl_952_ib_plugin_p2p_socket.log").read_bytes()
#: 8 processes that print Init COMPLETE, then WARN lines: their events come as the COMPLETE lines are read.
NCCL_COMPLETE = (NCCL_DATA / "deepspeedexamples_310_ib_async_warn.log").read_bytes()
#: 2 hosts of nccl-tests, in the file written after the rotation.
NCCL_AFTER = (NCCL_DATA / "nccl_tests_185_roce_2node_v2.19.3.log").read_bytes()


def _rank_key(a: dict) -> tuple:
    return (a["host"], a["pid"], a["cuda_dev"])


def _ranks_of(text: bytes) -> list[dict]:
    from hpcwatch.sources.nccl_log import parse_nccl_log

    events = parse_nccl_log(text.splitlines(), t=0.0)
    return sorted((dict(e.attrs) for e in events if e.kind == "nccl_rank"), key=_rank_key)


def _stored_ranks(store) -> list[dict]:
    return sorted((dict(e.attrs) for e in store.events("nccl_rank")), key=_rank_key)


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


def test_follow_nccl_log_stores_every_process_once_across_pieces_restart_and_rotation(store, tmp_path):
    log = tmp_path / "nccl.log"
    section = FollowSection(name="nccl", path=str(log), format="nccl-log")
    first = NCCL_NO_COMPLETE + NCCL_COMPLETE
    cut = NCCL_NO_COMPLETE.index(b"\n", 900) + 25  # mid-line: the follower must wait for the rest
    _append(log, first[:cut])
    f = LogFollower(store, section)
    f.run()
    assert _stored_ranks(store) == []  # no process has completed its init yet
    f.close()
    _append(log, first[cut : len(NCCL_NO_COMPLETE) + 600])
    f = LogFollower(store, section)  # a restart: what the stream held comes from the cursor
    f.run()
    _append(log, first[len(NCCL_NO_COMPLETE) + 600 :])
    f.run()
    live = _stored_ranks(store)
    assert [a["rank"] for a in live] == list(range(8))  # the 8 Init COMPLETE processes, while the file is live
    assert {a["pid"] for a in live} == set(range(5021, 5029))
    os.rename(log, tmp_path / "nccl.log.1")  # logrotate's create mode
    _append(log, NCCL_AFTER)
    assert "rotated" in f.run().note
    f.run()
    stored_ranks = _stored_ranks(store)
    expected = _ranks_of(first)  # the whole first file read at once, as ingest does
    for a in expected:  # a WARN after a process's Init COMPLETE is its own event,
        if a["pid"] in range(5021, 5029) and a["rank"] is not None:  # not in the nccl_rank stored at COMPLETE
            a["warns"] = 0
    assert stored_ranks == expected  # each of its processes once, the same attrs
    assert len({_rank_key(a) for a in stored_ranks}) == len(stored_ranks)
    assert not {a["host"] for a in stored_ranks} & {"dgxh100-3", "dgxh100-4"}  # the new file is not over
    assert len(store.events("nccl_warn")) == NCCL_COMPLETE.count(b"NCCL WARN")
    os.rename(log, tmp_path / "nccl.log.2")
    log.write_bytes(b"")
    f.run()
    assert _stored_ranks(store) == sorted(expected + _ranks_of(NCCL_AFTER), key=_rank_key)


def test_follow_nccl_bad_line_is_numbered_in_the_file(store, tmp_path):
    log = tmp_path / "nccl.log"
    log.write_bytes(NCCL_COMPLETE[:300] + b"\n")
    f = LogFollower(store, FollowSection(name="nccl", path=str(log), format="nccl-log"))
    f.run()
    before = NCCL_COMPLETE[:300].count(b"\n") + 1
    _append(log, b"h:1:2 [0] NCCL INFO comm 0x1 rank x nranks 8 cudaDev 0 busId 1000 - Init START\n")
    f.run()
    assert f.bad_lines == 1 and f"nccl.log:{before + 1}:" in f.last_bad
