"""web/scanprocess.py: the demo's security scan in a process of its own, over the demo's store folder.

The twin's RDMA exfiltration scenario (a node moving InfiniBand traffic with no job) must light its vector
from findings the child process wrote; the child stops when told, and when its parent's end of its standard
input closes (the parent died).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from hpcwatch.errors import ConfigError
from hpcwatch.store import Store
from hpcwatch.twin.live import LiveTwin
from hpcwatch.web.demo import cluster_with_nodes
from hpcwatch.web.scanprocess import ScanProcess, scan_until_stopped

START = 1_796_000_000.0


def _threat_store(tmp_path) -> Store:
    store = Store(tmp_path / "store")
    live = LiveTwin(store, cluster_with_nodes(3), seed=0, start=START, scenarios=("threat_rdma",))
    for _ in range(25):
        live.step()
    return store


def _vectors(store: Store) -> set[str]:
    return {f.vector for f in store.findings()}


def test_the_loop_scans_until_stopped_and_its_findings_reach_the_store(tmp_path):
    store = _threat_store(tmp_path)
    waits: list[float] = []

    def twice(wait_s: float) -> bool:
        waits.append(wait_s)
        return len(waits) > 2

    assert scan_until_stopped(str(store.path), 10.0, 300.0, 0.25, stopped=twice) == 2
    assert waits[0] == 10.0 and all(w >= 10.0 for w in waits)
    assert "rdma_blind_spot" in _vectors(store)
    store.close()


def test_the_child_process_writes_findings_and_stops_when_told(tmp_path):
    store = _threat_store(tmp_path)
    scanner = ScanProcess(store.path, every_s=0.2, window_s=300.0).start()
    try:
        deadline = time.monotonic() + 120  # the child's start-up (imports) and a first scan, on a loaded machine
        while "rdma_blind_spot" not in _vectors(store):
            assert scanner.running, "the scan process ended"
            assert time.monotonic() < deadline, "no finding from the scan process"
            time.sleep(0.2)
    finally:
        scanner.stop()
    assert not scanner.running
    store.close()


def test_the_child_stops_when_its_parents_end_of_stdin_closes(tmp_path):
    store = Store(tmp_path / "store")
    child = subprocess.Popen(
        [sys.executable, "-m", "hpcwatch.web.scanprocess", str(store.path), "3600", "300", "0.25"],
        stdin=subprocess.PIPE,
    )
    assert child.stdin is not None
    child.stdin.close()  # what the parent's death does
    assert child.wait(timeout=120) == 0  # before its first scan, an hour away
    store.close()


@pytest.mark.parametrize(("every_s", "share"), [(10.0, 0.0), (10.0, 1.5), (0.0, 0.25)])
def test_a_share_or_period_out_of_range_is_refused(tmp_path, every_s, share):
    with pytest.raises(ConfigError):
        ScanProcess(tmp_path, every_s=every_s, busy_share=share)


def test_usage_is_said_on_wrong_arguments(capsys):
    from hpcwatch.web.scanprocess import main

    assert main(["only-one"]) == 2
    assert "usage:" in capsys.readouterr().err


@pytest.mark.parametrize("fails", [False, True])
def test_a_scan_runs_without_the_collectors_pauses_and_leaves_its_survivors_frozen(fails):
    """``_unpaused``: no collection while the scan runs, the collector back on after it (whether or not it
    raised), and what the scan kept out of later collections."""
    import contextlib
    import gc

    from hpcwatch.web.scanprocess import _unpaused

    kept, seen = [], []

    def scan(store):
        seen.append(gc.isenabled())
        kept.append([object() for _ in range(100)])
        if fails:
            raise RuntimeError("store gone")

    frozen = gc.get_freeze_count()
    try:
        with pytest.raises(RuntimeError) if fails else contextlib.nullcontext():
            _unpaused(scan, None)
        assert seen == [False] and gc.isenabled()
        assert gc.get_freeze_count() >= frozen + 1  # the scan's list at least
    finally:
        gc.unfreeze()
