"""``hpcwatch act``: run the policies that act (see hpcwatch.act); ``act list``: the audit; ``act undo ID``."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import click

from hpcwatch.cli.common import (
    PATH,
    HelpGroup,
    app,
    argument,
    console,
    db_option,
    emit_json,
    json_option,
    open_store,
    safe_text,
)
from hpcwatch.cli.defaults import COLLECT_CONFIG_PATH
from hpcwatch.errors import ConfigError

__all__ = ["act"]

_CONFIG_HELP = "The TOML file holding the [act] table (and the [notify] table its warnings go through)."


def _load(config: Path, db: str | None) -> tuple[Any, Any, str | None]:
    import tomllib

    from hpcwatch.act.config import parse_act_text

    try:
        text = config.read_bytes().decode("utf-8")
    except OSError as err:
        raise ConfigError(f"{config}: cannot read the config: {err.strerror or err}") from err
    except UnicodeDecodeError as err:
        raise ConfigError(f"{config}: not UTF-8 (byte {err.start})") from err
    cfg, notify = parse_act_text(text, path=str(config))
    if db is None:
        store_table = tomllib.loads(text).get("store", {})
        db = store_table.get("path") if isinstance(store_table, dict) else None
    return cfg, notify, db


@app.group(cls=HelpGroup, invoke_without_command=True, no_args_is_help=False)
@click.option("--config", type=PATH, default=COLLECT_CONFIG_PATH, help=_CONFIG_HELP)
@db_option()
@click.option("--once", is_flag=True, default=False, help="One run, then exit (else every interval_s, until SIGTERM).")
@click.option("--dry-run", is_flag=True, default=False, help="Say what would be done; run nothing, store nothing.")
@json_option()
@click.pass_context
def act(ctx: click.Context, config: Path, db: str | None, once: bool, dry_run: bool, as_json: bool) -> None:
    """Run the policies of [act] (idle GPUs: warn, then hold; drained nodes: test, then resume), each step audited."""
    if ctx.invoked_subcommand is not None:
        return
    import logging
    import signal

    from hpcwatch.act.loop import Actor

    cfg, notify, db = _load(config, db)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with open_store(db) as store:
        actor = Actor(store, cfg, notify=notify)
        try:
            if once:
                _show(actor.run_once(dry_run=dry_run or None), as_json)
                return
            stop = threading.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
            while not stop.is_set():
                _show(actor.run_once(dry_run=dry_run or None), as_json)
                stop.wait(cfg.interval_s)
        finally:
            actor.close()


def _show(summary: Any, as_json: bool) -> None:
    if as_json:
        emit_json(summary.as_dict())
        return
    for s in summary.said:
        mark = "dry-run " if s.dry_run else ""
        done = f" [{safe_text(s.action)}]" if s.action else ""
        console.print(f"{mark}{s.policy} {safe_text(s.target)}: {s.step}{done}: {safe_text(s.text)}")
    console.print(f"act: {summary.acted} actions, {summary.notices} notices queued")


@act.command(name="list")
@db_option()
@click.option("--policy", type=click.Choice(["idle_gpus", "remediate"]), default=None, help="Only this policy's.")
@json_option()
def list_actions(db: str | None, policy: str | None, as_json: bool) -> None:
    """Every action of the audit trail: when, who, what, why, and whether it was undone."""
    from hpcwatch.act.audit import recorded

    with open_store(db) as store:
        found = recorded(store, policy=policy)
    if as_json:
        emit_json([r.to_dict() for r in found])
        return
    from rich.table import Table

    table = Table("id", "when (UTC)", "policy", "step", "target", "who", "rc", "why", "undo")
    for r in found:
        a = r.action
        undo = (
            f"undone {_utc(r.undone.t)}"
            if r.undone
            else ("act undo " + a.id if a.undo or a.details.get("stand_down") else a.undo_note or "-")
        )
        table.add_row(
            a.id,
            _utc(a.t),
            a.policy,
            a.step,
            safe_text(a.target),
            safe_text(a.who),
            "-" if a.rc is None else str(a.rc),
            safe_text(a.why),
            safe_text(undo),
        )
    console.print(table)


@act.command()
@argument("action_id", help="The action's id, as hpcwatch act list shows it (act-...).")
@click.option("--config", type=PATH, default=COLLECT_CONFIG_PATH, help=_CONFIG_HELP)
@db_option()
@json_option()
def undo(action_id: str, config: Path, db: str | None, as_json: bool) -> None:
    """Reverse one recorded action (a hold: scontrol release; a resume: drain again; ...), audited too."""
    from hpcwatch.act.config import ActConfig
    from hpcwatch.act.loop import Actor

    cfg = ActConfig()  # the undo's argv is the recorded one; the config only names who undoes it
    if config.exists() or not db:
        cfg, _, db = _load(config, db)
    with open_store(db) as store:
        r, done = Actor(store, cfg).undo(action_id)
    if as_json:
        emit_json({**r.to_dict(), "undo_run": done.to_event().attrs})
    else:
        what = f"{r.action.step} {safe_text(r.action.target)}"
        console.print(
            f"undo of {r.action.id} ({what}): {' '.join(safe_text(a) for a in done.argv) or 'no command'}: rc {done.rc}"
        )
        if done.output:
            console.print(safe_text(done.output))
    if done.rc != 0:
        raise click.exceptions.Exit(1)


def _utc(t: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))
