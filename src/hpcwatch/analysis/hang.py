"""Why a job hangs, from its ranks' Flight Recorder dumps: the wavefront, mismatches, the last collective done.

Each process group numbers its collectives (``collective_seq_id``, 1, 2, 3... on every member). A
collective completes only when every member has issued it, so in a hang the members split:

    seq:        3     4     5     6
    rank 0   ──done──done──issued (waits)
    rank 1   ──done──done──issued (waits)
    rank 2   ──done──done──            <- never issued 5: the wavefront is seq 5, rank 2 missing
    rank 3   ──done──done──issued (waits)

- **wavefront**: the first sequence number some members issued and others never did: which op, which
  ranks arrived, which never did (a member with no dump at all is listed apart: we cannot tell);
- **mismatches**: the same sequence number issued as different ops, sizes or dtypes on different
  ranks (``nccl:all_reduce`` on three ranks, ``nccl:broadcast`` on the fourth: NCCL cannot detect it
  and hangs or corrupts);
- **last completed**: the highest sequence number every member completed (state ``completed``,
  or ``retired`` / ``pg_status.last_completed_collective`` where the backend does not track states;
  gloo leaves every entry ``scheduled``).

Point-to-point ops (``is_p2p``) have their own sequence (``p2p_seq_id``) and are not matched here.
Input: the ``attrs`` of ``flight_recorder_dump`` events (``sources.flight_recorder``), plain dicts.
The member list of a group is ``pg_config[..]["ranks"]`` (a string such as ``"[0, 1, 2, 3]"``), read
as integers, never evaluated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Wavefront", "Mismatch", "GroupHang", "HangReport", "analyse_hang", "COMPARED_FIELDS"]

#: Entry fields that must agree across the members for one sequence number.
COMPARED_FIELDS = ("profiling_name", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes")


@dataclass(frozen=True, slots=True, kw_only=True)
class Wavefront:
    seq: int
    op: str
    arrived: tuple[int, ...]
    missing: tuple[int, ...]
    input_sizes: Any = None
    input_dtypes: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Mismatch:
    seq: int
    field: str
    values: Mapping[int, Any]
    """rank -> the value it recorded."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupHang:
    pg: str
    desc: str
    members: tuple[int, ...]
    dumped: tuple[int, ...]
    no_dump: tuple[int, ...]
    last_issued: Mapping[int, int]
    last_completed: Mapping[int, int]
    all_completed_seq: int | None
    all_completed_op: str | None
    wavefront: Wavefront | None
    mismatches: tuple[Mismatch, ...]

    @property
    def hung(self) -> bool:
        return self.wavefront is not None or any(
            self.last_completed.get(r, -1) < s for r, s in self.last_issued.items()
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class HangReport:
    ranks: tuple[int, ...]
    groups: tuple[GroupHang, ...]

    @property
    def verdict(self) -> str:
        if any(g.mismatches for g in self.groups):
            return "mismatch"
        if any(g.wavefront for g in self.groups):
            return "hang"
        return "stuck" if any(g.hung for g in self.groups) else "ok"

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"verdict": self.verdict, "ranks": list(self.ranks), "groups": [asdict(g) for g in self.groups]}


def _members(text: Any) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"-?\d+", str(text)))


def _int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _collectives(dump: Mapping[str, Any], pg: str) -> dict[int, Mapping[str, Any]]:
    """seq -> entry of the group's collectives in one rank's dump (the last entry wins a coalesced seq)."""
    out: dict[int, Mapping[str, Any]] = {}
    for e in dump.get("entries", []):
        names = e.get("process_group") or [None]
        if str(names[0]) == pg and not e.get("is_p2p", False) and _int(e.get("collective_seq_id"), 0) > 0:
            out[_int(e["collective_seq_id"])] = e
    return out


def _completed(entries: Mapping[int, Mapping[str, Any]], dump: Mapping[str, Any], pg_id: Any) -> int:
    done = [s for s, e in entries.items() if e.get("state") == "completed" or e.get("retired") is True]
    status = (dump.get("pg_status") or {}).get(str(pg_id), {})
    return max(done + [_int(status.get("last_completed_collective"))], default=-1)


def _mismatches(by_rank: Mapping[int, Mapping[int, Mapping[str, Any]]]) -> list[Mismatch]:
    out = []
    seqs = sorted({s for entries in by_rank.values() for s in entries})
    for seq in seqs:
        present = {r: entries[seq] for r, entries in by_rank.items() if seq in entries}
        if len(present) < 2:
            continue
        for name in COMPARED_FIELDS:
            values = {r: e.get(name) for r, e in present.items()}
            if len({repr(v) for v in values.values()}) > 1:
                out.append(Mismatch(seq=seq, field=name, values=values))
    return out


def _wavefront(
    by_rank: Mapping[int, Mapping[int, Mapping[str, Any]]], last_issued: Mapping[int, int]
) -> Wavefront | None:
    if not last_issued or len(set(last_issued.values())) < 2:
        return None
    seq = min(last_issued.values()) + 1
    arrived = tuple(sorted(r for r, s in last_issued.items() if s >= seq))
    missing = tuple(sorted(r for r, s in last_issued.items() if s < seq))
    entry = (
        next(by_rank[r][seq] for r in arrived if seq in by_rank[r]) if any(seq in by_rank[r] for r in arrived) else {}
    )
    return Wavefront(
        seq=seq,
        op=str(entry.get("profiling_name", "?")),
        arrived=arrived,
        missing=missing,
        input_sizes=entry.get("input_sizes"),
        input_dtypes=entry.get("input_dtypes"),
    )


def _group(pg: str, config: Mapping[str, Any], dumps: Mapping[int, Mapping[str, Any]]) -> GroupHang:
    members = _members(config.get("ranks", "")) or tuple(sorted(dumps))
    dumped = tuple(r for r in members if r in dumps)
    by_rank = {r: _collectives(dumps[r], pg) for r in dumped}
    pg_ids = {r: next((e.get("pg_id") for e in by_rank[r].values()), None) for r in dumped}
    last_issued = {r: max(by_rank[r], default=0) for r in dumped}
    last_completed = {r: _completed(by_rank[r], dumps[r], pg_ids[r]) for r in dumped}
    all_done = min(last_completed.values(), default=None)
    done_entry = next((by_rank[r].get(all_done) for r in dumped if all_done in by_rank[r]), None) if all_done else None
    return GroupHang(
        pg=pg,
        desc=str(config.get("desc", "")),
        members=members,
        dumped=dumped,
        no_dump=tuple(r for r in members if r not in dumps),
        last_issued=last_issued,
        last_completed=last_completed,
        all_completed_seq=all_done if all_done and all_done > 0 else None,
        all_completed_op=str(done_entry.get("profiling_name")) if done_entry else None,
        wavefront=_wavefront(by_rank, last_issued),
        mismatches=tuple(_mismatches(by_rank)),
    )


def _config_of(pg: str, configs: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    """The group's pg_config; a lone config under another key (gloo in torch 2.13 files the default group
    under ``""`` while its entries say ``"0"``: tests/data/flight_recorder/) is taken for the only group."""
    if pg in configs:
        return configs[pg]
    return next(iter(configs.values())) if len(configs) == 1 else {}


def analyse_hang(dumps: Sequence[Mapping[str, Any]]) -> HangReport:
    """The hang report of one job: ``dumps`` are the ranks' dump attrs (``rank``, ``pg_config``, ``entries``...)."""
    by_rank = {int(d["rank"]): d for d in dumps if d.get("rank") is not None}
    configs: dict[str, Mapping[str, Any]] = {}
    for d in by_rank.values():
        for name, config in (d.get("pg_config") or {}).items():
            configs.setdefault(str(name), config if isinstance(config, Mapping) else {})
    names = sorted(
        {
            str((e.get("process_group") or [None])[0])
            for d in by_rank.values()
            for e in d.get("entries", [])
            if not e.get("is_p2p", False)
        }
    )
    groups = tuple(_group(pg, _config_of(pg, configs), by_rank) for pg in names)
    return HangReport(ranks=tuple(sorted(by_rank)), groups=groups)
