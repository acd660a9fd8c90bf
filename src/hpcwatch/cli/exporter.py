"""``hpcwatch exporter``: serve hpcwatch's derived metrics on /metrics for Prometheus."""

from __future__ import annotations

from pathlib import Path

import click

from hpcwatch.cli.common import (
    Number,
    app,
    auth_option,
    console,
    db_option,
    duration_option,
    listen_options,
    open_store,
    policy_option,
    wait_for,
)
from hpcwatch.cli.defaults import EXPORTER_ENDED_WITHIN_S, EXPORTER_PORT, EXPORTER_RECENT_STEPS
from hpcwatch.errors import ConfigError

__all__ = ["exporter"]


@app.command()
@click.option(
    "--port", type=click.IntRange(0, 65535), default=EXPORTER_PORT, help="Port for /metrics (0: any free one)."
)
@listen_options("/metrics")
@db_option()
@click.option(
    "--recent-steps", type=int, default=EXPORTER_RECENT_STEPS, help="Training metrics use each job's last N steps."
)
@click.option(
    "--ended-within",
    "ended_within_s",
    type=Number(min=0.0, infinite=True),
    default=EXPORTER_ENDED_WITHIN_S,
    show_default=True,
    help="Show the running jobs and those that ended within this many seconds before the store's newest sample "
    "(inf: every job the store holds; Prometheus keeps the others' last values).",
)
@duration_option()
@auth_option("of every scrape (a bearer token of scope metrics)")
@policy_option("the labels of each token's scrape")
def exporter(
    auth: Path | None,
    policy_path: Path | None,
    port: int,
    host: str,
    allow_host: list[str],
    tls_cert: Path | None,
    tls_key: Path | None,
    insecure_no_auth: bool,
    db: str | None,
    recent_steps: int,
    ended_within_s: float,
    duration_s: float,
) -> None:
    """Per-job GPU-hours, energy, utilisation, idle GPUs, step time, stragglers, goodput and findings.

    The store is read on every scrape: the per-job sums from where the last scrape's read ended, or a
    restarted exporter's from the checkpoint it wrote in the store's folder (without one the first scrape
    reads the store's life, aside: a scrape waits at most 5 s for them, then serves the others). The
    per-job figures are those of the running jobs and of the jobs that ended within --ended-within. Metric
    names: see ``hpcwatch.exporter``; dashboard: deploy/grafana/hpcwatch.json.
    """
    from hpcwatch.exporter import serve_metrics
    from hpcwatch.httpguard import check_exposure, check_tls

    check_exposure(host, insecure_no_auth=insecure_no_auth or auth is not None)
    check_tls(tls_cert, tls_key)
    from hpcwatch.access.policy import load_policy

    policy = load_policy(policy_path) if policy_path is not None else None  # a bad file: one line, exit 2
    authenticate = None
    if auth is not None:
        from hpcwatch.cli.auth import identity_for

        identity = identity_for(auth, None)
        if identity.tokens is None:
            raise ConfigError(f"{auth}:1: the exporter checks tokens: give a [tokens] table (file = ...)")
        authenticate = lambda header: identity.from_bearer(header, "metrics")  # noqa: E731
    store = open_store(db)
    # Each token's user, with their roles from the auth file's [roles], sees what the policy gives them:
    # Prometheus' token wants `operator` (every job) or `decider` (pseudonyms), else only its own jobs.
    from hpcwatch.access.deployment import Access

    access = Access.of(policy, store_path=store.config.path)
    try:
        server, _thread = serve_metrics(
            store,
            port=port,
            host=host,
            recent_steps=recent_steps,
            ended_within_s=ended_within_s,
            allow_hosts=tuple(allow_host),
            tls_cert=tls_cert,
            tls_key=tls_key,
            authenticate=authenticate,
            scope_of=access.scope if authenticate is not None else None,
        )
    except OSError as err:
        store.close()
        raise ConfigError(f"--port {port}: {err.strerror or err}") from err
    scheme, bound = "https" if tls_cert else "http", server.server_address[1]  # --port 0: the one chosen
    console.print(f"hpcwatch exporter: {scheme}://{host}:{bound}/metrics (store {store.config.path}; Ctrl-C stops)")
    try:
        wait_for(duration_s)
    finally:
        server.shutdown()
        store.close()
