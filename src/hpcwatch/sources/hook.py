"""Reader of the training hook's JSON lines (``instrument.torch.StepRecorder``, one ``rank-N.jsonl``).

One record a line: ``{"kind": "span", job, rank, step, phase, start, dur, attrs}`` (a
``records.Span``) or ``{"kind": "sample", metric, labels, t, value}`` (a
``records.Sample``; a non-finite value is written as the string ``"nan"``/``"inf"``).
``instrument`` writes the format, this module reads it, so ``sources`` needs nothing of
``instrument``.

Line-oriented: ``on_bad_line=None`` (strict) raises the first bad line's ParseError;
given a callable, each bad line (not JSON, an unknown kind, a missing field, a number
beyond 64 bits) is handed to it as a ParseError naming the file and line, and the good
lines are still yielded. Not checked: that steps are in order or spans do not overlap.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from hpcwatch.errors import ParseError
from hpcwatch.records import Sample, Span
from hpcwatch.sources.lines import OnBadLine, iter_lines, line_text, report_bad_line, shown

__all__ = ["is_hook_jsonl", "parse_hook_jsonl", "read_hook_jsonl", "parse_hook_record"]

_INT64 = (-(1 << 63), (1 << 63) - 1)
_INT32 = (-(1 << 31), (1 << 31) - 1)


def is_hook_jsonl(head: str) -> bool:
    """Whether a file's first bytes are the hook's JSON lines (for the format registry)."""
    first = head.lstrip().split("\n", 1)[0]
    if not first.startswith("{"):
        return False
    try:
        doc = orjson.loads(first)
    except orjson.JSONDecodeError:
        return False
    return (
        isinstance(doc, dict)
        and doc.get("kind") in ("span", "sample")
        and "job" in (doc if doc["kind"] == "span" else doc.get("labels") or {})
    )


def parse_hook_jsonl(
    lines: Iterable[str | bytes], *, path: str | os.PathLike[str] = "<hook>", on_bad_line: OnBadLine = None
) -> Iterator[Span | Sample]:
    """The spans and samples of the hook's lines; see the module docstring for ``on_bad_line``."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield parse_hook_record(line, path, number)
        except ParseError as err:
            report_bad_line(err, on_bad_line)


def read_hook_jsonl(path: str | os.PathLike[str], *, on_bad_line: OnBadLine = None) -> Iterator[Span | Sample]:
    """The spans and samples a ``StepRecorder`` wrote (one ``rank-N.jsonl``), read line by line."""
    yield from parse_hook_jsonl(iter_lines(path), path=path, on_bad_line=on_bad_line)


def parse_hook_record(line: str | bytes, path: str | os.PathLike[str] = "<input>", number: int = 1) -> Span | Sample:
    """One line as a span or a sample; ParseError naming the file and line otherwise."""
    try:
        doc = orjson.loads(line)
        kind = doc["kind"]
        if kind == "span":
            return Span(
                job=str(doc["job"]),
                rank=_int(doc["rank"]),
                step=_int(doc["step"]),
                phase=str(doc["phase"]),
                start=float(doc["start"]),
                dur=float(doc["dur"]),
                attrs=_object(doc.get("attrs") or {}),
            )
        if kind == "sample":
            return Sample(
                metric=str(doc["metric"]), labels=_object(doc["labels"]), t=float(doc["t"]), value=float(doc["value"])
            )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError) as err:
        raise ParseError(
            f"bad hook record ({type(err).__name__}: {shown(err, 120)})", path=path, line=number, text=line_text(line)
        ) from err
    raise ParseError("unknown record kind", path=path, line=number, text=line_text(line))


def _int(value: Any) -> int:
    """A whole number within 32 bits: the store's rank and step columns are int32 (pyarrow refused
    a larger one with a traceback at ingest)."""
    number = int(value)
    if not _INT64[0] <= number <= _INT64[1]:
        raise ValueError(f"integer beyond 64 bits: {shown(value, 40)}")
    if not _INT32[0] <= number <= _INT32[1]:
        raise ValueError(f"integer beyond 32 bits (the store's rank and step): {shown(value, 40)}")
    return number


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"want a JSON object, got {type(value).__name__}")
    return value
