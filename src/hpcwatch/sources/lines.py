"""Helpers every reader shares: one way to open a path, read a number, say where it broke.

Every reader opens its file through ``open_binary`` (or ``read_bytes``, ``read_text``,
``iter_lines``, ``read_head`` on top of it), so every reader treats odd paths alike:

- symlinks are followed (a loop is ``ELOOP``, a ParseError); what they lead to must be
  a *regular file*: a FIFO, socket or character/block device (``/dev/zero``) is
  refused with one line, and a FIFO never blocks (it is opened ``O_NONBLOCK`` and
  checked with ``fstat`` before anything is read);
- a file larger than the reader's limit is refused before it is read;
- a gzip stream (recognised by its magic bytes, whatever the name) is inflated as it
  is read, and refused once its inflated size passes the limit, or once it has inflated
  past ``GZIP_RATIO_FREE_BYTES`` to more than ``GZIP_MAX_RATIO`` times the compressed bytes
  read so far: a gzip bomb (deflate reaches ~1030x) is refused after inflating 1 MiB, in
  about a second, instead of being read for minutes up to the reader's limit.

Limits are named defaults: ``MAX_FILE_BYTES`` for documents read whole,
``MAX_STREAM_BYTES`` for readers that stream (line by line, or Prometheus chunks),
``MAX_LINE_BYTES`` for one line of a streamed file. The gzip ratio bound also caps what
a streamed gzip may inflate to: at most 200x the file (64 GiB needs a 328 MB gzip).

Readers must raise ``ParseError`` (never ``OSError``, ``UnicodeDecodeError`` or
``ValueError``), so the file-level failures are turned into one here. Messages quote
data only through ``shown`` (bounded, control characters escaped).

Line-oriented logs take ``on_bad_line: OnBadLine``: ``None`` (strict) raises the first
bad line's ParseError; a callable receives each one and reading goes on
(``report_bad_line``).
"""

from __future__ import annotations

import io
import math
import os
import stat
import zlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

from hpcwatch.errors import ParseError

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_STREAM_BYTES",
    "MAX_LINE_BYTES",
    "SNIFF_BYTES",
    "GZIP_MAX_RATIO",
    "GZIP_RATIO_FREE_BYTES",
    "gzip_ratio_exceeded",
    "OnBadLine",
    "open_regular",
    "open_binary",
    "read_bytes",
    "read_text",
    "decode_utf8",
    "read_head",
    "iter_lines",
    "file_time",
    "to_float",
    "to_int",
    "shown",
    "line_text",
    "report_bad_line",
]

#: Documents read whole (JSON, XML, a scrape read as text): files, and inflated gzip, up to this.
MAX_FILE_BYTES = 1 << 30
#: Readers that stream (line by line, Prometheus text in chunks) hold one piece at a time.
MAX_STREAM_BYTES = 64 << 30
#: One line of a streamed file.
MAX_LINE_BYTES = 64 << 20
#: How much of a file a format sniffer sees (inflated).
SNIFF_BYTES = 64 << 10
#: Inflated bytes per compressed byte past which a gzip is a bomb. Real inputs stay far below:
#: Kineto traces and Slurm JSON compress ~10-30x, Prometheus scrapes ~20-60x; deflate cannot
#: exceed ~1030x, which only long runs of repeated bytes (a bomb) reach.
GZIP_MAX_RATIO = 200
#: A gzip may inflate this much whatever its ratio (a small file of repeated lines is legitimate);
#: past it the ratio bound applies, so a bomb costs a reader what a plain 1 MB file costs: up to
#: ~1M blank lines, a few seconds for the slowest line reader. A gzip of 5 KB or more inflating
#: at a real file's 10-60x never meets the bound.
GZIP_RATIO_FREE_BYTES = 1 << 20
#: Longest offending text quoted in a message.
SHOWN_CHARS = 80

_GZIP_MAGIC = b"\x1f\x8b"
_BLOCK_BYTES = 1 << 16
_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
)

OnBadLine = Callable[[ParseError], None] | None


def shown(text: object, limit: int = SHOWN_CHARS) -> str:
    """``text`` for a one-line message: repr-escaped (no raw control characters), cut to ``limit``."""
    value = (
        str(text)
        if not isinstance(text, (bytes, bytearray))
        else bytes(text[: limit * 4]).decode("utf-8", errors="replace")
    )
    cut = value[:limit]
    return repr(cut) + ("..." if len(value) > limit else "")


def line_text(line: str | bytes, limit: int = 400) -> str:
    """The start of a line for ``ParseError(text=...)`` (which escapes and cuts it further)."""
    return line[:limit].decode("utf-8", errors="replace") if isinstance(line, (bytes, bytearray)) else line[:limit]


def report_bad_line(err: ParseError, on_bad_line: OnBadLine) -> None:
    """Raise ``err`` (strict) or hand it to ``on_bad_line`` and let the reader go on."""
    if on_bad_line is None:
        raise err
    on_bad_line(err)


def _cannot(path: str | os.PathLike[str], err: OSError) -> ParseError:
    return ParseError(f"cannot read the file: {err.strerror or err}", path=path)


def open_regular(path: str | os.PathLike[str], max_bytes: int) -> io.BufferedReader:
    """The file at ``path`` (symlinks followed), raw and seekable (for zip archives), refused unless it
    is a regular file within ``max_bytes``. Reads of it may raise OSError: most readers want ``open_binary``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        _refuse_special(path, _kind_of_path(path))  # a socket cannot be opened (ENXIO): say what it is
        raise _cannot(path, err) from err
    try:
        info = os.fstat(fd)
        _refuse_special(path, _kind(info.st_mode))
        if info.st_size > max_bytes:
            raise ParseError(f"file larger than the limit of {max_bytes} bytes ({info.st_size} bytes)", path=path)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _kind(mode: int) -> str | None:
    """What a file that is not a regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a file")


def _kind_of_path(path: str | os.PathLike[str]) -> str | None:
    try:
        return _kind(os.stat(path).st_mode)
    except OSError:
        return None


def _refuse_special(path: str | os.PathLike[str], kind: str | None) -> None:
    if kind is not None:
        raise ParseError(f"not a regular file ({kind})", path=path)


def gzip_ratio_exceeded(
    inflated: int, compressed: int, *, ratio: int = GZIP_MAX_RATIO, free_bytes: int = GZIP_RATIO_FREE_BYTES
) -> bool:
    """Whether ``inflated`` bytes out of ``compressed`` bytes read so far make a gzip bomb."""
    return inflated > free_bytes and inflated > ratio * compressed


class _Inflating(io.RawIOBase):
    """A gzip stream (one or more members) inflated as it is read, refused past ``max_bytes`` or
    past the ratio bound (``gzip_ratio_exceeded``; the bounds are read when the file is opened)."""

    def __init__(self, raw: BinaryIO, path: str | os.PathLike[str], max_bytes: int, *, whole: bool) -> None:
        self.raw, self.path, self.max_bytes, self.whole = raw, path, max_bytes, whole
        self.ratio, self.free_bytes = GZIP_MAX_RATIO, GZIP_RATIO_FREE_BYTES
        self.inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self.pending = b""
        self.total = 0
        self.compressed = 0
        self.started = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer)  # any writable buffer; BufferedReader hands a bytes-shaped one
        out = self._inflate_some(len(view))
        view[: len(out)] = out
        return len(out)

    def _inflate_some(self, want: int) -> bytes:
        while True:
            if self.inflate.eof:
                self._next_member()
                if self.inflate.eof:
                    return b""
            data = self.inflate.unconsumed_tail or self._feed()
            if data is None:
                return b""
            try:
                out = self.inflate.decompress(data, want)
            except zlib.error as err:
                raise ParseError(f"not valid gzip ({err})", path=self.path) from err
            self.total += len(out)
            if self.total > self.max_bytes:
                raise ParseError(f"gzip inflates past the limit of {self.max_bytes} bytes", path=self.path)
            consumed = self.compressed - len(self.inflate.unconsumed_tail) - len(self.inflate.unused_data)
            if gzip_ratio_exceeded(self.total, consumed, ratio=self.ratio, free_bytes=self.free_bytes):
                raise ParseError(
                    f"gzip inflates more than {self.ratio}x its compressed size (a gzip bomb?): "
                    f"{self.total} bytes from {consumed}, refused",
                    path=self.path,
                )
            if out:
                return out

    def _feed(self) -> bytes | None:
        """The next compressed block; ``None`` at the end of the file (an error mid-stream)."""
        block = self.pending or self.raw.read(_BLOCK_BYTES)
        if not self.pending:
            self.compressed += len(block)  # a member's start handed back by _next_member is counted once
        self.pending = b""
        if block:
            self.started = True
            return block
        if self.whole or not self.started:
            raise ParseError("the gzip stream is truncated", path=self.path)
        return None

    def _next_member(self) -> None:
        rest = self.inflate.unused_data
        if not rest:
            rest = self.raw.read(_BLOCK_BYTES)
            self.compressed += len(rest)
        if rest.strip(b"\x00"):  # another member follows (gzip may pad with zeros)
            self.inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            self.pending = rest

    def close(self) -> None:
        self.raw.close()
        super().close()


class _Guarded(io.RawIOBase):
    """Reads of a file object with OSError turned into ParseError."""

    def __init__(self, raw: io.BufferedReader, path: str | os.PathLike[str]) -> None:
        self.raw, self.path = raw, path

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        try:
            return self.raw.readinto(buffer)
        except OSError as err:
            raise _cannot(self.path, err) from err

    def close(self) -> None:
        self.raw.close()
        super().close()


def open_binary(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES, truncated_ok: bool = False
) -> io.BufferedReader:
    """The file's bytes as a buffered stream, gunzipped (by magic) as read; see the module docstring.

    ``max_bytes`` bounds the file and its inflated size. ``truncated_ok`` lets a gzip
    stream end early without an error (for reading just its head). Use as a context manager.
    """
    raw = open_regular(path, max_bytes)
    try:
        magic = raw.read(2)
        raw.seek(0)
    except OSError as err:
        raw.close()
        raise _cannot(path, err) from err
    inner: io.RawIOBase = _Guarded(raw, path)
    if magic == _GZIP_MAGIC:
        inner = _Inflating(inner, path, max_bytes, whole=not truncated_ok)  # type: ignore[arg-type]
    return io.BufferedReader(inner, buffer_size=_BLOCK_BYTES)


def read_bytes(path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The file's bytes (gunzipped when it is gzip), at most ``max_bytes`` of them."""
    with open_binary(path, max_bytes=max_bytes) as stream:
        return stream.read()


def read_text(path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES) -> str:
    """The file as UTF-8 text; a byte that is not UTF-8 is a ParseError on its line."""
    data = read_bytes(path, max_bytes=max_bytes)
    return decode_utf8(data, path=path)


def decode_utf8(data: bytes, *, path: str | os.PathLike[str], first_line: int = 1) -> str:
    """``data`` as UTF-8; a ParseError naming the line of the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = first_line + data.count(b"\n", 0, err.start)
        raise ParseError("not UTF-8 text", path=path, line=line) from err


def read_head(path: str | os.PathLike[str], size: int = SNIFF_BYTES) -> bytes:
    """The first ``size`` bytes of the file, inflated when it is gzip (only that much is inflated).

    For format sniffers: the same refusals as every reader (FIFOs, devices...), but a
    gzip stream cut short is not an error here.
    """
    with open_binary(path, max_bytes=MAX_STREAM_BYTES, truncated_ok=True) as stream:
        return stream.read(size)


def iter_lines(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_STREAM_BYTES, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[bytes]:
    """Each line of the file as bytes, without its line ending, read a block at a time.

    The caller numbers lines (``enumerate(..., 1)``); a line longer than
    ``max_line_bytes`` is a ParseError on that line.
    """
    with open_binary(path, max_bytes=max_bytes) as stream:
        for number, line in enumerate(iter(lambda: stream.readline(max_line_bytes + 1), b""), 1):
            if len(line) > max_line_bytes and not line.endswith(b"\n"):
                raise ParseError(f"line longer than the limit of {max_line_bytes} bytes", path=path, line=number)
            yield line.rstrip(b"\r\n") if line.endswith(b"\n") else line


def file_time(path: str | os.PathLike[str]) -> float:
    """When the file was last written (UTC seconds): the scrape time of a saved scrape."""
    try:
        return os.stat(path).st_mtime
    except OSError as err:
        raise _cannot(path, err) from err


def to_float(
    token: str, what: str, *, path: str | os.PathLike[str] | None, line: int | None, text: str | None = None
) -> float:
    """``float(token)`` or a ParseError naming ``what``."""
    try:
        return float(token)
    except (TypeError, ValueError) as err:
        raise ParseError(f"{what} is not a number", path=path, line=line, text=text or str(token)) from err


_INT64 = (-(1 << 63), (1 << 63) - 1)


def to_int(
    token: str, what: str, *, path: str | os.PathLike[str] | None, line: int | None, text: str | None = None
) -> int:
    """A whole number within 64 bits (``"4096"``, ``"4e3"``), or a ParseError naming ``what``."""
    value = to_float(token, what, path=path, line=line, text=text)
    if not math.isfinite(value) or value != int(value) or not _INT64[0] <= int(value) <= _INT64[1]:
        raise ParseError(f"{what} is not a whole number within 64 bits", path=path, line=line, text=text or str(token))
    return int(value)
