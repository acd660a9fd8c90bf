"""``hpcwatch jobs`` and ``hpcwatch job ID``: the per-job efficiency report (jobstats, and more).

Views only: the numbers come from ``reports.jobs`` (the attribution analysis over the store's
samples and jobs); every string from data goes through ``safe_text``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

import click

from hpcwatch.cli.common import (
    app,
    argument,
    console,
    db_option,
    emit_json,
    json_option,
    open_store,
    price_options,
    safe_text,
)

if TYPE_CHECKING:  # the store and the reports are imported when a command runs, not for --help
    from hpcwatch.store import Store

__all__ = ["jobs", "job"]


def _prometheus_samples(store: Store, prometheus: str | None):
    """None (the store's samples), or the same columns read from Prometheus since the first job's start."""
    if prometheus is None:
        return None
    from hpcwatch.promql import PrometheusBackend
    from hpcwatch.reports.jobs import prometheus_samples

    starts = [j.start for j in store.jobs() if j.start is not None]
    with PrometheusBackend(prometheus) as prom:
        return prometheus_samples(prom, t0=min(starts) if starts else None, store=store)


prometheus_option = click.option(
    "--prometheus",
    help="Read samples from this Prometheus (http://host:9090) instead of the store; jobs still come from --db.",
)


def _bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}%"


def _hours(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _when(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _job_lines(r) -> list[str]:
    """The window, the attribution, jobstats' CPU/memory/time lines and the advice of one job."""
    lines = [
        f"allocated {_hours(r.gpu_hours_allocated)} GPU-h; observed {r.gpu_hours_observed:.2f} GPU-h on "
        f"{r.gpus_observed} GPUs from {_when(r.observed_start)} to {_when(r.observed_end)} UTC"
        + ("" if r.coverage is None else f" ({100 * r.coverage:.0f} % of the allocation)"),
        "attributed by: "
        + (", ".join(safe_text(a) for a in r.attributed_by) or "no samples")
        + f"; allocation: {safe_text(r.allocation, empty='none known')}",
    ]
    if r.cpus is not None:
        lines.append(
            f"CPU: {r.cpus} cores, {_pct(r.cpu_util_pct)} used; memory requested "
            f"{_bytes(r.memory_requested_bytes)}, max RSS "
            + (", ".join(f"{safe_text(n)} {_bytes(v)}" for n, v in r.max_rss_bytes_by_node) or "-")
            + f"; time limit used {_pct(None if r.time_limit_used is None else 100 * r.time_limit_used)}"
            + ("" if r.time_limit_s is None else f" of {r.time_limit_s / 3600:.2f} h")
        )
    lines += [f"[yellow]advice:[/] {safe_text(a)}" for a in r.advice]
    return lines


@app.command()
@db_option()
@click.option("--user", help="Only this user's jobs.")
@click.option("--account", help="Only this account's jobs.")
@prometheus_option
@json_option("json_out")
def jobs(db: str | None, user: str | None, account: str | None, prometheus: str | None, json_out: bool) -> None:
    """Every job that ran: GPU-hours, energy, GPU utilisation, IB and Lustre bytes, XID errors, idle GPUs."""
    from rich.table import Table

    from hpcwatch.analysis.attribution import report_dict
    from hpcwatch.reports.jobs import jobs_report

    with open_store(db) as store:
        reports = jobs_report(store, samples=_prometheus_samples(store, prometheus), user=user, account=account)
    if json_out:
        emit_json({"jobs": [report_dict(r) for r in reports]})
        return
    table = Table(
        title=f"{len(reports)} jobs",
        caption="GPU-h alloc: as Slurm bills (GPUs x elapsed); "
        "seen, kWh, util, bytes: over the observed window (samples) only",
    )
    for col in (
        "job",
        "user",
        "account",
        "state",
        "from",
        "GPUs",
        "GPU-h alloc",
        "GPU-h seen",
        "cover",
        "kWh",
        "util",
        "HBM max",
        "IB",
        "Lustre",
        "XID",
        "idle GPUs",
    ):
        table.add_column(col, justify="left" if col in ("job", "user", "account", "state", "from") else "right")
    for r in reports:
        table.add_row(
            safe_text(r.id),
            safe_text(r.user),
            safe_text(r.account),
            safe_text(r.state),
            safe_text(r.attributed_by[0] if r.attributed_by else r.allocation),
            f"{r.gpus}",
            _hours(r.gpu_hours_allocated),
            f"{r.gpu_hours_observed:.2f}",
            _pct(None if r.coverage is None else 100 * r.coverage),
            f"{r.energy_kwh:.2f}",
            _pct(r.mean_gpu_util),
            _bytes(r.max_fb_used_bytes),
            _bytes(r.ib_bytes),
            _bytes(r.lustre_bytes),
            str(r.xid_errors),
            f"[red]{r.idle_gpus}[/]" if r.idle_gpus else "0",
        )
    console.print(table)


@app.command()
@argument("job_id", required=True, help="Slurm job id, hpc_job label value, or namespace/pod.")
@db_option()
@prometheus_option
@price_options
@json_option("json_out")
def job(
    job_id: str, db: str | None, prometheus: str | None, gpu_hour_price: float | None, currency: str, json_out: bool
) -> None:
    """One job's report, GPU by GPU."""
    from hpcwatch.records import MAX_JOB_ID_CHARS

    if len(job_id) > MAX_JOB_ID_CHARS:  # no workload has such an id: refused before the store or pyarrow loads
        raise click.BadParameter(
            f"{len(job_id)} characters; a job id has at most {MAX_JOB_ID_CHARS}",
            ctx=click.get_current_context(),
            param_hint="'JOB_ID'",
        )
    from rich.table import Table

    from hpcwatch.analysis.attribution import report_dict
    from hpcwatch.reports.jobs import cost_dict, job_cost, job_report
    from hpcwatch.reports.jobstretches import KeptStretches

    with open_store(db) as store:
        # From the newest checkpoint a server's job pages left in the store's folder, when one is still true:
        # a long job's life is not read again (reports/checkpointfiles.py). Nothing is written.
        kept = KeptStretches(on_disk=True, writes=False)
        found = job_report(store, job_id, samples=_prometheus_samples(store, prometheus), kept=kept)
    cost = job_cost(found, price_per_gpu_hour=gpu_hour_price, currency=currency)
    if json_out:
        emit_json(report_dict(found, per_gpu=True) | {"cost": cost_dict(cost)})
        return
    console.print(
        f"[bold]job {safe_text(found.id)}[/] {safe_text(found.name, empty='')} — {safe_text(found.user)}/"
        f"{safe_text(found.account)}, {safe_text(found.state)}, "
        f"{found.gpus} GPUs on {', '.join(safe_text(n) for n in found.nodes)}; {found.gpu_hours:.2f} GPU-h, "
        f"{found.energy_kwh:.3f} kWh, IB {_bytes(found.ib_bytes)}, Lustre read "
        f"{_bytes(found.lustre_read_bytes)} / write {_bytes(found.lustre_write_bytes)}, "
        f"{found.xid_errors} XID errors"
        + (
            ""
            if cost.cost is None
            else f"; cost {cost.cost:,.2f} {safe_text(currency, empty='')} at {gpu_hour_price:g} a GPU-hour"
        )
    )
    for line in _job_lines(found):
        console.print(line)
    table = Table()
    for col in (
        "host",
        "GPU",
        "MIG",
        "samples",
        "util mean",
        "util max",
        "tensor",
        "HBM max",
        "power",
        "kWh",
        "XID",
        "",
    ):
        table.add_column(col, justify="left" if col in ("host", "") else "right")
    for g in found.per_gpu:
        table.add_row(
            safe_text(g.host),
            safe_text(g.gpu),
            "-" if g.instance is None else safe_text(f"{g.instance} {g.profile or ''}"),
            str(g.samples),
            _pct(g.mean_util_pct),
            _pct(g.max_util_pct),
            "-" if g.mean_tensor_active is None else f"{g.mean_tensor_active:.2f}",
            _bytes(g.max_fb_used_bytes),
            "-" if g.mean_power_w is None else f"{g.mean_power_w:.0f} W",
            f"{g.energy_kwh:.3f}",
            str(g.xid_errors),
            "[red]allocated but idle[/]" if g.idle else "",
        )
    console.print(table)
