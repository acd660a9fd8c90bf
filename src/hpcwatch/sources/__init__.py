"""Readers of the real formats a GPU cluster writes: one module per format.

Each module has ``parse_X(text, *, path=...)`` doing the work and ``read_X(path)``
opening the file; both yield ``records`` and raise ``errors.ParseError`` (file and
line) on bad input, never another exception. ``detect.read_any(path)`` picks the
reader from the file's first bytes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FORMATS", "Format", "detect_format", "read_any", "read_paths"]


def __getattr__(name: str) -> Any:
    # detect imports every reader (and pyarrow): load it only when asked, so that
    # `from hpcwatch.sources import kineto` stays light.
    if name in __all__:
        from hpcwatch.sources import detect

        return getattr(detect, name)
    raise AttributeError(f"module 'hpcwatch.sources' has no attribute {name!r}")
