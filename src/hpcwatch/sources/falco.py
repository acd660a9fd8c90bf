"""Reader of Falco alerts as JSON lines (``json_output: true``), one alert per line.

An alert has ``time`` (RFC 3339, nanoseconds), ``rule``, ``priority``, ``output``,
``output_fields`` (``proc.cmdline``, ``user.name``, ``container.image.repository``...),
``source``, ``tags`` and ``hostname``
(https://falco.org/docs/concepts/outputs/formatting/). Each becomes an ``Event``
of kind ``falco`` whose attrs are the alert as written, plus ``host``.

Lenient: unknown keys are kept, missing optional keys are absent; ``rule`` and
``time`` are required.

Line-oriented: ``on_bad_line=None`` (strict) raises the first bad line's ParseError;
given a callable, each bad line (not JSON, no ``rule``/``time``, a time that is not
RFC 3339) is handed to it as a ParseError naming the file and line, and the good
alerts are still yielded.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from datetime import datetime

import orjson

from hpcwatch.errors import ParseError
from hpcwatch.records import Event
from hpcwatch.sources.lines import OnBadLine, iter_lines, line_text, report_bad_line
from hpcwatch.vocab import EventKind

__all__ = ["is_falco_json", "parse_falco_json", "read_falco_json", "parse_rfc3339"]


def parse_rfc3339(text: str, *, path: str | os.PathLike[str], line: int | None) -> float:
    """UTC seconds of ``2024-01-02T03:04:05.123456789Z`` (digits past microseconds dropped)."""
    value = text.strip()[:64]  # longer is not a time; do not hand a huge string to the parser
    if value.endswith("Z"):
        value = value[:-1] + "+00:00"
    head, dot, rest = value.partition(".")
    if dot:
        digits = len(rest) - len(rest.lstrip("0123456789"))
        value = f"{head}.{rest[: min(digits, 6)]}{rest[digits:]}"
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError as err:
        raise ParseError("time is not RFC 3339", path=path, line=line, text=text[:200]) from err


def parse_falco_json(
    lines: Iterable[str | bytes], *, path: str | os.PathLike[str] = "<falco>", on_bad_line: OnBadLine = None
) -> Iterator[Event]:
    """One ``Event`` per alert line; see the module docstring for ``on_bad_line``."""
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            yield _alert(raw, path, lineno)
        except ParseError as err:
            report_bad_line(err, on_bad_line)


def _alert(raw: str | bytes, path: str | os.PathLike[str], lineno: int) -> Event:
    try:
        alert = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise ParseError("not a JSON alert", path=path, line=lineno, text=line_text(raw)) from err
    if not isinstance(alert, dict) or "rule" not in alert or "time" not in alert:
        raise ParseError("a Falco alert needs 'rule' and 'time'", path=path, line=lineno, text=line_text(raw))
    if not isinstance(alert["rule"], str):  # the detectors look rules up by name
        raise ParseError("a Falco alert's rule is text", path=path, line=lineno, text=line_text(raw))
    t = parse_rfc3339(str(alert["time"]), path=path, line=lineno)
    fields = alert.get("output_fields") or {}
    if not isinstance(fields, dict):
        raise ParseError("output_fields is not an object", path=path, line=lineno, text=line_text(raw))
    host = alert.get("hostname") or fields.get("evt.hostname")
    return Event(kind=EventKind.FALCO, t=t, source=str(path), attrs={**alert, "host": host})


def read_falco_json(path: str | os.PathLike[str], *, on_bad_line: OnBadLine = None) -> Iterator[Event]:
    """The alerts of a Falco JSON-lines file, read line by line."""
    yield from parse_falco_json(iter_lines(path), path=path, on_bad_line=on_bad_line)


def is_falco_json(head: str) -> bool:
    """Sniff: the first line is a JSON object with Falco's ``rule``, ``priority`` and ``output``."""
    first = head.lstrip().split("\n", 1)[0]
    return first.startswith("{") and all(f'"{k}"' in first for k in ("rule", "priority", "output"))
