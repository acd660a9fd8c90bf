"""The command line: one module per command family, all registered on one typer app.

Only this layer prints, reads flags and the environment; it calls the same
report functions (hpcwatch.reports) the web app and the exporter call.
"""

from __future__ import annotations

import importlib
import sys

import typer

from hpcwatch.cli.common import app, error_line
from hpcwatch.errors import HpcwatchError

__all__ = ["app", "main"]

# Typer (0.2x) vendors its own copy of click and raises that copy's errors, not click's.
try:
    from typer._click import exceptions as _click
except ImportError:  # an older typer over the click package
    from click import exceptions as _click  # type: ignore[no-redef]

# Each module registers its commands on import.
_COMMAND_MODULES = ("ingest", "twin", "jobs", "top", "steps", "whatif", "goodput", "scan", "serve", "exporter",
                    "twinserve", "nccl", "assess", "collect")

for _name in _COMMAND_MODULES:
    importlib.import_module(f"hpcwatch.cli.{_name}")


def _fail(message: str, status: int = 2) -> None:
    print(error_line(message), file=sys.stderr)
    sys.exit(status)


def main() -> None:
    """Entry point: every error is one line ``hpcwatch: what``, control characters escaped, exit status 2.

    Typer runs outside its standalone mode so that a usage error (an unknown
    option, a bad value) is our one line rather than its framed box; a bare
    ``hpcwatch`` or a group without a command still shows the help.
    """
    try:
        status = app(standalone_mode=False)
    except HpcwatchError as err:
        _fail(str(err))
    except _click.NoArgsIsHelpError as err:
        print(err.ctx.get_help() if err.ctx is not None else err.format_message())
        sys.exit(2)
    except _click.UsageError as err:
        where = f" (see {err.ctx.command_path} --help)" if err.ctx is not None else ""
        _fail(err.format_message() + where, err.exit_code)
    except _click.ClickException as err:
        _fail(err.format_message(), err.exit_code)
    except typer.Abort:
        _fail("aborted", 1)
    except OSError as err:
        # An argument we could not open or read, past every check a command makes itself.
        where = f"{err.filename}: " if err.filename is not None else ""
        _fail(f"{where}{err.strerror or err}")
    if isinstance(status, int) and status:
        sys.exit(status)
