"""``hpcwatch collect``: the collector daemon, driven by one TOML file (see hpcwatch.collect.config)."""

from __future__ import annotations

import signal
import socket
import threading
from pathlib import Path

import typer

from hpcwatch.cli.common import JsonOption, app, console, emit_json, safe_text
from hpcwatch.cli.defaults import COLLECT_CONFIG_PATH

__all__ = ["collect"]


@app.command()
def collect(config: Path = typer.Option(Path(COLLECT_CONFIG_PATH), "--config", help="The TOML config file."),
            once: bool = typer.Option(False, "--once", help="Run every collector once, then exit."),
            check: bool = typer.Option(False, "--check", help="Read the config, say what it runs, exit."),
            status: bool = typer.Option(False, "--status", help="Show what the running daemon last reported."),
            duration: float = typer.Option(0.0, "--duration", min=0.0, help="Stop after S seconds (0: on SIGTERM)."),
            json: bool = JsonOption) -> None:
    """Poll Slurm and Prometheus, follow logs, ingest spool folders and run the detectors, unattended."""
    from hpcwatch.collect.config import load_config
    from hpcwatch.collect.daemon import Daemon

    cfg = load_config(config)
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
            raise typer.Exit(1)
        return
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    daemon.start()
    console.print(f"hpcwatch collect: {len(cfg.collectors)} collectors into {safe_text(cfg.store.path)} "
                  f"(status: {safe_text(daemon.status_file)}; SIGTERM stops)")
    stop.wait(duration or None)
    daemon.stop()


def _show_plan(cfg, as_json: bool) -> None:
    from dataclasses import asdict

    from hpcwatch.collect.daemon import KINDS

    rows = [{"kind": KINDS[type(s)], **asdict(s)} for s in cfg.collectors]
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
        console.print(f"  {safe_text(c.name)} ({c.kind}): {state}, {c.runs} runs, {c.errors} errors, "
                      f"{c.records} records{error}")
