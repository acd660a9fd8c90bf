"""The command line: one module per command family, all registered on one typer app.

Only this layer prints, reads flags and the environment; it calls the same
analysis functions the web app and the exporter call.
"""

from __future__ import annotations

import importlib
import sys

from hpcwatch.cli.common import app
from hpcwatch.errors import HpcwatchError

__all__ = ["app", "main"]

# Each module registers its commands on import.
_COMMAND_MODULES = ("ingest", "twin", "jobs", "top", "steps", "whatif", "goodput", "scan", "serve", "exporter", "twinserve")

for _name in _COMMAND_MODULES:
    importlib.import_module(f"hpcwatch.cli.{_name}")


def main() -> None:
    """Entry point: errors we raise on purpose become one line and exit status 2.

    Typer's standalone mode already turns usage errors into a short message and
    exit status 2, and a command's ``typer.Exit(code)`` into that status.
    """
    try:
        app(standalone_mode=True)
    except HpcwatchError as err:
        print(f"hpcwatch: {err}", file=sys.stderr)
        sys.exit(2)
