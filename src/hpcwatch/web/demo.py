"""What ``hpcwatch demo`` and ``hpcwatch serve`` put around the app: the live twin, the step-player pair,
the uvicorn server (loopback unless ``serve --host``; the connection cap and header deadline of web/guard.py).

The step player offers "with / without straggler". We chose to run two short
twins of the same cluster and seed, one plain and one with the ``straggler``
scenario, and store the spans of one finished step of each under the job ids
``step-player/baseline`` and ``step-player/straggler`` (no Job record, so they
never show in the Slurm queue). The page then reads both with
``store.spans(job)`` like any other job: the timings are the twin's, not
constants in the page, and the comparison holds whatever scenario the live twin
runs. ``hpcwatch serve`` on an existing store offers every job that has spans.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import uvicorn
import yaml
from fastapi import FastAPI

from hpcwatch.errors import ConfigError
from hpcwatch.httpguard import allowed_hosts, check_tls
from hpcwatch.model.cluster import REFERENCE_PATH, Cluster, parse_cluster
from hpcwatch.store import Store
from hpcwatch.web.guard import guarded_protocol
from hpcwatch.web.live import run_paced

if TYPE_CHECKING:  # loaded when the demo starts its twin
    from hpcwatch.twin.live import LiveTwin

__all__ = [
    "STEP_PLAYER_JOBS",
    "seed_step_player",
    "start_live_twin",
    "cluster_with_nodes",
    "serve_app",
    "Listen",
    "uvicorn_config",
    "LiveRunner",
    "Periodic",
    "port_free",
    "check_port",
    "COMPARISON_WARMUP_S",
]


#: Where the step player's pair is stored (see the module docstring).
STEP_PLAYER_JOBS = {"baseline": "step-player/baseline", "straggler": "step-player/straggler"}
#: Simulated seconds each comparison twin runs before its last finished step is taken.
COMPARISON_WARMUP_S = 2.0


class LiveRunner(Protocol):
    def start(self) -> object: ...  # LiveTwin returns itself; nobody here uses it
    def stop(self) -> None: ...


def cluster_with_nodes(nodes: int) -> Cluster:
    """The reference cluster with ``nodes`` nodes (the model's own YAML, one number changed)."""
    if nodes < 1:
        raise ConfigError(f"--nodes must be >= 1, got {nodes}")
    from importlib import resources

    doc = yaml.safe_load(resources.files("hpcwatch.model").joinpath(REFERENCE_PATH).read_text())
    doc["nodes"][0]["count"] = nodes
    return parse_cluster(yaml.safe_dump(doc, sort_keys=False), path=f"{REFERENCE_PATH} (nodes={nodes})")


def seed_step_player(store: Store, cluster: Cluster, *, seed: int = 0) -> dict[str, str]:
    """Store one finished step of a plain twin and of a straggler twin; return ``{key: job id}``."""
    from hpcwatch.twin import Twin

    jobs = {}
    for key, scenarios in (("baseline", ()), ("straggler", ("straggler",))):
        twin = Twin(cluster, seed=seed, scenarios=scenarios)
        twin.advance(COMPARISON_WARMUP_S)
        job = STEP_PLAYER_JOBS[key]
        store.add(dataclasses.replace(span, job=job) for span in twin.spans())
        jobs[key] = job
    return jobs


def start_live_twin(
    store: Store,
    cluster: Cluster,
    *,
    seed: int,
    scenarios: Sequence[str],
    speed: float = 1.0,
    host_files: Any = None,
    scrape_s: float | None = None,
) -> LiveTwin:
    """The twin writing into ``store`` once per tick, in a background thread (hpcwatch.twin.live); ``host_files``
    feeds its scenarios' host captures (twin.livefiles.FolderIngest: ``ingest.ingest_folder`` over ``store``);
    ``scrape_s``: each node's exporters are scraped this often (None: twin.live.scrape_interval_s)."""
    from hpcwatch.twin.live import LiveTwin

    runner = LiveTwin(
        store,
        cluster,
        seed=seed,
        scenarios=tuple(scenarios),
        speed=speed,
        host_files=host_files,
        scrape_s=scrape_s,
    )
    runner.start()
    return runner


class Periodic:
    """Runs ``work()`` every ``every_s`` seconds in a daemon thread until ``stop()``. A run that raises is logged
    and kept in ``error`` (None again after a run that did not), and the next run comes at its time.

    ``busy_share``: running at most this share of the time: after a run that lasted ``d`` s, the next waits at
    least ``d`` x (1 / share - 1), however short ``every_s`` is (``web.live.rest_after``)."""

    def __init__(
        self, what: str, work: Callable[[], object], *, every_s: float, busy_share: float | None = None
    ) -> None:
        if busy_share is not None and not 0 < busy_share <= 1:
            raise ConfigError(f"busy_share must be in (0, 1], got {busy_share}")
        self.what, self.work, self.every_s, self.busy_share = what, work, every_s, busy_share
        self.error: str | None = None
        self.runs = 0
        """Runs done, raised or not."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"hpcwatch-{what.replace(' ', '-')}", daemon=True)

    def _run(self) -> None:
        run_paced(
            self.what,
            self.work,
            every_s=self.every_s,
            busy_share=self.busy_share,
            stopped=self._stop.wait,
            ran=self._ran,
        )

    def _ran(self, error: str | None) -> None:
        self.error = error
        self.runs += 1

    def start(self) -> Periodic:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def check_port(port: int, host: str = "127.0.0.1") -> None:
    """Fail early, with one line, on a port we cannot bind on ``host``."""
    if not 0 < port < 65536:
        raise ConfigError(f"--port must be 1..65535, got {port}")
    if not port_free(port, host):
        raise ConfigError(f"port {port} on {host} is already in use or not ours (choose another with --port)")


class _Server(uvicorn.Server):
    """uvicorn that also ends the SSE streams when asked to stop (Ctrl-C, --duration)."""

    def __init__(self, config: uvicorn.Config, stopping: threading.Event) -> None:
        super().__init__(config)
        self.stopping = stopping

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.stopping.set()
        super().handle_exit(sig, frame)

    def stop(self) -> None:
        self.stopping.set()
        self.should_exit = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Listen:
    """Where and how ``serve_app`` listens. ``host`` off loopback is for the command to allow
    (hpcwatch.httpguard.check_exposure); here it is only bound."""

    host: str = "127.0.0.1"
    port: int
    allow_hosts: tuple[str, ...] = ()
    """``Host`` names accepted besides the bound address, localhost, 127.0.0.1 and ::1 (``--allow-host``)."""
    tls_cert: Path | None = None
    tls_key: Path | None = None


def uvicorn_config(app: FastAPI, listen: Listen, *, log_level: str = "warning") -> uvicorn.Config:
    """uvicorn's settings for ``app``: the guarded h11 protocol (connection cap, header deadline), the
    keep-alive and head-size limits of the app's ``Limits``, TLS when a certificate is given; and the
    app's Host allow-list set from ``listen``."""
    state = app.state.hpcwatch
    limits = state.guard.limits
    state.guard.hosts = allowed_hosts(listen.host, listen.allow_hosts)
    return uvicorn.Config(
        app,
        host=listen.host,
        port=listen.port,
        log_level=log_level,
        timeout_graceful_shutdown=2,
        access_log=False,
        http=guarded_protocol(limits),
        timeout_keep_alive=limits.keep_alive_s,
        h11_max_incomplete_event_size=limits.max_header_bytes,
        ssl_certfile=listen.tls_cert,
        ssl_keyfile=listen.tls_key,
        server_header=False,
    )


def serve_app(
    app: FastAPI,
    *,
    port: int,
    duration_s: float | None = None,
    on_started: Callable[[str], None] | None = None,
    log_level: str = "warning",
    listen: Listen | None = None,
) -> None:
    """Run the app on ``listen`` (default 127.0.0.1:port) until Ctrl-C or ``duration_s``; blocks."""
    listen = listen or Listen(port=port)
    check_port(listen.port, listen.host)
    check_tls(listen.tls_cert, listen.tls_key)
    server = _Server(uvicorn_config(app, listen, log_level=log_level), app.state.hpcwatch.stopping)
    scheme = "https" if listen.tls_cert else "http"
    shown = f"[{listen.host}]" if ":" in listen.host else listen.host
    url = f"{scheme}://{shown}:{listen.port}/"

    def watch() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            from hpcwatch.web.app import warm

            threading.Thread(target=warm, args=(app,), name="hpcwatch-warm", daemon=True).start()
            if on_started is not None:
                on_started(url)
        if duration_s is not None:
            deadline = time.monotonic() + duration_s
            while time.monotonic() < deadline and not server.should_exit:
                time.sleep(0.1)
            server.stop()

    threading.Thread(target=watch, name="hpcwatch-serve-watch", daemon=True).start()
    with _terminate_by_exception():
        server.run()


@contextlib.contextmanager
def _terminate_by_exception() -> Iterator[None]:
    """SIGTERM (systemd, ``kill``, a test's teardown) raised as ``SystemExit(143)`` while the server runs.
    uvicorn stops gracefully on it, then raises the signal again for its default action, which would end
    the process at once: the callers' ``finally`` (the twin stopped, the store closed, a demo's temporary
    store removed) would never run. SIGINT already arrives as ``KeyboardInterrupt``."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers, and uvicorn then installs none either
        return

    def terminate(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
