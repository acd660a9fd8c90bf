"""``hpcwatch demo`` stopped as a service manager or a user stops it: its temporary store goes with it.

Before, SIGTERM (systemd, ``kill``, every test fixture that stops a demo) ended the process from inside
uvicorn, which re-raises the signal after its graceful stop: the CLI's ``finally`` never ran, and each
demo left its store under the temporary folder (5,041 of them, 21 GB, were found on the development
machine)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port

#: A 2-node demo starts in about 3 s; a loaded 2-core machine was seen to take ten times that.
START_TIMEOUT_S = 120


def _started_demo(tmp: Path) -> subprocess.Popen:
    """A 2-node demo whose temporary folder is ``tmp``, once it has said its address."""
    env = {**os.environ, "TMPDIR": str(tmp), "NO_COLOR": "1"}
    cmd = [sys.executable, "-m", "hpcwatch", "demo", "--no-browser", "--nodes", "2", "--port", str(free_port())]
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # As from a shell: pytest-xdist's workers ignore SIGINT, and an ignored signal stays ignored past exec.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    assert proc.stdout is not None
    for line in proc.stdout:  # ends when the process does
        if "Ctrl-C to stop" in line:
            return proc
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise AssertionError(f"the demo did not start: exit {proc.wait()}")


# SIGINT is Ctrl-C: click turns it into its Abort, which the CLI ends with status 1.
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGINT, 1)])
def test_a_stopped_demo_removes_its_temporary_store(tmp_path, sig, code):
    proc = _started_demo(tmp_path)
    stores = list(tmp_path.glob("hpcwatch-store-*"))
    assert len(stores) == 1, stores  # the demo's store is there while it runs
    proc.send_signal(sig)
    assert proc.wait(timeout=START_TIMEOUT_S) == code
    assert not stores[0].exists()
