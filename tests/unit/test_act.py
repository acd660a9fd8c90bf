"""hpcwatch act: the two policies with stand-in Slurm commands (tests/standins/slurm, which record their argv)
and stand-in check programs (tests/standins/checks, which print the real outputs of tests/data/health).

Times: samples and verdicts are UTC seconds on the data clock; the actor's clock (``now``) is the wall clock,
set by each test.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from hpcwatch import vocab
from hpcwatch.act.audit import recorded
from hpcwatch.act.config import parse_act_text
from hpcwatch.act.loop import Actor
from hpcwatch.cli import app
from hpcwatch.errors import ConfigError
from hpcwatch.notify.loop import Notifier
from hpcwatch.notify.message import Payload
from hpcwatch.records import Event, Job, Sample
from hpcwatch.store import Store
from hpcwatch.vocab import EventKind

STANDINS = Path(__file__).resolve().parents[1] / "standins"
T0 = 1_796_000_000.0
MIN = 60.0


class Recorder:
    """A channel that keeps what it was handed (the [[notify.channel]] it stands for is never connected)."""

    def __init__(self, name: str) -> None:
        self.name, self.sent = name, []

    def check(self) -> None: ...
    def close(self) -> None: ...

    def send(self, payload: Payload, *, delivery: str) -> None:
        self.sent.append(payload)


def _config(tmp_path: Path, act: str) -> str:
    slurm = STANDINS / "slurm"
    return f"""
[notify]
user_template = "{{user}}@example.org"
operators = ["ops@example.org"]

[[notify.channel]]
type = "smtp"
name = "mail"

[act]
scontrol = "{slurm / "scontrol"}"
sbatch = "{slurm / "sbatch"}"
scancel = "{slurm / "scancel"}"
squeue = "{slurm / "squeue"}"
who = "ops-test"
{act}
"""


class Bench:
    """A store, an actor over it, the stand-ins' argv log, the mails handed to the channel."""

    def __init__(self, tmp_path: Path, act: str, **env: str) -> None:
        self.tmp = tmp_path
        self.log = tmp_path / "argv.jsonl"
        self.text = _config(tmp_path, act)
        self.config, notify = parse_act_text(self.text, path="act.toml")
        self.store = Store(tmp_path / "store")
        self.mail = Recorder("mail")
        self.now = [T0]
        notifier = Notifier(self.store, notify, channels={"mail": self.mail}, clock=lambda: self.now[0])
        self.env = {**os.environ, "HPCWATCH_STANDIN_LOG": str(self.log), **env}
        self.actor = Actor(self.store, self.config, notifier=notifier, clock=lambda: self.now[0], env=self.env)

    def argv(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [orjson.loads(line) for line in self.log.read_text().splitlines()]

    def steps(self) -> list[str]:
        return [r.action.step for r in recorded(self.store)]

    def close(self) -> None:
        self.store.close()


# -- policy 1: idle allocated GPUs ------------------------------------------------------------------------

IDLE = """
[act.idle]
enabled = true
idle_minutes = 30
grace_minutes = 10
"""


def _idle_samples(store: Store, t0: float, t1: float, *, job: str = "17", gpus: tuple[int, ...] = (0, 1)) -> None:
    """GPU utilisation 0 % every 30 s on node1 for ``job`` (dcgm-exporter's labels)."""
    rows = []
    t = t0
    while t <= t1:
        for gpu in gpus:
            labels = {"Hostname": "node1", "gpu": str(gpu), "hpc_job": job, "modelName": "NVIDIA H100 80GB HBM3"}
            rows.append(Sample(metric=vocab.DCGM_FI_DEV_GPU_UTIL, labels=labels, t=t, value=0.0))
        t += 30.0
    store.add(rows)


def _job(store: Store, **kw) -> None:
    fields = dict(id="17", user="alice", account="proj-llm", partition="gpu", nodes=("node1",), gpus=2)
    store.add([Job(**{**fields, "start": T0 - MIN, "state": "RUNNING", **kw})])


@pytest.fixture
def idle(tmp_path):
    bench = Bench(tmp_path, IDLE)
    _job(bench.store)
    _idle_samples(bench.store, T0, T0 + 35 * MIN)
    bench.now[0] = T0 + 35 * MIN
    yield bench
    bench.close()


def test_idle_job_is_warned_first_and_held_only_after_the_grace_period(idle):
    first = idle.actor.run_once()
    assert [s.step for s in first.said] == ["warn"] and idle.argv() == []  # no Slurm command before the warning
    assert first.notices == 1
    to_user = [p for p in idle.mail.sent if p.to == "alice@example.org"]
    assert len(to_user) == 1 and "17" in to_user[0].subject and "hold" in to_user[0].text
    assert idle.actor.run_once().said[0].step == "wait"  # the grace period has not passed
    assert len(idle.mail.sent) == 1 + 1  # user + operators, once: the notice key is not composed again

    _idle_samples(idle.store, T0 + 35 * MIN + 30, T0 + 44 * MIN)  # 9 min more: under the 10 min grace
    idle.now[0] = T0 + 46 * MIN
    assert idle.actor.run_once().said[0].step == "wait" and idle.argv() == []

    _idle_samples(idle.store, T0 + 44 * MIN + 30, T0 + 46 * MIN)
    held = idle.actor.run_once()
    assert [s.step for s in held.said] == ["hold"]
    assert idle.argv() == [["scontrol", "requeuehold", "17"]]
    warn, hold = (r.action for r in recorded(idle.store))
    assert hold.t - warn.t >= 10 * MIN
    assert hold.who == "ops-test" and hold.rc == 0 and "warned by " + warn.id in hold.why
    assert hold.evidence["rule"] == "idle_allocated" and hold.evidence["gpus"] == ["node1/0", "node1/1"]
    assert hold.undo[1:] == ("release", "17")
    assert idle.actor.run_once().said[0].step == "skip"  # acted once: not again
    assert idle.argv() == [["scontrol", "requeuehold", "17"]]


def test_undo_of_a_hold_releases_the_job_and_is_audited(idle, tmp_path, monkeypatch, run_cli):
    monkeypatch.setenv("HPCWATCH_STANDIN_LOG", str(idle.log))  # the CLI's undo runs the recorded argv
    idle.actor.run_once()
    _idle_samples(idle.store, T0 + 35 * MIN + 30, T0 + 50 * MIN)
    idle.now[0] = T0 + 50 * MIN
    hold = idle.actor.run_once().said[0].action
    done = CliRunner().invoke(
        app, ["act", "undo", hold, "--db", str(tmp_path / "store"), "--config", str(tmp_path / "none.toml")]
    )
    assert done.exit_code == 0, done.output
    assert idle.argv()[-1] == ["scontrol", "release", "17"]
    listed = orjson.loads(CliRunner().invoke(app, ["act", "list", "--db", str(tmp_path / "store"), "--json"]).output)
    assert [(a["step"], a["undone"] is not None) for a in listed] == [("warn", False), ("hold", True)]
    assert listed[1]["undone"]["argv"][1:] == ["release", "17"]
    code, _, err = run_cli(
        ["act", "undo", hold, "--db", str(tmp_path / "store"), "--config", str(tmp_path / "none.toml")]
    )
    assert code == 2 and "was undone" in err and len(err.strip().splitlines()) == 1


def test_a_withdrawn_warning_leaves_the_job_alone_and_runs_no_command(idle, tmp_path, run_cli):
    warn = idle.actor.run_once().said[0].action
    code, out, _ = run_cli(["act", "undo", warn, "--db", str(tmp_path / "store"), "--config", str(tmp_path / "x")])
    assert code == 0 and "no command: rc 0" in out and idle.argv() == []
    _idle_samples(idle.store, T0 + 35 * MIN + 30, T0 + 60 * MIN)
    idle.now[0] = T0 + 60 * MIN  # past the grace period: it would be held
    said = idle.actor.run_once().said
    assert [s.step for s in said] == ["skip"] and f"warning {warn} withdrawn" in said[0].text
    assert idle.argv() == [] and idle.steps() == ["warn"]


def _past_grace(bench: Bench, *, warned: bool = False) -> list:
    """The warning, then the job idle past the grace period: the run that acts, what it said."""
    if not warned:
        bench.actor.run_once()  # the warning: no command
    _idle_samples(bench.store, T0 + 35 * MIN + 30, T0 + 50 * MIN)
    bench.now[0] = T0 + 50 * MIN
    return list(bench.actor.run_once().said)


def _refusing(tmp_path: Path, how: str, act: str = IDLE) -> Bench:
    bench = Bench(tmp_path, act, HPCWATCH_STANDIN_REFUSE_REQUEUE=how)
    _job(bench.store)
    _idle_samples(bench.store, T0, T0 + 35 * MIN)
    bench.now[0] = T0 + 35 * MIN
    return bench


@pytest.mark.parametrize(
    ("how", "answer", "why"),
    [
        ("disabled", "Requested operation is presently disabled for job 17", "may not be requeued"),
        ("batch", "Only batch jobs are accepted or processed for job 17", "not a batch job"),
    ],
)
def test_a_hold_slurm_refuses_is_audited_told_and_by_default_not_escalated(tmp_path, how, answer, why):
    bench = _refusing(tmp_path, how)
    bench.actor.run_once()  # the warning
    mails = len(bench.mail.sent)
    said = _past_grace(bench, warned=True)
    assert [s.step for s in said] == ["hold"] and bench.argv() == [["scontrol", "requeuehold", "17"]]
    hold = next(r.action for r in recorded(bench.store) if r.action.step == "hold")
    assert hold.rc == 1 and hold.output == answer and hold.undo == () and why in hold.details["refused"]
    told = bench.mail.sent[mails:]
    assert sorted(p.to for p in told) == ["alice@example.org", "ops@example.org"]
    assert all("will not requeue it" in p.subject and answer in p.text for p in told)
    assert all("left running; the operators decide" in p.text for p in told)  # fallback = "none", the default
    again = bench.actor.run_once().said
    assert again[0].step == "skip" and "not tried again" in again[0].text and len(bench.argv()) == 1
    bench.close()


def test_fallback_cancel_cancels_a_job_slurm_will_not_requeue_as_a_step_of_its_own(tmp_path):
    bench = _refusing(tmp_path, "disabled", IDLE + 'fallback = "cancel"\n')
    assert bench.actor.run_once().said[0].step == "warn"
    assert "it will be cancelled instead" in bench.mail.sent[0].text  # the warning names the fallback
    mails = len(bench.mail.sent)
    said = _past_grace(bench, warned=True)
    assert [s.step for s in said] == ["hold", "cancel"]
    assert bench.argv() == [["scontrol", "requeuehold", "17"], ["scancel", "17"]]
    steps = {r.action.step: r.action for r in recorded(bench.store)}
    hold, cancel = steps["hold"], steps["cancel"]
    assert not hold.ok and cancel.ok and cancel.details["fallback_of"] == hold.id
    assert cancel.why.startswith(f"fallback = cancel: Slurm refused the hold ({hold.id})")
    subjects = sorted(p.subject for p in bench.mail.sent[mails:] if p.to == "alice@example.org")
    assert subjects == [
        "[hpcwatch] job 17: Slurm will not requeue it, so it was not held",
        "[hpcwatch] job 17: cancelled by hpcwatch act",
    ]
    assert [s.step for s in bench.actor.run_once().said] == ["skip"] and len(bench.argv()) == 2  # once
    bench.close()


def test_a_hold_that_fails_otherwise_is_told_to_the_operators_and_never_falls_back(tmp_path):
    bench = Bench(tmp_path, IDLE + 'fallback = "cancel"\n', HPCWATCH_STANDIN_FAIL="scontrol")
    _job(bench.store)
    _idle_samples(bench.store, T0, T0 + 35 * MIN)
    bench.now[0] = T0 + 35 * MIN
    bench.actor.run_once()  # the warning
    mails = len(bench.mail.sent)
    said = _past_grace(bench, warned=True)
    assert [s.step for s in said] == ["hold"] and bench.argv() == [["scontrol", "requeuehold", "17"]]  # no scancel
    hold = next(r.action for r in recorded(bench.store) if r.action.step == "hold")
    assert hold.rc == 1 and "Unable to contact slurm controller" in hold.output and "refused" not in hold.details
    told = bench.mail.sent[mails:]
    assert [p.to for p in told] == ["ops@example.org"] and "could not hold (rc 1)" in told[0].subject
    again = bench.actor.run_once().said
    assert again[0].step == "skip" and "not tried again" in again[0].text and len(bench.argv()) == 1
    bench.close()


def test_fallback_is_the_fallback_of_a_hold_only(tmp_path):
    with pytest.raises(ConfigError, match=r"act.toml:22: \[act.idle\] fallback = 'cancel' is the fallback of action"):
        parse_act_text(_config(tmp_path, IDLE + 'action = "cancel"\nfallback = "cancel"\n'), path="act.toml")


def test_the_default_action_is_hold_the_one_with_an_undo(tmp_path):
    assert Bench(tmp_path, IDLE).config.idle.action == "hold"  # cancel only when written


def test_cancel_runs_scancel_and_undo_says_it_cannot(tmp_path):
    bench = Bench(tmp_path, IDLE + 'action = "cancel"\n')
    _job(bench.store)
    _idle_samples(bench.store, T0, T0 + 35 * MIN)
    bench.now[0] = T0 + 35 * MIN
    bench.actor.run_once()
    _idle_samples(bench.store, T0 + 35 * MIN + 30, T0 + 50 * MIN)
    bench.now[0] = T0 + 50 * MIN
    said = bench.actor.run_once().said
    assert [s.step for s in said] == ["cancel"] and bench.argv() == [["scancel", "17"]]
    with pytest.raises(ConfigError, match="cannot be undone: a cancelled job cannot be brought back"):
        bench.actor.undo(said[0].action)
    bench.close()


@pytest.mark.parametrize(
    ("allow", "job", "why"),
    [
        ('allow_jobs = ["17"]', {}, "allow_jobs"),  # the job itself
        ('allow_users = ["alice"]', {}, "allow_users"),  # its user
        ('exempt_partitions = ["gpu"]', {}, "partition gpu is exempt"),
        ('exempt_accounts = ["proj-llm"]', {}, "account proj-llm is exempt"),
        ("", {"gpus": 4}, "2 of its 4 GPUs are idle"),  # half its GPUs work
        ("", {"end": T0 + 30 * MIN, "state": "COMPLETED"}, "it has ended"),
    ],
)
def test_allow_list_and_exemptions_are_never_acted_on(tmp_path, allow, job, why):
    bench = Bench(tmp_path, IDLE + allow + "\n")
    _job(bench.store, **job)
    _idle_samples(bench.store, T0, T0 + 60 * MIN)
    for minutes in (35, 60, 90):
        bench.now[0] = T0 + minutes * MIN
        said = bench.actor.run_once().said
        assert [s.step for s in said] == ["skip"] and why in said[0].text
    assert bench.argv() == [] and bench.steps() == [] and bench.mail.sent == []
    bench.close()


def test_dry_run_acts_on_nothing_and_says_what_it_would_do(idle):
    said = idle.actor.run_once(dry_run=True).said
    assert [(s.step, s.dry_run) for s in said] == [("warn", True)] and said[0].text.startswith("would warn")
    assert idle.steps() == [] and idle.mail.sent == [] and idle.argv() == []
    idle.actor.run_once()  # a real warning
    _idle_samples(idle.store, T0 + 35 * MIN + 30, T0 + 50 * MIN)
    idle.now[0] = T0 + 50 * MIN
    said = idle.actor.run_once(dry_run=True).said
    assert said[0].step == "hold" and said[0].text.startswith("would hold") and not said[0].action
    assert idle.argv() == [] and idle.steps() == ["warn"]


def test_dry_run_of_the_cli_prints_what_it_would_do(idle, tmp_path):
    cfg = tmp_path / "act.toml"
    cfg.write_text(idle.text.replace('type = "smtp"', 'type = "smtp"\nhost = "127.0.0.1"'))
    out = CliRunner().invoke(app, ["act", "--config", str(cfg), "--db", str(tmp_path / "store"), "--once", "--dry-run"])
    assert out.exit_code == 0, out.output
    assert "dry-run idle_gpus job 17: warn: would warn" in out.output and idle.steps() == []


# -- policy 2: remediation of a drained node ------------------------------------------------------------------


def _remediate(tmp_path: Path) -> str:
    checks = STANDINS / "checks"
    return f"""
[act.remediate]
enabled = true
warn_minutes = 10
work_dir = "{tmp_path / "work"}"
dcgmi = "{checks / "dcgmi"}"
all_reduce_perf = "{checks / "all_reduce_perf"}"
ib_write_bw = "{checks / "ib_write_bw"}"
exempt_nodes = ["node9"]
"""


#: Real ``scontrol -o show node`` lines (Slurm 22.05.8, tests/data/SOURCES.md): node2 ``State=IDLE+DRAIN`` with
#: ``Reason=hpcwatch: a test reason ...``, as deploy/slurm/healthcheck leaves a node it drained.
SHOW_NODE = Path(__file__).resolve().parents[1] / "data" / "slurm" / "scontrol_o_show_node_mixed_and_drained.txt"


def _node2(tmp_path: Path, *, state: str = "IDLE+DRAIN", reason: str = "") -> str:
    """The captured lines, node2's state and reason replaced (made here from the real line, for the cases an
    operator makes: a reason of their own, a node resumed); the file's path for HPCWATCH_STANDIN_NODES."""
    lines = SHOW_NODE.read_text().splitlines()
    out = []
    for line in lines:
        if line.startswith("NodeName=node2 "):
            head, _, captured = line.partition(" Reason=")
            head = head.replace("State=IDLE+DRAIN", f"State={state}")
            line = head if state == "IDLE" else f"{head} Reason={reason or captured}"
        out.append(line)
    path = tmp_path / f"show-node-{len(list(tmp_path.glob('show-node-*')))}.txt"
    path.write_text("\n".join(out) + "\n")
    return str(path)


def _drain(store: Store, node: str, t: float) -> None:
    reason = "xid: XID 79 on GPU 3 (fallen off the bus)"
    store.add(
        [
            Event(
                kind=EventKind.HEALTH_VERDICT,
                t=t,
                source="hpcwatch collect",
                attrs={"node": node, "verdict": "drain", "reason": reason},
            )
        ]
    )


def _bench(tmp_path: Path, checks: str = "pass", act: str = "", **env: str) -> Bench:
    env = {"HPCWATCH_STANDIN_NODES": str(SHOW_NODE), **env}
    bench = Bench(
        tmp_path, _remediate(tmp_path) + act, HPCWATCH_STANDIN_RUN_JOBS="1", HPCWATCH_STANDIN_CHECKS=checks, **env
    )
    _drain(bench.store, "node2", T0 - 120)
    _drain(bench.store, "node2", T0 - 60)
    _drain(bench.store, "node9", T0 - 60)
    return bench


def _show_node2(argv: list[str]) -> bool:
    return argv == ["scontrol", "-o", "show", "node", "node2"]


def _warned(bench: Bench) -> list[list[str]]:
    """The warning run, then the clock past ``warn_minutes``: the commands the warning ran (reads only)."""
    said = bench.actor.run_once().said
    assert [(s.target, s.step) for s in said] == [("node node2", "warn"), ("node node9", "skip")]
    bench.now[0] += 10 * MIN
    return bench.argv()


def _acts(bench: Bench) -> list[list[str]]:
    """The commands run, less the reads of node2's state."""
    return [a for a in bench.argv() if not _show_node2(a)]


def test_node_state_reads_hpcwatchs_drain_from_real_scontrol_lines():
    from hpcwatch.act.remediate import node_state

    text = SHOW_NODE.read_text()
    node2 = node_state(text, "node2")  # IDLE+DRAIN, Reason=hpcwatch: a test reason State=IDLE [root@...]
    assert node2.state == "IDLE+DRAIN" and node2.reason.startswith("hpcwatch: a test reason") and node2.not_ours() == ""
    assert "no longer drained (State=MIXED)" in node_state(text, "node1").not_ours()  # running a job
    assert node_state(text, "node3").not_ours() == "scontrol does not know it"
    idle = (SHOW_NODE.parent / "scontrol_o_show_node_idle.txt").read_text()
    assert "no longer drained (State=IDLE)" in node_state(idle, "node1").not_ours()


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ("Requested operation is presently disabled for job 17", "may not be requeued"),
        ("Only batch jobs are accepted or processed for job 17", "not a batch job"),
        ("Job is pending execution for job 17", ""),  # ESLURM_JOB_PENDING: no refusal to requeue it
        ("Unable to contact slurm controller (connect failure)", ""),
        ("timed out after 30 s", ""),
    ],
)
def test_only_slurms_words_for_a_job_it_cannot_requeue_are_a_refusal(answer, why):
    from hpcwatch.act.idle import refusal

    assert (why in refusal(answer)) if why else refusal(answer) == ""


def test_a_drained_node_is_announced_to_the_operators_before_anything_is_done(tmp_path):
    bench = _bench(tmp_path)
    assert _warned(bench) == [["scontrol", "-o", "show", "node", "node2"]]  # read, not touched
    warn = next(r.action for r in recorded(bench.store) if r.action.step == "warn")
    told = [p for p in bench.mail.sent if p.to == "ops@example.org"]
    assert len(told) == 1 and "node node2: its checks start in 00:10:00" in told[0].subject
    assert f"hpcwatch act undo {warn.id}" in told[0].text and "exempt_nodes" in told[0].text
    bench.now[0] -= 1 * MIN  # 9 minutes after the warning: not yet
    said = bench.actor.run_once().said
    assert said[0].step == "wait" and "1 min before the reservation" in said[0].text and _acts(bench) == []
    bench.close()


def test_a_drained_node_that_passes_its_checks_is_resumed(tmp_path):
    bench = _bench(tmp_path)
    _warned(bench)
    first = bench.actor.run_once()
    assert [(s.target, s.step) for s in first.said] == [
        ("node node2", "reserve"),
        ("node node2", "resume"),
        ("node node2", "check"),
        ("node node9", "skip"),
    ]
    assert _show_node2(bench.argv()[1])  # its state read again just before the reservation
    reserve, resume, sbatch = _acts(bench)
    name = next(a.split("=", 1)[1] for a in reserve if a.startswith("reservationname="))
    assert (
        reserve[:3] == ["scontrol", "create", "reservation"]
        and "flags=maint,ignore_jobs" in reserve
        and "nodes=node2" in reserve
    )
    assert resume == ["scontrol", "update", "nodename=node2", "state=resume"]
    assert sbatch[0] == "sbatch" and f"--reservation={name}" in sbatch and "--nodelist=node2" in sbatch
    bench.now[0] += 5 * MIN
    second = bench.actor.run_once()
    assert [s.step for s in second.said if s.target == "node node2"] == ["result", "release"]
    # the job wrote its done file: squeue is not asked
    assert _acts(bench)[3:] == [["scontrol", "delete", f"reservationname={name}"]]
    result = next(r.action for r in recorded(bench.store) if r.action.step == "result")
    assert result.evidence["passed"] is True and result.evidence["problems"] == []
    kinds = {e.kind for e in bench.store.events() if e.attrs.get("node") == "node2"}
    assert {EventKind.DCGM_DIAG, EventKind.NCCL_TEST, EventKind.IB_WRITE_BW} <= kinds  # ingested
    assert any("node2" in p.subject for p in bench.mail.sent if p.to == "ops@example.org")
    n = len(bench.argv())
    assert [s.step for s in bench.actor.run_once().said] == ["done", "skip"] and len(bench.argv()) == n  # once
    release = next(r.action for r in recorded(bench.store) if r.action.step == "release")
    bench.actor.undo(release.id)
    assert bench.argv()[-1][:4] == ["scontrol", "update", "nodename=node2", "state=drain"]
    bench.close()


@pytest.mark.parametrize(
    ("state", "reason", "why"),
    [
        ("IDLE+DRAIN", "RMA: GPU 3 to replace [ops@2026-12-03T15:00:00]", "drain reason is not hpcwatch's"),
        ("IDLE", "", "no longer drained (State=IDLE): an operator resumed it"),
    ],
)
def test_an_operator_who_takes_the_node_during_the_warning_stops_the_policy(tmp_path, state, reason, why):
    bench = _bench(tmp_path)
    _warned(bench)
    bench.actor.runner.env["HPCWATCH_STANDIN_NODES"] = _node2(tmp_path, state=state, reason=reason)
    said = bench.actor.run_once().said
    assert [s.step for s in said if s.target == "node node2"] == ["stand_down"] and why in said[0].text
    assert _acts(bench) == []  # nothing was done to the node
    bench.now[0] += 60 * MIN
    said = bench.actor.run_once().said
    assert said[0].step == "done" and "stand_down by" in said[0].text and _acts(bench) == []
    bench.close()


def test_an_operators_drain_is_not_announced_nor_touched(tmp_path):
    nodes = _node2(tmp_path, reason="maintenance: firmware upgrade [root@2026-12-03T15:00:00]")
    bench = _bench(tmp_path, HPCWATCH_STANDIN_NODES=nodes)
    said = bench.actor.run_once().said
    assert said[0].step == "skip" and "an operator holds it" in said[0].text
    assert bench.steps() == [] and bench.mail.sent == [] and _acts(bench) == []
    bench.close()


def test_undo_of_the_warning_withdraws_it_and_the_node_is_left_alone(tmp_path):
    bench = _bench(tmp_path)
    _warned(bench)
    warn = next(r.action for r in recorded(bench.store) if r.action.step == "warn")
    _, undo = bench.actor.undo(warn.id)
    assert undo.argv == () and undo.rc == 0
    said = bench.actor.run_once().said
    assert said[0].step == "done" and f"warning {warn.id} withdrawn by ops-test" in said[0].text
    assert _acts(bench) == [] and bench.steps() == ["warn"]
    bench.close()


def test_a_verdict_that_cleared_during_the_warning_does_not_end_it_the_checks_decide(tmp_path):
    # the XID left the look-back window while the operators were warned: Slurm still has node2 drained by
    # hpcwatch, and nothing but the checks would give it back
    bench = _bench(tmp_path)
    _warned(bench)
    bench.store.add(
        [
            Event(
                kind=EventKind.HEALTH_VERDICT, t=T0, source="hpcwatch collect", attrs={"node": "node2", "verdict": "ok"}
            )
        ]
    )
    said = bench.actor.run_once().said
    assert [(s.target, s.step) for s in said] == [
        ("node node9", "skip"),
        ("node node2", "reserve"),
        ("node node2", "resume"),
        ("node node2", "check"),
    ]
    reserve = next(r.action for r in recorded(bench.store) if r.action.step == "reserve")
    warn = next(r.action for r in recorded(bench.store) if r.action.step == "warn")
    assert reserve.episode == warn.episode and reserve.evidence["reason"].startswith("xid: XID 79")
    bench.now[0] += 5 * MIN
    said = bench.actor.run_once().said
    assert [s.step for s in said if s.target == "node node2"] == ["result", "release"]
    assert [s.target for s in bench.actor.run_once().said] == ["node node9"]  # over: no longer listed
    bench.close()


def test_a_drained_node_that_fails_its_checks_stays_drained_and_operators_are_told(tmp_path):
    bench = _bench(tmp_path, checks="fail")
    _warned(bench)
    bench.actor.run_once()
    bench.now[0] += 5 * MIN
    said = bench.actor.run_once().said
    assert [s.step for s in said if s.target == "node node2"] == ["result", "drain", "release"]
    drain = _acts(bench)[-2]
    assert drain[:4] == ["scontrol", "update", "nodename=node2", "state=drain"]
    assert drain[4].startswith("reason=hpcwatch: checks failed")
    result = next(r.action for r in recorded(bench.store) if r.action.step == "result")
    rules = {c["rule"] for c in result.evidence["checks"] if c["verdict"] != "ok"}
    assert rules == {"dcgm_diag", "nccl_tests", "ib_write_bw"} and result.evidence["passed"] is False
    told = [p for p in bench.mail.sent if p.to == "ops@example.org" and "failed its checks" in p.subject]
    assert len(told) == 1 and "node2" in told[0].subject
    undo_drain = next(r.action for r in recorded(bench.store) if r.action.step == "drain")
    assert undo_drain.undo[-1] == "state=resume"
    # a later drain verdict (a new episode) finds node2 drained for its failed checks: a person looks first,
    # hpcwatch does not test it again and again
    bench.actor.runner.env["HPCWATCH_STANDIN_NODES"] = _node2(tmp_path, reason=drain[4].removeprefix("reason="))
    bench.store.add(
        [
            Event(
                kind=EventKind.HEALTH_VERDICT, t=T0, source="hpcwatch collect", attrs={"node": "node2", "verdict": "ok"}
            )
        ]
    )
    _drain(bench.store, "node2", T0 + 60)
    n = len(bench.mail.sent)
    said = bench.actor.run_once().said
    assert said[0].step == "skip" and "failed hpcwatch's checks" in said[0].text, said
    assert len(bench.mail.sent) == n
    bench.close()


def test_a_failed_sbatch_ends_the_episode_and_tells_the_operators(tmp_path):
    bench = _bench(tmp_path, HPCWATCH_STANDIN_FAIL="sbatch")
    _warned(bench)
    said = bench.actor.run_once().said
    assert [s.step for s in said if s.target == "node node2"] == ["reserve", "resume", "check"]
    check = next(r.action for r in recorded(bench.store) if r.action.step == "check")
    assert check.rc == 1 and "Unable to contact slurm controller" in check.output and check.undo == ()
    failed = [p for p in bench.mail.sent if "failed its checks" in p.subject]
    assert failed and "Unable to contact slurm controller" in failed[0].text  # Slurm's answer, in the notice
    n = len(bench.argv())
    assert bench.actor.run_once().said[0].step == "done" and len(bench.argv()) == n
    bench.close()


def _quiet(tmp_path: Path, act: str = "", **env: str) -> Bench:
    """node2 drained, the warning given and past; sbatch "runs" nothing unless told."""
    bench = Bench(tmp_path, _remediate(tmp_path) + act, HPCWATCH_STANDIN_NODES=str(SHOW_NODE), **env)
    _drain(bench.store, "node2", T0 - 60)
    assert bench.actor.run_once().said[0].step == "warn"
    bench.now[0] += 10 * MIN
    return bench


def test_a_check_job_that_left_no_output_fails_and_the_node_stays_drained(tmp_path):
    bench = _quiet(tmp_path)  # sbatch "runs" nothing: the job leaves the queue, no outputs
    bench.actor.run_once()
    said = bench.actor.run_once().said
    assert [s.step for s in said] == ["result", "drain", "release"]
    result = next(r.action for r in recorded(bench.store) if r.action.step == "result")
    assert result.evidence["problems"] == [
        f"{f}: no output" for f in ("dcgmi_diag.json", "all_reduce_perf.out", "ib_write_bw.out")
    ]
    bench.close()


def test_a_check_job_squeue_shows_as_completed_has_ended(tmp_path):
    bench = _quiet(tmp_path, HPCWATCH_STANDIN_SQUEUE="COMPLETED")
    bench.actor.run_once()
    assert [s.step for s in bench.actor.run_once().said] == ["result", "drain", "release"]  # no outputs: failed
    bench.close()


def test_a_check_job_past_its_timeout_is_cancelled_and_counts_as_a_failure(tmp_path):
    bench = _quiet(tmp_path, "check_timeout_minutes = 30\n", HPCWATCH_STANDIN_SQUEUE="RUNNING")
    bench.actor.run_once()
    bench.now[0] += 29 * MIN
    assert [s.step for s in bench.actor.run_once().said] == ["wait"]
    bench.now[0] += 2 * MIN
    assert [s.step for s in bench.actor.run_once().said] == ["result", "drain", "release"]
    assert ["scancel", "4242"] in bench.argv()
    result = next(r.action for r in recorded(bench.store) if r.action.step == "result")
    assert "still running after 30 min: cancelled" in result.evidence["problems"][0]
    bench.close()


def test_hostile_job_ids_and_node_names_never_reach_an_argv(tmp_path):
    bench = Bench(tmp_path, IDLE + _remediate(tmp_path))
    _job(bench.store, id="--help")
    _idle_samples(bench.store, T0, T0 + 60 * MIN, job="--help")
    _drain(bench.store, "node2,node3", T0)
    _drain(bench.store, "node[1-2]", T0)
    for minutes in (35, 60):
        bench.now[0] = T0 + minutes * MIN
        said = bench.actor.run_once().said
        assert {s.step for s in said} == {"skip"} and len(said) == 3, said
    assert bench.argv() == [] and bench.steps() == []
    bench.close()


def test_dry_run_of_remediation_runs_no_command(tmp_path):
    bench = _bench(tmp_path)
    said = bench.actor.run_once(dry_run=True).said
    assert said[0].dry_run and said[0].text.startswith("would warn the operators, then in 10 min: reserve node2")
    assert bench.argv() == [] and bench.steps() == [] and not (tmp_path / "work").exists()
    _warned(bench)
    n = len(bench.argv())
    said = bench.actor.run_once(dry_run=True).said
    assert said[0].dry_run and said[0].text.startswith("would reserve node2") and len(bench.argv()) == n
    bench.close()


# -- configuration --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("act", "notify", "message"),
    [
        ('[act.idle]\naction = "kill"', True, "act.toml:3: action must be one of 'hold', 'cancel', got 'kill'"),
        ("[act.idle]\nenabled = true", False, "act.toml:3: [act.idle] is enabled but the file has no [notify] table"),
        ("[act.idle]\nidle_minutes = 0", True, "act.toml:3: [act.idle] idle_minutes must be > 0, got 0"),
        ("[act.remediate]\ngpus = true", True, "act.toml:3: gpus must be int, got True"),
        (
            '[act.remediate]\nib_device = "mlx5_0; rm -rf /"',
            True,
            "act.toml:3: [act.remediate] ib_device must be a plain",
        ),
        ("[act]\nscontroll = 1", True, "act.toml:2: unknown key 'scontroll' in [act]"),
    ],
)
def test_bad_config_is_one_line_and_exit_2(tmp_path, act, notify, message, run_cli):
    header = "" if act.startswith("[act]") else "[act]\n"
    text = header + act + "\n" + ('[notify]\noperators = ["ops@example.org"]\n' if notify else "")
    path = tmp_path / "act.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        parse_act_text(text, path="act.toml")
    assert message in str(err.value)
    code, out, err = run_cli(["act", "--config", str(path), "--db", str(tmp_path / "s"), "--once"])
    assert code == 2 and out == "" and err.startswith("hpcwatch: ") and len(err.strip().splitlines()) == 1
    assert message.split(": ", 1)[1] in err


def test_collect_reads_the_act_table_as_one_more_collector(tmp_path):
    from hpcwatch.collect.config import parse_config
    from hpcwatch.collect.daemon import build_collector

    text = _config(tmp_path, IDLE)
    config = parse_config(text, path="collect.toml")
    assert config.act is not None and config.act.idle.enabled and config.collectors[-1] is config.act
    with Store(tmp_path / "store") as store:
        collector = build_collector(store, config.act, notify=config.notify)
        assert collector.run().records == 0
        collector.close()


def test_the_sample_configs_act_table_parses_once_uncommented():
    from hpcwatch.collect.config import parse_config

    text = (Path(__file__).resolve().parents[2] / "deploy" / "hpcwatch.toml").read_text()
    head, _, rest = text.partition("# [notify]")
    uncommented = head + "\n".join(
        line[2:] if line.startswith("# ") else line for line in ("# [notify]" + rest).splitlines()
    )
    cfg = parse_config(uncommented, path="hpcwatch.toml")
    assert cfg.act is not None and not cfg.act.idle.enabled and not cfg.act.remediate.enabled  # off by default
    assert cfg.act.idle.action == "hold" and cfg.act.idle.exempt_partitions == ("debug", "interactive")
    assert cfg.act.remediate.work_dir == "/shared/hpcwatch/act"
