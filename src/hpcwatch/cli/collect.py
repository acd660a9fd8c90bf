"""``hpcwatch collect``: the collector daemon, driven by one TOML file (see hpcwatch.collect.config)."""

from __future__ import annotations

import threading
from pathlib import Path

import click

from hpcwatch.cli.common import PATH, Number, app, console, emit_json, json_option, safe_text
from hpcwatch.cli.defaults import COLLECT_CONFIG_PATH

__all__ = ["collect"]


@app.command()
@click.option("--config", type=PATH, default=COLLECT_CONFIG_PATH, help="The TOML config file.")
@click.option("--once", is_flag=True, default=False, help="Run every collector once, then exit.")
@click.option("--check", is_flag=True, default=False, help="Read the config, say what it runs, exit.")
@click.option(
    "--agent", is_flag=True, default=False, help="Run this node's host checks ([agent]) and ship them to the centre."
)
@click.option("--status", is_flag=True, default=False, help="Show what the running daemon last reported.")
@click.option("--duration", type=Number(min=0.0), default=0.0, help="Stop after S seconds (0: on SIGTERM).")
@json_option("json")
def collect(config: Path, once: bool, check: bool, agent: bool, status: bool, duration: float, json: bool) -> None:
    """Poll Slurm and Prometheus, follow logs, ingest spool folders and run the detectors, unattended."""
    import signal
    import socket  # signal and socket: 7 ms that every --help would pay

    from hpcwatch.collect.config import load_config

    cfg = load_config(config)
    if agent:  # before the daemon's imports: the agent never loads the store (pyarrow, DuckDB)
        _run_agent(cfg, once=once, check=check, duration=duration, as_json=json)
        return
    from hpcwatch.collect.daemon import Daemon

    if cfg.notify is not None and cfg.notify.check_at_start and not check and not status:
        from hpcwatch.notify.loop import check_channels

        check_channels(cfg.notify)  # an SMTP server or a webhook that does not answer stops the start: exit 2
    if check:
        _show_plan(cfg, json)
        return
    if status:
        _show_status(cfg.store.path, json)
        return
    daemon = Daemon(cfg, node=cfg.collect.node or socket.gethostname())
    if once:
        found = daemon.run_once()
        _show_status(cfg.store.path, json)
        if any(s.last_error for s in found.values()):
            raise click.exceptions.Exit(1)
        return
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    daemon.start()
    console.print(
        f"hpcwatch collect: {len(cfg.collectors)} collectors into {safe_text(cfg.store.path)} "
        f"(status: {safe_text(daemon.status_file)}; SIGTERM stops)"
    )
    stop.wait(duration or None)
    daemon.stop()


def _run_agent(cfg, *, once: bool, check: bool, duration: float, as_json: bool) -> None:
    import logging
    import os
    import signal
    import socket

    from hpcwatch.collect.agent import Agent
    from hpcwatch.errors import ConfigError

    section = cfg.agent
    if section is None:
        raise ConfigError(f"{cfg.path}: --agent needs an [agent] table with [[agent.check]] tables")
    node = section.node or os.environ.get("HPCWATCH_NODE", "") or socket.gethostname()
    where = section.spool or section.push_url
    if check:
        rows = [
            {
                "name": c.name,
                "command": list(c.command),
                "format": c.format,
                "interval_s": c.interval_s,
                "timeout_s": c.timeout_s,
                "max_output_bytes": c.max_output_bytes,
            }
            for c in section.checks
        ]
        if as_json:
            emit_json({"config": cfg.path, "node": node, "ships_to": where, "checks": rows})
            return
        console.print(f"{safe_text(cfg.path)}: agent {safe_text(node)} ships to {safe_text(where)}")
        for row in rows:
            console.print(f"  {safe_text(row['name'])} ({safe_text(row['format'])}) every {row['interval_s']:g} s")
        return
    logging.basicConfig(level=logging.WARNING, format="hpcwatch agent: %(message)s")
    runner = Agent(section, node=node)
    if once:
        all_went = runner.run_once(drain_timeout_s=max(section.timeout_s * 3, 10.0))
        summary = {
            "node": node,
            "ships_to": where,
            "runs": runner.stats.runs,
            "shipped": runner.stats.shipped,
            "queued": len(runner.queue),
            "dropped": runner.queue.dropped,
        }
        if as_json:
            emit_json(summary)
        else:
            console.print(
                f"agent {safe_text(node)}: {summary['runs']} checks run, {summary['shipped']} shipped to "
                f"{safe_text(where)}, {summary['queued']} still queued, {summary['dropped']} dropped"
            )
        if not all_went:
            raise click.exceptions.Exit(1)
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: runner.stop())
    console.print(
        f"hpcwatch collect --agent: {len(section.checks)} checks of {safe_text(node)} to {safe_text(where)} "
        "(SIGTERM stops)"
    )
    runner.run(duration_s=duration)


def _show_plan(cfg, as_json: bool) -> None:
    from dataclasses import asdict

    from hpcwatch.collect.daemon import KINDS

    rows = [{"kind": KINDS[type(s)], **(s.describe() if hasattr(s, "describe") else asdict(s))} for s in cfg.collectors]
    if as_json:
        emit_json({"config": cfg.path, "store": cfg.store.path, "collectors": rows})
        return
    console.print(f"{safe_text(cfg.path)}: store {safe_text(cfg.store.path)}, {len(rows)} collectors")
    for row in rows:
        console.print(f"  {safe_text(row['name'])} ({row['kind']}) every {row['interval_s']:g} s")


def _show_status(store_path: str, as_json: bool) -> None:
    from hpcwatch.reports.collectors import read_status

    found = read_status(store_path)
    if as_json:
        emit_json(found.as_dict() if found else None)
        return
    if found is None:
        console.print(f"no collector status in {safe_text(store_path)}: is hpcwatch collect running on it?")
        return
    for name, d in found.daemons.items():
        stale = " [bold red](stale: it stopped writing its status)[/bold red]" if d["stale"] else ""
        console.print(f"hpcwatch collect {safe_text(name)} (pid {d['pid']}, {safe_text(d['config'])}){stale}")
    for c in found.collectors:
        state = "[green]answers[/green]" if c.answering else "[red]silent[/red]"
        error = f" — {safe_text(c.last_error)}" if c.last_error else ""
        console.print(
            f"  {safe_text(c.name)} ({c.kind}): {state}, {c.runs} runs, {c.errors} errors, {c.records} records{error}"
        )
