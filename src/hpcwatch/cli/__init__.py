"""The command line: one module per command family, all registered on one click group.

Only this layer prints, reads flags and the environment; it calls the same
report functions (hpcwatch.reports) the web app and the exporter call.
"""

from __future__ import annotations

import os
import sys

# Before numpy loads: OpenBLAS starts a thread per core when it is loaded, up to its build's MAX_THREADS
# (64 in numpy's wheel), which slowed every command's start (benchmarks/RESULTS.md, "CLI start-up"); no command
# does BLAS-sized algebra (the largest is a matrix-vector product in security/gradients.py). A value
# the user set is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from click import exceptions as _click

from hpcwatch.cli.common import app, error_line, simulate_app, twin_app
from hpcwatch.errors import HpcwatchError

__all__ = ["app", "main"]

#: The module (``hpcwatch.cli.X``) that registers each command, in the order of ``hpcwatch --help``: a command's
#: module is imported when the command runs (``HelpGroup.lazy``), so ``hpcwatch steps`` pays for no other
#: family's imports (a 0.02 MB trace's whole run is mostly start-up: benchmarks/RESULTS.md, "Critical path vs
#: HTA"); ``--help`` imports them all. The sub-groups ``twin`` and ``simulate`` come last, after the commands.
_COMMAND_MODULES: dict[str, str] = {
    "ingest": "ingest",
    "jobs": "jobs",
    "job": "jobs",
    "top": "top",
    "steps": "steps",
    "whatif": "whatif",
    "mfu": "whatif",
    "goodput": "goodput",
    "health": "goodput",
    "scan": "scan",
    "demo": "serve",
    "serve": "serve",
    "exporter": "exporter",
    "nccl": "nccl",
    "hang": "nccl",
    "assess": "assess",
    "collect": "collect",
    "notify": "notify",
    "act": "act",
    "token": "auth",
    "trace": "trace",
}
_TWIN_MODULES = {"run": "twin", "traces": "twin", "serve": "twinserve"}
_SIMULATE_MODULES = {"stragglers": "whatif", "goodput": "goodput"}

for _group, _modules in ((app, _COMMAND_MODULES), (twin_app, _TWIN_MODULES), (simulate_app, _SIMULATE_MODULES)):
    _group.lazy.update({name: f"hpcwatch.cli.{module}" for name, module in _modules.items()})
app.add_command(twin_app)
app.add_command(simulate_app)


def _fail(message: str, status: int = 2) -> None:
    print(error_line(message), file=sys.stderr)
    sys.exit(status)


def main(prog_name: str = "hpcwatch") -> None:
    """Entry point: every error is one line ``hpcwatch: what``, control characters escaped, exit status 2.

    Click runs outside its standalone mode so that a usage error (an unknown
    option, a bad value) is our one line rather than its "Usage: ... Error: ..."
    block; a bare ``hpcwatch`` or a group without a command still shows the help
    (``HelpGroup``, status 2). ``prog_name`` starts the usage lines (``python -m hpcwatch`` from
    ``__main__``); click would guess it from ``sys.argv[0]`` and ``__main__``, which is wrong in-process.
    """
    try:
        status = app.main(prog_name=prog_name, standalone_mode=False)
    except HpcwatchError as err:
        _fail(str(err))
    except _click.UsageError as err:
        where = f" (see {err.ctx.command_path} --help)" if err.ctx is not None else ""
        _fail(err.format_message() + where, err.exit_code)
    except _click.ClickException as err:
        _fail(err.format_message(), err.exit_code)
    except _click.Abort:
        _fail("aborted", 1)
    except OSError as err:
        # An argument we could not open or read, past every check a command makes itself.
        where = f"{err.filename}: " if err.filename is not None else ""
        _fail(f"{where}{err.strerror or err}")
    if isinstance(status, int) and status:
        sys.exit(status)
