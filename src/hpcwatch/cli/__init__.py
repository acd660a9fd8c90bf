"""The command line: one module per command family, all registered on one typer app.

Only this layer prints, reads flags and the environment; it calls the same
analysis functions the web app and the exporter call.
"""

from __future__ import annotations

import importlib
import sys

import click
import typer

from hpcwatch.cli.common import app
from hpcwatch.errors import HpcwatchError

__all__ = ["app", "main"]

# Each module registers its commands on import.
_COMMAND_MODULES = ("ingest", "twin", "jobs", "top", "steps", "whatif", "goodput", "scan", "serve", "exporter", "twinserve",
                    "assess")

for _name in _COMMAND_MODULES:
    importlib.import_module(f"hpcwatch.cli.{_name}")


def main() -> None:
    """Entry point: errors we raise on purpose become one line and exit status 2."""
    try:
        # Without standalone mode click returns a command's typer.Exit(code) instead of exiting.
        status = app(standalone_mode=False)
        if type(status) is int and status:
            sys.exit(status)
    except HpcwatchError as err:
        print(f"hpcwatch: {err}", file=sys.stderr)
        sys.exit(2)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    except typer.Exit as err:
        sys.exit(err.exit_code)
