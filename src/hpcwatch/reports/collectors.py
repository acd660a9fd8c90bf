"""Which collectors of ``hpcwatch collect`` answer: the status file the daemon writes beside the store.

Each ``collect`` daemon writes ``STORE/collect/status-<daemon>.json`` (temp file + rename, every
few seconds; ``<daemon>`` is its ``[collect] node``, by default the host name, so the node-level
daemons of a DaemonSet and the central one write side by side); ``serve``, the exporter and
``hpcwatch collect --status`` read them here. A file is the one contract between a daemon and its
readers::

    {"written_s": 1700000000.0, "pid": 1234, "daemon": "head1", "config": "/etc/hpcwatch/hpcwatch.toml",
     "collectors": [{"name": "slurm", "kind": "slurm-rest", "interval_s": 30.0,
                     "last_success_s": ..., "last_error": "...", "last_error_s": ...,
                     "lag_s": ..., "runs": 12, "errors": 1, "records": 340}, ...]}

``lag_s`` is what the collector knows of its own delay (a followed log: bytes not yet read are
not seconds, so it is the age of the newest record it stored; a poll: time since its last success).
A collector *answers* when its last run succeeded and that run is no older than three intervals
(ours: one missed poll is noise, three are an outage), and the daemon wrote the file within
``STALE_AFTER_S`` (a dead daemon answers for nobody).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import orjson

from hpcwatch.store import Store

__all__ = [
    "CollectorStatus",
    "CollectStatus",
    "STATUS_DIR",
    "STALE_AFTER_S",
    "MISSED_INTERVALS",
    "status_path",
    "read_status",
    "collector_statuses",
]

#: Where the status files live, relative to the store folder.
STATUS_DIR = Path("collect")
#: A status file not rewritten for this long means the daemon is gone (it writes every few seconds; ours).
STALE_AFTER_S = 60.0
#: Intervals without a success after which a collector no longer answers (ours, see the docstring).
MISSED_INTERVALS = 3.0


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectorStatus:
    """One collector as the daemon last saw it."""

    name: str
    kind: str
    interval_s: float
    daemon: str = ""
    """The daemon running it (its ``[collect] node``)."""
    last_success_s: float | None = None
    """UTC seconds of the end of the last run that succeeded."""
    last_error: str | None = None
    """The last failure, one line (None once a later run succeeded)."""
    last_error_s: float | None = None
    lag_s: float | None = None
    runs: int = 0
    errors: int = 0
    records: int = 0
    """Records stored since the daemon started."""
    note: str = ""
    """The last thing worth saying about a run that succeeded (a rotation, refused files)."""
    answering: bool = False
    """Set by ``read_status``: see the module docstring."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectStatus:
    """Every daemon writing one store: ``daemons`` (name -> written_s, pid, config, stale) and all their
    collectors."""

    daemons: dict[str, dict[str, Any]]
    collectors: tuple[CollectorStatus, ...]

    @property
    def stale(self) -> bool:
        """Every daemon stopped writing its file (``STALE_AFTER_S``)."""
        return all(d["stale"] for d in self.daemons.values())

    def as_dict(self) -> dict[str, Any]:
        return {"daemons": self.daemons, "stale": self.stale, "collectors": [asdict(c) for c in self.collectors]}


def status_path(store_root: str | Path, daemon: str) -> Path:
    """The status file of one daemon (a name safe in a file name)."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in daemon) or "collect"
    return Path(store_root) / STATUS_DIR / f"status-{safe}.json"


_FIELDS = {f.name for f in fields(CollectorStatus)} - {"answering"}


def read_status(store_root: str | Path, *, now: float | None = None) -> CollectStatus | None:
    """Every daemon's status under ``store_root``; None when no daemon ever wrote one. A file that cannot
    be read is skipped (a half-written one cannot happen: daemons rename theirs into place)."""
    now = time.time() if now is None else now
    daemons: dict[str, dict[str, Any]] = {}
    collectors: list[CollectorStatus] = []
    for path in sorted((Path(store_root) / STATUS_DIR).glob("status-*.json")):
        try:
            doc = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        if not isinstance(doc, dict) or not isinstance(doc.get("collectors"), list):
            continue
        name = str(doc.get("daemon") or path.stem[len("status-") :])
        written = float(doc.get("written_s") or 0.0)
        stale = now - written > STALE_AFTER_S
        daemons[name] = {
            "written_s": written,
            "pid": int(doc.get("pid") or 0),
            "config": str(doc.get("config") or ""),
            "stale": stale,
        }
        collectors += [
            _collector({**raw, "daemon": name}, now, stale) for raw in doc["collectors"] if isinstance(raw, dict)
        ]
    if not daemons:
        return None
    return CollectStatus(daemons=daemons, collectors=tuple(collectors))


def _collector(raw: dict[str, Any], now: float, stale: bool) -> CollectorStatus:
    status = CollectorStatus(**{k: v for k, v in raw.items() if k in _FIELDS})
    last_success = status.last_success_s
    recent = (
        last_success is not None
        and (status.last_error_s is None or status.last_error_s <= last_success)
        and now - last_success <= MISSED_INTERVALS * max(status.interval_s, 1.0)
    )
    return CollectorStatus(**{**{k: getattr(status, k) for k in _FIELDS}, "answering": bool(recent and not stale)})


def collector_statuses(store: Store, *, now: float | None = None) -> CollectStatus | None:
    """The status of the daemon writing ``store`` (None for an in-memory store or when none runs)."""
    root = store.config.path
    if str(root) == ":memory:":
        return None
    return read_status(root, now=now)
