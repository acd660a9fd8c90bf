"""The twin's Slurm, for ``hpcwatch act``'s remediation in ``hpcwatch demo``: the commands the actor runs,
answered in this process from the twin's state, in the words real Slurm prints where the actor reads them.

``answer(argv)`` gives (exit status, stdout, stderr): what ``act.runner.Runner(in_process=)`` takes (the twin sits
below ``act`` and does not import it). ``health_check(verdicts)`` is slurmd's HealthCheckProgram.

    health_check(verdicts)      deploy/slurm/healthcheck: a node whose health verdict turns drain is drained,
                                Reason="hpcwatch: drain: N: <the verdict's reason>"
    scontrol -o show node [N]   one line a node: NodeName=N ... State=IDLE+DRAIN ... Reason=... [root@T]
    scontrol update nodename=N state=resume | state=drain reason=R | reason=R
    scontrol create reservation reservationname=R nodes=N starttime=now duration=MIN users=U [flags=F]
    scontrol delete reservationname=R
    sbatch [--parsable] --reservation=R --nodelist=N ... SCRIPT        prints the job id
    squeue [-h] -j ID -o %T     PENDING, RUNNING; COMPLETED or CANCELLED for MinJobAge; then "Invalid job id"
    scancel ID

The check job starts once its node is not drained (Slurm allocates no drained node) and runs as long, in
simulated time, as its programs take (``DIAG_RUN_S``, ``PROGRAM_RUN_S``). At its end the twin runs its script
as the node's shell would, in the script's own folder only: each ``PROGRAM ARGS > OUT 2> ERR`` line runs the
twin's stand-in of ``dcgmi``, ``all_reduce_perf`` or ``ib_write_bw``, which prints the real format (the writers
of twin/host_faults.py and twin/assess_scenarios.py). ``dcgmi diag`` fails on the GPUs the scenarios'
``diag_failures`` name at the job's end: the check passes once the fault has cleared, fails while it persists.
Every time is the twin's simulated clock; nothing waits on the wall clock.

Where it departs from Slurm, on purpose:

- the health check drains once per run of drain verdicts of a node. The real script drains again at every
  HealthCheckInterval while the verdict stays drain, so it would drain a node the remediation just resumed
  into its reservation, on the very evidence the check job is about to answer;
- the node states are this controller's own: the twin's job scheduler (twin/workload.py) does not see them,
  so a node drained here may still run the twin's jobs (Slurm would let them finish, and start no new one);
- the controller moves when it is asked (a command, a health check): a job that ended since is ended then, as of
  its own end time, and its files appear then; the actor asks squeue before it reads them, as it does of Slurm;
- the stand-in ``dcgmi diag`` reports the same three tests at every ``-r`` level (``host_faults.DIAG_TESTS``),
  and ``all_reduce_perf`` on one node prints the twin's two-node busbw (``assess_scenarios._NCCL_GB_S``), below
  what NVLink gives one node and above the health rule's floor: the diag is what tells a fault here.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from hpcwatch.twin.assess_scenarios import ib_write_bw_text, nccl_tests_text
from hpcwatch.twin.host_faults import dcgmi_diag_json
from hpcwatch.twin.live import LiveTwin

__all__ = [
    "Answer",
    "TwinSlurm",
    "DIAG_RUN_S",
    "PROGRAM_RUN_S",
    "MIN_JOB_AGE_S",
    "HEALTHCHECK_REASON_MAX",
    "FIRST_CHECK_JOB_ID",
]

#: How long ``dcgmi diag -r N`` runs, simulated seconds, by level. Levels 1-3: "normally lasting seconds",
#: "approximately two minutes", "approximately 15 minutes" (https://docs.nvidia.com/datacenter/dcgm/latest/
#: reference/command-line-reference/dcgmi/dcgmi-diag.html); ours: 30 s for "seconds", and an hour for level 4,
#: which that page calls "extended, longer-running" without a figure.
DIAG_RUN_S = {1: 30.0, 2: 120.0, 3: 900.0, 4: 3600.0}
#: The other stand-ins' run times, simulated seconds. Ours: all_reduce_perf from 8 B to 1 GB and an
#: ib_write_bw loopback (5,000 iterations, perftest's default) each take seconds on a sound node.
PROGRAM_RUN_S = {"all_reduce_perf": 30.0, "ib_write_bw": 5.0}
#: How long squeue still shows an ended job: slurm.conf's MinJobAge default
#: (https://slurm.schedmd.com/slurm.conf.html#OPT_MinJobAge).
MIN_JOB_AGE_S = 300.0
#: What a drain reason keeps: deploy/slurm/healthcheck's MAX_REASON.
HEALTHCHECK_REASON_MAX = 240
#: Check jobs are numbered from here, far above the twin workload's ids (twin/workload.py FIRST_JOB_ID, 4101).
FIRST_CHECK_JOB_ID = 900001
#: Who a drain reason names (``[root@T]``): slurmd runs the health check as root; the actor runs as an admin.
REASON_USER = "root"
#: Ended job states (squeue(1), JOB STATE CODES) this controller gives.
_ENDED = ("COMPLETED", "CANCELLED", "FAILED")


class Answer(NamedTuple):
    rc: int
    stdout: str
    stderr: str


def _error(text: str) -> Answer:
    return Answer(1, "", text + "\n")


@dataclass(slots=True)
class _Node:
    drained: bool = False
    reason: str = ""
    reason_by: str = ""
    """``root@2026-12-03T14:23:09``: who set the reason and when (UTC), as scontrol prints it in brackets."""
    verdict_run: bool = False
    """The health check drained it for the run of drain verdicts in force (it does not drain it twice)."""


@dataclass(frozen=True, slots=True)
class _Reservation:
    node: str
    end: float
    flags: frozenset[str]


@dataclass(slots=True)
class _Job:
    id: str
    node: str
    script: Path
    text: str
    """The script as sbatch read it (slurmctld keeps that copy: a later edit of the file changes nothing)."""
    reservation: str
    run_s: float
    state: str = "PENDING"
    start: float | None = None
    end: float | None = None


class TwinSlurm:
    """The twin's controller for the actor: ``answer(argv)``; ``health_check(verdicts)`` at each health run."""

    def __init__(self, live: LiveTwin) -> None:
        self.live = live
        self._lock = threading.Lock()
        with live.lock:
            cluster = live.twin.cluster
        self._nodes = {n.name: _Node() for n in cluster.nodes}
        self._gpus = {n.name: len(n.gpus) for n in cluster.nodes}
        self._model = {n.name: n.gpus[0].spec.name if n.gpus else "" for n in cluster.nodes}
        self._partitions = ",".join(cluster.scheduler.partitions)
        self._reservations: dict[str, _Reservation] = {}
        self._jobs: dict[str, _Job] = {}
        self._next_job = FIRST_CHECK_JOB_ID

    def now(self) -> float:
        """The twin's simulated clock."""
        return self.live.twin.now

    # -- the health check -----------------------------------------------------------------------------

    def health_check(self, verdicts: Iterable[Mapping[str, Any]]) -> None:
        """One health run's verdicts (``reports.health.verdict_event_attrs``: node, verdict, reason)."""
        with self._lock:
            t = self.now()
            self._settle(t)
            for v in verdicts:
                node = self._nodes.get(str(v.get("node", "")))
                if node is None:
                    continue
                if v.get("verdict") != "drain":
                    node.verdict_run = False
                elif not node.verdict_run:
                    node.verdict_run = True
                    if not node.drained:
                        reason = f"hpcwatch: drain: {v['node']}: {v.get('reason', '')}"
                        self._set_reason(node, " ".join(reason.split())[:HEALTHCHECK_REASON_MAX], t, drain=True)

    # -- the commands ---------------------------------------------------------------------------------

    def answer(self, argv: Sequence[str]) -> Answer:
        """Run ``argv`` (``scontrol``, ``sbatch``, ``squeue``, ``scancel``, by the program's name)."""
        program = Path(argv[0]).name if argv else ""
        handler = {
            "scontrol": self._scontrol,
            "sbatch": self._sbatch,
            "squeue": self._squeue,
            "scancel": self._scancel,
        }.get(program)
        if handler is None:
            return Answer(127, "", f"cannot run {program or '(nothing)'}: the twin's Slurm has no such command\n")
        with self._lock:
            self._settle(self.now())
            return handler(list(argv[1:]))

    def _scontrol(self, args: list[str]) -> Answer:
        if args[:3] == ["-o", "show", "node"] and len(args) <= 4:
            return self._show_node(args[3:])
        if args[:1] == ["update"]:
            return self._update(_pairs(args[1:]))
        if args[:2] == ["create", "reservation"]:
            return self._create_reservation(_pairs(args[2:]))
        if args[:1] == ["delete"]:
            return self._delete_reservation(_pairs(args[1:]).get("reservationname", ""))
        return _error(f"invalid keyword: {args[0] if args else ''}")

    def _show_node(self, names: list[str]) -> Answer:
        if names and names[0] not in self._nodes:
            return Answer(1, f"Node {names[0]} not found\n", "")  # src/scontrol/info_node.c: on stdout
        return Answer(0, "".join(self._node_line(n) + "\n" for n in (names or self._nodes)), "")

    def _node_line(self, name: str) -> str:
        node = self._nodes[name]
        state = self._base_state(name) + ("+DRAIN" if node.drained else "")
        if any(r.node == name and "maint" in r.flags for r in self._reservations.values()):
            state += "+MAINT"
        fields = [
            f"NodeName={name}",
            "Arch=x86_64",
            f"Gres=gpu:{self._gpus[name]}",
            f"NodeAddr={name}",
            f"NodeHostName={name}",
            f"State={state}",
            f"Partitions={self._partitions}",
        ]
        if node.reason:
            fields.append(f"Reason={node.reason} [{node.reason_by}]")
        return " ".join(fields)

    def _base_state(self, name: str) -> str:
        """IDLE, MIXED or ALLOCATED: the twin's jobs on the node's GPUs, or a check job holding them all."""
        if any(j.node == name and j.state == "RUNNING" for j in self._jobs.values()):
            return "ALLOCATED"
        with self.live.lock:
            free = len(self.live.twin.scheduler.free[name])
        return "IDLE" if free >= self._gpus[name] else "ALLOCATED" if free == 0 else "MIXED"

    def _update(self, kv: dict[str, str]) -> Answer:
        name = kv.get("nodename", "")
        node = self._nodes.get(name)
        if node is None:
            return _error("slurm_update error: Invalid node name specified")
        state = kv.get("state", "").lower()
        if state == "resume":
            if not node.drained:
                return _error("slurm_update error: Invalid node state specified")
            node.drained, node.reason, node.reason_by = False, "", ""
        elif state == "drain":
            if not kv.get("reason"):
                return _error("You must specify a reason when DOWNING or DRAINING a node. Request denied")
            self._set_reason(node, kv["reason"], self.now(), drain=True)
        elif not state and "reason" in kv:
            self._set_reason(node, kv["reason"], self.now(), drain=node.drained)
        else:
            return _error("slurm_update error: Invalid node state specified")
        return Answer(0, "", "")

    def _set_reason(self, node: _Node, reason: str, t: float, *, drain: bool) -> None:
        node.drained, node.reason = drain, reason
        node.reason_by = f"{REASON_USER}@{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(t))}"

    def _create_reservation(self, kv: dict[str, str]) -> Answer:
        name, node = kv.get("reservationname", ""), kv.get("nodes", "")
        flags = frozenset(f.lower() for f in kv.get("flags", "").split(",") if f)
        if not name:
            return _error("Error creating the reservation: Requested reservation is invalid")
        if name in self._reservations:
            return _error("Error creating the reservation: Duplicate reservation name")
        if node not in self._nodes:
            return _error("Error creating the reservation: Invalid node name specified")
        if not kv.get("users"):
            return _error("Error creating the reservation: Reservation request lacks users or accounts")
        try:
            minutes = float(kv.get("duration", ""))
        except ValueError:
            return _error("Error creating the reservation: Invalid time specified")
        if "ignore_jobs" not in flags and self._base_state(node) != "IDLE":
            return _error("Error creating the reservation: Requested nodes are busy")
        self._reservations[name] = _Reservation(node=node, end=self.now() + minutes * 60.0, flags=flags)
        return Answer(0, f"Reservation created: {name}\n", "")

    def _delete_reservation(self, name: str) -> Answer:
        if name not in self._reservations:
            return _error(f"delete_reservation {name}: Requested reservation is invalid")
        if any(j.reservation == name and j.state not in _ENDED for j in self._jobs.values()):
            return _error(f"delete_reservation {name}: Requested reservation is in use")
        del self._reservations[name]
        return Answer(0, "", "")

    def _sbatch(self, args: list[str]) -> Answer:
        options = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
        script = Path(args[-1]) if args and not args[-1].startswith("-") else None
        if script is None:
            return _error("sbatch: error: Batch job submission failed: Job script not specified")
        name, node = options.get("reservation", ""), options.get("nodelist", "")
        reservation = self._reservations.get(name)
        if name and reservation is None:
            return _error("sbatch: error: Batch job submission failed: Requested reservation is invalid")
        if node not in self._nodes or (reservation is not None and reservation.node != node):
            return _error("sbatch: error: Batch job submission failed: Requested node configuration is not available")
        try:
            text = script.read_text()
        except (OSError, UnicodeDecodeError):
            return _error(f"sbatch: error: Unable to open file {script}")
        job = _Job(id=str(self._next_job), node=node, script=script, text=text, reservation=name, run_s=_run_s(text))
        self._next_job += 1
        self._jobs[job.id] = job
        self._settle(self.now())
        said = job.id if "--parsable" in args else f"Submitted batch job {job.id}"
        return Answer(0, said + "\n", "")

    def _squeue(self, args: list[str]) -> Answer:
        header, job_id, fmt = True, "", "%T"
        words = iter(args)
        for word in words:
            if word == "-h":
                header = False
            elif word == "-j":
                job_id = next(words, "")
            elif word == "-o":
                fmt = next(words, "")
            else:
                return _error(f"squeue: error: the twin's squeue reads -h, -j ID and -o %T only, not {word!r}")
        if fmt != "%T":
            return _error(f"squeue: error: the twin's squeue prints -o %T only, not {fmt!r}")
        job = self._jobs.get(job_id)
        if job is None or (job.end is not None and self.now() - job.end > MIN_JOB_AGE_S):
            return _error("slurm_load_jobs error: Invalid job id specified")
        return Answer(0, ("STATE\n" if header else "") + job.state + "\n", "")

    def _scancel(self, args: list[str]) -> Answer:
        job = self._jobs.get(args[-1] if args else "")
        if job is None:
            return _error(
                f"scancel: error: Kill job error on job id {args[-1] if args else ''}: Invalid job id specified"
            )
        if job.state in _ENDED:
            return _error(
                f"scancel: error: Kill job error on job id {job.id}: Job/step already completing or completed"
            )
        job.state, job.end = "CANCELLED", self.now()
        return Answer(0, "", "")

    # -- the check jobs ---------------------------------------------------------------------------------

    def _settle(self, now: float) -> None:
        """End the reservations whose time is over; start the pending jobs whose node is no longer drained; end
        those whose run is over (their script runs then, as of their end)."""
        for name in [n for n, r in self._reservations.items() if r.end <= now]:
            del self._reservations[name]  # its duration is over: slurmctld ends it
        for job in self._jobs.values():
            if job.state == "PENDING" and not self._nodes[job.node].drained:
                job.state, job.start = "RUNNING", now
            if job.state == "RUNNING" and job.start is not None and now >= job.start + job.run_s:
                job.end = job.start + job.run_s
                job.state = "COMPLETED" if self._run_script(job, job.end) else "FAILED"

    def _run_script(self, job: _Job, t: float) -> bool:
        """The batch script's lines as sh runs them; False when it could not (it ``cd``s to another folder)."""
        folder = job.script.parent
        rc = 0
        for line in job.text.splitlines():
            words = shlex.split(line, comments=True)
            words = words[: words.index("||")] if "||" in words else words
            if not words or words[0] in ("sleep", "wait") or "=" in words[0]:
                continue
            if words[0] == "cd":
                if len(words) < 2 or Path(words[1]) != folder:
                    return False  # the twin writes in the script's own folder only
                continue
            if words[0] == "touch":
                _put(folder, words[-1], "")
                continue
            args, out, err = _redirects(words)
            if not args:
                continue
            if args[0] == "echo":
                text = " ".join(str(rc) if a == "$?" else a for a in args[1:]) + "\n"
                rc, stdout, stderr = 0, text, ""
            elif args[0] == "hostname":
                rc, stdout, stderr = 0, job.node + "\n", ""
            else:
                rc, stdout, stderr = self._program(args, job.node, t)
            if out:
                _put(folder, out, stdout)
            if err:
                _put(folder, err, stderr)
        return True

    def _program(self, args: list[str], node: str, t: float) -> tuple[int, str, str]:
        """The twin's stand-in of a check program on ``node`` at ``t``: (exit status, stdout, stderr)."""
        program = Path(args[0]).name
        gpus = self._gpus[node]
        if program == "dcgmi":
            failing: dict[int, tuple[str, dict[str, Any]]] = {}
            with self.live.lock:
                for scenario in self.live.twin.scenarios:
                    failing.update(scenario.diag_failures(node=node, t=t))
            return 0, dcgmi_diag_json(gpus, failing), ""
        if program == "all_reduce_perf":
            per_node = int(_option(args, "-g") or gpus)
            return 0, nccl_tests_text([node], per_node, self._model[node]), ""
        if program == "ib_write_bw":
            # a client names its server (the loopback's "localhost"); a server alone prints nothing
            client = len(args) > 1 and not args[-1].startswith("-") and args[-2] not in ("-d", "--ib-dev")
            return 0, ib_write_bw_text(_option(args, "-d") or "mlx5_0") if client else "", ""
        return 127, "", f"sh: 1: {args[0]}: not found\n"


def _pairs(args: Iterable[str]) -> dict[str, str]:
    """scontrol's ``key=value`` arguments, keys in lower case (scontrol reads them so)."""
    return {k.lower(): v for k, _, v in (a.partition("=") for a in args)}


def _option(args: Sequence[str], flag: str) -> str:
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else ""


def _redirects(words: list[str]) -> tuple[list[str], str, str]:
    """A command's words, its stdout file and its stderr file (``> F``, ``2> F``; ``2>&1`` and ``&`` dropped)."""
    args, out, err = [], "", ""
    it = iter(words)
    for word in it:
        if word == ">":
            out = next(it, "")
        elif word == "2>":
            err = next(it, "")
        elif word not in ("2>&1", "&"):
            args.append(word)
    return args, out, err


def _put(folder: Path, name: str, text: str) -> None:
    if Path(name).name == name and name not in ("", ".", ".."):
        (folder / name).write_text(text)


def _run_s(script: str) -> float:
    """How long the job runs: the diag's level and each other stand-in program the script names."""
    total = 0.0
    for line in script.splitlines():
        words = shlex.split(line, comments=True)
        program = Path(words[0]).name if words else ""
        if program == "dcgmi":
            level = _option(words, "-r")
            total += DIAG_RUN_S.get(int(level) if level.isdigit() else 1, DIAG_RUN_S[1])
        elif program in PROGRAM_RUN_S and "&" not in words:  # the ib_write_bw server runs beside its client
            total += PROGRAM_RUN_S[program]
    return total
