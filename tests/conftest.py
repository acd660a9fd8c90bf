"""Shared test helpers: where the captured data lives, and the CLI run in-process."""

import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


@pytest.fixture
def data_dir() -> Path:
    return DATA


@pytest.fixture
def run_cli(capsys):
    """Run ``hpcwatch ARGV...`` in this process; returns (exit status, stdout, stderr)."""
    from hpcwatch.cli import main

    def run(argv: list[str]) -> tuple[int, str, str]:
        old, sys.argv = sys.argv, ["hpcwatch", *argv]
        try:
            main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code or 0
        finally:
            sys.argv = old
        out = capsys.readouterr()
        return code, out.out, out.err

    return run
