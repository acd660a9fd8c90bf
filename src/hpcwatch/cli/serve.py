"""``hpcwatch demo`` (twin + in-memory store + web, live) and ``hpcwatch serve`` (web on an existing store).

``demo`` binds 127.0.0.1 only; ``serve`` binds ``--host`` (off loopback only with ``--insecure-no-auth``:
hpcwatch.httpguard.check_exposure), with TLS from ``--tls-cert``/``--tls-key``. See hpcwatch.web.demo for how the step player's
"with / without straggler" pair is produced.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from hpcwatch.cli.common import (
    PATH,
    Number,
    app,
    auth_option,
    console,
    db_option,
    listen_options,
    open_store,
    policy_option,
    price_options,
    repeatable,
    safe_text,
)
from hpcwatch.cli.defaults import (
    SERVE_KEEP_READ_JOBS,
    SERVE_KEEP_READ_MAX_JOBS,
    SERVE_MAX_STREAMS,
    SERVE_MAX_STREAMS_PER_CLIENT,
)

__all__ = ["demo", "serve", "DEFAULT_PORT"]


def stream_options(command: Callable) -> Callable:
    """``--max-streams`` and ``--max-streams-per-client`` of ``demo`` and ``serve`` (hpcwatch.httpguard.Limits)."""
    command = click.option(
        "--max-streams-per-client",
        type=click.IntRange(min=1),
        default=SERVE_MAX_STREAMS_PER_CLIENT,
        help="Live streams per client address (behind a proxy all viewers share its address: raise it; "
        "benchmarks/bench_web.py opens 200 from one).",
    )(command)
    return click.option(
        "--max-streams",
        type=click.IntRange(min=1),
        default=SERVE_MAX_STREAMS,
        help="Live streams (SSE) open at once, all viewers; the next is refused 503.",
    )(command)


def keep_read_option(command: Callable) -> Callable:
    """``--keep-read-jobs`` of ``demo`` and ``serve`` (hpcwatch.web.pagewarm)."""
    return click.option(
        "--keep-read-jobs",
        type=click.IntRange(min=0, max=SERVE_KEEP_READ_MAX_JOBS),
        default=SERVE_KEEP_READ_JOBS,
        show_default=True,
        help="Keep the N running jobs with the most GPU-seconds read between job pages, so that their first page "
        "reads the last seconds, not their whole life (0: none; each takes a few MB and up to a tenth of a core "
        "at 1,536 GPUs).",
    )(command)


DEFAULT_PORT = 8000


@app.command()
@click.option("--port", type=int, default=DEFAULT_PORT, help="Port on 127.0.0.1.")
@click.option("--no-browser", is_flag=True, default=False, help="Do not open a browser.")
@click.option("--duration", type=Number(min=0.0), help="Stop after S seconds.")
@repeatable("--scenario", help="Twin scenario (repeatable), e.g. straggler.")
@click.option("--nodes", type=click.IntRange(min=1), help="Nodes of the reference cluster (default 2).")
@click.option("--seed", type=int, default=0, help="Seed of the twin.")
@click.option(
    "--speed",
    type=Number(min=0.01),
    default=1.0,
    help="Simulated seconds per real second (e.g. 20: see a node reboot in 10 s).",
)
@click.option(
    "--scrape-s",
    type=Number(min=0.0, min_open=True),
    default=None,
    help="Simulated seconds between two scrapes of a node's exporters, the nodes in turn (default: every "
    "second up to 128 nodes, one second more per 128 nodes: 8 s at 1,024).",
)
@click.option(
    "--scan-every",
    type=Number(min=0.0),
    default=10.0,
    help="Run the security detectors every S seconds (0: never).",
)
@click.option(
    "--scan-window",
    type=Number(min=0.0),
    default=300.0,
    help="Each scan looks at the last S seconds of data, read incrementally (0: the whole store every time).",
)
@click.option(
    "--no-act",
    is_flag=True,
    default=False,
    help="Do not play the remediation loop. By default the health rules judge the twin every simulated minute "
    "and `hpcwatch act` tests a node they drain on the twin's own Slurm (reserve, resume, check job), then "
    "resumes it or keeps it drained: all in this process, nothing real is touched (e.g. --scenario xid79 "
    "--speed 20).",
)
@stream_options
@keep_read_option
def demo(
    port: int,
    no_browser: bool,
    duration: float | None,
    scenario: list[str],
    nodes: int | None,
    seed: int,
    speed: float,
    scrape_s: float | None,
    scan_every: float,
    scan_window: float,
    no_act: bool,
    max_streams: int,
    max_streams_per_client: int,
    keep_read_jobs: int,
) -> None:
    """The main job: a live twin of the reference cluster in memory, and the web schematic on it."""
    from hpcwatch.cli.demotwin import DemoTwin, TwinProcess
    from hpcwatch.httpguard import Limits
    from hpcwatch.model.cluster import reference_cluster
    from hpcwatch.store import Store
    from hpcwatch.twin.live import scrape_interval_s
    from hpcwatch.web.app import create_app
    from hpcwatch.web.demo import check_port, cluster_with_nodes, seed_step_player, serve_app
    from hpcwatch.web.live import PROBLEMS_INTERVAL_S
    from hpcwatch.web.pageprocess import PageProcess
    from hpcwatch.web.scanprocess import ScanProcess

    check_port(port)
    cluster = cluster_with_nodes(nodes) if nodes else reference_cluster()
    store = Store(":memory:")
    # The twin and its remediation loop in a process of their own, writing the store folder as a cluster's collectors
    # do; the detectors in another, as `hpcwatch collect` runs them beside `serve`; the job pages' reports in a
    # third: the server's process keeps its interpreter for the page, its stream and its snapshot.
    twin = TwinProcess(
        store.path,
        DemoTwin(nodes=nodes, seed=seed, scenarios=tuple(scenario), speed=speed, scrape_s=scrape_s, act=not no_act),
    )
    scanner = ScanProcess(store.path, every_s=scan_every, window_s=scan_window or None) if scan_every > 0 else None
    pages = PageProcess(store.path, keep_read_jobs=keep_read_jobs)
    try:
        step_jobs = seed_step_player(store, cluster, seed=seed)
        twin.start()
        if scanner is not None:
            scanner.start()
        limits = Limits(max_streams=max_streams, max_streams_per_client=max_streams_per_client)
        # A node's data changes once a scrape: judging the problems more often re-judges most nodes on the same
        # samples (at 1,024 nodes each is scraped every 8 s).
        scraped_every_s = (scrape_s or scrape_interval_s(len(cluster.nodes))) / speed
        web = create_app(
            store,
            cluster,
            step_jobs=step_jobs,
            limits=limits,
            pages=pages.start(),
            problems_every_s=max(PROBLEMS_INTERVAL_S, scraped_every_s),
        )

        def started(url: str) -> None:
            console.print(
                f"hpcwatch demo: {len(cluster.nodes)} nodes, {len(cluster.gpus)} GPUs, "
                f"scenarios: {', '.join(scenario) or 'none'}, "
                f"remediation {'off' if no_act else 'on (--no-act: off)'} — [bold]{url}[/bold] (Ctrl-C to stop)"
            )
            if not no_browser:
                import webbrowser  # 6 ms of imports (shutil...) that every --help would pay

                webbrowser.open(url)

        serve_app(web, port=port, duration_s=duration, on_started=started)
    finally:
        twin.stop()
        if scanner is not None:
            scanner.stop()
        pages.stop()
        store.close()


@app.command()
@db_option()
@click.option("--port", type=int, default=DEFAULT_PORT, help="Port on --host.")
@listen_options("the web server")
@click.option("--model", type=PATH, help="Cluster model YAML (default: the reference cluster).")
@click.option(
    "--prometheus",
    help="Read live samples (DCGM, node-exporter, Lustre) from this Prometheus or "
    "VictoriaMetrics (http://host:9090); Slurm jobs, steps, events and findings still "
    "come from --db.",
)
@click.option(
    "--alertmanager",
    help="Show what this Alertmanager fires and resolves (http://host:9093, its v2 API), beside the "
    "store's health verdicts; the page says so when it stops answering.",
)
@click.option("--duration", type=Number(min=0.0), help="Stop after S seconds.")
@stream_options
@keep_read_option
@price_options
@auth_option("every viewer")
@policy_option("every page and API route")
def serve(
    db: str | None,
    port: int,
    host: str,
    allow_host: list[str],
    tls_cert: Path | None,
    tls_key: Path | None,
    insecure_no_auth: bool,
    model: Path | None,
    prometheus: str | None,
    alertmanager: str | None,
    duration: float | None,
    max_streams: int,
    max_streams_per_client: int,
    keep_read_jobs: int,
    gpu_hour_price: float | None,
    currency: str,
    auth: Path | None,
    policy_path: Path | None,
) -> None:
    """The web schematic on an existing store (what `hpcwatch ingest`, `collect` or a twin run filled)."""
    from hpcwatch.access.policy import load_policy
    from hpcwatch.cli.auth import check_auth_exposure, identity_for
    from hpcwatch.httpguard import Limits, check_exposure, check_tls
    from hpcwatch.model.cluster import load_cluster, reference_cluster
    from hpcwatch.web.app import create_app
    from hpcwatch.web.demo import Listen, check_port, serve_app
    from hpcwatch.web.pageprocess import PageProcess

    policy = load_policy(policy_path) if policy_path is not None else None  # a bad file: one line, exit 2
    check_exposure(host, insecure_no_auth=insecure_no_auth or auth is not None)
    check_tls(tls_cert, tls_key)
    identity = identity_for(auth, None) if auth is not None else None  # a bad config: one line, before the port
    if identity is not None:
        check_auth_exposure(identity, host, tls=tls_cert is not None)
    check_port(port, host)
    listen = Listen(host=host, port=port, allow_hosts=tuple(allow_host), tls_cert=tls_cert, tls_key=tls_key)
    cluster = load_cluster(model) if model else reference_cluster()
    prom = _prometheus(prometheus)
    watch = _alert_watch(alertmanager)  # a URL that cannot be one is refused before the store is opened
    store = open_store(db)
    if identity is not None:
        identity.audit = lambda event: store.add([event])  # logins, failures, lock-outs, logouts: store events
    limits = Limits(max_streams=max_streams, max_streams_per_client=max_streams_per_client)
    secure = identity is not None and (
        identity.config.session.secure == "always"
        or (identity.config.session.secure == "auto" and tls_cert is not None)
    )
    # The job pages' reports in a process of their own (from the store; with Prometheus they stay here).
    pages = PageProcess(store.path, keep_read_jobs=keep_read_jobs).start() if prom is None else None
    web = create_app(
        store,
        cluster,
        pages=pages,
        prometheus=prom,
        limits=limits,
        gpu_hour_price=gpu_hour_price,
        currency=currency,
        alert_watch=watch,
        identity=identity,
        secure_cookies=secure,
        policy=policy,
    )
    where = f"samples from {prom!r}, the rest from the store" if prom is not None else "the store"
    if watch is not None:
        where += f"; alerts from {watch.client.label}"
        watch.start()
    try:
        serve_app(
            web,
            port=port,
            listen=listen,
            duration_s=duration,
            on_started=lambda url: console.print(
                f"hpcwatch serve ({safe_text(where)}): [bold]{url}[/bold] (Ctrl-C to stop)"
            ),
        )
    finally:
        if watch is not None:
            watch.stop()
            watch.client.close()
        if pages is not None:
            pages.stop()
        store.close()
        if prom is not None:
            prom.close()


def _alert_watch(url: str | None):
    """The watch of ``--alertmanager`` (started with the server, asking on its own thread): one that does not
    answer yet is said on the page ("unreachable since"), never a refusal to start (Alertmanager may come up
    after the page); a URL that is no http(s) URL is one error line (exit 2)."""
    if url is None:
        return None
    from hpcwatch.alertmanager import AlertmanagerClient, AlertWatch

    return AlertWatch(AlertmanagerClient(url))


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
