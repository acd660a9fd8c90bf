"""What the server's child processes share (the security scan's, the job pages', the demo's twin): each takes the
end of its standard input for the order to stop, so that none outlives its parent however the parent dies (the
kernel closes a dead process's pipes); the parent ends one by closing that input, and kills it only when it does
not leave in time.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys

__all__ = ["parent_gone", "end_child"]


def parent_gone(wait_s: float) -> bool:
    """In the child: wait up to ``wait_s`` seconds for the end of standard input; True when it came (the parent
    closed it, or died)."""
    readable, _, _ = select.select([sys.stdin], [], [], wait_s)
    return bool(readable) and not os.read(sys.stdin.fileno(), 1)


def end_child(
    child: subprocess.Popen[bytes], *, timeout_s: float, outputs: bool = True, terminate: bool = False
) -> None:
    """In the parent: close ``child``'s input (it leaves through its store's close; ``terminate``: sent SIGTERM
    too, for a child busy where it does not read its input), and kill it after ``timeout_s``; its output pipe
    closed too when no other thread reads it (``outputs``)."""
    if child.stdin is not None:
        try:
            child.stdin.close()
        except OSError:
            pass  # a broken pipe: the child is gone already
    if terminate:
        child.terminate()
    try:
        child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    if outputs and child.stdout is not None:
        child.stdout.close()
