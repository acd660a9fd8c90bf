"""Readers of the real formats a GPU cluster writes: one module per format, one registry of them all.

Each reader module has ``parse_X(text, *, path=...)`` doing the work and ``read_X(path)``
opening the file; both yield ``records`` (or a documented columnar batch) and raise
``errors.ParseError`` (file and line) on bad input, never another exception.
``registry`` is the table of formats: how each is sniffed, which reader reads it and
what it yields; ``plan_inputs`` walks paths into what to read, ``read_input`` reads one.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Format", "formats", "format_named", "detect", "plan_inputs", "read_input"]


def __getattr__(name: str) -> Any:
    # The registry loads its formats' sniffers on first use: import it only when asked, so that
    # `from hpcwatch.sources import kineto` stays light.
    if name in __all__:
        from hpcwatch.sources import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'hpcwatch.sources' has no attribute {name!r}")
