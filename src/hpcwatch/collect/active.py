"""``[active]``: the active tests (dcgmi diag, nccl-tests, ib_write_bw) on idle nodes, each at its cadence, as
Slurm jobs, never beside another job.

    every interval_s
      poll    each check job started before that has ended (it wrote ``done``, or squeue no longer names it):
              its outputs read by ``sources.healthtools``, stored (from then on the health rules judge them:
              collect's health task gives a failing dcgmi diag its ``drain`` verdict, which remediation and
              notify act on), one ``active_result`` event, its reservation deleted
      choose  scontrol -o show node: nodes whose state is exactly ``IDLE`` (no allocation, not drained,
              responding), in scope,
              with a check due (its last run on the node started ``every_minutes`` ago, or none): the most
              overdue first, while fewer than ``max_nodes`` are under test
      start   scontrol create reservation nodes=N starttime=now duration=T+5 users=U
              sbatch --reservation=R --nodelist=N --exclusive --time=T WORK/RUN/check.sh     (``active_run``)

"Never on a busy node": scontrol's answer is a snapshot, so the guard is the reservation. It is created without
``ignore_jobs``, and slurmctld refuses, in one step of its own, a reservation of a node that runs a job
("Requested nodes are busy"): a node that got busy since is then ``refused`` — nothing is submitted, so
nothing waits for the node and nothing has to be cancelled; it is looked at again next interval. Once the
reservation holds, no other job starts on the node until it ends; ``--time`` ends the check job 5 minutes
before it. A job still in the queue once its reservation is over (``time_limit_minutes`` + 5) is cancelled:
a check job never waits for a node outside its reservation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcwatch.act import checkjob
from hpcwatch.act.checkjob import CheckSpec
from hpcwatch.act.remediate import NODE_NAME
from hpcwatch.act.runner import Ran, Runner
from hpcwatch.collect.base import RunResult
from hpcwatch.collect.config import ActiveCheck, ActiveSection
from hpcwatch.errors import ConfigError
from hpcwatch.records import Event
from hpcwatch.store import Store
from hpcwatch.vocab import EventKind

__all__ = ["ActiveChecks", "Candidate", "RESERVATION_SLACK_MINUTES", "SOURCE", "idle_nodes"]

SOURCE = "hpcwatch collect active"
#: Ours: the reservation outlasts the job's time limit by this, so the job ends (or Slurm ends it) inside it.
RESERVATION_SLACK_MINUTES = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    node: str
    checks: tuple[ActiveCheck, ...]
    """The checks due on the node."""
    overdue_s: float
    """How long past its cadence the most overdue of them is (inf: never run there)."""


#: Fields of ``scontrol -o show node`` after which free text may follow (a reason may say "State=IDLE").
_FREE_TEXT = ("Reason=", "Comment=", "Extra=")


def _node_fields(line: str) -> dict[str, str]:
    """The ``Key=Value`` fields of one node's line, up to the first free-text field; the first of each key."""
    fields: dict[str, str] = {}
    for token in line.split():
        if token.startswith(_FREE_TEXT):
            break
        key, eq, value = token.partition("=")
        if eq and key not in fields:
            fields[key] = value
    return fields


def idle_nodes(show_node: str, partitions: tuple[str, ...] = ()) -> list[str]:
    """The nodes of ``scontrol -o show node`` (one line a node) whose state is exactly ``IDLE`` with no CPU
    allocated, in one of ``partitions`` (empty: any). ``IDLE+DRAIN``, ``IDLE*`` (not responding), ``MIXED``,
    ``ALLOCATED``, ``IDLE+POWERED_DOWN``... are not. scontrol, not sinfo: sinfo's allocation counts lag
    (on Slurm 22.05 it showed a node ``mixed`` for tens of seconds after its job ended, scontrol ``IDLE``)."""
    out = []
    for line in show_node.splitlines():
        f = _node_fields(line)
        node = f.get("NodeName", "")
        if not node or f.get("State") != "IDLE" or f.get("CPUAlloc", "0") != "0":
            continue
        if partitions and not set(f.get("Partitions", "").split(",")) & set(partitions):
            continue
        out.append(node)
    return out


def spec(check: ActiveCheck) -> CheckSpec:
    return CheckSpec(kind=check.kind, program=check.command, level=check.level, args=check.args, device=check.device)


class ActiveChecks:
    def __init__(
        self,
        store: Store,
        section: ActiveSection,
        *,
        runner: Runner | None = None,
        clock: Callable[[], float] = time.time,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.store, self.section, self.clock = store, section, clock
        self.runner = runner or Runner(section.commands, timeout_s=section.command_timeout_s, env=env)

    def close(self) -> None:
        pass

    def run(self) -> RunResult:
        finished = self.poll()
        started: list[str] = []
        refused: list[str] = []
        for candidate in self.choose():
            run = self.start(candidate.node, candidate.checks)
            (started if run.attrs["step"] == "submit" else refused).append(candidate.node)
        parts = [f"{len(started)} started", f"{len(finished)} finished"]
        if refused:
            parts.append(f"not started on {', '.join(refused)}")
        return RunResult(records=len(started) + len(refused) + len(finished), lag_s=0.0, note=", ".join(parts))

    # -- what the store says ------------------------------------------------------------------------

    def _submitted(self) -> list[Event]:
        return [e for e in self.store.events(EventKind.ACTIVE_RUN) if e.attrs.get("step") == "submit"]

    def in_flight(self) -> list[Event]:
        """The check jobs submitted that have no result yet."""
        done = {e.attrs.get("run") for e in self.store.events(EventKind.ACTIVE_RESULT)}
        return [e for e in self._submitted() if e.attrs.get("run") not in done]

    def last_runs(self) -> dict[tuple[str, str], float]:
        """(node, check kind) -> when its newest check job was submitted."""
        last: dict[tuple[str, str], float] = {}
        for e in self._submitted():
            for kind in e.attrs.get("checks") or ():
                key = (str(e.attrs.get("node")), str(kind))
                last[key] = max(last.get(key, e.t), e.t)
        return last

    # -- choose -------------------------------------------------------------------------------------

    def _in_scope(self, node: str) -> bool:
        s = self.section
        return node not in s.exempt_nodes and (not s.nodes or node in s.nodes)

    def choose(self) -> list[Candidate]:
        """Idle nodes in scope with a check due, most overdue first, up to the room ``max_nodes`` leaves."""
        under_test = {str(e.attrs.get("node")) for e in self.in_flight()}
        room = self.section.max_nodes - len(under_test)
        if room <= 0:
            return []
        ran = self._ran("scontrol", "-o", "show", "node")
        if not ran.ok:
            raise ConfigError(f"scontrol -o show node failed (rc {ran.rc}): {ran.note()}")
        now, last = self.clock(), self.last_runs()
        out = []
        for node in idle_nodes(ran.stdout, self.section.partitions):
            if node in under_test or not self._in_scope(node) or not NODE_NAME.fullmatch(node):
                continue
            overdue = {
                c: now - last[(node, c.kind)] - c.every_minutes * 60.0
                for c in self.section.checks
                if (node, c.kind) in last
            }
            due = tuple(c for c in self.section.checks if (node, c.kind) not in last or overdue[c] >= 0)
            if due:
                worst = max((overdue.get(c, float("inf")) for c in due), default=0.0)
                out.append(Candidate(node=node, checks=due, overdue_s=worst))
        out.sort(key=lambda c: (-c.overdue_s, c.node))
        return out[:room]

    # -- start --------------------------------------------------------------------------------------

    def _ran(self, command: str, *args: str) -> Ran:
        return self.runner.run(self.runner.argv(command, args))

    def _record(self, kind: str, attrs: dict[str, Any]) -> Event:
        event = Event(kind=kind, t=self.clock(), source=SOURCE, attrs=attrs)
        self.store.add([event])
        return event

    def start(self, node: str, checks: tuple[ActiveCheck, ...]) -> Event:
        """Reserve ``node`` (refused by slurmctld if a job runs there), then submit the checks inside it."""
        s, t = self.section, self.clock()
        run = f"{node}-{t:.0f}"
        name = f"hpcwatch-active-{run}"
        common: dict[str, Any] = {"run": run, "node": node, "checks": [c.kind for c in checks], "reservation": name}
        minutes = s.time_limit_minutes + RESERVATION_SLACK_MINUTES
        reserve = self._ran(
            "scontrol", *checkjob.reservation_args(name, node, minutes=minutes, user=s.reservation_user)
        )
        if not reserve.ok:
            why = "the controller refused the reservation (a job runs there, or it is reserved): nothing submitted"
            return self._record(EventKind.ACTIVE_RUN, common | _ran_attrs(reserve) | {"step": "refused", "why": why})
        out_dir = Path(s.work_dir) / run
        script = out_dir / "check.sh"
        why = f"active checks {', '.join(c.kind for c in checks)} on idle node {node}, reservation {name}"
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            script.write_text(checkjob.script([spec(c) for c in checks], out_dir, why=f"collect {why}"))
        except OSError as err:
            self._ran("scontrol", "delete", f"reservationname={name}")
            raise ConfigError(f"{s.work_dir}: cannot write the check job's folder: {err.strerror or err}") from err
        extra = ("--exclusive", f"--time={max(1, round(s.time_limit_minutes))}")
        ran = self._ran(
            "sbatch", *checkjob.sbatch_args(script, reservation=name, node=node, partition=s.partition, extra=extra)
        )
        job = checkjob.job_id(ran)
        if not job:
            self._ran("scontrol", "delete", f"reservationname={name}")
            return self._record(EventKind.ACTIVE_RUN, common | _ran_attrs(ran) | {"step": "failed", "why": why})
        undo = [
            self.runner.argv("scancel", (job,)),
            self.runner.argv("scontrol", ("delete", f"reservationname={name}")),
        ]
        attrs = common | _ran_attrs(ran) | {"step": "submit", "why": why, "job": job, "dir": str(out_dir)}
        return self._record(EventKind.ACTIVE_RUN, attrs | {"undo": [list(u) for u in undo]})

    # -- poll ---------------------------------------------------------------------------------------

    def poll(self) -> list[Event]:
        """The results of every check job that has ended (or was cancelled for outliving its reservation)."""
        by_kind = {c.kind: c for c in self.section.checks}
        out = []
        for run in self.in_flight():
            a = run.attrs
            job, out_dir = str(a.get("job", "")), Path(str(a.get("dir", "")))
            problems: list[str] = []
            # A job still in the queue is running, or ending: its script wrote "done" but slurmctld has not let it
            # go yet, and until then its reservation cannot be deleted (left behind for its 7 minutes, seen under
            # load). Its results are read at the next poll after it has left.
            if checkjob.queued(self.runner, job):
                deadline_s = (self.section.time_limit_minutes + RESERVATION_SLACK_MINUTES) * 60.0
                if self.clock() - run.t < deadline_s:
                    continue
                ran = self._ran("scancel", job)
                problems.append(f"check job {job} still queued when its reservation ended: cancelled (rc {ran.rc})")
            node = str(a.get("node"))
            specs = [spec(by_kind[k]) if k in by_kind else CheckSpec(kind=k, program="") for k in a.get("checks") or ()]
            events, unread = checkjob.read_results(out_dir, node, specs)
            if events:
                self.store.add(events)  # the health rules see them from now on
            outcome = checkjob.judge_results(events, problems + unread, node, link=self.section.link)
            self._ran("scontrol", "delete", f"reservationname={a.get('reservation')}")
            attrs = {
                "run": a.get("run"),
                "node": node,
                "job": job,
                "passed": outcome.passed,
                "verdict": outcome.verdict,
                "reason": outcome.reason,
                "checks": list(outcome.checks),
                "problems": problems + unread,
                "dir": str(out_dir),
            }
            out.append(self._record(EventKind.ACTIVE_RESULT, attrs))
        return out


def _ran_attrs(ran: Ran) -> dict[str, Any]:
    return {"argv": list(ran.argv), "rc": ran.rc, "output": ran.note()}
