"""Serve the twin as a real Prometheus would find it: one dcgm-exporter + node-exporter per node.

Why: the chain Slurm prolog -> mapping files -> dcgm-exporter labels -> Prometheus -> PromQL ->
attribution can only be tested end to end if something answers scrapes the way dcgm-exporter does.
Each simulated node gets its own port, numbered from ``port``:

    node1 -> 127.0.0.1:P     GET /metrics                 dcgm-exporter text (DCGM_FI_*)
                             GET /node-exporter/metrics   node-exporter text (node_infiniband_*)
    node2 -> 127.0.0.1:P+1   ...
    nodeN -> 127.0.0.1:P+N-1

One port per node rather than one port with per-node paths: a scrape config for the twin is then
the one a real cluster uses (one ``host:port`` target per node, ``instance`` distinct without
relabelling, so ``on(instance)`` joins work), and Prometheus keeps one connection per target as it
does in production. Every port is served by one asyncio loop on one thread (no thread per node or
per request): 1,024 nodes cost 1,024 listening sockets, and a scrape costs one ``template % values``
(twin/exposition.py) — about 0.1 ms per node here.

Like dcgm-exporter run with ``--hpc-job-mapping-dir``, every scrape re-reads the node's mapping
directory (``mapping_dir/<node>/``: one file per GPU index or MIG ``gpu.instance``, job ids one per
line, as deploy/slurm/prolog writes them) and passes it to the twin as ``jobs_by_gpu``; a node with
no directory keeps the twin's own jobs. ``hpc_job=False`` serves dcgm-exporter as it runs without
a mapping directory (no ``hpc_job`` label at all). The loop advances the twin by ``tick_s`` every
``tick_s`` seconds of wall time, between scrapes.

One loop serves every node, so the twin holds in one process the sockets a cluster's exporters hold in
1,024: a listening socket and the scrapers' keep-alive connections per node. When the loop falls behind
(a loaded core), scrapers give up at scrape_timeout and reconnect while the connections they left are
still queued here; measured at 1,024 nodes under Prometheus and VictoriaMetrics with each scrape made
4 ms slower, the process went from 5,130 open files to 15,821 in 35 s. Three things follow. A node's
text is rendered once a tick and shared by every scraper, so a second scraper costs no render. Each
node keeps at most ``max_connections_per_node`` connections, and a new one closes the one idle
longest (a scraper that gave up on it). That bounds what the loop serves, not what the kernel has
already accepted for it: under an overload that lasts (the same 4 ms: 250 scrapes/s against 819
offered) the open files still reached the 20,000 limit in 40 s. So running out of file descriptors
stops the server with one line (``failure``), instead of asyncio retrying the accept every second
for as long as the process lives.

The text source is injected (anything with ``dcgm_text``, ``node_exporter_text``, ``advance``), so
the server is tested without the simulator.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from hpcwatch.errors import ConfigError

__all__ = [
    "TwinEndpoints",
    "ServeConfig",
    "TextSource",
    "CONTENT_TYPE",
    "DEFAULT_PORT",
    "DEFAULT_TICK_S",
    "DCGM_PATH",
    "NODE_EXPORTER_PATH",
    "MAX_REQUEST_HEAD_BYTES",
    "DEFAULT_MAX_CONNECTIONS_PER_NODE",
    "jobs_by_gpu",
    "prometheus_config",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The text exposition format 0.0.4, as dcgm-exporter and node-exporter send it
(https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format)."""
DEFAULT_PORT = 19400
"""dcgm-exporter listens on 9400 (https://github.com/NVIDIA/dcgm-exporter); shifted to stay clear of a real one."""
DEFAULT_TICK_S = 1.0
"""Simulated seconds per tick, and wall seconds between ticks."""
DCGM_PATH = "/metrics"
NODE_EXPORTER_PATH = "/node-exporter/metrics"
DEFAULT_MAX_CONNECTIONS_PER_NODE = 5
"""Ours: one keep-alive connection per scrape job (dcgm, node) for each of two scrapers (an HA pair, or
Prometheus beside VictoriaMetrics), and one for a scraper reconnecting after a timeout."""


class TextSource(Protocol):
    """What the server needs of the twin (hpcwatch.twin.Twin has these)."""

    def dcgm_text(self, node: str, *, jobs_by_gpu: Mapping[int | str, str] | None = None) -> str: ...

    def node_exporter_text(self, node: str) -> str: ...

    # With ServeConfig.timestamps both text methods are also called with ``timestamp=True``.

    def advance(self, dt_s: float) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeConfig:
    nodes: tuple[str, ...]
    """Node names, served on ports port, port+1, ... in this order."""
    port: int = DEFAULT_PORT
    """Port of the first node."""
    host: str = "127.0.0.1"
    """Address to bind; loopback unless you mean to expose the twin."""
    mapping_dir: Path | None = None
    """Parent of one job-mapping directory per node (``<mapping_dir>/<node>``); None: the twin's own jobs."""
    tick_s: float = DEFAULT_TICK_S
    """Seconds between twin ticks; 0 freezes the twin."""
    hpc_job: bool = True
    """False: no GPU carries an ``hpc_job`` label (dcgm-exporter without ``--hpc-job-mapping-dir``)."""
    timestamps: bool = False
    """Write the twin's clock as each sample's timestamp (ms), so a scraper stores the twin's times, not
    its own scrape times; real exporters leave it out (the default)."""

    max_connections_per_node: int = DEFAULT_MAX_CONNECTIONS_PER_NODE
    """Open connections a node's port keeps; one more closes the connection idle longest."""

    def __post_init__(self) -> None:
        if self.max_connections_per_node < 1:
            raise ConfigError(f"max_connections_per_node must be >= 1, got {self.max_connections_per_node}")
        if not self.nodes:
            raise ConfigError("nodes: at least one node to serve")
        if not 1 <= self.port <= 65535 - len(self.nodes) + 1:
            raise ConfigError(f"port: {self.port} leaves no room for {len(self.nodes)} consecutive ports")
        if self.tick_s < 0:
            raise ConfigError(f"tick_s must be >= 0, got {self.tick_s}")
        if self.mapping_dir is not None and not self.hpc_job:
            raise ConfigError("hpc_job: a mapping_dir labels GPUs with hpc_job; it cannot be off as well")


def jobs_by_gpu(mapping: Mapping[str, Sequence[str]]) -> dict[int | str, str]:
    """The mapping directory ({"0": ["7"], "1": ["7", "8"], "2.0": ["9"]}) in Twin.dcgm_text's shape.

    Whole-GPU names become ints (the twin's GPU index); MIG ``gpu.instance`` names stay strings.
    """
    return {(int(gpu) if gpu.isdigit() else gpu): ",".join(ids) for gpu, ids in mapping.items() if ids}


MAX_REQUEST_HEAD_BYTES = 16384
"""A scrape's request line and headers are a few hundred bytes; anything longer is not a scraper."""
_STARTUP_TIMEOUT_S = 60.0


@dataclass(slots=True)
class TwinEndpoints:
    """Every node's endpoints on one asyncio loop (one thread), started and stopped together."""

    source: TextSource
    config: ServeConfig
    read_mapping: Callable[[Path], dict[str, list[str]]] | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _last_error: dict[str, str] = field(default_factory=dict)
    scrapes: int = 0
    """Scrapes answered since start (both paths, every node)."""
    bytes_served: int = 0
    """Body bytes of those answers."""
    bodies_reused: int = 0
    """Scrapes answered with the text already rendered for their node in this tick (another scraper's, or the
    same scraper's again when a tick came late)."""
    connections_evicted: int = 0
    """Connections closed because their node had max_connections_per_node open (the loop fell behind)."""
    failure: str | None = None
    """Why the server stopped on its own (out of file descriptors); None while it serves."""
    _open: dict[str, dict[asyncio.StreamWriter, float]] = field(default_factory=dict)
    _bodies: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    _ticks: int = 0

    @property
    def targets(self) -> dict[str, str]:
        """node -> "host:port", what a Prometheus static config lists."""
        return {node: f"{self.config.host}:{self.config.port + i}" for i, node in enumerate(self.config.nodes)}

    def start(self) -> TwinEndpoints:
        if self.read_mapping is None and self.config.mapping_dir is not None:
            # The twin writes formats and reads none: the caller hands it the mapping reader.
            raise ConfigError("twin serve: a mapping_dir needs read_mapping (sources.mapping.read_job_mapping_dir)")
        bound: Future = Future()
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, args=(loop, bound), daemon=True, name="hpcwatch-twin-serve")
        self._thread.start()
        try:
            bound.result(timeout=_STARTUP_TIMEOUT_S)  # a port in use raises its ConfigError here
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            # A failed bind closes the loop on its own thread, which may not have returned yet.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
        self._loop = self._thread = None

    def __enter__(self) -> TwinEndpoints:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def serving(self) -> bool:
        """True while the loop runs (False after stop() or a failure)."""
        return self._thread is not None and self._thread.is_alive()

    # -- what a scrape returns -------------------------------------------------------------------

    def dcgm_body(self, node: str) -> str:
        """dcgm-exporter's answer for one node, labelled from its mapping directory as it is now."""
        jobs = self._node_jobs(node)
        kwargs = {"timestamp": True} if self.config.timestamps else {}
        with self._lock:
            return self.source.dcgm_text(node, jobs_by_gpu=jobs, **kwargs)

    def node_exporter_body(self, node: str) -> str:
        kwargs = {"timestamp": True} if self.config.timestamps else {}
        with self._lock:
            return self.source.node_exporter_text(node, **kwargs)

    def _node_jobs(self, node: str) -> dict[int | str, str] | None:
        if not self.config.hpc_job:
            return {}  # no GPU maps to a job: no hpc_job label
        if self.config.mapping_dir is None or self.read_mapping is None:
            return None
        directory = self.config.mapping_dir / node
        if not directory.is_dir():
            return {}  # dcgm-exporter with an empty directory: no GPU carries a job
        return jobs_by_gpu(self.read_mapping(directory))

    def answer(self, node: str, path: str) -> tuple[int, bytes]:
        """(HTTP status, body) of one GET on ``node``'s port: the one core the loop's handler wraps."""
        if path in (DCGM_PATH, NODE_EXPORTER_PATH):
            body, status = self._render_once_a_tick(node, path), 200
        elif path == "/":
            body, status = f"hpcwatch twin, {node}: {DCGM_PATH} (dcgm-exporter), {NODE_EXPORTER_PATH}\n", 200
        else:
            body, status = "not found\n", 404
        if body is None:
            body, status = "the twin failed to render this scrape; see the server log\n", 500
        data = body.encode()
        if status == 200 and path != "/":
            self.scrapes += 1
            self.bytes_served += len(data)
        return status, data

    def _render_once_a_tick(self, node: str, path: str) -> str | None:
        """The body for ``path``, rendered once per node and tick: a second scraper in the same tick (an HA
        pair, Prometheus beside VictoriaMetrics) gets the same text without costing the loop a render.
        Not with a mapping directory, which dcgm-exporter re-reads on every scrape, nor with a frozen twin
        (``tick_s`` 0), which its owner may advance by hand between scrapes."""
        hit = self._bodies.get((node, path))
        if hit is not None and hit[0] == self._ticks:
            self.bodies_reused += 1
            return hit[1]
        fn = self.dcgm_body if path == DCGM_PATH else self.node_exporter_body
        body = self._render(node, fn)
        if body is not None and self.config.mapping_dir is None and self.config.tick_s > 0:
            self._bodies[(node, path)] = (self._ticks, body)
        return body

    def _render(self, node: str, fn: Callable[[str], str]) -> str | None:
        try:
            return fn(node)
        except Exception as err:  # a scrape must answer, even when the twin or the reader fails
            message = f"{node}: {type(err).__name__}: {err}"
            if self._last_error.get(node) != message:  # once, not once per scrape
                self._last_error[node] = message
                print(f"hpcwatch twin serve: {message}", file=sys.stderr)
            return None

    # -- the loop --------------------------------------------------------------------------------

    def _run(self, loop: asyncio.AbstractEventLoop, bound: Future) -> None:
        asyncio.set_event_loop(loop)
        loop.set_exception_handler(self._on_loop_error)
        servers: list[asyncio.AbstractServer] = []
        try:
            loop.run_until_complete(self._bind_all(servers))
        except BaseException as err:
            _close(loop, servers)  # the ports bound so far are free again when start() raises
            bound.set_exception(err)
            return
        bound.set_result(None)
        ticker = loop.create_task(self._tick()) if self.config.tick_s > 0 else None
        loop.run_forever()  # until stop() calls loop.stop
        if ticker is not None:
            ticker.cancel()
        _close(loop, servers)

    async def _bind_all(self, servers: list) -> None:
        for node, target in self.targets.items():
            port = int(target.rsplit(":", 1)[1])
            try:
                servers.append(
                    await asyncio.start_server(
                        functools.partial(self._serve, node),
                        self.config.host,
                        port,
                        limit=MAX_REQUEST_HEAD_BYTES,
                    )
                )
            except OSError as err:
                raise ConfigError(f"port {port} for {node}: {err.strerror or err}") from err

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """Out of file descriptors: stop with one line. asyncio itself logs a traceback and retries the
        accept every second (selector_events, ACCEPT_RETRY_DELAY), for as long as the process lives."""
        err = context.get("exception")
        if isinstance(err, asyncio.CancelledError):
            return  # our own _close cancelling a connection's task; Python 3.11's stream callback reports it
        if not (isinstance(err, OSError) and err.errno in (errno.EMFILE, errno.ENFILE)):
            loop.default_exception_handler(context)
            return
        if self.failure is None:
            self.failure = _out_of_files(err, context.get("socket"))
            print(f"hpcwatch twin serve: {self.failure}", file=sys.stderr)
            loop.stop()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.config.tick_s)
            with self._lock:
                self.source.advance(self.config.tick_s)
                self._ticks += 1

    async def _serve(self, node: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """HTTP/1.1 keep-alive, GET only: what Prometheus and VictoriaMetrics send to an exporter."""
        live = self._open.setdefault(node, {})
        self._admit(live, writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                live[writer] = time.monotonic()
                method, path, keep_alive = _request(head)
                status, body = self.answer(node, path) if method == "GET" else (405, b"GET only\n")
                writer.write(_response_head(status, len(body), keep_alive) + body)
                await writer.drain()
                if not keep_alive:
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass  # the scraper hung up (or gave up at scrape_timeout: its `up` already says so)
        except asyncio.CancelledError:
            pass  # stop(): ending normally, because Python 3.11's stream callback re-raises a cancellation
        finally:
            live.pop(writer, None)
            writer.close()

    def _admit(self, live: dict[asyncio.StreamWriter, float], writer: asyncio.StreamWriter) -> None:
        """Make room for ``writer`` among a node's open connections, closing the one idle longest."""
        while len(live) >= self.config.max_connections_per_node:
            idle_longest = min(live, key=live.__getitem__)
            del live[idle_longest]
            idle_longest.close()
            self.connections_evicted += 1
        live[writer] = time.monotonic()


def _out_of_files(err: OSError, sock: object) -> str:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    where = getattr(sock, "getsockname", lambda: ("?", "?"))()
    return (
        f"out of file descriptors accepting on port {where[1]} ({err.strerror}; soft limit {soft}, "
        f"ulimit -n): serve fewer nodes or raise the limit"
    )


_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error"}


def _request(head: bytes) -> tuple[str, str, bool]:
    """(method, path without query, keep the connection) of a request head; ValueError when malformed."""
    lines = head.decode("latin-1").split("\r\n")
    method, target, version = lines[0].split(" ", 2)
    headers = {k.strip().lower(): v.strip().lower() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    keep = headers.get("connection", "keep-alive" if version == "HTTP/1.1" else "close") != "close"
    return method, target.split("?", 1)[0], keep


def _response_head(status: int, length: int, keep_alive: bool) -> bytes:
    return (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\nServer: hpcwatch-twin\r\nContent-Type: {CONTENT_TYPE}\r\n"
        f"Content-Length: {length}\r\nConnection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    ).encode()


def _close(loop: asyncio.AbstractEventLoop, servers: list) -> None:
    """Close the listening sockets and the open connections, then the loop."""
    for server in servers:
        server.close()
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


def prometheus_config(
    targets: Mapping[str, str], *, scrape_interval_s: float = 1.0, cluster: str = "twin", honor_timestamps: bool = True
) -> str:
    """A prometheus.yml that scrapes every node's two endpoints (YAML is a JSON superset).

    One static group per node, so each target carries its ``node`` label (what ``schemas.sample_keys``
    reads as the host of node-exporter series); ``honor_timestamps`` is written out because
    VictoriaMetrics' default for it has changed across releases, and the twin may serve timestamps.
    """
    import json

    def job(name: str, path: str) -> dict:
        return {
            "job_name": name,
            "metrics_path": path,
            "honor_timestamps": honor_timestamps,
            "static_configs": [
                {"targets": [target], "labels": {"cluster": cluster, "node": node}} for node, target in targets.items()
            ],
        }

    interval = f"{scrape_interval_s:g}s"
    return json.dumps(
        {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [job("dcgm", DCGM_PATH), job("node", NODE_EXPORTER_PATH)],
        },
        indent=1,
    )
