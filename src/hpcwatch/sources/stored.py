"""Documents that are not records, kept in the store as events and read back.

An OSV advisory and a shard manifest are inputs of the detectors, not measurements;
storing them as events (``osv_advisory``, ``shard_manifest``) lets ``hpcwatch ingest``
take them like any file, and ``hpcwatch scan --db`` find them again, so the scan of
files and the scan of a store are one path.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from hpcwatch.records import Event
from hpcwatch.sources.manifest import Shard, ShardManifest
from hpcwatch.sources.osv import OsvDatabase, OsvEntry, OsvRange
from hpcwatch.vocab import EventKind

__all__ = ["ADVISORY", "MANIFEST", "advisory_events", "osv_from_events", "manifest_event", "manifests_from_events"]

ADVISORY = EventKind.OSV_ADVISORY
MANIFEST = EventKind.SHARD_MANIFEST


def advisory_events(db: OsvDatabase, *, t: float) -> Iterator[Event]:
    """One event per (advisory, package) of ``db``.

    Every field of ``OsvEntry`` is kept: a matcher reads them all, and one dropped here
    (``withdrawn`` once was) turns a retracted advisory back into a live one on ``scan --db``.
    """
    for entries in db.by_package.values():
        for e in entries:
            yield Event(
                kind=ADVISORY,
                t=t,
                source=e.source,
                attrs={
                    "id": e.id,
                    "summary": e.summary,
                    "aliases": list(e.aliases),
                    "package": e.package,
                    "versions": list(e.versions),
                    "ranges": [{"type": r.type, "events": [list(ev) for ev in r.events]} for r in e.ranges],
                    "withdrawn": e.withdrawn,
                },
            )


def osv_from_events(events: Iterable[Event]) -> OsvDatabase:
    db = OsvDatabase()
    db.add(
        OsvEntry(
            id=a["id"],
            summary=a["summary"],
            aliases=tuple(a["aliases"]),
            package=a["package"],
            versions=tuple(a["versions"]),
            source=e.source,
            ranges=tuple(OsvRange(type=r["type"], events=tuple((k, v) for k, v in r["events"])) for r in a["ranges"]),
            # A record stored before "withdrawn" was kept has none: it reads back live, as it was stored.
            withdrawn=a.get("withdrawn"),
        )
        for e in events
        if e.kind == ADVISORY
        for a in (e.attrs,)
    )
    return db


def manifest_event(m: ShardManifest, *, t: float) -> Event:
    return Event(
        kind=MANIFEST,
        t=t,
        source=m.source,
        attrs={
            "dataset": m.dataset,
            "root": m.root,
            "signature": m.signature,
            "shards": [{"path": s.path, "sha256": s.sha256, "bytes": s.bytes, "samples": s.samples} for s in m.shards],
        },
    )


def manifests_from_events(events: Iterable[Event]) -> list[ShardManifest]:
    return [
        ShardManifest(
            dataset=a["dataset"],
            root=a["root"],
            signature=a["signature"],
            source=e.source,
            shards=tuple(Shard(**s) for s in a["shards"]),
        )
        for e in events
        if e.kind == MANIFEST
        for a in (e.attrs,)
    ]
