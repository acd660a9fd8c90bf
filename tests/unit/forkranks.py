"""How the gloo worker scripts of the tests start a job's ranks: each in a forked child, as torchrun's agent
would start processes, and the ranks that failed. ``beside(script)`` copies this file next to a worker script,
whose folder is first on its ``sys.path``, so the script imports it as ``from forkranks import fork_ranks``."""

from __future__ import annotations

import os
import shutil
import sys
import traceback
from collections.abc import Callable
from pathlib import Path


def fork_ranks(world: int, run: Callable[[int], object], *, setup: Callable[[int], object] | None = None) -> list[int]:
    """``run(rank)`` for each rank in its own child (``setup(rank)`` first, in the child); the ranks whose child
    raised or died, once every child has ended."""
    pids = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                if setup is not None:
                    setup(rank)
                run(rank)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids.append(pid)
    return [rank for rank, pid in enumerate(pids) if os.waitpid(pid, 0)[1] != 0]


def beside(script: Path) -> None:
    shutil.copyfile(__file__, script.parent / "forkranks.py")
