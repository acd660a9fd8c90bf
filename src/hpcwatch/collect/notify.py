"""``[notify]`` in the daemon: ``hpcwatch notify`` every ``interval_s``, one ``Notifier`` kept between runs
(so a channel's outage and back-off span runs, and its recovery is logged once).

A job that ends is seen here as soon as any collector stored its end (the Slurm poll): its end
report is composed at the next run.
"""

from __future__ import annotations

from hpcwatch.collect.base import RunResult
from hpcwatch.notify.config import NotifyConfig
from hpcwatch.notify.loop import Notifier
from hpcwatch.store import Store

__all__ = ["NotifyCollector"]


class NotifyCollector:
    def __init__(self, store: Store, section: NotifyConfig) -> None:
        self.notifier = Notifier(store, section)

    def run(self) -> RunResult:
        summary = self.notifier.run_once()
        note = f"{summary.pending} pending" + (f", down: {', '.join(summary.down)}" if summary.down else "")
        return RunResult(records=summary.sent, lag_s=0.0, note=note if summary.pending or summary.down else "")

    def close(self) -> None:
        self.notifier.close()
