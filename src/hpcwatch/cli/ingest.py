"""``hpcwatch ingest PATH...``: read files or folders of real formats into the store.

Each file is read whole, then written in its own transaction(s): a bad file
stops the command with ``hpcwatch: FILE:LINE: what`` (exit 2) and writes none
of its records, while the files before it stay in the store.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import typer
from rich.table import Table

from hpcwatch.cli.common import DbOption, JsonOption, app, console, emit_json, open_store
from hpcwatch.sources.detect import FORMATS, detect_format, format_named, iter_files
from hpcwatch.store import IngestCounts, Store

__all__ = ["ingest"]

_KINDS = ("samples", "events", "spans", "jobs", "findings")


def _ingest_file(store: Store, path: Path, format: str | None, totals: IngestCounts) -> str | None:
    """Store one file's records; returns the format used (None for an empty file)."""
    fmt = format_named(format) if format else detect_format(path)
    if fmt is None:
        return None
    if fmt.table_reader is not None:
        # Every chunk first: a parse error in a late chunk writes nothing of the file.
        # TODO(lead): add chunks inside one store transaction instead, so memory stays bounded. #10
        for table in list(fmt.table_reader(path)):
            totals.samples += store.add_sample_table(table)
    else:
        records = list(fmt.reader(path))  # whole file first: a parse error writes nothing of it
        counts = store.add(records)
        for kind in _KINDS:
            setattr(totals, kind, getattr(totals, kind) + getattr(counts, kind))
    return fmt.name


@app.command()
def ingest(
    paths: list[Path] = typer.Argument(..., help="Files or folders (walked) of real formats."),
    format: str | None = typer.Option(None, "--format", "-f",
                                      help="Skip detection: " + ", ".join(f.name for f in FORMATS) + "."),
    db: str | None = DbOption,
    json_out: bool = JsonOption,
) -> None:
    """Read files or folders of real formats into the store (format auto-detected)."""
    if format:
        format_named(format)  # an unknown name fails before anything is read
    totals = IngestCounts()
    formats: Counter[str] = Counter()
    files = empty = 0
    with open_store(db) as store:
        for path in iter_files(paths):
            used = _ingest_file(store, path, format, totals)
            files += 1
            if used is None:
                empty += 1
            else:
                formats[used] += 1
    doc = {"files": files, **{kind: getattr(totals, kind) for kind in _KINDS}, "empty_files": empty,
           "formats": dict(sorted(formats.items()))}
    if json_out:
        emit_json(doc)
        return
    table = Table(title=f"ingested {files} file(s)")
    table.add_column("kind")
    table.add_column("count", justify="right")
    for kind in _KINDS:
        table.add_row(kind, str(doc[kind]))
    for name, n in doc["formats"].items():
        table.add_row(f"files: {name}", str(n))
    if empty:
        table.add_row("files: empty", str(empty))
    console.print(table)
