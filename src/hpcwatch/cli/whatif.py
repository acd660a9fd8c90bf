"""Commands of this family register here (see cli/__init__.py)."""

from hpcwatch.cli.common import app  # noqa: F401
