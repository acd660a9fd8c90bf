"""The check job: what both remediation (``act/remediate.py``) and the scheduled active tests
(``collect/active.py``) submit to Slurm, read back and judge.

    specs ─ script() ─ WORK/ID/check.sh ─ sbatch_args() ─ sbatch ─ (job runs on the node: outputs, then done)
    queued(): squeue still names it ─ read_results(): sources.healthtools readers ─ judge_results(): health rules

A ``CheckSpec`` is one program the job runs: ``dcgmi_diag`` (``dcgmi diag -r LEVEL -j``), ``nccl_tests``
(``all_reduce_perf ARGS`` — rccl-tests' ``all_reduce_perf`` prints the same table, so the same spec runs it on
AMD nodes), ``ib_write_bw`` (a loopback through the HCA: a server, then a client to it). Each writes its
output file, its stderr and its exit status in the job's folder; ``done`` is the last thing the job writes.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hpcwatch.act.runner import Ran, Runner
from hpcwatch.analysis.health import active_checks, judge
from hpcwatch.errors import HpcwatchError, one_line
from hpcwatch.records import Event
from hpcwatch.sources.healthtools import read_dcgmi_diag, read_ib_write_bw, read_nccl_tests

__all__ = [
    "CHECK_KINDS",
    "CheckKind",
    "CheckSpec",
    "ENDED_STATES",
    "Outcome",
    "RESULT_FILES",
    "judge_results",
    "queued",
    "read_results",
    "reservation_args",
    "sbatch_args",
    "script",
]

CheckKind = Literal["dcgmi_diag", "nccl_tests", "ib_write_bw"]
CHECK_KINDS: tuple[CheckKind, ...] = ("dcgmi_diag", "nccl_tests", "ib_write_bw")
#: What each check writes in the job's folder (its output file; ``.err`` and ``.rc`` beside it).
RESULT_FILES: dict[CheckKind, str] = {
    "dcgmi_diag": "dcgmi_diag.json",
    "nccl_tests": "all_reduce_perf.out",
    "ib_write_bw": "ib_write_bw.out",
}
#: squeue's states of a job that has ended (squeue(1), "JOB STATE CODES").
ENDED_STATES = frozenset(
    ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT")
)


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckSpec:
    kind: CheckKind
    program: str
    """The program as the node runs it (a path, or a name on the node's PATH)."""
    level: int = 1
    """dcgmi_diag: ``dcgmi diag -r LEVEL``."""
    args: tuple[str, ...] = ()
    """nccl_tests: all_reduce_perf's arguments, e.g. ``-b 8 -e 1G -f 2 -g 8``."""
    device: str = "mlx5_0"
    """ib_write_bw: ``-d DEVICE``."""

    def lines(self) -> list[str]:
        """The script lines that run it and keep its output, stderr and exit status."""
        q = shlex.quote
        out = RESULT_FILES[self.kind]
        stem = out.rsplit(".", 1)[0]
        if self.kind == "dcgmi_diag":
            return [f"{q(self.program)} diag -r {self.level} -j > {out} 2> {stem}.err", f"echo $? > {stem}.rc"]
        if self.kind == "nccl_tests":
            args = " ".join(q(a) for a in self.args)
            return [f"{q(self.program)} {args} > {out} 2> {stem}.err", f"echo $? > {stem}.rc"]
        ib = f"{q(self.program)} -d {q(self.device)} --report_gbits"
        return [
            "# ib_write_bw loops back through the HCA: a server, then a client to it",
            f"{ib} > {stem}.server.out 2>&1 &",
            "server=$!",
            "sleep 1",
            f"{ib} localhost > {out} 2> {stem}.err",
            f"echo $? > {stem}.rc",
            'wait "$server"',
        ]


def script(specs: Sequence[CheckSpec], out_dir: Path, *, why: str) -> str:
    """The batch script: each check on the node, its output in ``out_dir``, then a ``done`` file."""
    body = [line for spec in specs for line in spec.lines()]
    return "\n".join(
        ["#!/bin/sh", f"# hpcwatch: {one_line(why)}", f"cd {shlex.quote(str(out_dir))} || exit 1", "hostname > node"]
        + body
        + ["touch done", ""]
    )


def reservation_args(name: str, node: str, *, minutes: float, user: str, flags: str = "") -> tuple[str, ...]:
    """``scontrol create reservation`` of ``node`` from now. Without ``ignore_jobs`` in ``flags`` slurmctld
    refuses a node that runs a job ("Requested nodes are busy"): the reservation is then a guard, decided
    atomically by the controller, that no job shares the node with the checks."""
    return (
        "create",
        "reservation",
        f"reservationname={name}",
        f"nodes={node}",
        "starttime=now",
        f"duration={max(1, round(minutes))}",
        f"users={user}",
        *([f"flags={flags}"] if flags else []),
    )


def sbatch_args(
    script_path: Path, *, reservation: str, node: str, partition: str = "", extra: Iterable[str] = ()
) -> list[str]:
    """The check job's sbatch arguments: one node, that node, inside the reservation; output in its folder."""
    return [
        "--parsable",
        f"--reservation={reservation}",
        f"--nodelist={node}",
        "--nodes=1",
        "--job-name=hpcwatch-check",
        f"--output={script_path.parent}/slurm-%j.out",
        *([f"--partition={partition}"] if partition else []),
        *extra,
        str(script_path),
    ]


def job_id(ran: Ran) -> str:
    """The job id ``sbatch --parsable`` printed (``ID`` or ``ID;CLUSTER``), empty when it failed."""
    return ran.stdout.strip().split(";")[0] if ran.ok else ""


def queued(runner: Runner, job: str) -> bool:
    """squeue names the job in a state that is not an end (it shows an ended job until MinJobAge passes;
    then it says "Invalid job id": rc 1)."""
    ran = runner.run(runner.argv("squeue", ("-h", "-j", job, "-o", "%T")))
    state = ran.stdout.strip().split("\n", 1)[0].strip()
    return ran.ok and bool(state) and state not in ENDED_STATES


def _reader(spec: CheckSpec, node: str) -> Callable[[Path], Iterator[Event]]:
    if spec.kind == "dcgmi_diag":
        return lambda p: read_dcgmi_diag(p, node=node, level=spec.level)
    if spec.kind == "nccl_tests":
        return lambda p: read_nccl_tests(p, node=node)
    return lambda p: read_ib_write_bw(p, node=node)


def read_results(out_dir: Path, node: str, specs: Sequence[CheckSpec]) -> tuple[list[Event], list[str]]:
    """The check job's outputs as events (``node`` set), and what is missing or unreadable (one line each)."""
    events: list[Event] = []
    problems: list[str] = []
    for spec in specs:
        name = RESULT_FILES[spec.kind]
        path = out_dir / name
        if not path.is_file() or path.stat().st_size == 0:
            problems.append(f"{name}: no output")
            continue
        try:
            events += list(_reader(spec, node)(path))
        except HpcwatchError as err:
            problems.append(one_line(str(err)))
    return events, problems


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    passed: bool
    verdict: str
    reason: str
    checks: tuple[dict[str, Any], ...]


def judge_results(events: list[Event], problems: list[str], node: str, *, link: str) -> Outcome:
    """The health rules' active checks on the results: a drain verdict, or a check that gave nothing, fails."""
    report = judge(active_checks(events, link=link), events=events, nodes=[node])
    health = report.node(node)
    verdict = health.verdict if health is not None else "ok"
    checks = tuple(c.to_dict() for c in health.checks) if health is not None else ()
    reasons = ([health.reason()] if health is not None and verdict != "ok" else []) + problems
    passed = verdict != "drain" and not problems
    return Outcome(
        passed=passed, verdict=verdict if not problems else "drain", reason="; ".join(reasons), checks=checks
    )
