"""``[act]`` in the daemon: ``hpcwatch act`` every ``interval_s``, one ``Actor`` kept between runs (its notices
go through a ``Notifier`` of the file's ``[notify]`` table, so a channel's outage spans runs)."""

from __future__ import annotations

from hpcwatch.act.config import ActConfig
from hpcwatch.act.loop import Actor
from hpcwatch.collect.base import RunResult
from hpcwatch.notify.config import NotifyConfig
from hpcwatch.store import Store

__all__ = ["ActCollector"]


class ActCollector:
    def __init__(self, store: Store, section: ActConfig, *, notify: NotifyConfig | None = None) -> None:
        self.actor = Actor(store, section, notify=notify)

    def run(self) -> RunResult:
        summary = self.actor.run_once()
        dry = " (dry-run)" if self.actor.config.dry_run else ""
        note = f"{summary.acted} actions{dry}" if summary.acted or dry else ""
        return RunResult(records=summary.acted, lag_s=0.0, note=note)

    def close(self) -> None:
        self.actor.close()
