"""The exceptions hpcwatch raises, one tree.

- ``HpcwatchError``: everything below; the CLI and the web app catch this one only.
  - ``InputError``: a file or text we were given is not what it claims to be.
    - ``ParseError``: a line we cannot read; carries the path, the line and the text.
    - ``UnsupportedVersion``: a known format in a version we do not read.
  - ``StoreError``: the store cannot be opened, written or queried.
  - ``ConfigError``: a cluster model, a setting or a flag is wrong; names the key.
  - ``BackendError``: a remote service (Prometheus, Slurm) did not answer as expected.
"""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = [
    "HpcwatchError",
    "InputError",
    "ParseError",
    "UnsupportedVersion",
    "StoreError",
    "ConfigError",
    "BackendError",
    "one_line",
]


class HpcwatchError(Exception):
    """Root of every error hpcwatch raises on purpose."""


class InputError(HpcwatchError):
    """Input that is not what it claims to be."""


class ParseError(InputError):
    """A line we cannot read.

    ``str(err)`` is the one-line message the CLI prints: ``FILE:LINE: what``.
    """

    def __init__(
        self, what: str, *, path: str | os.PathLike[str] | None = None, line: int | None = None, text: str | None = None
    ) -> None:
        self.what = what
        self.path = str(path) if path is not None else "<input>"
        self.line = line
        self.text = text
        super().__init__(self._render())

    def _render(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        found = ""
        if self.text is not None:
            shown = self.text.strip()
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            found = f" (found: {shown!r})"
        return one_line(f"{where}: {self.what}{found}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its fields when it crosses to another process (a forked reader, a Dask worker);
        # the default would pass the rendered message as ``what`` and lose the path.
        return _parse_error, (type(self), self.what, self.path, self.line, self.text)

    def at(self, path: str | os.PathLike[str]) -> ParseError:
        """The same error, naming the file (readers of text learn the path late)."""
        return ParseError(self.what, path=path, line=self.line, text=self.text)


def _parse_error(cls: type[ParseError], what: str, path: str, line: int | None, text: str | None) -> ParseError:
    return cls(what, path=path, line=line, text=text)


#: Longest message an error prints (a library's error can quote megabytes of input).
MAX_MESSAGE_CHARS = 500
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def one_line(message: str) -> str:
    """``message`` as one printable line: line breaks become " / ", other control characters ``\\xNN``."""
    text = re.sub(r"\s*[\r\n]+\s*", " / ", message.strip())
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."


class UnsupportedVersion(InputError):
    """A format we know, in a version we do not read."""


class StoreError(HpcwatchError):
    """The store cannot be opened, written or queried."""


class ConfigError(HpcwatchError):
    """A cluster model, a setting or a flag is wrong."""


class BackendError(HpcwatchError):
    """A remote service did not answer as expected."""
