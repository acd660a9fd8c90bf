"""Readers of the real formats a GPU cluster writes: one module per format.

Each module has ``parse_X(text, *, path=...)`` doing the work and ``read_X(path)``
opening the file; both yield ``records`` and raise ``errors.ParseError`` (file and
line) on bad input, never another exception. ``detect.read_any(path)`` picks the
reader from the file's first bytes.
"""

from hpcwatch.sources.detect import FORMATS, Format, detect_format, read_any, read_paths

__all__ = ["FORMATS", "Format", "detect_format", "read_any", "read_paths"]
