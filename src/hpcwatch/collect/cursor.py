"""Positions kept across restarts, committed in the same store transaction as the data they cover.

A cursor is a ``SourceMark`` whose key holds its state (``cursor/1|<name>|<state JSON>``) and whose
commit replaces the cursor's previous mark (``SourceMark.replaces``): the rows of a batch and the
position after it become visible together or not at all, so a ``kill -9`` anywhere resumes from the
last committed batch — nothing read twice, nothing skipped — and the manifest keeps one mark per
cursor rather than one per batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson

from hpcwatch.store import SourceMark, Store

__all__ = ["Cursor", "CURSOR_FORMAT", "load_cursors"]

#: The ``format`` of every cursor mark (how ``load_cursors`` tells them from ingested files).
CURSOR_FORMAT = "hpcwatch-cursor/1"
_PREFIX = "cursor/1|"


def _key(name: str, state: dict[str, Any]) -> str:
    return f"{_PREFIX}{name}|" + orjson.dumps(state, option=orjson.OPT_SORT_KEYS).decode()


def load_cursors(store: Store) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every cursor's newest mark: name -> (key, state)."""
    found: dict[str, tuple[float, str, dict[str, Any]]] = {}
    for mark in store.sources():
        if mark.format != CURSOR_FORMAT or not mark.key.startswith(_PREFIX):
            continue
        name, _, blob = mark.key[len(_PREFIX) :].partition("|")
        try:
            state = orjson.loads(blob)
        except orjson.JSONDecodeError:
            continue
        if name not in found or (mark.committed_s or 0) >= found[name][0]:
            found[name] = (mark.committed_s or 0.0, mark.key, state)
    return {name: (key, state) for name, (_t, key, state) in found.items()}


class Cursor:
    """One named position: ``state`` as last committed; ``commit`` moves it with a batch of records."""

    def __init__(self, store: Store, name: str, *, path: str = "") -> None:
        self.store, self.name, self.path = store, name, path
        found = load_cursors(store).get(name)
        self._key: str | None
        self.state: dict[str, Any]
        self._key, self.state = found if found else (None, {})

    @contextmanager
    def commit(self, state: dict[str, Any], *, also_replaces: Iterable[str] = ()) -> Iterator[Any]:
        """A store transaction whose commit also moves this cursor to ``state``."""
        key = _key(self.name, state)
        replaces = tuple(k for k in (self._key, *also_replaces) if k and k != key)
        with self.store.transaction(
            source=SourceMark(key=key, path=self.path, format=CURSOR_FORMAT, replaces=replaces)
        ) as tx:
            yield tx
        if not tx.skipped:
            self._key, self.state = key, dict(state)
