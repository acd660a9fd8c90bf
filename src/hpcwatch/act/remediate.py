"""Policy 2, ``[act.remediate]``: a drained node is tested through a reservation and given back when it passes.

    health_verdict drain (collect's [[schedule]] task="health", or hpcwatch demo's) for node N, a new episode
      (Slurm has N drained by hpcwatch: ``scontrol -o show node N`` says DRAIN, its reason starts "hpcwatch")
      warn      a notice to the operators: what will be done, when, how to stop it   undo: stand down
    warn_minutes later, N still drained by hpcwatch (else: stand_down, the episode is over)
      reserve   scontrol create reservation reservationname=hpcwatch-N-ID nodes=N flags=maint,ignore_jobs
                starttime=now duration=M users=U              undo: scontrol delete reservationname=R
      resume    scontrol update nodename=N state=resume       undo: scontrol update nodename=N state=drain reason=...
                (Slurm allocates no drained node, not even through a reservation: the node is resumed
                *into* the reservation, where only the check job may run)
      check     sbatch --reservation=R --nodelist=N ... WORK/ID/check.sh     undo: scancel JOB
    a later run: the job left the queue (or wrote WORK/ID/done)
      results   dcgmi diag -j, all_reduce_perf, ib_write_bw outputs read by sources.healthtools, stored as
                events, judged by the health rules' active checks (analysis.health.active_checks)
      pass  ->  release   scontrol delete reservationname=R: the node takes jobs again   undo: drain it again
      fail  ->  drain     scontrol update nodename=N state=drain reason="hpcwatch: checks failed: ..."
                          (undo: resume), then release, and a notice to the operators

The warning gives the operators ``warn_minutes`` to keep the node: ``hpcwatch act undo`` of the ``warn`` step,
a drain reason of their own (``scontrol update nodename=N reason="..."``: one not starting with "hpcwatch", the
words ``deploy/slurm/healthcheck`` drains with), resuming the node themselves, or ``exempt_nodes``. A verdict
that is no longer ``drain`` does not end an episode once warned (``open_episodes``): the node is still drained
in Slurm, nothing else gives it back, and the checks are what may (with the default 15 min look-back and 15 min
warning, a single XID leaves the window about when the reservation is due). Before the warning and again
before ``reserve`` the node's Slurm state is read, so nothing is announced or done on a node an operator holds,
nor on one this policy drained after failed checks (``checks failed`` in its reason: the operators were told,
and a person looks before anything tests it again).

An episode is the run of ``drain`` verdicts of the node (``store.queries.verdict_episode_start``): it is
remediated once; a node drained again later (after another verdict) is a new episode. A command that fails
ends the episode there (audited, operators told); a check job still running after ``check_timeout_minutes``
is cancelled and counts as a failure. While the checks run, and once they passed, what the node showed before
it was resumed into the reservation is answered by them: ``hpcwatch health`` neither drains a node under test
nor counts those faults again (``reports.acting.node_checks``). The check programs are the node's own; the tests' stand-ins
(``tests/standins/checks``) print the real formats, and so do the twin's, which its Slurm (``twin/slurmctl.py``)
runs the check job with when ``hpcwatch demo`` plays this policy.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcwatch.act import checkjob
from hpcwatch.act.audit import Recorded, recorded
from hpcwatch.act.checkjob import CheckSpec, Outcome, judge_results
from hpcwatch.act.config import RemediatePolicy
from hpcwatch.records import Event
from hpcwatch.store import Store, queries
from hpcwatch.vocab import EventKind

__all__ = [
    "POLICY",
    "DrainEpisode",
    "Outcome",
    "drain_episodes",
    "out_of_scope",
    "reservation_name",
    "NodeState",
    "node_state",
    "DRAINED_BY",
    "FAILED_CHECKS",
    "episode_over",
    "open_episodes",
    "check_specs",
    "check_script",
    "read_results",
    "judge_results",
]

POLICY = "remediate"
#: A node name as it may go into ``nodes=`` / ``nodename=``: one host name (a comma or a bracket would name
#: other nodes, a space another argument).
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainEpisode:
    node: str
    start: float
    """UTC s of the first drain verdict of the run (the episode's key)."""
    reason: str
    """The verdict's reason (the rules that fired): the drain reason an undo of a resume puts back."""

    @property
    def episode(self) -> str:
        return f"remediate/{self.node}/{self.start:.3f}"


def drain_episodes(store: Store) -> list[DrainEpisode]:
    """Nodes whose latest health verdict is ``drain``, with their episode."""
    latest: dict[str, Event] = {}
    for e in store.events(EventKind.HEALTH_VERDICT):
        node = str(e.attrs.get("node") or "")
        if node:
            latest[node] = e
    out = []
    for node, e in sorted(latest.items()):
        if e.attrs.get("verdict") != "drain":
            continue
        start = queries.verdict_episode_start(store, kind=EventKind.HEALTH_VERDICT, node=node, verdict="drain", at=e.t)
        out.append(DrainEpisode(node=node, start=start, reason=str(e.attrs.get("reason") or "")))
    return out


def episode_over(past: Sequence[Recorded]) -> str:
    """Why a remediation episode is over, from its audit ("" while it runs)."""
    for r in past:
        if r.action.step == "warn" and r.undone is not None:
            return f"warning {r.action.id} withdrawn by {r.undone.who}"
        if not r.action.ok:
            return f"{r.action.step} failed ({r.action.id})"
        if r.action.step in ("release", "stand_down"):
            return f"{r.action.step} by {r.action.id}"
    return ""


def open_episodes(store: Store, listed: Sequence[DrainEpisode]) -> list[DrainEpisode]:
    """Episodes warned and not over whose node is not in ``listed`` (its verdict is no longer ``drain``): they
    run to their end, rebuilt from their warning's evidence."""
    known = {ep.episode for ep in listed}
    by_episode: dict[str, list[Recorded]] = {}
    for r in recorded(store, policy=POLICY):
        if r.action.episode not in known:
            by_episode.setdefault(r.action.episode, []).append(r)
    out = []
    for episode, past in by_episode.items():
        warn = past[0].action
        _, node, start = episode.split("/", 2) if episode.count("/") == 2 else ("", "", "")
        ep = DrainEpisode(node=node, start=_seconds(start), reason=str(warn.evidence.get("reason") or ""))
        if warn.step == "warn" and ep.episode == episode and NODE_NAME.fullmatch(node) and not episode_over(past):
            out.append(ep)
    return sorted(out, key=lambda ep: ep.node)


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")  # its episode key then differs: not one of ours


def out_of_scope(policy: RemediatePolicy, node: str) -> str:
    """Why the policy leaves this node alone ("" when it may act)."""
    if not NODE_NAME.fullmatch(node):
        return "not one plain node name"
    if node in policy.exempt_nodes:
        return "it is on exempt_nodes"
    if policy.nodes and node not in policy.nodes:
        return "it is not on nodes"
    return ""


#: How a drain reason written by hpcwatch begins (deploy/slurm/healthcheck: "hpcwatch: drain: ...", the
#: alert's advice: "hpcwatch <rule>", this policy's own: "hpcwatch: checks failed ..."). Any other reason is an
#: operator's: the node is theirs.
DRAINED_BY = "hpcwatch"
#: How this policy's drain after failed checks begins: the operators were told; the node is theirs to look at.
FAILED_CHECKS = "hpcwatch: checks failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeState:
    node: str
    state: str
    """``State=`` of ``scontrol -o show node``: ``IDLE+DRAIN``, ``DOWN+DRAIN``, ``MIXED+DRAIN`` (draining)..."""
    reason: str
    """``Reason=``: the rest of the line (free text, the last field scontrol prints that we read)."""

    def not_ours(self) -> str:
        """Why the policy must leave the node alone now ("" when hpcwatch's drain still holds it)."""
        if not self.state:
            return "scontrol does not know it"
        if "DRAIN" not in self.state.split("+"):
            return f"it is no longer drained (State={self.state}): an operator resumed it"
        if not self.reason.startswith(DRAINED_BY):
            return f"its drain reason is not hpcwatch's (Reason={self.reason[:80]}): an operator holds it"
        if self.reason.startswith(FAILED_CHECKS):
            return f"it failed hpcwatch's checks (Reason={self.reason[:80]}): the operators have it"
        return ""


def node_state(show_node: str, node: str) -> NodeState:
    """The state and drain reason of ``node`` in ``scontrol -o show node [N]`` (one line a node)."""
    for line in show_node.splitlines():
        head, _, reason = line.partition(" Reason=")
        fields = dict(f.split("=", 1) for f in head.split() if "=" in f)
        if fields.get("NodeName") == node:
            return NodeState(node=node, state=fields.get("State", ""), reason=reason.strip())
    return NodeState(node=node, state="", reason="")


def reservation_name(node: str, action_id: str) -> str:
    return f"hpcwatch-{node}-{action_id.removeprefix('act-')[:6]}"


def check_specs(policy: RemediatePolicy) -> tuple[CheckSpec, ...]:
    """The three checks of a drained node, as the policy configures them."""
    return (
        CheckSpec(kind="dcgmi_diag", program=policy.dcgmi, level=policy.diag_level),
        CheckSpec(
            kind="nccl_tests",
            program=policy.all_reduce_perf,
            args=("-b", "8", "-e", "1G", "-f", "2", "-g", str(policy.gpus)),
        ),
        CheckSpec(kind="ib_write_bw", program=policy.ib_write_bw, device=policy.ib_device),
    )


def check_script(policy: RemediatePolicy, out_dir: Path, *, reservation: str) -> str:
    """The batch script: the three checks on the node, each output in ``out_dir``, then a ``done`` file."""
    why = f"act: the checks of a drained node, run through reservation {reservation}"
    return checkjob.script(check_specs(policy), out_dir, why=why)


def read_results(out_dir: Path, node: str, policy: RemediatePolicy) -> tuple[list[Event], list[str]]:
    """The check job's outputs as events (``node`` set), and what is missing or unreadable (one line each)."""
    return checkjob.read_results(out_dir, node, check_specs(policy))
