"""The follower on Tetragon's own export lines, end to end: log -> store -> the weights detector.

The two lines of tests/data/security/tetragon_docs_events.jsonl are the JSON events printed in
Tetragon's documentation (a ``process_exec`` of curl; a ``process_kprobe`` of
``security_file_permission`` when vi writes /etc/passwd under the file-monitoring policy), one
object per line as the export file holds them. Tetragon rotates its export file by renaming it
(and compresses the old one), so the rotation case renames.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hpcwatch.collect.config import FollowSection
from hpcwatch.collect.follow import LogFollower
from hpcwatch.security.weights_access import WeightsConfig, weights_report
from hpcwatch.store import Store
from hpcwatch.vocab import EventKind

DATA = Path(__file__).resolve().parents[1] / "data" / "security" / "tetragon_docs_events.jsonl"
EXEC_LINE, KPROBE_LINE = DATA.read_bytes().splitlines(keepends=True)


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "store") as s:
        yield s


def follower(store, path: Path) -> LogFollower:
    return LogFollower(store, FollowSection(name="tetragon", path=str(path), format="tetragon-json"))


def test_follower_stores_tetragons_documented_events_with_their_fields(store, tmp_path):
    log = tmp_path / "tetragon.log"
    log.write_bytes(EXEC_LINE + KPROBE_LINE)
    assert follower(store, log).run().records == 2
    events = sorted(store.events(EventKind.TETRAGON), key=lambda e: e.t)
    exec_, kprobe = events
    assert exec_.attrs["type"] == "process_exec" and exec_.attrs["binary"] == "/usr/bin/curl"
    assert exec_.attrs["host"] == "gke-john-632-default-pool-7041cac0-9s95"
    assert kprobe.attrs["function_name"] == "security_file_permission"
    assert kprobe.attrs["path"] == "/etc/passwd" and kprobe.attrs["mask"] == 2
    assert kprobe.attrs["policy_name"] == "file-monitoring"
    assert kprobe.t == pytest.approx(datetime(2024, 4, 14, 2, 18, 14, 376304, UTC).timestamp(), abs=1e-6)


def test_a_watched_folders_write_reaches_the_weights_report_through_the_follower(store, tmp_path):
    log = tmp_path / "tetragon.log"
    log.write_bytes(EXEC_LINE)
    f = follower(store, log)
    f.run()
    os.rename(log, tmp_path / "tetragon-2024-04-14T02-18-00.000.log")  # Tetragon's rotation: rename
    log.write_bytes(KPROBE_LINE)
    f.run()
    # The documented policy watches /etc: with /etc as the watched folder, the write is an access.
    accesses = weights_report(store.events(EventKind.TETRAGON), (), WeightsConfig(weights_path="/etc"))
    assert [(a.access, a.binary, a.uid, a.host, a.path) for a in accesses] == [
        ("write", "/bin/vi", 0, "tetragon-dev-control-plane", "/etc/passwd")
    ]
    assert weights_report(store.events(EventKind.TETRAGON), (), WeightsConfig()) == []  # not the checkpoints


def test_a_line_cut_mid_write_is_stored_once_complete(store, tmp_path):
    log = tmp_path / "tetragon.log"
    log.write_bytes(EXEC_LINE + KPROBE_LINE[:500])
    f = follower(store, log)
    assert f.run().records == 1
    with open(log, "ab") as fh:
        fh.write(KPROBE_LINE[500:])
    assert f.run().records == 1
    assert f.run().records == 0
    assert len(list(store.events(EventKind.TETRAGON))) == 2
