"""``hpcwatch assess``: ClusterMAX-style criteria, evidence and tier, from a store."""

from __future__ import annotations

from pathlib import Path

import click

from hpcwatch.cli.common import PATH, Number, app, console, db_option, emit_json, json_option, open_store, safe_text
from hpcwatch.cli.defaults import ACTIVE_CHECK_DAYS
from hpcwatch.errors import ConfigError

__all__ = ["assess"]

_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "unknown": "dim"}


@app.command()
@db_option()
@json_option("json_out")
@click.option("--html", type=PATH, help="Also write the report as one self-contained HTML page.")
@click.option("--cluster", "cluster_file", type=PATH, help="Cluster model YAML (default: the reference).")
@click.option(
    "--active-check-days",
    type=Number(min=0.0),
    default=ACTIVE_CHECK_DAYS,
    help="Active checks older than this do not count.",
)
@click.option("--params", type=Number(min=0.0, min_open=True), help="MFU: non-embedding parameters N.")
@click.option("--layers", type=int, help="MFU: transformer layers L.")
@click.option("--d-model", type=int, help="MFU: model width d.")
@click.option("--seq", type=int, help="MFU: sequence length T.")
@click.option("--tokens-per-step", type=Number(min=0.0, min_open=True), help="MFU: tokens per step.")
def assess(
    db: str | None,
    json_out: bool,
    html: Path | None,
    cluster_file: Path | None,
    active_check_days: float,
    params: float | None,
    layers: int | None,
    d_model: int | None,
    seq: int | None,
    tokens_per_step: float | None,
) -> None:
    """Rate the cluster ClusterMAX-style from its own records: criteria, evidence, a tier per category."""
    from hpcwatch.assess import AssessConfig, ModelShape
    from hpcwatch.model import load_cluster, reference_cluster
    from hpcwatch.reports.assess import assessment_document, assessment_report

    shape = [params, layers, d_model, seq, tokens_per_step]
    if any(v is not None for v in shape) and any(v is None for v in shape):
        raise ConfigError("assess: MFU needs all of --params --layers --d-model --seq --tokens-per-step")
    model = (
        ModelShape(params=params, layers=layers, d_model=d_model, seq=seq, tokens_per_step=tokens_per_step)
        if params is not None
        and layers is not None
        and d_model is not None
        and seq is not None
        and tokens_per_step is not None
        else None  # all of them or none (checked above)
    )
    config = AssessConfig(
        cluster=load_cluster(cluster_file) if cluster_file else reference_cluster(),
        active_check_days=active_check_days,
        model=model,
    )
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
            table.add_row(
                r["id"], f"[{_STYLE[r['status']]}]{r['status']}[/]", safe_text(r["evidence"]), safe_text(r["command"])
            )
        console.print(table)
    console.print("Not assessable from cluster data: " + ", ".join(n["category"] for n in doc["not_assessable"]))
