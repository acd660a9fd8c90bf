"""Scheduled work: the security detectors and the health rules, each at its own interval.

``scan`` runs the detectors over the last ``window_s`` of data, read incrementally
(``security.scan.LiveScan``: only rows committed since the previous run are read), and replaces
the stored findings in one commit; ``window_s = 0`` rescans the whole store. ``health`` runs the
health rules (``reports.health.node_health``) over the last ``window_s`` (kept between runs, each reading only
the rows committed since the last: ``reports.healthwindow``) and stores one
``health_verdict`` event per node (attrs: node, verdict, reason, and each rule's verdict there) — the verdict
history, and what ``/metrics`` publishes (``hpcwatch_health_verdict{node,rule}``) for the alerting rules. ``assess``
runs the assessment (``reports.assess.assessment_report``: evidence and the six detectors, read-only
over the store) and stores its verdict as one ``assessment`` event (tier, per-category tiers), which
``serve`` (``/api/assess/latest``, the Decider mode) and ``/metrics`` (``hpcwatch_assessment_tier``) show
without assessing again.
"""

from __future__ import annotations

import time
from pathlib import Path

from hpcwatch.assess import AssessConfig
from hpcwatch.collect.base import RunResult
from hpcwatch.collect.config import ScheduleSection
from hpcwatch.model import load_cluster, reference_cluster
from hpcwatch.reports.assess import assessment_event, assessment_report
from hpcwatch.reports.health import verdict_events
from hpcwatch.reports.healthwindow import KeptWindow
from hpcwatch.security.scan import LiveScan, rescan
from hpcwatch.store import Store

__all__ = ["ScheduledTask"]


class ScheduledTask:
    def __init__(self, store: Store, section: ScheduleSection) -> None:
        self.store, self.section = store, section
        self._scan = (
            (LiveScan(window_s=section.window_s) if section.window_s else rescan) if section.task == "scan" else None
        )
        self._assess_config = _assess_config(section) if section.task == "assess" else None
        # the health task over a bounded window reads, each run, only the rows committed since the last
        self._health_window = KeptWindow() if section.task == "health" and section.window_s else None

    def close(self) -> None:
        pass

    def run(self) -> RunResult:
        if self._scan is not None:
            return RunResult(records=len(self._scan(self.store)), lag_s=0.0)
        if self._assess_config is not None:
            return self._assess(self._assess_config)
        window_s = self.section.window_s or float("inf")
        events = verdict_events(
            self.store, t=time.time(), source="hpcwatch collect", window_s=window_s, kept=self._health_window
        )
        with self.store.transaction() as tx:
            tx.add(events)
        return RunResult(records=len(events), lag_s=0.0)

    def _assess(self, config: AssessConfig) -> RunResult:
        event = assessment_event(assessment_report(self.store, config), t=time.time())
        with self.store.transaction() as tx:
            tx.add([event])
        return RunResult(records=1, lag_s=0.0, note=f"tier {event.attrs['tier']}")


def _assess_config(section: ScheduleSection) -> AssessConfig:
    """Read the cluster model once, at start: a bad path stops the daemon there, not every interval."""
    cluster = load_cluster(Path(section.cluster)) if section.cluster else reference_cluster()
    return AssessConfig(cluster=cluster)
