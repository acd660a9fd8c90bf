"""`hpcwatch goodput`, `hpcwatch health`, `hpcwatch simulate goodput`: views over reports.goodput (a job's
goodput, the simulated run) and reports.health."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hpcwatch.cli.common import (
    PATH,
    Number,
    app,
    argument,
    console,
    db_option,
    emit_json,
    json_option,
    open_store,
    repeatable,
    safe_text,
    simulate_app,
)
from hpcwatch.cli.defaults import (
    CHECKPOINT_COST_S,
    GOODPUT_DAYS,
    GOODPUT_GPUS,
    GOODPUT_STEP_S,
    HEALTH_WINDOW_S,
    RESTART_COST_S,
    RESTORE_COST_S,
    SWEEP_GPUS,
)
from hpcwatch.errors import ConfigError

if TYPE_CHECKING:  # imported when a command runs, not for --help
    from hpcwatch.analysis.goodputsim import GoodputRun, Interval
    from hpcwatch.analysis.health import HealthReport
    from hpcwatch.records import Event

__all__ = ["goodput", "health", "simulate_goodput_cmd"]


# -- goodput ---------------------------------------------------------------------------------------


@app.command()
@argument("job", required=True, help="Job id (as the scheduler names it).")
@db_option()
@json_option()
def goodput(job: str, db: str | None, as_json: bool) -> None:
    """Goodput of one job: productive time, and where the rest of its wall time went."""
    from rich.table import Table

    from hpcwatch.reports.goodput import BADPUT_KINDS, goodput_report

    with open_store(db) as store:
        report = goodput_report(store, job)
    if as_json:
        emit_json(report.to_dict())
        return
    console.print(
        f"[bold]Job {safe_text(job)}: goodput {report.goodput:.1%}[/bold] of {report.total_s / 3600:.2f} h "
        f"({report.steps} steps, {report.lost_steps} lost, {report.interruptions} interruptions)"
    )
    shares = report.to_dict()["badput"]  # each kind's share of the wall time, as --json writes it
    table = Table("category", "hours", "share")
    table.add_row("productive", f"{report.productive_s / 3600:.3f}", f"{report.goodput:.2%}")
    for kind in BADPUT_KINDS:
        table.add_row(kind, f"{report.badput_s[kind] / 3600:.3f}", f"{shares[kind]:.2%}" if report.total_s else "-")
    console.print(table)
    if report.barrier_wait_s > 0:
        console.print(
            f"compute goodput {report.compute_goodput:.1%}: productive time less "
            f"{report.barrier_wait_s / 3600:.3f} h the ranks waited, on average, at the barrier for the slowest"
        )
    if report.ideal_step_s is not None:
        console.print(f"ideal step time (mean under median + 3·MAD): {report.ideal_step_s:.3f} s")
    for note in report.notes:
        console.print(f"[yellow]note:[/yellow] {safe_text(note)}")


# -- health ----------------------------------------------------------------------------------------


def _read_active(dcgmi: list[Path], nccl: list[Path], ibbw: list[Path], node: str | None) -> list[Event]:
    from hpcwatch.sources.healthtools import read_dcgmi_diag, read_ib_write_bw, read_nccl_tests

    events: list[Event] = []
    for path in dcgmi:
        events += read_dcgmi_diag(path, node=node)
    for path in nccl:
        events += read_nccl_tests(path, node=node)
    for path in ibbw:
        events += read_ib_write_bw(path, node=node)
    return events


def _print_health(report: HealthReport) -> None:
    from rich.table import Table

    if not report.nodes:
        console.print("no samples or events to judge in the window (nothing was looked at, so nothing is known)")
        return
    table = Table("node", "verdict", "why")
    colour = {"ok": "green", "warn": "yellow", "drain": "red"}
    for n in report.nodes:
        testing = f" (under test: {n.under_test})" if n.under_test else ""
        table.add_row(
            safe_text(n.node),
            f"[{colour[n.verdict]}]{n.verdict}[/{colour[n.verdict]}]{safe_text(testing)}",
            safe_text(n.reason()),
        )
    console.print(table)


@app.command()
@db_option()
@click.option("--node", help="Judge this node only (as the samples name it).")
@click.option(
    "--window",
    type=Number(min=0.0, min_open=True),
    default=HEALTH_WINDOW_S,
    help="Seconds of samples to judge, back from the newest.",
)
@repeatable("--dcgmi-diag", "dcgmi", type=PATH, help="`dcgmi diag -j` output to judge (repeatable).")
@repeatable("--nccl-tests", "nccl", type=PATH, help="nccl-tests output to judge (repeatable).")
@repeatable("--ib-write-bw", "ibbw", type=PATH, help="ib_write_bw output to judge (repeatable).")
@click.option(
    "--link", default="ndr", help="Link of the fabric for ib_write_bw / nccl-tests / ibstat port rates (hdr, ndr, xdr)."
)
@click.option("--summary", is_flag=True, default=False, help="Print one line: the verdict and the reasons.")
@click.option("--fail-on", default="never", help="Exit 1 when the verdict is at least this: warn, drain or never.")
@click.option(
    "--list-rules",
    is_flag=True,
    default=False,
    help="List every health rule (id, family, source format, severity, action, threshold, citation) and exit.",
)
@json_option()
def health(
    db: str | None,
    node: str | None,
    window: float,
    dcgmi: list[Path],
    nccl: list[Path],
    ibbw: list[Path],
    link: str,
    summary: bool,
    fail_on: str,
    list_rules: bool,
    as_json: bool,
) -> None:
    """Node health from the store's samples and events (passive) and from benchmark outputs (active)."""
    from hpcwatch.analysis.health import VERDICTS
    from hpcwatch.reports.health import health_rules, node_health
    from hpcwatch.reports.text import visible

    if list_rules:
        rules = health_rules()
        if as_json:
            emit_json({"rules": rules})
        else:
            _print_rules(rules)
        return
    if fail_on not in ("warn", "drain", "never"):
        raise ConfigError(f"--fail-on must be warn, drain or never, got {fail_on!r}")
    active = _read_active(dcgmi, nccl, ibbw, node)
    with open_store(db) as store:
        report = node_health(store, node=node, window_s=window, active=active, link=link)
    if as_json:
        emit_json(report.to_dict())
    elif summary:
        print(visible(_summary_line(report)))
    else:
        _print_health(report)
    if fail_on != "never" and VERDICTS.index(report.acted_verdict) >= VERDICTS.index(fail_on):
        raise click.exceptions.Exit(1)


def _print_rules(rules: list[dict[str, Any]]) -> None:
    from rich.table import Table

    table = Table(show_lines=True)
    for name in ("rule", "family", "source format", "severity", "action"):
        table.add_column(name, no_wrap=True)
    table.add_column("threshold", ratio=3)
    table.add_column("citation", ratio=2, overflow="fold")
    for r in rules:
        cells = (
            r["id"],
            r["family"] + (" (active)" if r["active"] else ""),
            ", ".join(r["sources"]),
            r["severity"],
            "/".join(r["actions"]),
            r["threshold"],
            r["citation"],
        )
        table.add_row(*(safe_text(c) for c in cells))
    console.print(table)


def _summary_line(report: HealthReport) -> str:
    """``drain: node2: xid: ...`` for `--summary` (the Slurm health check's drain reason), then the nodes under
    test, whose checks decide."""
    verdict = report.acted_verdict
    judged = [n for n in report.nodes if not n.under_test and n.verdict != "ok"]
    line = (
        f"{verdict}: " + " | ".join(f"{n.node}: {n.reason()}" for n in judged)
        if verdict != "ok"
        else ("ok" if any(n.checks for n in report.nodes) else "ok (no data)")
    )
    testing = [
        f"{n.node} under test ({n.under_test}), its checks decide: {n.verdict}: {n.reason()}"
        for n in report.nodes
        if n.under_test
    ]
    return " | ".join([line, *testing])


# -- simulate goodput ------------------------------------------------------------------------------


def _interval(text: str) -> Interval:
    if text == "young":
        return "young"
    if text == "daly":
        return "daly"
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"--interval must be seconds, young or daly, got {text!r}") from None


@simulate_app.command("goodput")
@click.option("--gpus", type=int, default=GOODPUT_GPUS, help="GPUs of the synchronous job.")
@click.option("--days", type=Number(min=0.0, min_open=True), default=GOODPUT_DAYS, help="Wall-clock days of the run.")
@click.option(
    "--checkpoint-cost",
    type=Number(min=0.0),
    default=CHECKPOINT_COST_S,
    help="C: seconds a checkpoint save stops training.",
)
@click.option(
    "--restart-cost",
    type=Number(min=0.0),
    default=RESTART_COST_S,
    help="R: seconds from a failure to running again (detect, requeue, start).",
)
@click.option(
    "--restore-cost", type=Number(min=0.0), default=RESTORE_COST_S, help="Seconds to load the last checkpoint."
)
@click.option("--interval", default="young", help="Checkpoint interval: seconds, young or daly.")
@click.option("--step", type=Number(min=0.0, min_open=True), default=GOODPUT_STEP_S, help="Seconds per training step.")
@click.option("--seed", type=int, default=0)
@click.option("--sweep", is_flag=True, default=False, help=f"Run at {', '.join(map(str, SWEEP_GPUS))} GPUs.")
@db_option(help="Also write the run's records (job, spans, events) here.")
@click.option("--job-id", default="goodput-sim", help="Job id of the records written with --db.")
@json_option()
def simulate_goodput_cmd(
    gpus: int,
    days: float,
    checkpoint_cost: float,
    restart_cost: float,
    restore_cost: float,
    interval: str,
    step: float,
    seed: int,
    sweep: bool,
    db: str | None,
    job_id: str,
    as_json: bool,
) -> None:
    """Goodput of a synchronous job under Llama 3's failure rates (16,384 H100, 54 days, 419 interruptions)."""
    from rich.table import Table

    from hpcwatch.reports.goodput import simulated_goodput, simulated_goodput_sweep, simulation_config

    config = simulation_config(
        gpus=gpus,
        days=days,
        checkpoint_cost_s=checkpoint_cost,
        restart_cost_s=restart_cost,
        restore_cost_s=restore_cost,
        interval=_interval(interval),
        step_s=step,
        seed=seed,
    )
    if sweep:
        runs = simulated_goodput_sweep(config)
        if as_json:
            emit_json({"sweep": [r.to_dict() for r in runs]})
            return
        table = Table("GPUs", "MTBF (h)", "interruptions", "interval (s)", "goodput")
        for r in runs:
            table.add_row(
                str(r.config.gpus),
                f"{r.mtbf_s / 3600:.2f}",
                str(r.interruptions),
                f"{r.checkpoint_interval_s:.0f}",
                f"{r.goodput:.1%}",
            )
        console.print(table)
        return
    run = simulated_goodput(config)
    if db is not None:
        _store_run(run, db, job_id)
    if as_json:
        emit_json(run.to_dict())
        return
    _print_run(run)


def _store_run(run: GoodputRun, db: str, job_id: str) -> None:
    from hpcwatch.reports.goodput import simulated_records

    records = simulated_records(run, job_id)
    with open_store(db) as store:
        store.add(records)


def _print_run(run: GoodputRun) -> None:
    from rich.table import Table

    d = run.to_dict()
    console.print(
        f"[bold]{d['gpus']} GPUs × {d['days']:g} days: goodput {d['goodput']:.1%}[/bold], effective "
        f"training time {d['effective_time']:.1%}; {d['interruptions']} interruptions "
        f"(MTBF {d['mtbf_s'] / 3600:.2f} h), checkpoint every {d['checkpoint_interval']:.0f} s"
    )
    table = Table("badput", "share")
    for kind, share in d["badput"].items():
        table.add_row(kind, f"{share:.2%}")
    console.print(table)
    causes = Table("cause", "interruptions")
    for cause, n in sorted(d["interruptions_by_cause"].items(), key=lambda kv: -kv[1]):
        causes.add_row(cause, str(n))
    console.print(causes)
