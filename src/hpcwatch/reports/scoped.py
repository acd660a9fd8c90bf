"""The reports as one principal may read them: each function takes a report's result and an
``access.scope.Scope`` and returns what that scope sees of it (a copy; the shared result is untouched).

One rule throughout: a job is shown with its id, name, user and account when ``scope.sees_job`` says so;
an aggregates-only scope (decider) sees the cluster's numbers with user and account pseudonymised and no
job ids; any other job is left out (lists) or left anonymous (a GPU keeps its numbers, not its job).
Health (problems, verdicts, the recent events), findings and the weights' readers each need their
permission. ``FULL`` (no authentication configured) passes everything through unchanged.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from hpcwatch.access.scope import Scope
from hpcwatch.records import Finding, Job
from hpcwatch.reports.triage import alert_groups
from hpcwatch.store import Store

if TYPE_CHECKING:  # the decider report pulls in goodput and the assessment: the live path needs neither
    from hpcwatch.reports.decider import DeciderReport

__all__ = [
    "Owners",
    "job_owners",
    "scoped_live",
    "scoped_findings",
    "job_visible",
    "scoped_job_ids",
    "scoped_overview",
    "scoped_jobs",
    "scoped_decider",
]

Owners = Mapping[str, tuple[str | None, str | None]]
"""Job id → (user, account)."""

_JOB_FIELDS = ("job", "user", "account", "job_name")
_BLANK_VECTOR = {"findings": 0, "last_t": None, "title": None, "severity": None, "target": None, "rule": None}


def job_owners(jobs: Iterable[Job]) -> dict[str, tuple[str | None, str | None]]:
    return {j.id: (j.user, j.account) for j in jobs}


def _sees(scope: Scope, job: str | None, owners: Owners) -> bool:
    if not job:
        return False
    return all(scope.sees_job(*owners.get(part, (None, None))) for part in str(job).split(","))


def job_visible(store: Store, job_id: str, scope: Scope) -> bool:
    """Whether ``scope`` may open ``job_id``'s page, steps or history. A workload known only from its
    spans (no Slurm record: no owner) is visible to ``jobs:all`` only."""
    if scope.everything or scope.all_jobs:
        return True
    record = store.job(job_id)
    return record is not None and scope.sees_job(record.user, record.account)


def scoped_job_ids(store: Store, job_ids: Iterable[str], scope: Scope) -> list[str]:
    return [j for j in job_ids if job_visible(store, j, scope)]


def scoped_jobs(jobs: Iterable[Job], scope: Scope) -> list[Job]:
    """Jobs as ``scope`` may list them (the exporter's labels): its own whole; for an aggregates-only
    scope every job with its user and account pseudonymised; no other."""
    if scope.everything or scope.all_jobs:
        return list(jobs)
    if scope.pseudonymous:
        return [dataclasses.replace(j, user=scope.shown(j.user), account=scope.shown(j.account)) for j in jobs]
    return [j for j in jobs if scope.sees_job(j.user, j.account)]


#: Job ids shorter than this are not searched for in free text (a "3" in "3 of 5 jobs" is a count): Slurm's
#: ids on a real cluster have 5 to 8 digits.
MIN_SCRUBBED_ID_CHARS = 3


def scoped_text(doc: Any, scope: Scope, owners: Owners) -> Any:
    """A report written for people (the assessment's evidence, figures) with every job id, user and account
    it names in free text replaced: by a pseudonym for an aggregates-only scope, else by ``…``; unchanged for
    a scope that sees every job. The names are those of ``owners`` (the store's jobs)."""
    if scope.everything or scope.all_jobs:
        return doc
    names = {j for j in owners if len(j) >= MIN_SCRUBBED_ID_CHARS}
    names |= {n for pair in owners.values() for n in pair if n}
    if not names:
        return doc
    pattern = re.compile(
        r"(?<![\w.-])(" + "|".join(sorted(map(re.escape, names), key=len, reverse=True)) + r")(?![\w-]|\.\d)"
    )

    def replace(match: re.Match[str]) -> str:
        return scope.pseudonym(match.group(1)) if scope.pseudonymous else "…"

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return pattern.sub(replace, value)
        if isinstance(value, dict):
            return {walk(k) if isinstance(k, str) else k: walk(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v) for v in value]
        return value

    return walk(doc)


def scoped_findings(found: Iterable[Finding], scope: Scope) -> list[Finding]:
    return list(found) if scope.can("findings") else []


def scoped_overview(overview: Any, scope: Scope) -> Any:
    """A job page's report (``reports.jobpage.JobOverview``) without its findings unless ``findings``."""
    if scope.can("findings") or not overview.findings:
        return overview
    return dataclasses.replace(overview, findings=())


def scoped_decider(report: DeciderReport, scope: Scope) -> DeciderReport:
    """The Decider view's per-account figures as ``scope`` reads them: every account pseudonymised for an
    aggregates-only scope (its numbers are the cluster's, the names are not), whole for ``jobs:all``; any
    other scope only the accounts it coordinates (a user's own jobs are not an account's total)."""
    if scope.everything or scope.all_jobs:
        return report
    if scope.pseudonymous:
        accounts = tuple(dataclasses.replace(s, account=scope.shown(s.account)) for s in report.accounts)
    else:
        accounts = tuple(s for s in report.accounts if scope.sees_job(None, s.account))
    return dataclasses.replace(report, accounts=accounts)


def scoped_live(doc: dict[str, Any], scope: Scope, owners: Owners) -> dict[str, Any]:
    """The live snapshot (``reports.live.live_snapshot`` + ``apply_states``) as ``scope`` sees it."""
    if scope.everything:
        return doc
    out = _copied(doc)

    def sees(job: Any) -> bool:
        return _sees(scope, job, owners)

    for entry in out.get("gpus", {}).values():
        _mask_job(entry, scope, sees(entry.get("job")))
    queue = out.get("queue") or {}
    queue["jobs"] = _rows(queue.get("jobs", []), scope, sees, id_key="id")
    storage = out.get("storage") or {}
    storage["jobs"] = _rows(storage.get("jobs", []), scope, sees, id_key="job")
    training = out.get("training")
    if training is not None and not sees(training.get("job")):
        out["training"] = None
    out["nccl"] = [card for card in out.get("nccl", []) if sees(card.get("job"))]
    out["job_gpus"] = {job: gpus for job, gpus in out.get("job_gpus", {}).items() if sees(job)}
    out["problems"] = [p for p in out.get("problems", []) if _problem_shown(p, scope, sees)]
    out["alerts"] = alert_groups(out["problems"])
    if not scope.can("health"):
        out["events"], out["node_events"], out["collect"] = [], {}, None
    else:
        out["events"] = [e for e in out.get("events", []) if not e.get("job") or sees(e.get("job"))]
        out["node_events"] = {
            node: [e for e in events if not e.get("job") or sees(e.get("job"))]
            for node, events in out.get("node_events", {}).items()
        }
    if not scope.can("findings"):
        out["vectors"] = {v: _blank_vector(entry) for v, entry in out.get("vectors", {}).items()}
    if not scope.can("weights"):
        out["weights"] = {"checkpoint_events": None, "last_checkpoint_t": None}
    return out


def _copied(doc: dict[str, Any]) -> dict[str, Any]:
    """A copy deep enough for the changes below (the GPUs' and the job rows' dicts), the rest shared: a
    whole deep copy costs most of the filtering at 1,024 GPUs."""
    out = dict(doc)
    out["gpus"] = {gid: dict(entry) for gid, entry in doc.get("gpus", {}).items()}
    for section in ("queue", "storage"):
        if isinstance(doc.get(section), dict):
            out[section] = {**doc[section], "jobs": [dict(row) for row in doc[section].get("jobs", [])]}
    return out


def _mask_job(entry: dict[str, Any], scope: Scope, seen: bool) -> None:
    if seen and not scope.pseudonymous:
        return
    for key in _JOB_FIELDS:
        if key not in entry:
            continue
        entry[key] = scope.shown(entry[key]) if scope.pseudonymous and key in ("user", "account") else None


def _rows(
    rows: list[dict[str, Any]], scope: Scope, sees: Callable[[Any], bool], *, id_key: str
) -> list[dict[str, Any]]:
    """Rows of jobs: the visible ones whole; for a decider, every row with pseudonymous names and no id."""
    if scope.pseudonymous:
        for row in rows:
            row[id_key] = None
            for key in ("name", "job_name"):
                if key in row:
                    row[key] = None
            for key in ("user", "account"):
                if key in row:
                    row[key] = scope.shown(row[key])
        return rows
    return [row for row in rows if sees(row.get(id_key))]


def _problem_shown(problem: Mapping[str, Any], scope: Scope, sees: Callable[[Any], bool]) -> bool:
    kind = problem.get("kind")
    if kind == "finding":
        return scope.can("findings")
    if problem.get("job"):
        return sees(problem["job"]) and not scope.pseudonymous
    return scope.can("health")


def _blank_vector(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {**entry, **_BLANK_VECTOR, "text": None}
