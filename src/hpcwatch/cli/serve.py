"""``hpcwatch demo`` (twin + in-memory store + web, live) and ``hpcwatch serve`` (web on an existing store).

Both bind 127.0.0.1 only. See hpcwatch.web.demo for how the step player's
"with / without straggler" pair is produced.
"""

from __future__ import annotations

import webbrowser
from pathlib import Path

import typer

from hpcwatch.cli.common import DbOption, app, console, open_store, safe_text

__all__ = ["demo", "serve", "DEFAULT_PORT"]

DEFAULT_PORT = 8000


@app.command()
def demo(port: int = typer.Option(DEFAULT_PORT, "--port", help="Port on 127.0.0.1."),
         no_browser: bool = typer.Option(False, "--no-browser", help="Do not open a browser."),
         duration: float = typer.Option(None, "--duration", min=0.0, help="Stop after S seconds."),
         scenario: list[str] = typer.Option([], "--scenario", help="Twin scenario (repeatable), e.g. straggler."),
         nodes: int = typer.Option(None, "--nodes", min=1, help="Nodes of the reference cluster (default 2)."),
         seed: int = typer.Option(0, "--seed", help="Seed of the twin."),
         speed: float = typer.Option(1.0, "--speed", min=0.01,
                                     help="Simulated seconds per real second (e.g. 20: see a node reboot in 10 s)."),
         scan_every: float = typer.Option(10.0, "--scan-every", min=0.0,
                                          help="Run the security detectors every S seconds (0: never)."),
         scan_window: float = typer.Option(300.0, "--scan-window", min=0.0,
                                           help="Each scan looks at the last S seconds of data, read incrementally "
                                                "(0: the whole store every time).")) -> None:
    """The main job: a live twin of the reference cluster in memory, and the web schematic on it."""
    from hpcwatch.model.cluster import reference_cluster
    from hpcwatch.store import Store
    from hpcwatch.web.app import create_app
    from hpcwatch.web.demo import Scanner, check_port, cluster_with_nodes, seed_step_player, serve_app, start_live_twin

    check_port(port)
    cluster = cluster_with_nodes(nodes) if nodes else reference_cluster()
    store = Store(":memory:")
    step_jobs = seed_step_player(store, cluster, seed=seed)
    runner = start_live_twin(store, cluster, seed=seed, scenarios=scenario, speed=speed)
    scanner = Scanner(store, every_s=scan_every, window_s=scan_window or None) if scan_every > 0 else None
    if scanner is not None:
        scanner.start()
    web = create_app(store, cluster, step_jobs=step_jobs)

    def started(url: str) -> None:
        console.print(f"hpcwatch demo: {len(cluster.nodes)} nodes, {len(cluster.gpus)} GPUs, "
                      f"scenarios: {', '.join(scenario) or 'none'} — [bold]{url}[/bold] (Ctrl-C to stop)")
        if not no_browser:
            webbrowser.open(url)

    try:
        serve_app(web, port=port, duration_s=duration, on_started=started)
    finally:
        if scanner is not None:
            scanner.stop()
        runner.stop()
        store.close()


@app.command()
def serve(db: str = DbOption,
          port: int = typer.Option(DEFAULT_PORT, "--port", help="Port on 127.0.0.1."),
          model: Path = typer.Option(None, "--model", help="Cluster model YAML (default: the reference cluster)."),
          prometheus: str = typer.Option(None, "--prometheus",
                                         help="Read live samples (DCGM, node-exporter, Lustre) from this Prometheus "
                                              "or VictoriaMetrics (http://host:9090); Slurm jobs, steps, events "
                                              "and findings still come from --db."),
          duration: float = typer.Option(None, "--duration", min=0.0, help="Stop after S seconds.")) -> None:
    """The web schematic on an existing store (what `hpcwatch ingest`, `collect` or a twin run filled)."""
    from hpcwatch.model.cluster import load_cluster, reference_cluster
    from hpcwatch.web.app import create_app
    from hpcwatch.web.demo import check_port, serve_app

    check_port(port)
    cluster = load_cluster(model) if model else reference_cluster()
    prom = _prometheus(prometheus)
    store = open_store(db)
    web = create_app(store, cluster, prometheus=prom)
    where = f"samples from {prom!r}, the rest from the store" if prom is not None else "the store"
    try:
        serve_app(web, port=port, duration_s=duration,
                  on_started=lambda url: console.print(f"hpcwatch serve ({safe_text(where)}): [bold]{url}[/bold] "
                                                       "(Ctrl-C to stop)"))
    finally:
        store.close()
        if prom is not None:
            prom.close()


def _prometheus(url: str | None):
    """The PromQL backend for ``--prometheus``, checked once before the server starts: a wrong URL is one
    line at start-up (``BackendError``), not an error on every tick of every viewer."""
    if url is None:
        return None
    from hpcwatch.errors import BackendError
    from hpcwatch.promql import PrometheusBackend, server_time
    prom = PrometheusBackend(url)
    try:
        server_time(prom)
    except BackendError:
        prom.close()
        raise
    return prom
