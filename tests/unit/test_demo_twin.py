"""cli/demotwin.py: the demo's twin and remediation loop in a process of their own, over the server's store folder.

The parent must get control back only once the twin's first tick is in the store, see the twin go on writing
while it only reads, hear a twin that cannot start as one line, and never leave the child behind: when it stops
it, and when the child's input ends because the parent is gone.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from hpcwatch.cli import demotwin
from hpcwatch.cli.demotwin import DemoTwin, TwinProcess, run_until_stopped
from hpcwatch.errors import ConfigError
from hpcwatch.store import Store
from hpcwatch.twin.live import LiveTwin

#: A 2-node twin starts in a second; a loaded 2-core machine was seen to take ten times that. Ours.
WAIT_S = 120


def _ticks(store: Store) -> int:
    return int(store.query("SELECT count(DISTINCT t) FROM samples WHERE metric = 'DCGM_FI_DEV_GPU_UTIL'")[0][0])


def test_the_child_writes_the_store_from_its_first_tick_on_until_stopped(tmp_path) -> None:
    with Store(tmp_path / "store") as store:
        twin = TwinProcess(store.path, DemoTwin(nodes=2, seed=3, act=False)).start()
        try:
            assert _ticks(store) >= 1  # start() returned after the first tick was committed
            first = _ticks(store)
            deadline = time.monotonic() + WAIT_S
            while _ticks(store) < first + 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _ticks(store) >= first + 2, "the twin did not go on writing"
            assert {job.user for job in store.jobs()}  # the twin's Slurm jobs too
            child = twin._child
            assert child is not None
        finally:
            twin.stop()
        assert child.returncode == 0 and not twin.running  # left through its store's close
        settled = _ticks(store)
        time.sleep(1.5)
        assert _ticks(store) == settled  # nothing writes once it is stopped


def test_a_twin_that_cannot_start_is_one_line_and_leaves_no_child(tmp_path) -> None:
    twin = TwinProcess(tmp_path / "store", DemoTwin(nodes=2, scenarios=("no_such_scenario",)))
    with pytest.raises(ConfigError) as caught:
        twin.start()
    assert str(caught.value).startswith("unknown scenario 'no_such_scenario' (known: ")
    assert "\n" not in str(caught.value) and not twin.running


def test_the_child_stops_when_its_input_ends(tmp_path) -> None:
    """The parent gone however it went (here: its end of the pipe closed, as the kernel closes it when the
    parent is killed): the child stops its twin and leaves on its own, with no one waiting for it."""
    config = '{"nodes": 2, "seed": 0, "scenarios": [], "speed": 1.0, "scrape_s": null, "act": true}'
    child = subprocess.Popen(
        [sys.executable, "-m", "hpcwatch.cli.demotwin", str(tmp_path / "store"), config],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline() == b"ready\n"
    child.stdin.close()
    assert child.wait(timeout=WAIT_S) == 0


def test_the_loop_stops_when_told_and_says_ready_after_the_first_tick(tmp_path) -> None:
    said: list[int] = []
    with Store(tmp_path / "store") as store:
        asked = iter([False, False, True])
        run_until_stopped(
            str(store.path),
            DemoTwin(nodes=2, act=True),
            ready=lambda: said.append(_ticks(store)),
            stopped=lambda wait_s: next(asked),
        )
        assert said and said[0] >= 1


def test_a_twin_thread_that_dies_ends_the_loop_with_its_error(tmp_path, monkeypatch) -> None:
    def broken(self: LiveTwin) -> None:
        raise RuntimeError("tick failed")

    monkeypatch.setattr(LiveTwin, "step", broken)
    monkeypatch.setattr(demotwin, "_WATCH_S", 0.05)
    with Store(tmp_path / "store") as store, pytest.raises(RuntimeError, match="tick failed"):
        run_until_stopped(str(store.path), DemoTwin(nodes=2, act=False), ready=lambda: None, stopped=lambda s: False)
