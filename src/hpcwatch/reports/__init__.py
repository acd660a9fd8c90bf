"""Reports: one function per question, below every view.

Each reads the store (plain values in), calls ``analysis/`` and ``security/``,
and returns a frozen dataclass (or, where a JSON contract already exists, a
documented dict). The CLI, the web (routes and SSE) and the exporter call these
and only format what they get, so a number is computed in one place.

=====================  ===========================================================
question               function (module)
=====================  ===========================================================
jobs list, one job     ``jobs_report``, ``job_report`` (jobs) -> ``JobReport``
steps of a job         ``step_report`` / ``step_report_of`` (steps) -> ``StepReport``
the player's step      ``player_step`` (steps) -> ``PlayerStep`` (verdict included)
goodput of a job       ``goodput_report`` (goodput) -> ``GoodputReport``
node health            ``node_health`` (health) -> ``HealthReport``
findings summary       ``findings_summary``, ``finding_counts`` (findings)
live snapshot          ``live_snapshot``, ``gpu_table`` (live)
=====================  ===========================================================
"""

from hpcwatch.reports.findings import VectorSummary, finding_counts, findings_summary, recent_findings, scan_inputs
from hpcwatch.reports.goodput import goodput_report
from hpcwatch.reports.health import node_health
from hpcwatch.reports.jobs import job_report, jobs_report
from hpcwatch.reports.live import gpu_table, latest_t, live_snapshot
from hpcwatch.reports.steps import (LiveTraining, PlayerStep, PlayerVerdict, StepReport, live_training, player_jobs,
                                    player_step, step_report, step_report_of)
from hpcwatch.reports.text import visible

__all__ = ["jobs_report", "job_report", "step_report", "step_report_of", "StepReport", "player_step", "PlayerStep",
           "PlayerVerdict", "player_jobs", "live_training", "LiveTraining", "goodput_report", "node_health",
           "findings_summary", "finding_counts", "recent_findings", "scan_inputs", "VectorSummary", "live_snapshot",
           "latest_t", "gpu_table", "visible"]
