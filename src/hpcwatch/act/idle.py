"""Policy 1, ``[act.idle]``: a job whose allocated GPUs all stay idle is warned, then held (or cancelled).

    data clock:  GPUs idle ────── idle_minutes ──────┬──────── grace_minutes ────────┬─ still idle
    wall clock:                                   warning to the user         (and >= grace after it)
                                                  (act_action step=warn)       hold / cancel (audited)

Idle is the health rule ``idle_allocated`` (``analysis.health``: a GPU the job holds at <= 5 % utilisation),
asked for runs of ``idle_minutes`` (``HealthConfig.idle_min_s``) through ``reports.health.node_health``; a job
is idle when every GPU it holds that reports is idle (at least ``Job.gpus`` of them when the scheduler gave a
count), and its idle runs are current (ended within ``CURRENT_S`` of the newest sample). The action comes only
after the warning, once the job has stayed idle ``grace_minutes`` more on the data clock (the GPUs' samples)
and as long on the wall clock since the warning was queued.

``hold`` is ``scontrol requeuehold JOB``: ``scontrol hold`` only holds a pending job (on a running one it sets
its priority to 0 and nothing else: scontrol(1)), so a running one is requeued and held (its GPUs are freed; it
keeps its id and its place); undo: ``scontrol release JOB``, and it starts again from its script. Slurm refuses
to requeue a job that may not be requeued (``sbatch --no-requeue``, or ``JobRequeue=0`` in slurm.conf) or that
is not a batch job (``salloc``, ``srun``): ``NOT_REQUEUEABLE`` has its words. Then the refused hold is audited
(rc, Slurm's answer), the job's user and the operators are told, and ``fallback`` says what follows: ``none``
(the default) leaves the job running for an operator to decide; ``cancel`` runs ``scancel JOB``, audited as a
step of its own. A hold that fails otherwise (a timeout, the controller down) is told to the operators and
never falls back: only Slurm's word that the job cannot be requeued does. ``cancel`` is ``scancel JOB``: it
cannot be undone, so it is never the default.

The warning can be withdrawn: ``hpcwatch act undo`` of the ``warn`` step leaves the job alone for good.
A job acted on once (even if released by an undo) is not acted on again; a job on ``allow_jobs``, of a user on
``allow_users``, in an ``exempt_partitions`` partition or an ``exempt_accounts`` account never is, nor a job
the store does not know (its owner and partition cannot be checked).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from hpcwatch.act.audit import Recorded
from hpcwatch.act.config import IdlePolicy
from hpcwatch.analysis.health import HealthConfig
from hpcwatch.records import Job
from hpcwatch.reports.health import node_health
from hpcwatch.store import Store

__all__ = ["IdleJob", "idle_jobs", "exemption", "decide", "refusal", "POLICY", "CURRENT_S", "NOT_REQUEUEABLE"]

POLICY = "idle_gpus"
#: A Slurm job id as scontrol and scancel take it: JOBID, JOBID_TASK (array), JOBID+OFFSET (heterogeneous).
#: Anything else (a pod name, an id starting with "-") never reaches their argv.
SLURM_JOB_ID = re.compile(r"[0-9]{1,10}(_[0-9]{1,7})?(\+[0-9]{1,4})?")
#: Ours: an idle run that ended more than this before the newest sample is over (the GPUs work again, or stopped
#: reporting); a few scrape intervals of dcgm-exporter (15-30 s) and of ``collect``'s polls.
CURRENT_S = 300.0
#: What ``scontrol requeuehold JOB`` prints when Slurm will not requeue the job ("%s for job %s", scontrol's
#: src/scontrol/update_job.c), by the reason it gives: slurmctld's ``_job_requeue_op`` (src/slurmctld/job_mgr.c)
#: answers ESLURM_DISABLED for a job whose ``requeue`` is off and ESLURM_BATCH_ONLY for a job that is not a batch
#: job; the words are those of src/common/slurm_errno.c (the same in Slurm 22.05 and 25.x), and Slurm's own
#: testsuite/expect/test3.8 expects the first after ``scontrol requeue`` of a ``--no-requeue`` job.
NOT_REQUEUEABLE = {
    "Requested operation is presently disabled": "the job may not be requeued (--no-requeue, or JobRequeue=0)",
    "Only batch jobs are accepted or processed": "it is not a batch job (salloc or srun): Slurm requeues only those",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class IdleJob:
    job: str
    gpus: tuple[str, ...]
    """``node/gpu`` of each idle GPU."""
    since: float
    """Start of the latest-starting idle run of its GPUs (UTC s, data clock): all are idle from then on."""
    until: float
    """End of the earliest-ending run (UTC s, data clock): all were idle up to then."""

    @property
    def idle_s(self) -> float:
        return self.until - self.since

    def evidence(self) -> dict[str, Any]:
        return {
            "rule": "idle_allocated",
            "gpus": list(self.gpus),
            "idle_from": self.since,
            "idle_to": self.until,
            "idle_s": self.idle_s,
        }


def idle_jobs(store: Store, policy: IdlePolicy) -> list[IdleJob]:
    """Jobs whose every reporting GPU is idle now, for at least ``idle_minutes`` (the health rule's runs)."""
    idle_s = policy.idle_minutes * 60.0
    window_s = idle_s + 2 * policy.grace_minutes * 60.0 + CURRENT_S
    report = node_health(store, window_s=window_s, config=HealthConfig(idle_min_s=idle_s))
    _, newest = store.time_range()
    runs: dict[str, list[tuple[str, float, float]]] = defaultdict(list)
    for node in report.nodes:
        for c in node.checks:
            if c.rule == "idle_allocated" and c.evidence.get("job"):
                ev = c.evidence
                runs[str(ev["job"])].append((f"{node.node}/{ev['gpu']}", float(ev["from"]), float(ev["to"])))
    out = []
    for job, found in sorted(runs.items()):
        since, until = max(r[1] for r in found), min(r[2] for r in found)
        if newest is not None and until < newest - CURRENT_S:
            continue
        out.append(IdleJob(job=job, gpus=tuple(sorted(r[0] for r in found)), since=since, until=until))
    return out


def exemption(policy: IdlePolicy, job: Job | None, idle: IdleJob) -> str:
    """Why this job is left alone ("" when it is not)."""
    if not SLURM_JOB_ID.fullmatch(idle.job):
        return "not a Slurm job id"
    if job is None:
        return "the store has no such job (owner and partition unknown)"
    if job.end is not None:
        return "it has ended"
    if job.id in policy.allow_jobs:
        return "it is on allow_jobs"
    if job.user and job.user in policy.allow_users:
        return f"its user {job.user} is on allow_users"
    if job.partition and job.partition in policy.exempt_partitions:
        return f"its partition {job.partition} is exempt"
    if job.account and job.account in policy.exempt_accounts:
        return f"its account {job.account} is exempt"
    if job.gpus and len(idle.gpus) < job.gpus:
        return f"{len(idle.gpus)} of its {job.gpus} GPUs are idle, not all"
    return ""


def refusal(output: str) -> str:
    """Why Slurm will not requeue the job, from what scontrol answered ("" when it is not such a refusal)."""
    return next((why for words, why in NOT_REQUEUEABLE.items() if words in output), "")


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    step: str
    """``warn``, the action (``hold``/``cancel``), or ``wait`` / ``skip`` (nothing to do: ``why`` says why)."""
    why: str


def decide(policy: IdlePolicy, idle: IdleJob, past: list[Recorded], *, now: float) -> Decision:
    """What to do with an idle job, given what was done before in its episode."""
    grace_s = policy.grace_minutes * 60.0
    done = [r.action for r in past if r.action.step in ("hold", "cancel")]
    if done:
        last = done[-1]
        if not last.ok:
            return Decision(step="skip", why=f"{last.step} failed ({last.id}, rc {last.rc}): not tried again")
        return Decision(step="skip", why=f"already {last.step} by {last.id}")
    withdrawn = next((r for r in past if r.action.step == "warn" and r.undone is not None), None)
    if withdrawn is not None and withdrawn.undone is not None:
        return Decision(
            step="skip", why=f"warning {withdrawn.action.id} withdrawn by {withdrawn.undone.who}: left alone"
        )
    warned = [r.action for r in past if r.action.step == "warn"]
    if not warned:
        return Decision(
            step="warn",
            why=f"every GPU it holds ({len(idle.gpus)}) idle for {idle.idle_s / 60:.0f} min "
            f">= {policy.idle_minutes:g} min",
        )
    warn = warned[-1]
    seen_to = float(warn.evidence.get("idle_to", idle.until))
    more_s, since_warn_s = idle.until - seen_to, now - warn.t
    if idle.since > seen_to:
        return Decision(step="warn", why=f"idle again for {idle.idle_s / 60:.0f} min after working since {warn.id}")
    if more_s < grace_s or since_warn_s < grace_s:
        return Decision(
            step="wait",
            why=f"warned by {warn.id}; idle {more_s / 60:.0f} min more (data), {since_warn_s / 60:.0f} min since "
            f"the warning (wall), of {policy.grace_minutes:g} min",
        )
    return Decision(
        step=policy.action,
        why=f"warned by {warn.id} {since_warn_s / 60:.0f} min ago; idle {more_s / 60:.0f} min more since "
        f">= grace {policy.grace_minutes:g} min (every GPU idle {idle.idle_s / 60:.0f} min)",
    )
