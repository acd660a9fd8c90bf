"""``hpcwatch assess``: ClusterMAX-style criteria, evidence and tier, from a store."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hpcwatch.cli.common import DbOption, JsonOption, app, console, emit_json, open_store, safe_text
from hpcwatch.cli.defaults import ACTIVE_CHECK_DAYS
from hpcwatch.errors import ConfigError

__all__ = ["assess"]

_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "unknown": "dim"}


@app.command()
def assess(
    db: Optional[str] = DbOption,
    json_out: bool = JsonOption,
    html: Optional[Path] = typer.Option(None, "--html", help="Also write the report as one self-contained HTML page."),
    cluster_file: Optional[Path] = typer.Option(None, "--cluster", help="Cluster model YAML (default: the reference)."),
    active_check_days: float = typer.Option(ACTIVE_CHECK_DAYS, "--active-check-days",
                                            help="Active checks older than this do not count."),
    params: Optional[float] = typer.Option(None, "--params", help="MFU: non-embedding parameters N."),
    layers: Optional[int] = typer.Option(None, "--layers", help="MFU: transformer layers L."),
    d_model: Optional[int] = typer.Option(None, "--d-model", help="MFU: model width d."),
    seq: Optional[int] = typer.Option(None, "--seq", help="MFU: sequence length T."),
    tokens_per_step: Optional[float] = typer.Option(None, "--tokens-per-step", help="MFU: tokens per step."),
) -> None:
    """Rate the cluster ClusterMAX-style from its own records: criteria, evidence, a tier per category."""
    from hpcwatch.assess import AssessConfig, ModelShape
    from hpcwatch.model import load_cluster, reference_cluster
    from hpcwatch.reports.assess import assessment_document, assessment_report
    shape = [params, layers, d_model, seq, tokens_per_step]
    if any(v is not None for v in shape) and any(v is None for v in shape):
        raise ConfigError("assess: MFU needs all of --params --layers --d-model --seq --tokens-per-step")
    model = ModelShape(params=params, layers=layers, d_model=d_model, seq=seq, tokens_per_step=tokens_per_step) \
        if params is not None else None
    config = AssessConfig(cluster=load_cluster(cluster_file) if cluster_file else reference_cluster(),
                          active_check_days=active_check_days, model=model)
    with open_store(db) as store:
        doc = assessment_document(assessment_report(store, config))
    if html is not None:
        from hpcwatch.web.assess_html import render_assessment_html
        _write(html, render_assessment_html(doc))
    if json_out:
        emit_json(doc)
        return
    _print(doc)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)  # rename(2) is atomic on one filesystem
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"{path}: cannot write: {err.strerror}") from err


def _print(doc: dict) -> None:
    from rich.table import Table
    console.print(f"[bold]Tier: {doc['tier']}[/] (the lowest category; unknown never counts as a pass)")
    for cat in doc["categories"]:
        table = Table(title=f"{cat['name']}: {cat['tier']}", expand=True)
        table.add_column("criterion", no_wrap=True)
        table.add_column("status", no_wrap=True)
        table.add_column("evidence", ratio=3, overflow="fold")
        table.add_column("see it", overflow="fold")
        for r in cat["criteria"]:
            table.add_row(r["id"], f"[{_STYLE[r['status']]}]{r['status']}[/]", safe_text(r["evidence"]),
                          safe_text(r["command"]))
        console.print(table)
    console.print("Not assessable from cluster data: " + ", ".join(n["category"] for n in doc["not_assessable"]))
