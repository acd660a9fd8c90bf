"""``hpcwatch nccl LOG...|DIR`` (what NCCL built, what is wrong) and ``hpcwatch hang DUMPS...|DIR`` (why a job hangs)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from hpcwatch.cli.common import PATH, app, argument, console, db_option, emit_json, json_option, open_store, safe_text
from hpcwatch.errors import InputError

if TYPE_CHECKING:  # imported when a command runs, not for --help
    from hpcwatch.analysis.hang import HangReport
    from hpcwatch.reports.nccl import NcclReport

__all__ = ["nccl", "hang"]

_STYLE = {"warn": "yellow", "drain": "bold red", "ok": "green"}


def _paths_or_store(paths: list[Path], db: str | None) -> None:
    if not paths and not db:
        raise InputError("give files or folders, or --db to read a store")


@app.command()
@argument("paths", nargs=-1, type=PATH, help="NCCL_DEBUG=INFO logs (one job), or folders of them.")
@json_option()
@db_option()
@click.option("--expect-ib", is_flag=True, default=False, help="The nodes have InfiniBand (Socket is a fallback).")
def nccl(paths: list[Path], as_json: bool, db: str | None, expect_ib: bool) -> None:
    """NCCL's topology from its debug logs: version, ranks, network, IB devices, transports, channels; rules."""
    from hpcwatch.analysis.nccl import NcclConfig
    from hpcwatch.ingest import ingest_paths
    from hpcwatch.reports.nccl import nccl_report, stored_nccl_report

    _paths_or_store(paths, db)
    config = NcclConfig(expect_ib=expect_ib)
    if paths and db:
        ingest_paths(open_store(db), paths, format="nccl-log")
    report = nccl_report(paths, config=config) if paths else stored_nccl_report(open_store(db), config=config)
    if as_json:
        emit_json(report.to_dict())
        return
    _print_nccl(report)


def _print_nccl(report: NcclReport) -> None:
    from rich.table import Table

    t = report.topology
    versions = ", ".join(f"{v} ({len(h)} host{'s' * (len(h) != 1)})" for v, h in t.versions.items()) or "-"
    console.print(
        f"[bold]NCCL[/bold] {safe_text(versions)} · CUDA runtime {safe_text(', '.join(t.cuda_runtimes))}"
        f" · driver {safe_text(', '.join(map(str, t.cuda_drivers)))}"
    )
    console.print(
        f"{t.processes} process(es) on {len(t.hosts)} host(s), ranks seen {len(t.ranks)}"
        f"{f' of {t.nranks}' if t.nranks else ''} · network {safe_text(', '.join(t.networks))}"
        f" · plugin {safe_text(', '.join(t.plugins))} · GPU Direct RDMA {'yes' if t.gdr else 'no'}"
    )
    console.print(
        f"transports {safe_text(', '.join(f'{k}×{n}' for k, n in t.transports.items()))} · coll channels "
        f"{safe_text(', '.join(map(str, t.coll_channels)))} · rings {t.rings_max} · trees {t.trees_max}"
    )
    if t.env:
        console.print("environment " + safe_text(" ".join(f"{k}={v}" for k, v in t.env.items())))
    table = Table("host", "NET/IB devices", "sockets")
    for host in t.hosts:
        table.add_row(
            safe_text(host),
            safe_text(" ".join(t.ib_devices.get(host, ()))),
            safe_text(" ".join(t.socket_ifs.get(host, ()))),
        )
    console.print(table)
    for r in report.rules:
        console.print(
            f"[{_STYLE[r.verdict]}]{r.verdict}[/] {r.rule}: {safe_text(r.title)} "
            f"[dim]{safe_text(', '.join(r.hosts[:8]))}[/dim]"
        )
    if not report.rules:
        console.print("[green]no rule fired[/green]")
    for w in report.warns[:10]:
        console.print(f"[yellow]WARN[/yellow] {safe_text(w.get('host'))} {safe_text(w.get('message'))}")
    for o in report.timeouts[:10]:
        console.print(
            f"[red]timeout[/red] rank {o.get('rank')} seq {o.get('seq')} {safe_text(o.get('op'))} "
            f"after {o.get('ran_ms')} ms"
        )


@app.command()
@argument("paths", nargs=-1, type=PATH, help="Flight Recorder dumps (one per rank, pickle or JSON), or their folder.")
@json_option()
@db_option()
def hang(paths: list[Path], as_json: bool, db: str | None) -> None:
    """Why a job hangs: the collective some ranks never reached, mismatched collectives, the last one all completed.

    Pickled dumps are read by a restricted loader that refuses any pickle naming a class or function
    (it never runs the pickle's code)."""
    from hpcwatch.ingest import ingest_paths
    from hpcwatch.reports.nccl import hang_report, stored_hang_report

    _paths_or_store(paths, db)
    if paths and db:
        ingest_paths(open_store(db), paths, format="flight-recorder")
    report = hang_report(paths) if paths else stored_hang_report(open_store(db))
    if as_json:
        emit_json(report.to_dict())
        return
    _print_hang(report)


def _print_hang(report: HangReport) -> None:
    console.print(f"[bold]{report.verdict}[/bold] · dumps of ranks {', '.join(map(str, report.ranks))}")
    for g in report.groups:
        console.print(
            f"process group {safe_text(g.pg)} {safe_text(g.desc)} · members {len(g.members)}"
            + (f" · no dump from {', '.join(map(str, g.no_dump))}" if g.no_dump else "")
        )
        if g.all_completed_seq is not None:
            console.print(
                f"  last collective every rank completed: seq {g.all_completed_seq} {safe_text(g.all_completed_op)}"
            )
        if g.wavefront is not None:
            w = g.wavefront
            console.print(
                f"  [red]wavefront[/red]: seq {w.seq} {safe_text(w.op)} sizes {safe_text(w.input_sizes)} "
                f"— ranks {', '.join(map(str, w.missing))} never arrived "
                f"({len(w.arrived)} rank(s) wait in it)"
            )
        for m in g.mismatches[:10]:
            values = ", ".join(f"rank {r}: {v}" for r, v in m.values.items())
            console.print(f"  [red]mismatch[/red] at seq {m.seq} in {m.field}: {safe_text(values)}")
