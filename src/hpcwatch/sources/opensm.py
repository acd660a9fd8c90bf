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
from collections.abc import Iterator

from hpcwatch.errors import ParseError
from hpcwatch.records import Event
from hpcwatch.sources.lines import file_time, read_text

__all__ = ["is_partitions_conf", "parse_partitions_conf", "read_partitions_conf"]


def parse_partitions_conf(text: str, *, path: str | os.PathLike[str] = "<partitions.conf>",
                          t: float = 0.0) -> Iterator[Event]:
    body = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    partitions, offset = [], 0
    for chunk in body.split(";"):
        line = body.count("\n", 0, offset + len(chunk) - len(chunk.lstrip())) + 1
        offset += len(chunk) + 1
        if not chunk.strip():
            continue
        head, sep, members = chunk.partition(":")
        if not sep:
            raise ParseError("a partition is 'Name[=PKey][,flags] : members ;'", path=path, line=line,
                             text=chunk.strip())
        parts = [p.strip() for p in head.split(",")]
        name, _, pkey = parts[0].partition("=")
        if not name.strip():
            raise ParseError("partition without a name", path=path, line=line, text=chunk.strip())
        partitions.append({"name": name.strip(), "pkey": pkey.strip() or None, "flags": parts[1:],
                           "members": [_member(m) for m in members.split(",") if m.strip()], "line": line})
    yield Event(kind="opensm_partitions", t=t, source=str(path), attrs={"partitions": partitions})


def _member(text: str) -> list[str]:
    who, _, membership = text.strip().partition("=")
    return [who.strip(), membership.strip() or "limited"]


def read_partitions_conf(path: str | os.PathLike[str]) -> Iterator[Event]:
    yield from parse_partitions_conf(read_text(path), path=path, t=file_time(path))


def is_partitions_conf(head: str, name: str = "") -> bool:
    """Sniff: named partitions.conf, or ``Name[=PKey]... : members ;`` with full/limited members."""
    if name == "partitions.conf":
        return True
    body = "\n".join(line.split("#", 1)[0] for line in head.splitlines()).strip()
    return bool(body) and body.rstrip().endswith(";") and ":" in body and ("=full" in body or "=limited" in body) \
        and not body.startswith(("{", "["))
