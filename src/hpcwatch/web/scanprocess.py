"""The demo's security scan in a process of its own, as ``hpcwatch collect`` runs the detectors apart from
``hpcwatch serve`` on a real cluster.

In the demo's process the scan took a quarter of the interpreter (its busy share, ``SCAN_BUSY_SHARE``) beside
the twin, the page's snapshots and the problems' judgement: at 1,024 nodes one scan is ~10 s of CPU over the
5-minute window, and the snapshot the stream waits for got what was left. A process of its own shares the
store folder (any number of processes may read and write one, ``store.core``), not the interpreter.

``stop()`` terminates the child (a scan cut short commits nothing: a store transaction is whole or nothing).
The parent also holds the child's standard input: when the parent dies, however it dies, the child reads its
end after the scan under way and stops, so no scan outlives its demo.

    python -m hpcwatch.web.scanprocess STORE EVERY_S WINDOW_S BUSY_SHARE
"""

from __future__ import annotations

import gc
import logging
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcwatch.errors import ConfigError
from hpcwatch.web.children import end_child, parent_gone

__all__ = ["ScanProcess", "SCAN_BUSY_SHARE", "main"]

#: The most of the time the scan runs: after a scan of ``d`` s the next waits ``d`` x (1 / share - 1). Ours: a
#: quarter, as when the scan ran in the demo's own process; apart it no longer slows the page, but it still
#: takes a core's quarter on a laptop.
SCAN_BUSY_SHARE = 0.25
#: How long ``stop()`` waits for the terminated child to close its store before it kills it: short, so that the
#: demo's own shutdown (which a test or a service manager may cut short with SIGKILL, leaving the store folder)
#: does not wait on a scan. A killed child loses nothing: its staged parts are in no manifest.
STOP_TIMEOUT_S = 2.0


class ScanProcess:
    """Runs the six detectors over the store folder ``path`` every ``every_s`` seconds in a child process:
    ``security.scan.LiveScan`` over the last ``window_s`` seconds (None: ``rescan`` of everything), at most
    ``busy_share`` of the time. Its findings reach the page through the store, as a real detector's do."""

    def __init__(
        self, path: Path, *, every_s: float, window_s: float | None = None, busy_share: float = SCAN_BUSY_SHARE
    ) -> None:
        if not 0 < busy_share <= 1:
            raise ConfigError(f"busy_share must be in (0, 1], got {busy_share}")
        if every_s <= 0:
            raise ConfigError(f"every_s must be > 0, got {every_s}")
        self.path, self.every_s, self.window_s, self.busy_share = path, every_s, window_s, busy_share
        self._child: subprocess.Popen[bytes] | None = None

    def start(self) -> ScanProcess:
        args = [str(self.path), str(self.every_s), str(self.window_s or 0), str(self.busy_share)]
        self._child = subprocess.Popen(
            [sys.executable, "-m", "hpcwatch.web.scanprocess", *args], stdin=subprocess.PIPE, close_fds=True
        )
        return self

    @property
    def running(self) -> bool:
        return self._child is not None and self._child.poll() is None

    def stop(self) -> None:
        child, self._child = self._child, None
        if child is not None:  # a scan under way is cut: its findings commit whole or not at all
            end_child(child, timeout_s=STOP_TIMEOUT_S, terminate=True)


def scan_until_stopped(
    path: str, every_s: float, window_s: float, busy_share: float, *, stopped: Callable[[float], bool] = parent_gone
) -> int:
    """The child's loop; ``stopped(wait_s)`` waits and says whether to stop. Returns the scans run."""
    from hpcwatch.security.scan import LiveScan, rescan
    from hpcwatch.store import Store
    from hpcwatch.web.live import run_paced

    with Store(path) as store:
        scan = LiveScan(window_s=window_s) if window_s > 0 else rescan
        return run_paced(
            "security scan", lambda: _unpaused(scan, store), every_s=every_s, busy_share=busy_share, stopped=stopped
        )


def _unpaused(scan: Callable[[Any], object], store: Any) -> None:
    """``scan(store)`` without the garbage collector's pauses. A live scan held its window's millions of points
    as Python objects, and each read added a hundred thousand: the collector went through them all several times a
    read (a second of a two-second scan at 1,024 nodes). The grouped detectors now keep numpy columns, but the
    samples the others read, the events and the findings are still objects. A scan makes no reference cycle (a
    collection after one finds nothing to free), so the collector waits until the scan is over, collects what
    the scan made, and the survivors are frozen out of later collections (``gc.freeze``): they are still freed
    when no longer referred to, as the window moves on."""
    gc.disable()
    try:
        scan(store)
    finally:
        gc.collect()
        gc.freeze()
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4:
        print("usage: python -m hpcwatch.web.scanprocess STORE EVERY_S WINDOW_S BUSY_SHARE", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="hpcwatch demo scan: %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop(): leave through the store's close
    path, every_s, window_s, busy_share = args[0], float(args[1]), float(args[2]), float(args[3])
    try:
        scan_until_stopped(path, every_s, window_s, busy_share)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the demo stops us too
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
