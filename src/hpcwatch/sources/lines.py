"""Helpers every reader shares: open a file as text, read a number, say where it broke.

Readers must raise ``ParseError`` (never ``OSError``, ``UnicodeDecodeError`` or
``ValueError``), so the file-level failures are turned into one here.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from hpcwatch.errors import ParseError

__all__ = ["read_text", "read_bytes", "read_head_bytes", "file_time", "to_float", "MAX_FILE_BYTES"]

#: Refuse files larger than this: every format here is a scrape or a dump, not a bulk archive.
MAX_FILE_BYTES = 1 << 30


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The file's bytes (transparently gunzipped when the name ends in ``.gz``)."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise ParseError(f"file larger than {MAX_FILE_BYTES} bytes", path=p)
        data = p.read_bytes()
        if p.name.endswith(".gz"):
            data = gzip.decompress(data)
        return data
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        raise ParseError(f"cannot read the file: {getattr(err, 'strerror', None) or err}", path=p) from err


def read_head_bytes(path: str | os.PathLike[str], n: int) -> bytes:
    """The first ``n`` bytes (of the gunzipped stream for ``.gz``), never more read or inflated."""
    p = Path(path)
    try:
        with (gzip.open(p, "rb") if p.name.endswith(".gz") else open(p, "rb")) as fh:
            return fh.read(n)
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        raise ParseError(f"cannot read the file: {getattr(err, 'strerror', None) or err}", path=p) from err


def read_text(path: str | os.PathLike[str]) -> str:
    """The file as UTF-8 text; a byte that is not UTF-8 is a ParseError on its line."""
    data = read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ParseError("not UTF-8 text", path=path, line=line) from err


def file_time(path: str | os.PathLike[str]) -> float:
    """When the file was last written (UTC seconds): the scrape time of a saved scrape."""
    try:
        return Path(path).stat().st_mtime
    except OSError as err:
        raise ParseError(f"cannot read the file: {err.strerror or err}", path=path) from err


def to_float(token: str, what: str, *, path: str | os.PathLike[str] | None, line: int | None,
             text: str | None = None) -> float:
    """``float(token)`` or a ParseError naming ``what``."""
    try:
        return float(token)
    except (TypeError, ValueError) as err:
        raise ParseError(f"{what} is not a number", path=path, line=line, text=text or str(token)) from err
