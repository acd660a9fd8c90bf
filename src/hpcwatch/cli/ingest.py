"""``hpcwatch ingest PATH...``: read files or folders of real formats into the store, each file once.

The work is ``hpcwatch.ingest.ingest_paths``; this view prints what it did: the
records stored per kind, the files already in the store, the files skipped and
why, and the bad lines of logs (kept: their good lines were stored). A strict file
that is bad is named on stderr as ``hpcwatch: FILE:LINE: what``, one line per file, as
it is met; every other file is still read and stored, and the command exits 2 at the end
(a spool folder or a cron ingest is not held back by one bad file).

``--remote-write URL`` sends the same readers' samples to a Prometheus (``--web.enable-remote-write-receiver``)
or VictoriaMetrics instead of the store (``hpcwatch.ingest.remote_write_paths``); the store is not opened.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hpcwatch.cli.common import (
    PATH,
    app,
    argument,
    console,
    db_option,
    emit_json,
    error_line,
    json_option,
    open_store,
    safe_text,
)
from hpcwatch.reports.text import visible
from hpcwatch.sources.registry import RECORD_KINDS, format_named, formats

if TYPE_CHECKING:  # hpcwatch.ingest opens the store (pyarrow, duckdb): imported when the command runs
    from hpcwatch.ingest import FileResult, IngestReport

__all__ = ["ingest", "ingest_document"]


@app.command()
@argument("paths", nargs=-1, required=True, type=PATH, help="Files or folders (walked) of real formats.")
@click.option("--format", "-f", "format", help="Skip detection: " + ", ".join(f.name for f in formats()) + ".")
@click.option(
    "--host",
    help="The node these files belong to, for formats that do not name it (node-exporter text, perfquery, nvidia-smi).",
)
@click.option(
    "--remote-write",
    metavar="URL",
    help="Send the samples to this Prometheus or VictoriaMetrics "
    "(http://host:9090, remote-write API) instead of the store.",
)
@db_option()
@json_option("json_out")
def ingest(
    paths: list[Path], format: str | None, host: str | None, remote_write: str | None, db: str | None, json_out: bool
) -> None:
    """Read files or folders of real formats into the store (format auto-detected; the same content only once)."""
    from hpcwatch.ingest import ingest_paths, remote_write_paths

    if format:
        format_named(format)  # an unknown name fails before anything is read
    on_file = None if json_out else _warn
    if remote_write is not None:
        from hpcwatch.promql import PrometheusBackend

        with PrometheusBackend(remote_write) as backend:
            report = remote_write_paths(
                backend.write, paths, format=format, host=host, on_file=on_file, keep_going=True
            )
    else:
        with open_store(db) as store:
            report = ingest_paths(store, paths, format=format, host=host, on_file=on_file, keep_going=True)
    if json_out:
        emit_json(ingest_document(report))
        for result in report.bad():  # with --json too, every bad file is an error line on stderr
            print(error_line(result.reason), file=sys.stderr)
    else:
        _print(report)
    if report.bad():
        raise click.exceptions.Exit(2)


def ingest_document(report: IngestReport) -> dict:
    """The ``--json`` document: totals per kind, files per outcome and format, what was skipped and why."""
    formats_used = Counter(f.format for f in report.files if f.status in ("stored", "sent"))
    return {
        "files": sum(1 for f in report.files if f.status not in ("skipped", "bad")),
        **report.totals(),
        "empty_files": sum(1 for f in report.files if f.status == "empty"),
        "formats": dict(sorted(formats_used.items())),
        "status": report.by_status(),
        "already_ingested": [f.path for f in report.files if f.status == "already"],
        "skipped": [
            {"path": f.path, "reason": f.reason}
            for f in report.files
            if f.status in ("skipped", "not stored", "not sent")
        ],
        "bad_lines": [
            {"path": f.path, "count": f.bad_line_count, "first": f.bad_lines} for f in report.files if f.bad_line_count
        ],
        "bad_files": [{"path": f.path, "error": f.reason} for f in report.bad()],
    }


def _warn(result: FileResult) -> None:
    """Bad files, bad lines and skipped files go to stderr as they happen, one line each."""
    if result.status == "bad":
        print(error_line(result.reason), file=sys.stderr)
    if result.bad_line_count:
        for line in result.bad_lines:
            print(f"hpcwatch: warning: {visible(line)}", file=sys.stderr)
        more = result.bad_line_count - len(result.bad_lines)
        tail = f" ({more} more not shown)" if more else ""
        print(
            f"hpcwatch: warning: {visible(result.path)}: {result.bad_line_count} bad line(s) "
            f"skipped, the good ones kept{tail}",
            file=sys.stderr,
        )


def _print(report: IngestReport) -> None:
    from rich.table import Table

    doc = ingest_document(report)
    sent = any(f.status in ("sent", "not sent") for f in report.files)
    table = Table(title=f"{'sent (remote write)' if sent else 'ingested'} {doc['files']} file(s)")
    table.add_column("kind")
    table.add_column("count", justify="right")
    for kind in RECORD_KINDS:
        table.add_row(kind, str(doc[kind]))
    for name, n in doc["formats"].items():
        table.add_row(f"files: {safe_text(name)}", str(n))
    for status, n in doc["status"].items():
        if status not in ("stored", "sent"):
            table.add_row(f"files: {status}", str(n))
    console.print(table)
    for f in report.files:
        if f.status == "already":
            console.print(f"already in the store (same content): {safe_text(f.path)}", highlight=False)
        elif f.status in ("skipped", "not stored", "not sent"):
            console.print(f"{f.status}: {safe_text(f.path)}: {safe_text(f.reason)}", highlight=False)
