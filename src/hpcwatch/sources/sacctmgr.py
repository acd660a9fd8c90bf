"""Reader of Slurm's account coordinators: ``sacctmgr show user withcoordinator --parsable2`` or
``sacctmgr show account withcoordinator --parsable2`` (``-p``, with its trailing ``|``, reads the same).

Shape (Slurm 22.05, tests/data/sacctmgr/): a header line, then one ``|``-separated row per user or
account. Both commands head the coordinators' column ``Coord Accounts`` in 22.05, though in the
account listing it holds user names; the first column's header (``User`` or ``Account``) says which
listing it is. Cells of several names are comma-separated. ``--json`` does not exist for sacctmgr
before 23.02, so this plain listing is what every version prints.

What the roles policy reads (``access/scope.py``): user → the accounts they coordinate, whose jobs
they may see with ``jobs:account``. Not a record stream: not in the ingest registry.
"""

from __future__ import annotations

import os

from hpcwatch.errors import ParseError
from hpcwatch.sources.lines import read_text

__all__ = ["parse_coordinators", "read_coordinators", "COORD_COLUMN"]

COORD_COLUMN = "Coord Accounts"
#: Newer sacctmgr versions may name the account listing's column for what it holds.
_COORD_COLUMNS = (COORD_COLUMN, "Coord Names", "Coordinators")
#: Rows read at most: a site has thousands of users, not millions (memory stays bounded).
MAX_ROWS = 200_000


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
