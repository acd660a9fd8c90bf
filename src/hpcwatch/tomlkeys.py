"""What every TOML config of hpcwatch needs and tomllib does not give: the line a key is written on, and a
value checked against the annotation of the field it fills.

``collect``, ``notify``, ``act``, the auth config and the roles policy read their files with ``read_config``
and ``load_toml`` and their tables with ``KeyLines`` and ``typed``, so a wrong key reads alike in all of them:
``FILE:LINE: what is wrong``.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from hpcwatch.errors import ConfigError

__all__ = ["KeyLines", "load_toml", "read_config", "typed"]

_HEADER_RE = re.compile(r"\s*(\[\[?)\s*([A-Za-z0-9_.\-\"' ]+?)\s*\]\]?\s*(?:#.*)?$")
_KEY_RE = re.compile(r"\s*([A-Za-z0-9_\-]+|\"[^\"]*\")\s*=")


def read_config(path: str | Path, what: str) -> str:
    """The text of the config file at ``path``; a ConfigError naming it and ``what`` it was to be."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the {what}: {getattr(err, 'strerror', None) or err}") from err


def load_toml(text: str, path: str) -> dict[str, Any]:
    """``text`` as TOML; a ConfigError ``PATH: what`` (tomllib's words say the line and column)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: {err}") from err


class KeyLines:
    """Where a key of a table (the ``index``-th of an array of tables) is written in a TOML text."""

    def __init__(self, text: str) -> None:
        self.keys: list[tuple[str | None, int, str | None, int]] = []  # table, index, key, line
        table: str | None = None
        counts: dict[str, int] = {}
        index = 0
        for number, line in enumerate(text.splitlines(), 1):
            header = _HEADER_RE.match(line)
            if header:
                table = header.group(2).strip().strip("\"'")
                index = counts[table] = counts.get(table, -1) + 1 if header.group(1) == "[[" else 0
                self.keys.append((table, index, None, number))
            elif key := _KEY_RE.match(line):
                self.keys.append((table, index, key.group(1).strip('"'), number))

    def find(self, table: str | None, index: int | None, key: str | None) -> int:
        """The line of ``key`` in that table; else the header of a sub-table named by the key (``[notify.users]``,
        or ``[agent]`` for the key ``agent`` of the top level); else the table's own header; 1 if unseen."""
        index = index or 0
        for t, i, k, number in self.keys:
            if t == table and i == index and k == key:
                return number
        if key is not None:
            sub_table = key if table is None else f"{table}.{key}"
            for t, _i, k, number in self.keys:
                if t == sub_table and k is None:
                    return number
        for t, i, k, number in self.keys:
            if t == table and i == index and k is None:
                return number
        return 1


def typed(value: Any, name: str, kind: Any, where: str, *, table: str | None = None) -> Any:
    """``value`` as the field annotated ``kind`` takes it (a list as a tuple, an int as a float), or a
    ConfigError at ``where`` (``FILE:LINE``); ``table`` names the table at the end of a wrong type's message."""
    origin = get_origin(kind)
    if origin is Literal:
        if value not in get_args(kind):
            raise ConfigError(f"{where}: {name} must be one of {', '.join(map(repr, get_args(kind)))}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: {name} must be a list of strings, got {value!r}")
        return tuple(value)
    if origin is Mapping:
        return _string_table(value, name, get_args(kind)[1], where)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        in_table = f" in [{table}]" if table else ""
        raise ConfigError(f"{where}: {name} must be {kind.__name__}, got {value!r}{in_table}")
    return value


def _string_table(value: Any, name: str, inner: Any, where: str) -> dict[str, Any]:
    """A ``Mapping[str, str]`` or ``Mapping[str, tuple[str, ...]]`` field: a TOML table of strings or of lists."""
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {name} must be a table, got {value!r}")
    out: dict[str, Any] = {}
    for k, v in value.items():
        if inner is str and isinstance(v, str):
            out[k] = v
        elif inner is not str and isinstance(v, list) and all(isinstance(x, str) for x in v):
            out[k] = tuple(v)
        else:
            shape = "a string" if inner is str else "a list of strings"
            raise ConfigError(f"{where}: {name}.{k} must be {shape}, got {v!r}")
    return out
