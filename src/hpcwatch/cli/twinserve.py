"""``hpcwatch twin serve``: the twin's nodes as dcgm-exporter / node-exporter endpoints for a real Prometheus."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hpcwatch.cli.common import PATH, Number, console, duration_option, emit_json, repeatable, twin_app, wait_for
from hpcwatch.cli.defaults import TWIN_SERVE_PORT, TWIN_SERVE_TICK_S
from hpcwatch.errors import ConfigError

if TYPE_CHECKING:  # the twin is imported when the command runs, not for --help
    from hpcwatch.model.cluster import Cluster

__all__ = ["twin_serve", "sized_cluster", "raise_open_files_limit", "FDS_PER_NODE"]

FDS_PER_NODE = 6
"""File descriptors a served node may hold: its listening socket and at most
twin.serve.DEFAULT_MAX_CONNECTIONS_PER_NODE (5) connections (the server closes one past that)."""


def sized_cluster(nodes: int | None) -> Cluster:
    """The reference cluster, or the same node type ``nodes`` times (node1 ... nodeN)."""
    from importlib import resources  # 7 ms (tempfile, zipfile...) that every --help would pay

    import yaml

    from hpcwatch.model.cluster import parse_cluster, reference_cluster

    if nodes is None:
        return reference_cluster()
    if nodes < 1:
        raise ConfigError(f"--nodes must be >= 1, got {nodes}")
    doc = yaml.safe_load(resources.files("hpcwatch.model").joinpath("reference.yaml").read_text())
    doc["nodes"] = [dict(doc["nodes"][0], count=nodes)]
    return parse_cluster(yaml.safe_dump(doc), path=f"reference.yaml (nodes={nodes})")


def raise_open_files_limit(nodes: int) -> None:
    """Lift the soft open-files limit to the hard one when ``nodes`` need more than it allows (1,024 is a
    common soft default; 1,024 nodes need ~6,200). Go programs do the same at start (Go 1.19+, os package),
    so Prometheus and VictoriaMetrics already run this way. ConfigError when the hard limit is short."""
    import resource

    need = FDS_PER_NODE * nodes + 64  # + the interpreter's own files
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise ConfigError(f"--nodes {nodes} needs {need} open files; the hard limit is {hard} (ulimit -Hn)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@twin_app.command("serve")
@click.option("--port", type=int, default=TWIN_SERVE_PORT, help="Port of node1; node k listens on PORT+k-1.")
@click.option("--nodes", type=int, help="Number of nodes (default: the reference cluster's 2).")
@click.option(
    "--mapping-dir",
    type=PATH,
    help="Parent of per-node dcgm-exporter job-mapping dirs (DIR/<node>/<gpu>), "
    "re-read on every scrape, as written by deploy/slurm/prolog.",
)
@click.option("--seed", type=int, default=0, help="Random seed of the twin.")
@repeatable("--scenario", help="Scenario to run (repeatable).")
@click.option(
    "--tick",
    "tick_s",
    type=Number(min=0.0),
    default=TWIN_SERVE_TICK_S,
    help="Seconds between twin ticks (0 freezes it).",
)
@click.option("--host", default="127.0.0.1", help="Address to bind.")
@click.option(
    "--hpc-job/--no-hpc-job",
    default=True,
    help="Label GPUs with hpc_job (--no-hpc-job: dcgm-exporter without a mapping dir).",
)
@click.option(
    "--timestamps", is_flag=True, default=False, help="Stamp each sample with the twin's clock (real exporters do not)."
)
@duration_option()
@click.option(
    "--scrape-interval",
    "scrape_interval_s",
    type=Number(min=0.0, min_open=True),
    default=1.0,
    help="scrape_interval (s) of the --prometheus-config written.",
)
@click.option(
    "--prometheus-config",
    "prom_config",
    type=PATH,
    help="Also write a prometheus.yml scraping every endpoint to this file.",
)
@click.option(
    "--json", "as_json", is_flag=True, default=False, help="Print the targets as one JSON document, then serve."
)
def twin_serve(
    port: int,
    nodes: int | None,
    mapping_dir: Path | None,
    seed: int,
    scenario: list[str],
    tick_s: float,
    host: str,
    hpc_job: bool,
    timestamps: bool,
    duration_s: float,
    scrape_interval_s: float,
    prom_config: Path | None,
    as_json: bool,
) -> None:
    """Serve each node's dcgm-exporter (/metrics) and node-exporter (/node-exporter/metrics) text."""
    from hpcwatch.sources.mapping import read_job_mapping_dir
    from hpcwatch.twin import Twin  # the simulator is heavy: only this command needs it
    from hpcwatch.twin.serve import DCGM_PATH, NODE_EXPORTER_PATH, ServeConfig, TwinEndpoints, prometheus_config

    cluster = sized_cluster(nodes)
    twin = Twin(cluster, seed=seed, scenarios=tuple(scenario))
    config = ServeConfig(
        nodes=tuple(n.name for n in cluster.nodes),
        port=port,
        host=host,
        mapping_dir=mapping_dir,
        tick_s=tick_s,
        hpc_job=hpc_job,
        timestamps=timestamps,
    )
    raise_open_files_limit(len(config.nodes))
    endpoints = TwinEndpoints(twin, config, read_mapping=read_job_mapping_dir if mapping_dir else None).start()
    try:
        if prom_config is not None:
            prom_config.write_text(prometheus_config(endpoints.targets, scrape_interval_s=scrape_interval_s) + "\n")
        if as_json:
            emit_json({"targets": endpoints.targets, "paths": {"dcgm": DCGM_PATH, "node": NODE_EXPORTER_PATH}})
            sys.stdout.flush()
        else:
            first, last = config.nodes[0], config.nodes[-1]
            console.print(
                f"serving {len(config.nodes)} nodes: {first} http://{endpoints.targets[first]}{DCGM_PATH}"
                f" … {last} http://{endpoints.targets[last]}{DCGM_PATH} (Ctrl-C stops)"
            )
        wait_for(duration_s, alive=lambda: endpoints.serving)
    finally:
        endpoints.stop()
    if endpoints.failure is not None:
        raise ConfigError(f"twin serve stopped: {endpoints.failure}")
