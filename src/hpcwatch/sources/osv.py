"""Reader of an offline OSV dump: a zip of OSV JSON files (``PyPI/all.zip``) or a folder of them.

OSV publishes one archive per ecosystem at
https://osv-vulnerabilities.storage.googleapis.com/PyPI/all.zip; each member is
one record in the OSV schema (https://ossf.github.io/osv-schema/). We keep what
a version check needs: ``id``, ``summary``, ``aliases``, and per affected PyPI
package its ``versions`` list and ``ranges`` (``ECOSYSTEM`` / ``SEMVER`` events
``introduced``, ``fixed``, ``last_affected``). ``MAL-`` ids are the OpenSSF
malicious-packages feed (https://github.com/ossf/malicious-packages).

A record with ``withdrawn`` (the time it was retracted) is kept but never matches.
``OsvDatabase.matching`` gives one advisory per alias group: records whose ``id`` or
``aliases`` meet (a ``MAL-`` record and the ``GHSA-`` one for the same package) count
once, the malicious one kept.

Version comparison uses ``packaging`` (PEP 440). A version that PEP 440 cannot
read makes that one range unknown (no match), never an exception. ``GIT`` ranges
are skipped: they name commits, not releases.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from packaging.version import InvalidVersion, Version

from hpcwatch.errors import ParseError
from hpcwatch.sources.lines import MAX_FILE_BYTES, open_regular, read_bytes, read_head, shown
from hpcwatch.sources.pip import normalize_name

__all__ = ["OsvEntry", "OsvRange", "OsvDatabase", "parse_osv_entry", "read_osv", "version_affected"]

ECOSYSTEM = "PyPI"
#: One OSV record, inflated from a zip; real ones are a few KiB.
MAX_RECORD_BYTES = 16 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class OsvRange:
    type: str
    """``ECOSYSTEM`` or ``SEMVER``."""
    events: tuple[tuple[str, str], ...]
    """(``introduced`` | ``fixed`` | ``last_affected``, version), in file order."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OsvEntry:
    id: str
    summary: str
    aliases: tuple[str, ...]
    package: str
    """PEP 503 normalised PyPI name."""
    versions: tuple[str, ...]
    ranges: tuple[OsvRange, ...]
    source: str
    """The file (or zip member) it came from."""
    withdrawn: str | None = None
    """When the record was withdrawn (RFC 3339), if it was: it then matches nothing."""

    @property
    def malicious(self) -> bool:
        return self.id.startswith("MAL-")

    def affects(self, version: str | None) -> bool:
        """True when ``version`` is listed or inside a range; a malicious record with no version data
        matches all; a withdrawn record matches none."""
        if self.withdrawn is not None:
            return False
        if self.malicious and not self.versions and not self.ranges:
            return True
        if version is None:
            return False
        return version_affected(version, self.versions, self.ranges)


@dataclass(slots=True)
class OsvDatabase:
    """OSV entries indexed by normalised package name."""

    by_package: dict[str, list[OsvEntry]] = field(default_factory=dict)

    def add(self, entries: Iterable[OsvEntry]) -> None:
        for entry in entries:
            self.by_package.setdefault(entry.package, []).append(entry)

    def __len__(self) -> int:
        return sum(len(v) for v in self.by_package.values())

    def matching(self, name: str, version: str | None) -> list[OsvEntry]:
        """The records that affect ``name`` at ``version``, one per alias group (malicious first)."""
        found = [e for e in self.by_package.get(normalize_name(name), []) if e.affects(version)]
        found.sort(key=lambda e: (not e.malicious, e.id))
        kept: list[OsvEntry] = []
        seen: set[str] = set()
        for entry in found:
            names = {entry.id, *entry.aliases}
            if names.isdisjoint(seen):
                kept.append(entry)
            seen |= names
        return kept


def version_affected(version: str, versions: Iterable[str], ranges: Iterable[OsvRange]) -> bool:
    try:
        v = Version(version)
    except InvalidVersion:
        return version in set(versions)
    for listed in versions:
        try:
            if Version(listed) == v:
                return True
        except InvalidVersion:
            if listed == version:
                return True
    return any(_in_range(v, r) for r in ranges if r.type in ("ECOSYSTEM", "SEMVER"))


def _in_range(v: Version, rng: OsvRange) -> bool:
    """The OSV evaluation: walk events sorted by version; introduced opens, fixed/last_affected close."""
    try:
        events = sorted(((Version("0") if val == "0" else Version(val)), kind) for kind, val in rng.events)
    except InvalidVersion:
        return False
    affected = False
    for at, kind in events:
        if kind == "introduced" and v >= at:
            affected = True
        elif (kind == "fixed" and v >= at) or (kind == "last_affected" and v > at):
            affected = False
    return affected


def parse_osv_entry(data: bytes | str, *, path: str = "<osv>") -> Iterator[OsvEntry]:
    """One ``OsvEntry`` per affected PyPI package of one OSV JSON record."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as err:
        raise ParseError(f"not JSON: {err}", path=path) from err
    if not isinstance(doc, dict) or not isinstance(doc.get("id"), str):
        raise ParseError("not an OSV record (no id)", path=path, line=1)
    affected_list = doc.get("affected") or []
    if not isinstance(affected_list, list) or not all(isinstance(a, dict) for a in affected_list):
        raise ParseError("'affected' is not a list of objects", path=path, line=1)
    for affected in affected_list:
        pkg = affected.get("package") if isinstance(affected.get("package"), dict) else {}
        if pkg.get("ecosystem") != ECOSYSTEM or not pkg.get("name"):
            continue
        ranges = tuple(
            OsvRange(
                type=str(r.get("type", "")),
                events=tuple(
                    (k, str(val))
                    for ev in _list(r.get("events"))
                    for k, val in ev.items()
                    if k in ("introduced", "fixed", "last_affected")
                ),
            )
            for r in _list(affected.get("ranges"))
            if isinstance(r, dict) and all(isinstance(ev, dict) for ev in _list(r.get("events")))
        )
        withdrawn = doc.get("withdrawn")
        yield OsvEntry(
            id=doc["id"],
            summary=str(doc.get("summary") or doc.get("details") or "")[:200],
            aliases=_aliases(doc.get("aliases"), path),
            package=normalize_name(str(pkg["name"])),
            versions=tuple(str(v) for v in _list(affected.get("versions"))),
            ranges=ranges,
            source=path,
            withdrawn=None if withdrawn in (None, "") else str(withdrawn),
        )


def _list(value: object) -> list[Any]:
    """A list field, or an empty one when it is missing or not a list (lenient, as for ``GIT`` ranges)."""
    return value if isinstance(value, list) else []


def _aliases(value: object, path: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise ParseError("'aliases' is not a list of ids", path=path, line=1)
    return tuple(value)


def read_osv(path: str | os.PathLike[str]) -> OsvDatabase:
    """An ``OsvDatabase`` of a zip of OSV JSON files, a folder of them (recursively), or one file."""
    p = Path(path)
    db = OsvDatabase()
    if p.is_dir():
        for member in sorted(m for m in p.rglob("*.json") if m.is_file()):  # a folder named x.json is no record
            db.add(parse_osv_entry(read_bytes(member), path=str(member)))
    elif _is_zip(p):
        _read_zip(p, db)
    else:
        db.add(parse_osv_entry(read_bytes(p), path=str(p)))
    return db


def _is_zip(p: Path) -> bool:
    return read_head(p, 4) == b"PK\x03\x04"


def _read_zip(p: Path, db: OsvDatabase) -> None:
    """The records of a zip, each member at most ``MAX_RECORD_BYTES`` inflated (a zip bomb is refused)."""
    with open_regular(p, MAX_FILE_BYTES) as stream:
        try:
            with zipfile.ZipFile(stream) as archive:
                for info in sorted(
                    (i for i in archive.infolist() if i.filename.endswith(".json") and not i.is_dir()),
                    key=lambda i: i.filename,
                ):
                    db.add(parse_osv_entry(_member(archive, info, p), path=f"{p}:{info.filename}"))
        except (
            zipfile.BadZipFile,
            zipfile.LargeZipFile,
            OSError,
            EOFError,
            zlib.error,
            ValueError,
            NotImplementedError,
            RuntimeError,
        ) as err:
            raise ParseError(f"cannot read the zip: {shown(err, 120)}", path=p) from err


def _member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, p: Path) -> bytes:
    with archive.open(info) as member:
        data = member.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise ParseError(f"zip member {shown(info.filename)} inflates past {MAX_RECORD_BYTES} bytes", path=p)
    return data
