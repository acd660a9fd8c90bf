"""The live stream as deltas: what changed since the viewer's previous tick, encoded once for every viewer.

At 1,024 nodes a snapshot is ~1.8 MB of JSON, almost all of it the 8,192 GPUs; 200 viewers at 1 Hz would
be 360 MB/s of socket writes for values that mostly did not move on the page. The stream therefore sends:

- ``event: live``  a full snapshot (``/api/live``'s document plus ``v``, its version): on connect, and
  whenever the viewer missed a version (its last one is not the delta's ``base``);
- ``event: delta`` ``{v, base, gpus: {id: {field: value}}, nodes: {...}, job_gpus: {job: [gpu, ...]},
  set: {key: value}}``: only the GPU and node fields that changed (``null``: the field is gone), the jobs
  whose GPUs changed (``null``: the job is gone), and the other top-level keys that changed, whole. The page applies it only on top of version ``base`` (static/app.js), else it reconnects for a
  full snapshot, so a delta is never applied out of order.

The stream's GPU values are kept at the precision the page shows (power 0.1 W, memory 0.1 GiB) and
without their sample time: a GPU whose shown values did not move is not in the delta. ``/api/live``
keeps every value as the report returned it.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["stream_doc", "delta", "KEYED", "BY_ENTRY"]

#: Top-level keys whose entries are diffed one by one (the rest are replaced whole when they changed).
KEYED = ("gpus", "nodes")
#: Top-level keys whose entries are replaced one by one: an entry that changed is sent whole, one gone as null.
#: ``job_gpus`` (each job's GPUs) was 147 KB at 1,024 nodes, sent whole whenever one job started or ended.
BY_ENTRY = ("job_gpus",)
#: What the page shows of a GPU (static/card.js, tiles.js): the stream rounds to it.
_GIB_TENTH = 2**30 / 10


def _shown_gpu(g: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in g.items() if k != "t"}
    if isinstance(out.get("power_w"), float):
        out["power_w"] = round(out["power_w"], 1)
    mem = out.get("mem_used_bytes")
    if isinstance(mem, (int, float)) and math.isfinite(mem):  # an exporter may write NaN or +Inf
        out["mem_used_bytes"] = int(round(mem / _GIB_TENTH) * _GIB_TENTH)
    return out


def stream_doc(doc: dict[str, Any], before: tuple[dict[str, Any], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The snapshot as the stream carries it: GPUs at the page's precision (the rest as the report returned).

    ``before``: the snapshot of the tick before and its stream document. A GPU whose snapshot entry is equal to
    the one before (the same object, when ``reports.live.GpuTable`` kept it) keeps its stream entry, the very
    object, which ``delta`` then passes over without comparing:
    at 1,024 nodes a tick scrapes an eighth of the 8,192 GPUs, and rounding them all again was a tenth of a
    snapshot (cProfile)."""
    gpus = doc.get("gpus") or {}
    old, shown_old = ({}, {}) if before is None else (before[0].get("gpus") or {}, before[1].get("gpus") or {})
    shown = {}
    for gid, g in gpus.items():
        kept, before_g = shown_old.get(gid), old.get(gid)
        shown[gid] = kept if kept is not None and (before_g is g or before_g == g) else _shown_gpu(g)
    return doc | {"gpus": shown}


def _entry_delta(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    if old is None:
        return new
    changed = {k: v for k, v in new.items() if old.get(k, _MISSING) != v}
    changed.update({k: None for k in old.keys() - new.keys()})
    return changed


_MISSING = object()


def delta(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """What turns stream doc ``old`` into ``new`` (both from ``stream_doc``), without ``v``/``base``."""
    out: dict[str, Any] = {}
    for key in KEYED:
        before, after = old.get(key) or {}, new.get(key) or {}
        changes = {}
        for name, entry in after.items():
            previous = before.get(name)
            if previous is not entry and previous != entry:  # the same object: a GPU ``stream_doc`` kept
                changes[name] = _entry_delta(previous, entry)
        changes.update({name: None for name in before.keys() - after.keys()})
        if changes:
            out[key] = changes
    for key in BY_ENTRY:
        before, after = old.get(key) or {}, new.get(key) or {}
        replaced = {name: entry for name, entry in after.items() if before.get(name, _MISSING) != entry}
        replaced.update({name: None for name in before.keys() - after.keys()})
        if replaced:
            out[key] = replaced
    whole = (*KEYED, *BY_ENTRY, "v")
    out["set"] = {k: v for k, v in new.items() if k not in whole and old.get(k, _MISSING) != v}
    out["set"].update({k: None for k in old.keys() - new.keys() if k not in whole})
    return out
