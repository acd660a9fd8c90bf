"""Reader of Tetragon events as JSON lines (``tetra getevents -o json`` or the export file).

Each line is one object with a single event key (``process_exec``,
``process_kprobe``, ``process_exit``...), plus ``node_name`` and ``time``
(https://tetragon.io/docs/concepts/events/). We keep ``process_exec`` and
``process_kprobe`` as ``Event(kind="tetragon")`` with flat attrs:

    type           process_exec | process_kprobe
    host           node_name
    binary, arguments, pid, uid, user (process.user.name when Tetragon resolves it), cwd
    parent_binary  parent.binary
    pod            process.pod (namespace, name, container{image{name}}) or None
    function_name, policy_name, action       (kprobes)
    path           the first file_arg / path_arg path, if any
    mask           the first int_arg (MAY_READ 4, MAY_WRITE 2 for security_file_permission)

Other event types are skipped, not checked.

Line-oriented: ``on_bad_line=None`` (strict) raises the first bad line's ParseError;
given a callable, each bad line (not JSON, a kept event without ``time``, a time that
is not RFC 3339) is handed to it as a ParseError naming the file and line, and the
good events are still yielded.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from hpcwatch.errors import ParseError
from hpcwatch.records import Event
from hpcwatch.sources.falco import parse_rfc3339
from hpcwatch.sources.lines import OnBadLine, iter_lines, line_text, report_bad_line
from hpcwatch.vocab import EventKind

__all__ = ["is_tetragon_json", "parse_tetragon_json", "read_tetragon_json", "MAY_WRITE", "MAY_READ"]

#: include/linux/fs.h: the mask security_file_permission() receives.
MAY_WRITE = 0x2
MAY_READ = 0x4

_KEPT = ("process_exec", "process_kprobe")


def parse_tetragon_json(
    lines: Iterable[str | bytes], *, path: str | os.PathLike[str] = "<tetragon>", on_bad_line: OnBadLine = None
) -> Iterator[Event]:
    """One ``Event`` per kept event line; see the module docstring for ``on_bad_line``."""
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            event = _event(raw, path, lineno)
        except ParseError as err:
            report_bad_line(err, on_bad_line)
            continue
        if event is not None:
            yield event


def _event(raw: str | bytes, path: str | os.PathLike[str], lineno: int) -> Event | None:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise ParseError("not a JSON event", path=path, line=lineno, text=line_text(raw)) from err
    if not isinstance(doc, dict):
        raise ParseError("a Tetragon event is a JSON object", path=path, line=lineno, text=line_text(raw))
    kind = next((k for k in _KEPT if k in doc), None)
    if kind is None:
        return None
    if "time" not in doc or not isinstance(doc[kind], dict):
        raise ParseError(
            f"a Tetragon event needs 'time' and a {kind} object", path=path, line=lineno, text=line_text(raw)
        )
    t = parse_rfc3339(str(doc["time"]), path=path, line=lineno)
    return Event(kind=EventKind.TETRAGON, t=t, source=str(path), attrs=_flatten(kind, doc[kind], doc))


def _flatten(kind: str, body: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    process = _obj(body.get("process"))
    attrs: dict[str, Any] = {
        "type": kind,
        "host": doc.get("node_name"),
        "binary": process.get("binary"),
        "arguments": process.get("arguments"),
        "pid": process.get("pid"),
        "uid": process.get("uid"),
        "user": _obj(process.get("user")).get("name"),
        "cwd": process.get("cwd"),
        "parent_binary": _obj(body.get("parent")).get("binary"),
        "pod": process.get("pod"),
    }
    if kind == "process_kprobe":
        args = [a for a in body.get("args") or [] if isinstance(a, dict)] if isinstance(body.get("args"), list) else []
        attrs.update(
            function_name=body.get("function_name"),
            policy_name=body.get("policy_name"),
            action=body.get("action"),
            path=_first_path(args),
            mask=_first_int(args),
        )
    return attrs


def _obj(value: Any) -> dict[str, Any]:
    """A nested object, or an empty one when the field is missing or not an object (lenient)."""
    return value if isinstance(value, dict) else {}


def _first_path(args: list[dict[str, Any]]) -> str | None:
    for arg in args:
        for key in ("file_arg", "path_arg"):
            # a path that is not text (hostile or broken export) is no path: the rules do string work on it
            path = _obj(arg.get(key)).get("path")
            if isinstance(path, str) and path:
                return path
        text = arg.get("string_arg")
        if isinstance(text, str) and text.startswith("/"):
            return text
    return None


def _first_int(args: list[dict[str, Any]]) -> int | None:
    for arg in args:
        for key in ("int_arg", "uint_arg", "size_arg"):
            value = arg.get(key)
            if isinstance(value, int):
                return value
    return None


def read_tetragon_json(path: str | os.PathLike[str], *, on_bad_line: OnBadLine = None) -> Iterator[Event]:
    """The kept events of a Tetragon JSON-lines file, read line by line."""
    yield from parse_tetragon_json(iter_lines(path), path=path, on_bad_line=on_bad_line)


def is_tetragon_json(head: str) -> bool:
    """Sniff: the first line is a JSON object keyed by a Tetragon event type."""
    first = head.lstrip().split("\n", 1)[0]
    return first.startswith("{") and any(
        f'"{k}"' in first[:4000] for k in ("process_exec", "process_kprobe", "process_exit", "process_tracepoint")
    )
