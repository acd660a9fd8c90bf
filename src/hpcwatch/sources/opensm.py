"""Reader of OpenSM's partition file, ``partitions.conf`` (P_Key partitions of an InfiniBand fabric).

Grammar (opensm's ``partitions.conf`` man page, https://github.com/linux-rdma/opensm/blob/master/doc/partition-config.txt):
``PartitionName[=PKey][,ipoib][,flag=value...] : member[=full|limited|both], ... ;``
where a member is a port GUID, ``ALL``, ``ALL_CAS``, ``ALL_SWITCHES``, ``ALL_ROUTERS``
or ``SELF``. ``#`` starts a comment; a definition may span lines and ends at ``;``.
The file OpenSM ships, ``Default=0x7fff, ipoib : ALL=full;``, puts every port in
one partition with full membership: it isolates nothing.

Yields one ``Event`` of kind ``opensm_partitions``: attrs ``partitions``, a list of
``{name, pkey, flags, members: [[member, membership]], line}``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import TypedDict

from hpcwatch.errors import ParseError
from hpcwatch.records import Event
from hpcwatch.sources.lines import file_time, read_text
from hpcwatch.vocab import EventKind

__all__ = ["is_partitions_conf", "parse_partitions_conf", "read_partitions_conf"]


_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]+\Z")
_PKEY_RE = re.compile(r"(?:0[xX][0-9a-fA-F]{1,4}|[0-9]{1,5})\Z")
_FLAG_RE = re.compile(r"[A-Za-z_]+(?:=[^\s=,:;]+)?\Z")
_MEMBER_RE = re.compile(
    r"(ALL|ALL_CAS|ALL_SWITCHES|ALL_ROUTERS|SELF|0[xX][0-9a-fA-F]{1,16})"
    r"(?:\s*=\s*(full|limited|both))?\Z"
)
_COMMENT_RE = re.compile(r"#[^\n]*")


def parse_partitions_conf(
    text: str, *, path: str | os.PathLike[str] = "<partitions.conf>", t: float = 0.0
) -> Iterator[Event]:
    """The partitions of ``text``; a line that is not the grammar above is a ParseError naming it.

    Strict: the name, P_Key, each flag (``word`` or ``word=value``) and each member
    are checked, and text after the last ``;`` must be blank. Not supported (parse
    errors): the multicast-group sections of newer OpenSM (``mgid=...`` lines).
    """
    body = _COMMENT_RE.sub(lambda m: " " * len(m.group(0)), text)  # offsets, hence lines, unchanged
    partitions, offset = [], 0
    *chunks, rest = body.split(";")
    if rest.strip():
        raise _error(body, offset=len(body) - len(rest), what="definition not ended by ';'", text=rest, path=path)
    for chunk in chunks:
        start, offset = offset, offset + len(chunk) + 1
        if chunk.strip():
            partitions.append(_partition(body, chunk, start, path))
    yield Event(kind=EventKind.OPENSM_PARTITIONS, t=t, source=str(path), attrs={"partitions": partitions})


def _error(body: str, *, offset: int, what: str, text: str, path: str | os.PathLike[str]) -> ParseError:
    lead = len(text) - len(text.lstrip())
    return ParseError(what, path=path, line=body.count("\n", 0, offset + lead) + 1, text=text.strip()[:200])


class _Partition(TypedDict):
    """One partition as the event carries it (JSON)."""

    name: str
    pkey: str | None
    flags: list[str]
    members: list[list[str]]
    """``[port GUID or ALL..., membership]``"""
    line: int


def _partition(body: str, chunk: str, start: int, path: str | os.PathLike[str]) -> _Partition:
    line = body.count("\n", 0, start + len(chunk) - len(chunk.lstrip())) + 1
    head, sep, members = chunk.partition(":")
    if not sep:
        raise _error(body, offset=start, what="a partition is 'Name[=PKey][,flags] : members ;'", text=chunk, path=path)
    parts = [p.strip() for p in head.split(",")]
    name, has_key, pkey = (x.strip() for x in parts[0].partition("="))
    if not _NAME_RE.match(name) or (has_key and not _PKEY_RE.match(pkey)):
        raise _error(
            body, offset=start, what="a partition starts 'Name[=PKey]' (PKey hex 0x.. or decimal)", text=head, path=path
        )
    if bad := next((f for f in parts[1:] if not _FLAG_RE.match(f)), None):
        raise _error(body, offset=start, what="a partition flag is 'word' or 'word=value'", text=bad or head, path=path)
    found: list[list[str]] = []
    at = start + len(head) + 1
    for member in members.split(","):
        if member.strip():
            m = _MEMBER_RE.match(member.strip())
            if m is None:
                raise _error(
                    body,
                    offset=at,
                    what="a member is a port GUID (0x..), ALL, ALL_CAS, ALL_SWITCHES, "
                    "ALL_ROUTERS or SELF, then =full|limited|both",
                    text=member,
                    path=path,
                )
            found.append([m.group(1), m.group(2) or "limited"])
        at += len(member) + 1
    return {"name": name, "pkey": pkey or None, "flags": parts[1:], "members": found, "line": line}


def read_partitions_conf(path: str | os.PathLike[str]) -> Iterator[Event]:
    yield from parse_partitions_conf(read_text(path), path=path, t=file_time(path))


def is_partitions_conf(head: str, name: str = "") -> bool:
    """Sniff: named partitions.conf, or ``Name[=PKey]... : members ;`` with full/limited members."""
    if name == "partitions.conf":
        return True
    body = "\n".join(line.split("#", 1)[0] for line in head.splitlines()).strip()
    return (
        bool(body)
        and body.rstrip().endswith(";")
        and ":" in body
        and ("=full" in body or "=limited" in body)
        and not body.startswith(("{", "["))
    )
