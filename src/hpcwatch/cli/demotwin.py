"""The demo's cluster in a process of its own: the live twin writing the store folder each tick, and the
remediation loop playing on its Slurm (``cli.demoact``), beside the web server's process, as a real cluster
and its operators are apart from ``hpcwatch serve``.

In the server's process the twin's ticks (the samples of 8,192 GPUs, the store's commits and merges: a tenth of
a core at 1,024 nodes) held the interpreter lock in turn with the live snapshot, the problems' judgement and
every request, the page's own HTML included. The child shares the store folder (any number of processes may
write one, ``store.core``), not the interpreter.

The parent starts the child and waits for its first tick in the store (``ready`` on the child's standard
output; an error that stopped it, a one-line ``error: ...``, becomes a ``ConfigError``: an unknown scenario).
It holds the child's standard input: when the parent closes it or dies, however it dies, the child stops the
loop and the twin and leaves through its store's close. Ctrl-C reaches the child too: it stops the same way.

    python -m hpcwatch.cli.demotwin STORE CONFIG_JSON
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from hpcwatch.errors import ConfigError, HpcwatchError, one_line
from hpcwatch.reports.text import visible
from hpcwatch.web.children import end_child, parent_gone

__all__ = ["DemoTwin", "TwinProcess", "STOP_TIMEOUT_S", "main"]

log = logging.getLogger(__name__)

#: How long ``stop()`` waits for the child to stop its twin and close its store before it is killed: the twin's
#: thread ends within a tick (``LiveTwin.stop`` waits 5 s for it), the loop's threads within a run. A killed child
#: loses nothing: its staged parts are in no manifest.
STOP_TIMEOUT_S = 10.0
#: How often the child looks whether its twin's thread still runs, between two looks at its standard input.
_WATCH_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoTwin:
    """What the demo's twin runs: ``hpcwatch demo``'s options."""

    nodes: int | None
    """None: the reference cluster as its YAML has it."""
    seed: int = 0
    scenarios: tuple[str, ...] = ()
    speed: float = 1.0
    scrape_s: float | None = None
    act: bool = True
    """The remediation loop on the twin's Slurm (``demo --no-act``: off)."""


class TwinProcess:
    """The twin of ``config`` writing the store folder ``path`` from a child process (module doc)."""

    def __init__(self, path: Path, config: DemoTwin) -> None:
        self.path, self.config = path, config
        self._child: subprocess.Popen[bytes] | None = None

    def start(self) -> TwinProcess:
        """Start the child and return once its first tick is in the store. ``ConfigError`` when it stopped
        before (its own one-line reason)."""
        child = subprocess.Popen(
            [sys.executable, "-m", "hpcwatch.cli.demotwin", str(self.path), json.dumps(asdict(self.config))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self._child = child
        assert child.stdout is not None
        said = child.stdout.readline().decode("utf-8", "replace").strip()
        if said == "ready":
            return self
        self.stop()
        if said.startswith("error: "):
            raise ConfigError(said.removeprefix("error: "))
        raise ConfigError(f"the demo's twin did not start (its process ended with {child.returncode})")

    @property
    def running(self) -> bool:
        return self._child is not None and self._child.poll() is None

    def stop(self) -> None:
        """Close the child's input (it stops its loop and its twin, and closes its store); kill it after
        ``STOP_TIMEOUT_S``."""
        child, self._child = self._child, None
        if child is not None:
            end_child(child, timeout_s=STOP_TIMEOUT_S)


def run_until_stopped(
    path: str, config: DemoTwin, *, ready: Callable[[], None], stopped: Callable[[float], bool] = parent_gone
) -> None:
    """The child: the twin of ``config`` on the store folder ``path`` (and its remediation loop); ``ready()``
    once its first tick is in the store; until ``stopped(wait_s)`` says so, or the twin's thread dies (what
    killed it re-raised)."""
    from hpcwatch.cli.demoact import DemoRemediation
    from hpcwatch.ingest import ingest_folder
    from hpcwatch.model.cluster import reference_cluster
    from hpcwatch.store import Store
    from hpcwatch.web.demo import cluster_with_nodes, start_live_twin

    with Store(path) as store:
        # The scenarios' host captures (smartctl, df, dmesg...) reach the store through the readers, as an agent's do.
        runner = start_live_twin(
            store,
            cluster_with_nodes(config.nodes) if config.nodes else reference_cluster(),
            seed=config.seed,
            scenarios=config.scenarios,
            speed=config.speed,
            host_files=functools.partial(ingest_folder, store),
            scrape_s=config.scrape_s,
        )
        remediation = None
        try:
            runner.wait_started()
            remediation = DemoRemediation(store, runner).start() if config.act else None
            ready()
            while runner.running and not stopped(_WATCH_S):
                pass
        finally:
            if remediation is not None:
                remediation.stop()
            runner.stop()  # re-raises what killed the twin's thread, if anything did


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 2:
        print("usage: python -m hpcwatch.cli.demotwin STORE CONFIG_JSON", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="hpcwatch demo twin: %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # leave through the store's close
    # The parent reads one line on standard output: anything else printed goes to standard error.
    said = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    told: list[str] = []

    def tell(line: str) -> None:
        told.append(line)
        with contextlib.suppress(OSError):  # the parent went meanwhile
            print(line, file=said, flush=True)

    fields = json.loads(args[1])
    config = DemoTwin(**{**fields, "scenarios": tuple(fields["scenarios"])})
    try:
        run_until_stopped(args[0], config, ready=lambda: tell("ready"))
    except (KeyboardInterrupt, BrokenPipeError):  # Ctrl-C reaches the whole process group; the demo stops us too
        return 0
    except Exception as err:  # an unknown scenario before the first tick; after it, the twin's thread died
        reason = one_line(str(err)) if isinstance(err, HpcwatchError) else one_line(f"{type(err).__name__}: {err}")
        if told:
            log.error("the twin stopped: %s", visible(reason))
        else:
            tell(f"error: {reason}")
        return 2 if isinstance(err, HpcwatchError) else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
