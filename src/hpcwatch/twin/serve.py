"""Serve the twin as a real Prometheus would find it: one dcgm-exporter + node-exporter per node.

Why: the chain Slurm prolog -> mapping files -> dcgm-exporter labels -> Prometheus -> PromQL ->
attribution can only be tested end to end if something answers scrapes the way dcgm-exporter does.
Each simulated node gets its own port (Prometheus needs one target per node, and keeps
``instance`` distinct), numbered from ``port``:

    node1 -> 127.0.0.1:P     GET /metrics                 dcgm-exporter text (DCGM_FI_*)
                             GET /node-exporter/metrics   node-exporter text (node_infiniband_*)
    node2 -> 127.0.0.1:P+1   ...
    nodeN -> 127.0.0.1:P+N-1

Like dcgm-exporter run with ``--hpc-job-mapping-dir``, every scrape re-reads the node's mapping
directory (``mapping_dir/<node>/``: one file per GPU index or MIG ``gpu.instance``, job ids one per
line, as deploy/slurm/prolog writes them) and passes it to the twin as ``jobs_by_gpu``; a node with
no directory keeps the twin's own jobs. A background thread advances the twin by ``tick_s`` every
``tick_s`` seconds of wall time; scrapes and ticks share one lock.

The text source is injected (anything with ``dcgm_text``, ``node_exporter_text``, ``advance``), so
the server is tested without the simulator.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Protocol

from hpcwatch.errors import ConfigError

__all__ = ["TwinEndpoints", "ServeConfig", "TextSource", "CONTENT_TYPE", "DEFAULT_PORT", "DEFAULT_TICK_S",
           "DCGM_PATH", "NODE_EXPORTER_PATH", "jobs_by_gpu", "prometheus_config"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The text exposition format 0.0.4, as dcgm-exporter and node-exporter send it
(https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format)."""
DEFAULT_PORT = 19400
"""dcgm-exporter listens on 9400 (https://github.com/NVIDIA/dcgm-exporter); shifted to stay clear of a real one."""
DEFAULT_TICK_S = 1.0
"""Simulated seconds per tick, and wall seconds between ticks."""
DCGM_PATH = "/metrics"
NODE_EXPORTER_PATH = "/node-exporter/metrics"


class TextSource(Protocol):
    """What the server needs of the twin (hpcwatch.twin.Twin has these)."""

    def dcgm_text(self, node: str, *, jobs_by_gpu: Mapping[int | str, str] | None = None) -> str: ...

    def node_exporter_text(self, node: str) -> str: ...

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

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ConfigError("nodes: at least one node to serve")
        if not 1 <= self.port <= 65535 - len(self.nodes) + 1:
            raise ConfigError(f"port: {self.port} leaves no room for {len(self.nodes)} consecutive ports")
        if self.tick_s < 0:
            raise ConfigError(f"tick_s must be >= 0, got {self.tick_s}")


def jobs_by_gpu(mapping: Mapping[str, Sequence[str]]) -> dict[int | str, str]:
    """The mapping directory ({"0": ["7"], "1": ["7", "8"], "2.0": ["9"]}) in Twin.dcgm_text's shape.

    Whole-GPU names become ints (the twin's GPU index); MIG ``gpu.instance`` names stay strings.
    """
    return {(int(gpu) if gpu.isdigit() else gpu): ",".join(ids) for gpu, ids in mapping.items() if ids}


@dataclass(slots=True)
class TwinEndpoints:
    """One HTTP server per node, started and stopped together."""

    source: TextSource
    config: ServeConfig
    read_mapping: Callable[[Path], dict[str, list[str]]] | None = None
    _servers: list[ThreadingHTTPServer] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _last_error: dict[str, str] = field(default_factory=dict)

    @property
    def targets(self) -> dict[str, str]:
        """node -> "host:port", what a Prometheus static config lists."""
        return {node: f"{self.config.host}:{self.config.port + i}" for i, node in enumerate(self.config.nodes)}

    def start(self) -> "TwinEndpoints":
        if self.read_mapping is None and self.config.mapping_dir is not None:
            # The twin writes formats and reads none: the caller hands it the mapping reader.
            raise ConfigError("twin serve: a mapping_dir needs read_mapping (sources.mapping.read_job_mapping_dir)")
        try:
            for node, target in self.targets.items():
                self._servers.append(self._bind(node, int(target.rsplit(":", 1)[1])))
        except BaseException:
            self.stop()
            raise
        for server in self._servers:
            self._spawn(server.serve_forever, 0.2)
        if self.config.tick_s > 0:
            self._spawn(self._tick)
        return self

    def stop(self) -> None:
        self._stop.set()
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._servers.clear()
        self._threads.clear()

    def __enter__(self) -> "TwinEndpoints":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what a scrape returns -------------------------------------------------------------------

    def dcgm_body(self, node: str) -> str:
        """dcgm-exporter's answer for one node, labelled from its mapping directory as it is now."""
        jobs = self._node_jobs(node)
        with self._lock:
            return self.source.dcgm_text(node, jobs_by_gpu=jobs)

    def node_exporter_body(self, node: str) -> str:
        with self._lock:
            return self.source.node_exporter_text(node)

    def _node_jobs(self, node: str) -> dict[int | str, str] | None:
        if self.config.mapping_dir is None or self.read_mapping is None:
            return None
        directory = self.config.mapping_dir / node
        if not directory.is_dir():
            return {}   # dcgm-exporter with an empty directory: no GPU carries a job
        return jobs_by_gpu(self.read_mapping(directory))

    # -- plumbing ------------------------------------------------------------------------------

    def _bind(self, node: str, port: int) -> ThreadingHTTPServer:
        handler = type(f"Handler_{node}", (_Handler,), {"endpoints": self, "node": node})
        try:
            server = ThreadingHTTPServer((self.config.host, port), handler)
        except OSError as err:
            raise ConfigError(f"port {port} for {node}: {err.strerror or err}") from err
        server.daemon_threads = True
        return server

    def _spawn(self, target: Callable, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name="hpcwatch-twin-serve")
        thread.start()
        self._threads.append(thread)

    def _tick(self) -> None:
        while not self._stop.wait(self.config.tick_s):
            with self._lock:
                self.source.advance(self.config.tick_s)


class _Handler(BaseHTTPRequestHandler):
    endpoints: TwinEndpoints
    node: str
    server_version = "hpcwatch-twin"

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        path = self.path.split("?", 1)[0]
        if path == DCGM_PATH:
            body, status = self._render(self.endpoints.dcgm_body), 200
        elif path == NODE_EXPORTER_PATH:
            body, status = self._render(self.endpoints.node_exporter_body), 200
        elif path == "/":
            body = f"hpcwatch twin, {self.node}: {DCGM_PATH} (dcgm-exporter), {NODE_EXPORTER_PATH}\n"
            status = 200
        else:
            body, status = "not found\n", 404
        if body is None:
            body, status = "the twin failed to render this scrape; see the server log\n", 500
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        try:
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass   # Prometheus gave up on a slow scrape (scrape_timeout); its `up` already says so

    def _render(self, fn: Callable[[str], str]) -> str | None:
        try:
            return fn(self.node)
        except Exception as err:  # a scrape must answer, even when the twin or the reader fails
            message = f"{self.node}: {type(err).__name__}: {err}"
            if self.endpoints._last_error.get(self.node) != message:   # once, not once per scrape
                self.endpoints._last_error[self.node] = message
                self.log_error("%s", message)
            return None

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
        pass   # one line per scrape per node would drown the console

    def log_error(self, format: str, *args: object) -> None:  # noqa: A002
        import sys
        print(f"hpcwatch twin serve: {format % args}", file=sys.stderr)


def prometheus_config(targets: Mapping[str, str], *, scrape_interval_s: float = 1.0,
                      cluster: str = "twin") -> str:
    """A prometheus.yml that scrapes every node's two endpoints (YAML is a JSON superset)."""
    import json

    def job(name: str, path: str) -> dict:
        return {"job_name": name, "metrics_path": path, "static_configs": [
            {"targets": [target], "labels": {"cluster": cluster, "node": node}} for node, target in targets.items()]}

    interval = f"{scrape_interval_s:g}s"
    return json.dumps({"global": {"scrape_interval": interval, "evaluation_interval": interval},
                       "scrape_configs": [job("dcgm", DCGM_PATH), job("node", NODE_EXPORTER_PATH)]}, indent=1)
