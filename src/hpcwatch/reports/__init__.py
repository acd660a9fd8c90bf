"""Reports: one function per question, below every view.

Each reads the store (plain values in), calls ``analysis/`` and ``security/``,
and returns a frozen dataclass (or, where a JSON contract already exists, a
documented dict). The CLI, the web (routes and SSE) and the exporter call these
and only format what they get, so a number is computed in one place.

=====================  ===========================================================
question               function (module)
=====================  ===========================================================
jobs list, one job     ``jobs_report``, ``job_report`` (jobs) -> ``JobReport``
a job's whole page     ``job_overview`` (jobpage) -> ``JobOverview`` (job, steps, goodput, findings)
steps of a job         ``step_report`` / ``step_report_of`` (steps) -> ``StepReport``
steps of a trace set   ``reduce_trace_files``, ``reduced_report`` (steps); ``steps_document`` (its JSON)
the player's step      ``player_step`` (steps) -> ``PlayerStep`` (verdict included)
what-if slowdown       ``whatif_of_ops``, ``whatif_of_job`` (whatif) -> ``WhatIf``; ``whatif_document``
MFU of a model         ``model_mfu`` (whatif) -> ``MfuResult``; ``mfu_document`` (steps) of a step report
straggler simulation   ``straggler_efficiency`` (whatif) -> ``StragglerCurve``
goodput of a job       ``goodput_report`` (goodput) -> ``GoodputReport``
simulated goodput      ``simulated_goodput``, ``simulated_goodput_sweep`` (goodput) -> ``GoodputRun``
node health            ``node_health`` (health) -> ``HealthReport``
findings summary       ``findings_summary``, ``finding_counts`` (findings)
live snapshot          ``live_snapshot``, ``gpu_table`` (live)
live problems, ranked  ``alert_groups``, ``natural_key`` (triage)
a GPU's last minutes   ``element_history`` (history) -> ``History`` (a samples source: Store or PromQL)
=====================  ===========================================================
"""

from importlib import import_module

#: Where each public name lives. The package imports none of them itself: ``hpcwatch.reports.text`` (which
#: every CLI command loads for ``safe_text``) would otherwise pull in the store, pyarrow and duckdb, and
#: ``hpcwatch --help`` with them. ``from hpcwatch.reports import job_report`` still works (PEP 562).
_HOMES = {
    "element_history": "history",
    "History": "history",
    "jobs_report": "jobs",
    "job_report": "jobs",
    "step_report": "steps",
    "step_report_of": "steps",
    "StepReport": "steps",
    "reduce_trace_files": "steps",
    "reduced_report": "steps",
    "steps_document": "steps",
    "mfu_document": "steps",
    "player_step": "steps",
    "PlayerStep": "steps",
    "PlayerVerdict": "steps",
    "player_jobs": "steps",
    "live_training": "livetraining",
    "LiveTraining": "livetraining",
    "goodput_report": "goodput",
    "simulated_goodput": "goodput",
    "simulated_goodput_sweep": "goodput",
    "whatif_of_ops": "whatif",
    "whatif_of_job": "whatif",
    "whatif_document": "whatif",
    "model_mfu": "whatif",
    "straggler_efficiency": "whatif",
    "node_health": "health",
    "findings_summary": "findings",
    "finding_counts": "findings",
    "recent_findings": "findings",
    "scan_inputs": "findings",
    "VectorSummary": "findings",
    "live_snapshot": "live",
    "latest_t": "live",
    "gpu_table": "live",
    "alert_groups": "triage",
    "natural_key": "triage",
    "visible": "text",
    "job_overview": "jobpage",
    "JobOverview": "jobpage",
    "overview_dict": "jobpage",
}

__all__ = list(_HOMES)


def __getattr__(name: str) -> object:
    """A public name, imported from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'hpcwatch.reports' has no attribute {name!r}")
    value = getattr(import_module(f"hpcwatch.reports.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
