"""``hpcwatch notify``: send what is new to the people it concerns (see hpcwatch.notify)."""

from __future__ import annotations

import threading
from pathlib import Path

import click

from hpcwatch.cli.common import PATH, app, console, db_option, emit_json, json_option, open_store, safe_text
from hpcwatch.cli.defaults import COLLECT_CONFIG_PATH
from hpcwatch.errors import ConfigError

__all__ = ["notify"]


@app.command()
@click.option("--config", type=PATH, default=COLLECT_CONFIG_PATH, help="The TOML file holding a [notify] table.")
@db_option()
@click.option("--once", is_flag=True, default=False, help="One run, then exit (else every interval_s, until SIGTERM).")
@click.option("--job", "job", default=None, help="Only this job's end report (Slurm's EpilogSlurmctld).")
@click.option(
    "--mail-user", default="", help="With --job: Slurm's mail-user of the job (used if the users map lacks it)."
)
@click.option("--no-check", is_flag=True, default=False, help="Do not connect to the channels' servers at start.")
@json_option()
def notify(
    config: Path, db: str | None, once: bool, job: str | None, mail_user: str, no_check: bool, as_json: bool
) -> None:
    """Mail and post health verdicts, findings, job-end reports and digests, each once."""
    import logging
    import signal
    import tomllib

    from hpcwatch.notify.config import parse_notify_text
    from hpcwatch.notify.loop import Notifier

    try:
        text = config.read_bytes().decode("utf-8")
    except OSError as err:
        raise ConfigError(f"{config}: cannot read the config: {err.strerror or err}") from err
    except UnicodeDecodeError as err:
        raise ConfigError(f"{config}: not UTF-8 (byte {err.start})") from err
    cfg = parse_notify_text(text, path=str(config))
    if job is not None:
        from hpcwatch.reports.jobs import check_job_id

        check_job_id(job)
    if db is None:
        store_table = tomllib.loads(text).get("store", {})
        db = store_table.get("path") if isinstance(store_table, dict) else None
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with open_store(db) as store:
        notifier = Notifier(store, cfg)
        try:
            if cfg.check_at_start and not no_check:
                notifier.check()
            if once or job is not None:
                summary = notifier.run_once(job=job, mail_user=mail_user)
                _show(summary, as_json)
                if job is not None and summary.unbuilt:
                    raise click.exceptions.Exit(1)  # the report could not be built (logged): the epilog says so
                return
            stop = threading.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
            while not stop.is_set():
                _show(notifier.run_once(), as_json)
                stop.wait(cfg.interval_s)
        finally:
            notifier.close()


def _show(summary, as_json: bool) -> None:
    if as_json:
        emit_json(summary.as_dict())
        return
    down = f"; down: {', '.join(safe_text(d) for d in summary.down)}" if summary.down else ""
    console.print(
        f"notify: {summary.composed} new, {summary.sent} sent, {summary.failed} failed, "
        f"{summary.deferred} deferred, {summary.pending} pending{down}"
    )
