"""``hpcwatch exporter``: serve hpcwatch's derived metrics on /metrics for Prometheus."""

from __future__ import annotations


import typer

from hpcwatch.cli.common import DbOption, app, console, open_store, wait_for
from hpcwatch.cli.defaults import EXPORTER_PORT, EXPORTER_RECENT_STEPS
from hpcwatch.errors import ConfigError

__all__ = ["exporter"]


@app.command()
def exporter(
    port: int = typer.Option(EXPORTER_PORT, "--port", help="Port for /metrics."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (0.0.0.0 to let a remote Prometheus in)."),
    db: str = DbOption,
    recent_steps: int = typer.Option(EXPORTER_RECENT_STEPS, "--recent-steps",
                                     help="Training metrics use each job's last N steps."),
    duration_s: float = typer.Option(0.0, "--duration", help="Stop after this many seconds (0: until Ctrl-C)."),
) -> None:
    """Per-job GPU-hours, energy, utilisation, idle GPUs, step time, stragglers, goodput and findings.

    The store is read on every scrape. Metric names: see ``hpcwatch.exporter``; dashboard:
    deploy/grafana/hpcwatch.json.
    """
    from hpcwatch.exporter import serve_metrics

    store = open_store(db)
    try:
        server, _thread = serve_metrics(store, port=port, host=host, recent_steps=recent_steps)
    except OSError as err:
        raise ConfigError(f"--port {port}: {err.strerror or err}") from err
    console.print(f"hpcwatch exporter: http://{host}:{port}/metrics (store {store.config.path}; Ctrl-C stops)")
    try:
        wait_for(duration_s)
    finally:
        server.shutdown()
        store.close()
