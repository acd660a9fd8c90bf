"""What every command shares: the click groups and option helpers, the console, JSON output, the store location."""

from __future__ import annotations

import importlib
import math
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson

if TYPE_CHECKING:  # imported when a command runs, not for --help (the store pulls in pyarrow and duckdb)
    from rich.console import Console

    from hpcwatch.store import Store


def _visible(text: object) -> str:
    """``hpcwatch.reports.text.visible``, imported on first use."""
    from hpcwatch.reports.text import visible

    return visible(text)


__all__ = [
    "app",
    "twin_app",
    "simulate_app",
    "console",
    "emit_json",
    "open_store",
    "default_db_path",
    "db_option",
    "listen_options",
    "auth_option",
    "json_option",
    "price_options",
    "argument",
    "repeatable",
    "PATH",
    "Number",
    "wait_for",
    "duration_option",
    "safe_text",
    "error_line",
    "warning_line",
    "HelpGroup",
    "HelpCommand",
    "HelpArgument",
]

#: Option and argument values that are paths arrive as ``pathlib.Path`` (click's default is ``str``).
PATH = click.Path(path_type=Path)


class Number(click.FloatRange):
    """The type of every option that takes a number with a fraction: a finite one within the range given
    (``infinite``: ``inf`` too). Click's ``float`` takes ``nan``, which no range refuses (no comparison holds for
    it) and which reached a traceback (``top --speed nan``) or silent nonsense; here it gets the usage error."""

    name = "number"

    def __init__(
        self,
        min: float | None = None,
        max: float | None = None,
        *,
        min_open: bool = False,
        infinite: bool = False,
    ) -> None:
        super().__init__(min, max, min_open=min_open)
        self.infinite = infinite

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if math.isnan(number) or (math.isinf(number) and not self.infinite):
            self.fail(f"{_visible(value)!r} is not a {'number' if self.infinite else 'finite number'}.", param, ctx)
        return number


class HelpArgument(click.Argument):
    """A positional argument with a ``help`` text, shown under "Arguments" by ``HelpCommand``.

    Click documents arguments itself only from 8.5 on; this keeps ``click>=8.1`` working the same.
    """

    def __init__(self, param_decls, help: str | None = None, **attrs: Any) -> None:
        super().__init__(param_decls, **attrs)
        self.help = help


class HelpCommand(click.Command):
    """A command whose ``--help`` has an "Arguments" section (the help of each ``HelpArgument``)
    between its description and its options, on every click 8."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self.format_usage(ctx, formatter)
        self.format_help_text(ctx, formatter)
        self.format_arguments(ctx, formatter)
        self.format_options(ctx, formatter)
        self.format_epilog(ctx, formatter)

    def format_arguments(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [
            (p.get_usage_pieces(ctx)[0], p.help + ("  [required]" if p.required else ""))
            for p in self.get_params(ctx)
            if isinstance(p, HelpArgument) and p.help
        ]
        if rows:
            with formatter.section("Arguments"):
                formatter.write_dl(rows)


class HelpGroup(click.Group):
    """A command group whose ``--help`` lists its commands in the order they were registered, each with
    the whole first paragraph of its help, and which shows that help (exit status 2) when run bare.

    Click would sort the commands and cut each line at 45 characters; this keeps the sentence and wraps
    it instead. Click 8.1 exits 0 on a bare group and 8.2+ raises ``NoArgsIsHelpError``; answering here
    gives every click 8 the same status.
    """

    command_class = HelpCommand

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy: dict[str, str] = {}
        """Command name -> the module that registers it, imported when the command is asked for (click's
        "lazily loading subcommands" pattern): ``hpcwatch steps`` imports no other command's module."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*self.lazy, *(name for name in self.commands if name not in self.lazy)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            importlib.import_module(self.lazy[cmd_name])  # its decorators register it on this group
        return super().get_command(ctx, cmd_name)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            click.echo(ctx.get_help(), color=ctx.color)
            ctx.exit(2)
        return super().parse_args(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
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


# Every option's default is shown in --help ("[default: 300.0]"); the children inherit the setting.
app = HelpGroup(
    name="hpcwatch",
    no_args_is_help=True,
    context_settings={"show_default": True},
    help="See an AI training cluster as it runs and as it can be attacked.",
)
twin_app = HelpGroup(name="twin", no_args_is_help=True, help="The simulated cluster that writes real formats.")
simulate_app = HelpGroup(
    name="simulate", no_args_is_help=True, help="Simulators: stragglers at scale, goodput under failures."
)


def _as_list(_ctx: click.Context, _param: click.Parameter, values: tuple) -> list:
    return list(values)


def argument(name: str, *, help: str, nargs: int = 1, required: bool = False, type: Any = None) -> Callable:
    """A positional argument with its help; ``nargs=-1`` takes any number of values, passed as a list."""
    return click.argument(
        name,
        cls=HelpArgument,
        help=help,
        nargs=nargs,
        required=required,
        type=type,
        callback=_as_list if nargs == -1 else None,
    )


def repeatable(*decls: str, help: str, default: tuple = (), type: Any = None) -> Callable:
    """An option that may be given several times; its values are passed as a list."""
    return click.option(*decls, multiple=True, default=default, type=type, help=help, callback=_as_list)


#: The help of ``--db`` on the commands that read or write the store.
_DB_HELP = "Store folder (Parquet parts, readable while written) or :memory:; default: the user's data directory."


def db_option(help: str = _DB_HELP) -> Callable:
    """``--db``: the store to read or write, passed as the parameter ``db`` (None: the default store)."""
    return click.option("--db", "db", default=None, help=help)


def auth_option(what: str) -> Callable:
    """``--auth FILE``: the auth config (hpcwatch.access.authconfig) of ``what``, passed as ``auth``."""
    return click.option(
        "--auth",
        "auth",
        type=PATH,
        default=None,
        help=f"Auth config (TOML: [ldap], [proxy], [tokens], [roles]) {what} requires; see docs/deploy.md.",
    )


def policy_option(what: str) -> Callable:
    """``--policy FILE`` (or ``HPCWATCH_POLICY``): the roles policy (hpcwatch.access.policy) that filters
    what each principal of ``what`` sees, passed as ``policy_path``."""
    return click.option(
        "--policy",
        "policy_path",
        type=PATH,
        default=None,
        envvar="HPCWATCH_POLICY",
        help=f"Roles policy (TOML: roles -> permissions) for {what}; default: the built-in "
        "user/operator/security/decider.",
    )


def listen_options(what: str) -> Callable:
    """``--host``, ``--allow-host``, ``--tls-cert``, ``--tls-key``, ``--insecure-no-auth`` of a server
    (``what``: its name in the help); checked by hpcwatch.httpguard before anything is bound."""
    options = (
        click.option(
            "--host",
            default="127.0.0.1",
            help=f"Address {what} binds. Off loopback it needs --auth FILE (or --insecure-no-auth).",
        ),
        repeatable(
            "--allow-host",
            help="A Host name clients use (repeatable); besides the bound address, localhost, 127.0.0.1 and ::1 "
            "any other Host gets 400 (DNS rebinding).",
        ),
        click.option("--tls-cert", type=PATH, help="PEM certificate (chain) to serve HTTPS; with --tls-key."),
        click.option("--tls-key", type=PATH, help="PEM private key of --tls-cert."),
        click.option(
            "--insecure-no-auth",
            is_flag=True,
            default=False,
            help="Bind a non-loopback --host although anyone reaching the port reads everything.",
        ),
    )

    def decorate(f: Callable) -> Callable:
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def price_options(function: Callable) -> Callable:
    """``--gpu-hour-price`` and ``--currency`` (also ``HPCWATCH_GPU_HOUR_PRICE``, ``HPCWATCH_CURRENCY``): what a
    job's cost is computed at (``reports.jobs.job_cost``); no price, no cost."""
    function = click.option(
        "--currency", "currency", default="", envvar="HPCWATCH_CURRENCY", help="Currency of --gpu-hour-price (a label)."
    )(function)
    return click.option(
        "--gpu-hour-price",
        "gpu_hour_price",
        type=Number(min=0.0),
        default=None,
        envvar="HPCWATCH_GPU_HOUR_PRICE",
        help="Price of one GPU-hour: a job's cost is its allocated GPU-hours times this.",
    )(function)


def json_option(name: str = "as_json") -> Callable:
    """``--json``, passed as the parameter ``name``."""
    return click.option("--json", name, is_flag=True, default=False, help="Print one JSON document on stdout.")


class _Console:
    """rich's ``Console``, made on first use (importing rich.console would slow ``hpcwatch --help``:
    benchmarks/RESULTS.md, "CLI start-up").

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


def _one_line(message: str) -> str:
    # A message of several lines (a library's error text) is joined into one; what is left is escaped.
    return _visible(_LINE_BREAKS.sub(" ", message.strip()))


def error_line(message: str) -> str:
    """``hpcwatch: <message>`` on one line, control characters (newlines included) shown as ``\\xNN``."""
    return f"hpcwatch: {_one_line(message)}"


def warning_line(message: str) -> str:
    """``warning: <message>`` for stderr, as plain text (no rich: a warning of a fast command such as
    ``steps`` must not cost rich's import), on one line like ``error_line``."""
    return f"warning: {_one_line(message)}"


def emit_json(document: Any) -> None:
    """One JSON document on stdout (numpy scalars and dataclasses welcome)."""
    sys.stdout.write(
        orjson.dumps(
            document,
            option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS | orjson.OPT_INDENT_2,
            default=_default,
        ).decode()
    )
    sys.stdout.write("\n")


def _default(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def duration_option() -> Callable:
    """``--duration S`` (``duration_s``) of a command that serves until stopped: what ``wait_for`` waits."""
    return click.option(
        "--duration",
        "duration_s",
        type=Number(min=0.0),
        default=0.0,
        help="Stop after this many seconds (0: until Ctrl-C).",
    )


def wait_for(duration_s: float, *, alive: Callable[[], bool] = lambda: True) -> None:
    """Block for ``duration_s`` seconds (forever when <= 0), until Ctrl-C, which ends the wait quietly, or
    until ``alive()`` turns False (what is being waited on stopped by itself)."""
    deadline = time.monotonic() + duration_s if duration_s > 0 else None
    try:
        while (deadline is None or time.monotonic() < deadline) and alive():
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
