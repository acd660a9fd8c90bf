"""The twin's Slurm (twin/slurmctl.py) answers the actor's commands as Slurm would, read back by the actor's own
code: ``remediate.node_state`` on ``scontrol -o show node``, ``checkjob`` for the reservation, sbatch and squeue,
the real readers and health rules on what the check job wrote. The twin is stepped by hand (``LiveTwin.step``,
20 simulated seconds a step): no thread, no wall clock.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from hpcwatch.act import checkjob, remediate
from hpcwatch.act.config import ActConfig, RemediatePolicy
from hpcwatch.act.runner import Ran, Runner
from hpcwatch.model.cluster import reference_cluster
from hpcwatch.twin.live import LiveTwin
from hpcwatch.twin.slurmctl import DIAG_RUN_S, FIRST_CHECK_JOB_ID, MIN_JOB_AGE_S, PROGRAM_RUN_S, TwinSlurm

STEP_S = 20.0
"""Simulated seconds a ``LiveTwin.step()`` moves (tick 1 s x speed 20)."""
XID_VERDICT = {"node": "node2", "verdict": "drain", "reason": "xid: XID 79 on GPU 3: GPU has fallen off the bus"}


class _Nowhere:
    """A sink for the live twin's ticks: these tests read the twin's Slurm, not the store."""

    def add(self, records):
        pass

    def add_sample_table(self, table):
        pass

    def add_span_table(self, table):
        pass

    @contextlib.contextmanager
    def transaction(self):
        yield self


class Bench:
    def __init__(self, *scenarios: str) -> None:
        self.live = LiveTwin(_Nowhere(), reference_cluster(), seed=0, scenarios=scenarios, speed=STEP_S)
        self.slurm = TwinSlurm(self.live)
        self.runner = Runner(ActConfig().commands, timeout_s=30.0, in_process=self.slurm.answer)

    def run(self, command: str, *args: str) -> Ran:
        return self.runner.run(self.runner.argv(command, args))

    def node(self, name: str) -> remediate.NodeState:
        return remediate.node_state(self.run("scontrol", "-o", "show", "node", name).stdout, name)

    def steps(self, simulated_s: float) -> None:
        for _ in range(int(-(-simulated_s // STEP_S))):
            self.live.step()


@pytest.fixture
def bench() -> Bench:
    return Bench()


def test_a_drain_verdict_drains_the_node_with_the_reason_the_actor_takes_for_hpcwatchs(bench):
    assert "no longer drained" in bench.node("node2").not_ours()  # before: in service
    bench.slurm.health_check([XID_VERDICT, {"node": "node1", "verdict": "ok", "reason": ""}])
    node2 = bench.node("node2")
    assert "DRAIN" in node2.state.split("+") and node2.not_ours() == ""
    assert node2.reason.startswith("hpcwatch: drain: node2: xid: XID 79 on GPU 3") and node2.reason.endswith("]")
    assert "DRAIN" not in bench.node("node1").state.split("+")
    every = bench.run("scontrol", "-o", "show", "node")
    assert every.ok and [line.split()[0] for line in every.stdout.splitlines()] == ["NodeName=node1", "NodeName=node2"]


def test_a_node_scontrol_does_not_know_is_not_found(bench):
    ran = bench.run("scontrol", "-o", "show", "node", "node9")
    assert ran.rc == 1 and ran.stdout == "Node node9 not found\n"
    assert remediate.node_state(ran.stdout, "node9").not_ours() == "scontrol does not know it"
    update = bench.run("scontrol", "update", "nodename=node9", "state=resume")
    assert update.rc == 1 and update.note() == "slurm_update error: Invalid node name specified"


def test_a_busy_node_gets_a_reservation_only_with_ignore_jobs(bench):
    busy = next(n for n in ("node1", "node2") if not bench.node(n).state.startswith("IDLE"))  # the twin's jobs
    plain = checkjob.reservation_args("r1", busy, minutes=60, user="root")
    refused = bench.run("scontrol", *plain)
    assert refused.rc == 1 and refused.note() == "Error creating the reservation: Requested nodes are busy"
    made = bench.run(
        "scontrol", *checkjob.reservation_args("r1", busy, minutes=60, user="root", flags="maint,ignore_jobs")
    )
    assert made.ok and made.stdout == "Reservation created: r1\n"
    assert bench.node(busy).state.endswith("+MAINT")
    assert "Duplicate reservation name" in bench.run("scontrol", *plain).note()
    assert bench.run("scontrol", "delete", "reservationname=r1").ok
    assert "Requested reservation is invalid" in bench.run("scontrol", "delete", "reservationname=r1").note()
    assert "MAINT" not in bench.node(busy).state


@pytest.mark.parametrize(
    ("argv", "rc", "said"),
    [
        (("scontrol", "frobnicate"), 1, "invalid keyword: frobnicate"),  # scontrol's word for a command it lacks
        (("squeue", "--me"), 1, "squeue: error:"),
        (("scancel", "4242"), 1, "Kill job error on job id 4242: Invalid job id specified"),
        (("scontrol", "update", "nodename=node2", "state=resume"), 1, "Invalid node state specified"),  # not drained
        (("scontrol", "update", "nodename=node2", "state=drain"), 1, "You must specify a reason"),
        (("sbatch", "--parsable", "--reservation=none", "--nodelist=node2", "/nonexistent/check.sh"), 1, "reservation"),
    ],
)
def test_a_command_slurm_would_refuse_gives_its_error_and_a_nonzero_status(bench, argv, rc, said):
    ran = bench.run(*argv)
    assert ran.rc == rc and not ran.ok and said in ran.note()


def test_a_program_the_twin_does_not_play_cannot_run(bench):
    ran = bench.runner.run(("srun", "hostname"))
    assert ran.rc == 127 and "srun" in ran.note()


def test_the_health_check_drains_once_per_run_of_drain_verdicts(bench):
    bench.slurm.health_check([XID_VERDICT])
    assert bench.run("scontrol", "update", "nodename=node2", "state=resume").ok
    bench.slurm.health_check([XID_VERDICT])  # the same run: the node resumed into its reservation stays so
    assert "DRAIN" not in bench.node("node2").state
    bench.slurm.health_check([{**XID_VERDICT, "verdict": "ok"}])
    bench.slurm.health_check([XID_VERDICT])  # a new run of drain verdicts: drained again
    assert bench.node("node2").not_ours() == ""


def test_an_operators_reason_makes_the_node_theirs(bench):
    bench.slurm.health_check([XID_VERDICT])
    assert bench.run("scontrol", "update", "nodename=node2", "reason=PSU swap, ticket 42").ok
    assert "an operator holds it" in bench.node("node2").not_ours()


def _submit(bench: Bench, tmp_path: Path, name: str = "job") -> tuple[str, Path, RemediatePolicy]:
    """The remediation's own script and arguments, through a maint reservation of node2."""
    policy = RemediatePolicy(enabled=True, work_dir=str(tmp_path))
    out = tmp_path / name
    out.mkdir()
    (out / "check.sh").write_text(remediate.check_script(policy, out, reservation=f"r-{name}"))
    reserve = checkjob.reservation_args(f"r-{name}", "node2", minutes=60, user="root", flags="maint,ignore_jobs")
    assert bench.run("scontrol", *reserve).ok
    ran = bench.run("sbatch", *checkjob.sbatch_args(out / "check.sh", reservation=f"r-{name}", node="node2"))
    return checkjob.job_id(ran), out, policy


def _run(bench: Bench, job: str) -> None:
    """Past the check job's run, then squeue, as the actor asks before it reads the results (the twin's Slurm
    sees a job end when it is next asked)."""
    bench.steps(DIAG_RUN_S[1] + sum(PROGRAM_RUN_S.values()))
    assert not checkjob.queued(bench.runner, job)


def _judged(out: Path, policy: RemediatePolicy) -> checkjob.Outcome:
    events, problems = remediate.read_results(out, "node2", policy)
    assert problems == [] and {e.kind for e in events} == {"dcgm_diag", "nccl_test", "ib_write_bw"}
    return remediate.judge_results(events, problems, "node2", link=policy.link)


def test_a_check_job_runs_on_the_twins_clock_and_writes_the_real_formats(bench, tmp_path):
    job, out, policy = _submit(bench, tmp_path)
    assert int(job) >= FIRST_CHECK_JOB_ID and checkjob.queued(bench.runner, job)
    assert bench.node("node2").state.startswith("ALLOCATED")  # the check holds the node's GPUs
    run_s = DIAG_RUN_S[policy.diag_level] + sum(PROGRAM_RUN_S.values())
    bench.steps(run_s - STEP_S)
    assert checkjob.queued(bench.runner, job) and not (out / "done").exists()  # not before its simulated end
    bench.steps(STEP_S)
    assert not checkjob.queued(bench.runner, job) and (out / "done").exists()
    assert bench.run("squeue", "-h", "-j", job, "-o", "%T").stdout == "COMPLETED\n"
    assert (out / "node").read_text() == "node2\n" and (out / "dcgmi_diag.rc").read_text() == "0\n"
    outcome = _judged(out, policy)
    assert outcome.passed and outcome.verdict == "ok"
    assert {c["rule"]: c["verdict"] for c in outcome.checks} == {
        "dcgm_diag": "ok",
        "nccl_tests": "ok",
        "ib_write_bw": "ok",
    }
    bench.steps(MIN_JOB_AGE_S + STEP_S)  # squeue forgets an ended job after MinJobAge
    gone = bench.run("squeue", "-h", "-j", job, "-o", "%T")
    assert gone.rc == 1 and gone.note() == "slurm_load_jobs error: Invalid job id specified"


def test_a_check_fails_while_the_fault_persists_and_passes_once_it_cleared(tmp_path):
    from hpcwatch.twin.failures import SCENARIO_ONSET_S, Xid79

    bench = Bench("xid79")
    bench.steps(SCENARIO_ONSET_S + STEP_S)  # node2's GPU 3 has fallen off the bus
    job, out, policy = _submit(bench, tmp_path, "rebooting")
    _run(bench, job)
    failed = _judged(out, policy)
    assert not failed.passed and failed.verdict == "drain" and "pcie fail on GPU 3" in failed.reason
    bench.steps(Xid79.TEARDOWN_S + Xid79.REBOOT_S)  # back from its reboot
    job, out, policy = _submit(bench, tmp_path, "rebooted")
    _run(bench, job)
    assert _judged(out, policy).passed


def test_a_gpu_with_a_double_bit_error_fails_its_memory_test_for_good(tmp_path):
    from hpcwatch.twin.failures import SCENARIO_ONSET_S

    bench = Bench("diag_failed")
    bench.steps(SCENARIO_ONSET_S + 600.0)
    job, out, policy = _submit(bench, tmp_path)
    _run(bench, job)
    outcome = _judged(out, policy)
    assert not outcome.passed and "memory fail on GPU 4" in outcome.reason


def test_a_check_job_waits_while_its_node_is_drained(bench, tmp_path):
    bench.slurm.health_check([XID_VERDICT])
    job, _, _ = _submit(bench, tmp_path)
    assert bench.run("squeue", "-h", "-j", job, "-o", "%T").stdout == "PENDING\n"
    assert "in use" in bench.run("scontrol", "delete", "reservationname=r-job").note()  # its job still waits there
    assert bench.run("scontrol", "update", "nodename=node2", "state=resume").ok
    assert bench.run("squeue", "-h", "-j", job, "-o", "%T").stdout == "RUNNING\n"
    assert bench.run("scancel", job).ok and not checkjob.queued(bench.runner, job)
    assert "already completing or completed" in bench.run("scancel", job).note()


def test_a_script_that_leaves_its_folder_is_not_run(bench, tmp_path):
    out = tmp_path / "job"
    out.mkdir()
    (out / "check.sh").write_text(f"#!/bin/sh\ncd {tmp_path} || exit 1\ntouch escaped\n")
    job = checkjob.job_id(bench.run("sbatch", "--parsable", "--nodelist=node2", str(out / "check.sh")))
    bench.steps(STEP_S)
    assert bench.run("squeue", "-h", "-j", job, "-o", "%T").stdout == "FAILED\n"
    assert not (tmp_path / "escaped").exists() and not (out / "escaped").exists()
