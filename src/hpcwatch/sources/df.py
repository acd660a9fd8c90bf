"""Reader of ``df``: the blocks and inodes of each mounted file system, to judge how full it is.

The command an agent runs is GNU df's one table of both (``df --local --output=source,fstype,itotal,iused,
iavail,ipcent,size,used,avail,pcent,target``: ``--local`` also keeps df off a hung NFS server); what an operator
pastes is read too: ``df -P`` / ``df -PT`` / ``df -Pk`` (blocks), ``df -Pi`` / ``df -i`` (inodes), plain
``df``, ``df -h`` / ``df -ih`` (sizes like ``3.7G``, read in powers of 1024 as ``-h`` prints them), and several
of those one after the other in one file (each header starts a new table)::

    Filesystem     Type 1024-blocks     Used Available Capacity Mounted on
    /dev/sda7      ext4    19554584  7314944  11223272      40% /

The header names the columns (GNU coreutils ``df.c``: Filesystem, Type, Inodes, IUsed, IFree, IUse%, Size or
``<N>-blocks``, Used, Avail or Available, Use% or Capacity, File, Mounted on); a mount point with spaces is
the rest of its line; a source too long for its column that plain ``df`` of older coreutils wraps onto a line
of its own is joined to the next line. ``-`` (no inode counts, as on vfat or btrfs) gives no sample.

Samples, named as node_exporter's filesystem collector names them (so its scrapes are judged by the same rules;
labels ``node`` from ``--host``, ``device`` the source, ``mountpoint``, ``fstype`` where ``-T`` or ``--output``
printed it):

- ``node_filesystem_size_bytes``, ``node_filesystem_avail_bytes``: the size and the space unprivileged users can
  still write (df's Available: the free blocks less those reserved for root), bytes;
- ``node_filesystem_files``, ``node_filesystem_files_free``: inodes, all and free.

df's own Use% (used / (used + available), rounded up) is not kept: the rules compute the free share from the
counts. The ``total`` row of ``--total`` is skipped. Dated by the file's write time. Lenient: shell prompts
are skipped; a row before any header, with too few fields or longer than ``MAX_ROW_CHARS``, or a count that is
not a number is a ``ParseError`` (or goes to ``on_bad_line``); a line that looks like a header but names a
column df does not print is read as a row, and so refused.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from hpcwatch import vocab
from hpcwatch.errors import ParseError
from hpcwatch.records import Sample
from hpcwatch.sources.lines import OnBadLine, file_time, line_text, read_text, report_bad_line, to_float, to_int

__all__ = ["parse_df", "read_df", "is_df", "DF_COLUMNS", "MAX_ROW_CHARS"]

#: df's column headers (LANG=C) -> the field each holds; ``<N>-blocks`` and ``Size`` are the size column.
DF_COLUMNS: dict[str, str] = {
    "Filesystem": "source",
    "Type": "fstype",
    "Inodes": "itotal",
    "IUsed": "iused",
    "IFree": "iavail",
    "IUse%": "ipcent",
    "Size": "size",
    "Used": "used",
    "Avail": "avail",
    "Available": "avail",
    "Use%": "pcent",
    "Capacity": "pcent",
    "File": "file",
    "Mounted on": "target",
}
_BLOCKS_RE = re.compile(r"(?P<n>\d+)(?P<unit>[KMGTPEZYkmgtpezy]?)(?P<si>B?)-blocks\Z")
_HUMAN_RE = re.compile(r"(?P<n>\d+(?:\.\d+)?)(?P<unit>[KMGTPEZYkmgtpezy]?)\Z")
_POWERS = "KMGTPEZY"
_PROMPT_RE = re.compile(r"(?:\[[^\]]*\]|[\w.@:~/-]*)\s*[$#]\s*(?:sudo\s+)?df\b.*\Z")
_TOTAL_ROW = "total"
#: A row holds two paths of at most PATH_MAX (4096, linux/limits.h) and a few numbers: longer is not df's.
MAX_ROW_CHARS = 3 * 4096


@dataclass(frozen=True, slots=True)
class _Header:
    fields: tuple[str, ...]
    """The field of each column, in order (``target`` last when printed)."""
    block_bytes: int | None
    """Bytes of one unit of the size/used/avail columns; None for ``Size`` (human sizes: each value has its unit)."""


def _unit_bytes(unit: str, si: bool) -> int:
    if not unit:
        return 1
    base = 1000 if si else 1024
    return int(base ** (_POWERS.index(unit.upper()) + 1))


def _header(line: str) -> _Header | None:
    """The columns a df header line names; None when it is not one."""
    if not line.startswith("Filesystem"):
        return None
    tokens = line.replace("Mounted on", "Mounted\x00on").split()
    fields, block_bytes = [], None
    for token in (t.replace("\x00", " ") for t in tokens):
        if m := _BLOCKS_RE.match(token):
            fields.append("size")
            block_bytes = int(m.group("n")) * _unit_bytes(m.group("unit"), bool(m.group("si")))
        elif token in DF_COLUMNS:
            fields.append(DF_COLUMNS[token])
        else:
            return None
    if len(fields) < 2:
        return None
    return _Header(fields=tuple(fields), block_bytes=block_bytes)


def is_df(head: str) -> bool:
    """The first line that is not a prompt is a df header."""
    for raw in head.lstrip().split("\n")[:4]:
        line = raw.strip()
        if line and not _PROMPT_RE.match(line):
            return _header(line) is not None
    return False


class _Row:
    """One row's fields by name, and how to read a count of it."""

    def __init__(self, header: _Header, values: list[str], *, path: str | os.PathLike[str], number: int) -> None:
        self.values = dict(zip(header.fields, values))
        self.header, self.path, self.number = header, path, number

    def count(self, name: str, *, bytes_: bool) -> float | None:
        """The field as a number (bytes for a size column), None when absent or ``-``."""
        token = self.values.get(name)
        if token is None or token == "-":
            return None
        what, text = f"df {name}", line_text(token)
        if token.isdigit():  # a count of blocks (or of bytes under -h) or of inodes
            scale = (self.header.block_bytes or 1) if bytes_ else 1
            return float(to_int(token, what, path=self.path, line=self.number, text=text) * scale)
        m = _HUMAN_RE.match(token)  # -h / -ih: each value carries its unit
        if m is None or (bytes_ and self.header.block_bytes is not None):
            raise ParseError(f"{what} is not a number", path=self.path, line=self.number, text=text)
        value = to_float(m.group("n"), what, path=self.path, line=self.number, text=text)
        return value * _unit_bytes(m.group("unit"), si=False)


def _samples(row: _Row, node: str | None, t: float) -> Iterator[Sample]:
    source = row.values.get("source", "")
    if source == _TOTAL_ROW and row.values.get("target", "-") == "-":
        return
    labels = {
        **({"node": node} if node else {}),
        "device": source,
        **({"mountpoint": row.values["target"]} if "target" in row.values else {}),
        **({"fstype": row.values["fstype"]} if "fstype" in row.values else {}),
    }
    pairs = (
        (vocab.NODE_FILESYSTEM_SIZE_BYTES, "size", True),
        (vocab.NODE_FILESYSTEM_AVAIL_BYTES, "avail", True),
        (vocab.NODE_FILESYSTEM_FILES, "itotal", False),
        (vocab.NODE_FILESYSTEM_FILES_FREE, "iavail", False),
    )
    for metric, name, is_bytes in pairs:
        value = row.count(name, bytes_=is_bytes)
        if value is not None:
            yield Sample(metric=metric, labels=labels, t=t, value=value)


def _split(header: _Header, line: str) -> list[str] | None:
    """The row's values, the mount point keeping its spaces; None when the line has too few fields."""
    tokens = line.split()
    n = len(header.fields)
    if len(tokens) < n:
        return None
    if header.fields[-1] == "target" and len(tokens) > n:
        # the mount point is the rest of the line, spaces and all
        rest = line.split(None, n - 1)[-1]
        return tokens[: n - 1] + [rest.strip()]
    return tokens if len(tokens) == n else None


def parse_df(
    text: str,
    *,
    path: str | os.PathLike[str] = "<df>",
    node: str | None = None,
    t: float = 0.0,
    on_bad_line: OnBadLine = None,
) -> Iterator[Sample]:
    """The samples of each row of each df table in ``text`` (see the module docstring)."""
    header: _Header | None = None
    wrapped = ""
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or _PROMPT_RE.match(line):
            continue
        if (found := _header(line)) is not None:
            header, wrapped = found, ""
            continue
        if len(line) > MAX_ROW_CHARS:
            what = f"line of {len(line)} characters, longer than a df row ({MAX_ROW_CHARS})"
            report_bad_line(ParseError(what, path=path, line=number, text=line_text(raw)), on_bad_line)
            wrapped = ""
            continue
        if header is None:
            report_bad_line(
                ParseError("no df header before this line", path=path, line=number, text=line_text(raw)), on_bad_line
            )
            continue
        if not wrapped and len(line.split()) == 1 and len(header.fields) > 1:
            wrapped = line  # plain df put a long source on a line of its own
            continue
        values = _split(header, f"{wrapped} {line}" if wrapped else line)
        wrapped = ""
        if values is None:
            what = f"not a df row (want {len(header.fields)} fields: {' '.join(header.fields)})"
            report_bad_line(ParseError(what, path=path, line=number, text=line_text(raw)), on_bad_line)
            continue
        try:
            yield from _samples(_Row(header, values, path=path, number=number), node, t)
        except ParseError as err:
            report_bad_line(err, on_bad_line)


def read_df(
    path: str | os.PathLike[str], *, node: str | None = None, t: float | None = None, on_bad_line: OnBadLine = None
) -> Iterator[Sample]:
    text = read_text(path)
    yield from parse_df(text, path=path, node=node, t=file_time(path) if t is None else t, on_bad_line=on_bad_line)
