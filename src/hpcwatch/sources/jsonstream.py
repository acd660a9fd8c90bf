"""One array of a big JSON document, element by element, in bounded memory.

``sacct --json`` over a month of a big cluster is one JSON object of a gigabyte or more, almost all of it
the ``"jobs"`` array. Decoding it whole costs ~11x the file (Python objects); this reads it a block at a
time, hands each element of the top-level member ``key`` to the caller as soon as it is complete, and
keeps the document's other top-level members (``meta``, ``errors``, ``last_update``...) in ``members``,
so memory is one block plus one element plus what the caller keeps.

Each value is decoded by the standard library's own scanner (``json.JSONDecoder.raw_decode``, C code),
so elements decode exactly as ``json.loads`` of the whole document would give them: same numbers (ints
of any size), same strings. An element cut by the end of a block is decoded again once more text is in
(a block is 1 MiB, a Slurm job a few KiB: the cost is ~1 %); the pending text doubles each time, so a
huge element costs linear time, up to ``max_value_chars``, past which it is refused.

Members before ``key`` are in ``members`` when the first element comes; members after it (Slurm 23.11+
writes ``last_update`` after ``jobs``) once the elements are exhausted. A second member named ``key``
is refused (``json.loads`` would keep only the last). Errors are ``ParseError``s naming the line: of the
element for a bad element, of the first bad byte for text that is not UTF-8 or not JSON.
"""

from __future__ import annotations

import codecs
import io
import json
import os
import re
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from hpcwatch.errors import ParseError

__all__ = ["JsonArrayStream", "BLOCK_CHARS", "MAX_VALUE_CHARS"]

#: Text read at a time.
BLOCK_CHARS = 1 << 20
#: Longest one element (or other top-level member) may be: a Slurm job is a few KiB.
MAX_VALUE_CHARS = 256 << 20

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class _NotJson(ValueError):
    """Bad JSON at a character offset of the buffer."""

    def __init__(self, msg: str, pos: int) -> None:
        super().__init__(msg)
        self.msg, self.pos = msg, pos


class _NotUtf8(ValueError):
    """A byte that is not UTF-8, after ``newlines`` line ends of the block it came in."""

    def __init__(self, newlines: int) -> None:
        super().__init__("not UTF-8 text")
        self.newlines = newlines


class JsonArrayStream:
    """The elements of top-level member ``key`` of a JSON object (module docstring).

    ``read(n)`` gives up to ``n`` characters, ``""`` at the end (``from_binary`` and ``from_text``
    make one). Iterate once: each item is ``(line, element)``, ``line`` where the element starts.
    After iterating, ``found`` says whether the document had the member at all.
    """

    def __init__(
        self,
        read: Callable[[int], str],
        key: str,
        *,
        path: str | os.PathLike[str] = "<input>",
        max_value_chars: int = MAX_VALUE_CHARS,
    ) -> None:
        self._read, self.key, self.path, self.max_value_chars = read, key, path, max_value_chars
        self.members: dict[str, Any] = {}
        self.found = False
        self._buf, self._pos, self._line, self._eof = "", 0, 1, False

    @classmethod
    def from_binary(cls, stream: BinaryIO, key: str, **kw: Any) -> JsonArrayStream:
        """Over a byte stream read as UTF-8 (strictly: a byte that is not is a ParseError on its line)."""
        decoder = codecs.getincrementaldecoder("utf-8")("strict")

        def read(n: int) -> str:
            data = stream.read(n)
            try:
                return decoder.decode(data, final=not data)
            except UnicodeDecodeError as err:
                raise _NotUtf8(data.count(b"\n", 0, max(err.start, 0))) from err

        return cls(read, key, **kw)

    @classmethod
    def from_text(cls, text: str, key: str, **kw: Any) -> JsonArrayStream:
        return cls(io.StringIO(text).read, key, **kw)

    # -- the document ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        if self._peek() != "{":
            raise ParseError(f'no "{self.key}" list (not a JSON object)', path=self.path, line=self._line)
        self._advance(self._pos + 1)
        if self._peek() == "}":
            self._advance(self._pos + 1)
        else:
            while True:
                name = self._value()
                if not isinstance(name, str):
                    self._fail("Expecting property name enclosed in double quotes")
                self._expect(":")
                if name == self.key:
                    yield from self._elements()
                else:
                    self.members[name] = self._value()
                if self._expect(",}") == "}":
                    break
        if self._peek() != "":
            self._fail("Extra data")

    def _elements(self) -> Iterator[tuple[int, Any]]:
        if self.found:
            raise ParseError(f'two "{self.key}" members', path=self.path, line=self._line)
        self.found = True
        if self._peek() != "[":
            raise ParseError(f'no "{self.key}" list (it is not a list)', path=self.path, line=self._line)
        self._advance(self._pos + 1)
        if self._peek() == "]":
            self._advance(self._pos + 1)
            return
        while True:
            self._peek()
            line = self._line
            yield line, self._value()
            if self._expect(",]") == "]":
                return

    # -- the buffer -----------------------------------------------------------------------------

    def _advance(self, pos: int) -> None:
        self._line += self._buf.count("\n", self._pos, pos)
        self._pos = pos

    def _more(self, at_least: int = 0) -> bool:
        """Read at least ``at_least`` (and a block) more characters, fewer at the end; False at the end."""
        if self._eof:
            return False
        at_least = max(at_least, BLOCK_CHARS)
        parts, got = [self._buf[self._pos :]], 0
        while got < at_least:
            try:
                text = self._read(max(BLOCK_CHARS, at_least - got))
            except _NotUtf8 as err:
                line = self._line + sum(p.count("\n") for p in parts)
                raise ParseError("not UTF-8 text", path=self.path, line=line + err.newlines) from err
            if not text:
                self._eof = True
                break
            parts.append(text)
            got += len(text)
        self._buf, self._pos = "".join(parts), 0
        return got > 0

    def _peek(self) -> str:
        """The next character after white space, ``""`` at the end."""
        while True:
            end = _WS.match(self._buf, self._pos).end()  # type: ignore[union-attr]
            self._advance(end)
            if end < len(self._buf):
                return self._buf[end]
            if not self._more():
                return ""

    def _expect(self, chars: str) -> str:
        ch = self._peek()
        if not ch or ch not in chars:
            self._fail(f"Expecting {' or '.join(repr(c) for c in chars)} delimiter")
        self._advance(self._pos + 1)
        return ch

    def _value(self) -> Any:
        """Decode the value at the position (after white space), reading more while it is cut short."""
        self._peek()
        while True:
            try:
                value, end = self._decode()
            except _NotJson as err:
                if self._eof or not self._cut_short(err):
                    self._fail(err.msg, err.pos)
            else:
                if end < len(self._buf) or self._eof:  # a number at the end may go on in the next block
                    self._advance(end)
                    return value
            pending = len(self._buf) - self._pos
            if pending > self.max_value_chars:
                raise ParseError(
                    f"a JSON value longer than the limit of {self.max_value_chars} characters",
                    path=self.path,
                    line=self._line,
                )
            self._more(pending)

    def _decode(self) -> tuple[Any, int]:
        try:
            return _DECODER.raw_decode(self._buf, self._pos)
        except json.JSONDecodeError as err:
            raise _NotJson(err.msg, err.pos) from err
        except RecursionError as err:
            raise ParseError("JSON nested too deep", path=self.path, line=self._line) from err
        except ValueError as err:  # an integer of more than 4300 digits (int_max_str_digits)
            raise ParseError(f"not JSON: {str(err)[:60]}", path=self.path, line=self._line) from err

    def _cut_short(self, err: _NotJson) -> bool:
        """Whether the error may be the end of the buffer cutting the value (then more text is read)."""
        return err.pos >= len(self._buf) - 6 or err.msg.startswith("Unterminated string")

    def _fail(self, msg: str, pos: int | None = None) -> None:
        pos = self._pos if pos is None else pos
        line = self._line + self._buf.count("\n", self._pos, pos)
        raise ParseError(f"not JSON: {msg}", path=self.path, line=line)
