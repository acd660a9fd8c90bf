"""Reader of Slurm's account coordinators: ``sacctmgr show user withcoordinator --parsable2`` or
``sacctmgr show account withcoordinator --parsable2`` (``-p``, with its trailing ``|``, reads the same).

Shape (Slurm 22.05, tests/data/sacctmgr/): a header line, then one ``|``-separated row per user or
account. Both commands head the coordinators' column ``Coord Accounts`` in 22.05, though in the
account listing it holds user names; the first column's header (``User`` or ``Account``) says which
listing it is. Cells of several names are comma-separated. ``--json`` does not exist for sacctmgr
before 23.02, so this plain listing is what every version prints.

Who reads it: the roles policy (``access/scope.py``: user → the accounts they coordinate, whose jobs
they may see with ``jobs:account``) and ``hpcwatch notify`` (``coordinators_file``: account → the users
its digest goes to), both through ``CoordinatorsFile``, the saved listing re-read when it changes. Not a
record stream: not in the ingest registry.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from hpcwatch.errors import InputError, ParseError
from hpcwatch.sources.lines import read_text

__all__ = [
    "parse_coordinators",
    "read_coordinators",
    "by_account",
    "CoordinatorsFile",
    "COORD_COLUMN",
    "RECHECK_S",
    "REFRESH_COMMAND",
]

COORD_COLUMN = "Coord Accounts"
#: Newer sacctmgr versions may name the account listing's column for what it holds.
_COORD_COLUMNS = (COORD_COLUMN, "Coord Names", "Coordinators")
#: Rows read at most: a site has thousands of users, not millions (memory stays bounded).
MAX_ROWS = 200_000
#: How often a watched file's mtime is looked at: a coordinator added in sacctmgr shows within a minute of cron.
RECHECK_S: Final = 30.0
#: The command whose output the reader expects, as the cron line or systemd unit saving the file runs it.
REFRESH_COMMAND: Final = "sacctmgr show user withcoordinator --parsable2"


def read_coordinators(path: str | os.PathLike[str]) -> dict[str, frozenset[str]]:
    return parse_coordinators(read_text(path), path=path)


def parse_coordinators(text: str, *, path: str | os.PathLike[str] = "<sacctmgr>") -> dict[str, frozenset[str]]:
    """User → accounts they coordinate, from either listing; a ParseError naming the line otherwise."""
    lines = text.splitlines()
    if not lines or not lines[0].strip():
        raise ParseError(
            "empty: want the header of sacctmgr show user|account withcoordinator --parsable2", path=path, line=1
        )
    trailing = lines[0].rstrip("\r").endswith("|")  # --parsable: every line ends with one more "|"
    header = _cells(lines[0], trailing)
    kind = header[0]
    coord = next((header.index(c) for c in _COORD_COLUMNS if c in header), None)
    if kind not in ("User", "Account") or coord is None:
        raise ParseError(
            f"want a header starting User| or Account| with a {COORD_COLUMN!r} column "
            "(sacctmgr show user withcoordinator --parsable2)",
            path=path,
            line=1,
            text=lines[0][:200],
        )
    out: dict[str, set[str]] = {}
    for number, line in enumerate(lines[1 : MAX_ROWS + 1], 2):
        if not line.strip():
            continue
        cells = _cells(line, trailing)
        if len(cells) != len(header):
            raise ParseError(
                f"want {len(header)} |-separated cells, got {len(cells)}", path=path, line=number, text=line[:200]
            )
        names = [n for n in cells[coord].split(",") if n]
        if kind == "User":
            out.setdefault(cells[0], set()).update(names)
        else:
            for user in names:
                out.setdefault(user, set()).add(cells[0])
    return {user: frozenset(accounts) for user, accounts in out.items() if accounts}


def _cells(line: str, trailing: bool) -> list[str]:
    line = line.rstrip("\r")
    return (line[:-1] if trailing and line.endswith("|") else line).split("|")


def by_account(table: Mapping[str, frozenset[str]]) -> dict[str, frozenset[str]]:
    """Account → the users coordinating it: the user → accounts table turned around."""
    out: dict[str, set[str]] = {}
    for user, accounts in table.items():
        for account in accounts:
            out.setdefault(account, set()).add(user)
    return {account: frozenset(users) for account, users in out.items()}


class CoordinatorsFile:
    """A saved listing (the web server and ``notify`` run no Slurm command: a cron job saves it), read
    at construction and again when its mtime changes, at most every ``RECHECK_S``; thread-safe. Without
    a path, the fixed ``table`` (none: nobody coordinates).

    At construction a missing or unreadable file is an ``InputError`` (a ``ParseError`` naming the
    line); later, a file that breaks (half-written, removed) keeps the last good table and its error
    is kept in ``error`` for the caller to report — a reader must not lose every coordinator at once.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None, *, table: Mapping[str, frozenset[str]] | None = None
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.error: str | None = None
        """Why the last re-read failed (None when the table is the file's current content)."""
        self._lock = threading.Lock()
        self._table: Mapping[str, frozenset[str]] = dict(table or {})
        self._accounts = by_account(self._table)
        self._mtime: float | None = None
        self._checked = 0.0
        if self.path is not None:
            self._load()

    def table(self) -> Mapping[str, frozenset[str]]:
        """User → the accounts they coordinate."""
        self._recheck()
        return self._table

    def users_of(self, account: str) -> frozenset[str]:
        """The users coordinating ``account`` (empty when none)."""
        self._recheck()
        return self._accounts.get(account, frozenset())

    def _recheck(self) -> None:
        if self.path is None or time.monotonic() - self._checked < RECHECK_S:
            return
        with self._lock:
            try:
                self._load()
                self.error = None
            except InputError as err:
                self.error = str(err)

    def _load(self) -> None:
        assert self.path is not None
        self._checked = time.monotonic()
        try:
            mtime = self.path.stat().st_mtime
        except OSError as err:
            raise InputError(f"{self.path}: cannot read the coordinators file: {err.strerror}") from err
        if mtime != self._mtime:
            table = read_coordinators(self.path)
            self._table, self._accounts, self._mtime = table, by_account(table), mtime
