"""What every command shares: the console, JSON output, the store location, the sub-command groups."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import typer
from typer.core import TyperGroup

if TYPE_CHECKING:   # imported when a command runs, not for --help (the store pulls in pyarrow and duckdb)
    from rich.console import Console

    from hpcwatch.store import Store


def _visible(text: object) -> str:
    """``hpcwatch.reports.text.visible``, imported on first use."""
    from hpcwatch.reports.text import visible
    return visible(text)

__all__ = ["app", "twin_app", "simulate_app", "console", "emit_json", "open_store", "default_db_path",
           "DbOption", "JsonOption", "wait_for", "safe_text", "error_line", "HelpGroup"]


class HelpGroup(TyperGroup):
    """A command group whose ``--help`` lists each command with the whole first paragraph of its help.

    Help is rendered by click, not Rich (``rich_markup_mode=None``): typer's Rich help imports rich's
    console, markdown and markdown-it, 0.08 s of a 0.2 s ``hpcwatch --help``. Click would cut each
    command's line at 45 characters; this keeps the sentence and wraps it instead.
    """

    def format_commands(self, ctx: typer.Context, formatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, _first_paragraph(command.short_help or command.help or "")))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _first_paragraph(text: str) -> str:
    return " ".join(text.strip().split("\n\n", 1)[0].split())


def _typer(**options: Any) -> typer.Typer:
    return typer.Typer(cls=HelpGroup, rich_markup_mode=None, no_args_is_help=True, **options)


app = _typer(name="hpcwatch", add_completion=False,
             help="See an AI training cluster as it runs and as it can be attacked.")
twin_app = _typer(help="The simulated cluster that writes real formats.")
simulate_app = _typer(help="Simulators: stragglers at scale, goodput under failures.")
app.add_typer(twin_app, name="twin")
app.add_typer(simulate_app, name="simulate")


class _Console:
    """rich's ``Console``, made on first use (importing rich.console costs ``hpcwatch --help`` 0.03 s).

    Attributes are read from and set on the real console; pass ``console.real`` where rich wants one
    (``Live``, ``Progress``)."""

    _real: Console | None = None

    @property
    def real(self) -> Console:
        if _Console._real is None:
            from rich.console import Console
            # No emoji codes: a user named ":warning:" is shown as typed. Markup stays on for our own
            # styles; every string from data goes through safe_text first.
            _Console._real = Console(emoji=False)
        return _Console._real

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.real, name, value)


console = _Console()
_LINE_BREAKS = re.compile(r"\s*[\r\n]+\s*")

DbOption = typer.Option(None, "--db", help="Store folder (Parquet parts, readable while written) or :memory:; "
                                           "default: the user's data directory.")
JsonOption = typer.Option(False, "--json", help="Print one JSON document on stdout.")


def default_db_path() -> Path:
    """$HPCWATCH_DB, else the folder $XDG_DATA_HOME/hpcwatch/store (~/.local/share by default)."""
    if os.environ.get("HPCWATCH_DB"):
        return Path(os.environ["HPCWATCH_DB"])
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "hpcwatch" / "store"


def open_store(db: str | None) -> Store:
    from hpcwatch.store import Store
    return Store(db if db else default_db_path())


def safe_text(value: object, empty: str = "-") -> str:
    """A string from data, ready for a Rich table or ``console.print``: control characters shown as
    ``\\xNN`` (no ESC reaches the terminal, one value stays on one line) and Rich markup escaped
    (``[bold]root[/bold]`` is shown as typed, ``[/x]`` cannot raise). ``None`` and ``""`` become ``empty``."""
    if value is None or value == "":
        return empty
    from rich.markup import escape
    return escape(_visible(value))


def error_line(message: str) -> str:
    """``hpcwatch: <message>`` on one line, control characters (newlines included) shown as ``\\xNN``."""
    # A message of several lines (a library's error text) is joined into one; what is left is escaped.
    return f"hpcwatch: {_visible(_LINE_BREAKS.sub(' ', message.strip()))}"


def emit_json(document: Any) -> None:
    """One JSON document on stdout (numpy scalars and dataclasses welcome)."""
    sys.stdout.write(orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
                                  | orjson.OPT_INDENT_2, default=_default).decode())
    sys.stdout.write("\n")


def _default(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def wait_for(duration_s: float, *, alive: Callable[[], bool] = lambda: True) -> None:
    """Block for ``duration_s`` seconds (forever when <= 0), until Ctrl-C, which ends the wait quietly, or
    until ``alive()`` turns False (what is being waited on stopped by itself)."""
    deadline = time.monotonic() + duration_s if duration_s > 0 else None
    try:
        while (deadline is None or time.monotonic() < deadline) and alive():
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
