"""hpcwatch act's remediation against a real slurmctld: a drained node is tested through a reservation and resumed.

node2 is drained in slurmctld (with a reason starting "hpcwatch", as deploy/slurm/healthcheck drains) and the
store holds a ``drain`` health verdict for it (as ``collect``'s ``[[schedule]] task = "health"`` writes one). The
actor runs the real ``scontrol`` / ``sbatch`` / ``squeue``: it reads node2's state (``scontrol -o show node``),
warns the operators, and ``warn_minutes`` later (4 s here) reads it again and creates a maintenance reservation on node2, resumes node2 into it, submits the checks as a batch job
there (the stand-ins of tests/standins/checks, which print real dcgmi diag, all_reduce_perf and ib_write_bw
outputs), reads and judges the results once the job has left the queue, and deletes the reservation (pass)
or drains node2 again (fail). node2 is resumed at the end whatever happens.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hpcwatch.act.audit import recorded
from hpcwatch.act.config import parse_act_text
from hpcwatch.act.loop import Actor
from hpcwatch.notify.loop import Notifier
from hpcwatch.records import Event
from hpcwatch.store import Store
from hpcwatch.vocab import EventKind

from .conftest import wait_until

pytestmark = pytest.mark.integration

CHECKS = Path(__file__).resolve().parents[1] / "standins" / "checks"


class Recorder:
    def __init__(self) -> None:
        self.name, self.sent = "mail", []

    def check(self) -> None: ...
    def close(self) -> None: ...
    def send(self, payload, *, delivery: str) -> None:
        self.sent.append(payload)


def node_state(slurm, node: str) -> tuple[str, str]:
    line = slurm.run("scontrol", "-o", "show", "node", node).stdout.strip()
    head, _, reason = line.partition(" Reason=")
    info = dict(f.split("=", 1) for f in head.split() if "=" in f)
    return info.get("State", ""), reason


def reservations(slurm) -> str:
    return slurm.run("scontrol", "show", "reservation", check=False).stdout


def act_head(notify: str = "", act: str = "") -> str:
    """The TOML every act test on the real Slurm starts with: mail to the operators through a recorded channel,
    and Slurm's own commands (``notify``, ``act``: more keys of those tables)."""
    return f"""
[notify]
operators = ["ops@example.org"]
{notify}
[[notify.channel]]
type = "smtp"
name = "mail"

[act]
scontrol = "{shutil.which("scontrol")}"
sbatch = "{shutil.which("sbatch")}"
scancel = "{shutil.which("scancel")}"
squeue = "{shutil.which("squeue")}"
{act}
"""


def _actor(slurm, tmp_path: Path, store: Store, checks: str) -> tuple[Actor, Recorder]:
    text = (
        act_head()
        + f"""
[act.remediate]
enabled = true
work_dir = "{tmp_path / "work"}"
reservation_minutes = 10
warn_minutes = 0.0667
check_timeout_minutes = 2
dcgmi = "{CHECKS / "dcgmi"}"
all_reduce_perf = "{CHECKS / "all_reduce_perf"}"
ib_write_bw = "{CHECKS / "ib_write_bw"}"
"""
    )
    config, notify = parse_act_text(text, path="act.toml")
    mail = Recorder()
    notifier = Notifier(store, notify, channels={"mail": mail})
    env = {**slurm.env, "HPCWATCH_STANDIN_CHECKS": checks}  # sbatch exports it to the job (--export=ALL)
    return Actor(store, config, notifier=notifier, env=env), mail


def _verdict(store: Store, node: str, verdict: str, t: float) -> None:
    attrs = {"node": node, "verdict": verdict, "reason": "xid: XID 79 on GPU 3" if verdict == "drain" else "ok"}
    store.add([Event(kind=EventKind.HEALTH_VERDICT, t=t, source="hpcwatch collect", attrs=attrs)])


def _until_started(actor: Actor) -> list[str]:
    """Runs until the warning's delay is over and the checks were submitted (or a step failed)."""
    steps: list[str] = []

    def started() -> bool:
        steps.extend(s.step for s in actor.run_once().said if s.target == "node node2")
        return bool({"check", "stand_down", "done"} & set(steps))

    wait_until(started, timeout_s=30, every_s=1.0, what="the warning's delay to pass and the checks to start")
    return steps


def _until_concluded(actor: Actor) -> list[str]:
    steps: list[str] = []

    def concluded() -> bool:
        steps.extend(s.step for s in actor.run_once().said if s.target == "node node2")
        return "release" in steps

    wait_until(concluded, timeout_s=90, every_s=1.0, what="the check job to end and the episode to conclude")
    return steps


def test_a_drained_node_is_tested_through_a_reservation_and_resumed_or_kept_drained(slurm, tmp_path):
    import time

    store = Store(tmp_path / "store")
    try:
        slurm.run("scontrol", "update", "nodename=node2", "state=drain", "reason=hpcwatch: drain: node2: xid")
        wait_until(lambda: "DRAIN" in node_state(slurm, "node2")[0], timeout_s=10, what="node2 drained")
        _verdict(store, "node2", "drain", time.time() - 30)

        actor, mail = _actor(slurm, tmp_path, store, "pass")
        warned = [s.step for s in actor.run_once().said if s.target == "node node2"]
        assert warned == ["warn"], [s.text for s in actor.run_once(dry_run=True).said]
        assert any("its checks start in" in p.subject for p in mail.sent)
        assert "reserve" not in {r.action.step for r in recorded(store)}  # nothing done before the delay
        first = _until_started(actor)
        assert first[-3:] == ["reserve", "resume", "check"], [r.action.output for r in recorded(store)]
        reserve = next(r.action for r in recorded(store) if r.action.step == "reserve")
        name = reserve.details["reservation"]
        assert name in reservations(slurm) and "MAINT" in reservations(slurm)
        steps = _until_concluded(actor)
        assert steps[-2:] == ["result", "release"], steps
        result = next(r.action for r in recorded(store) if r.action.step == "result")
        assert result.evidence["passed"] is True, result.evidence
        check = next(r.action for r in recorded(store) if r.action.step == "check")
        out_dir = Path(check.details["dir"])
        assert (out_dir / "done").exists() and (out_dir / f"slurm-{check.details['job']}.out").exists()
        assert {e.kind for e in store.events() if e.attrs.get("node") == "node2"} >= {
            EventKind.DCGM_DIAG,
            EventKind.NCCL_TEST,
            EventKind.IB_WRITE_BW,
        }
        state, _ = node_state(slurm, "node2")
        assert "DRAIN" not in state and name not in reservations(slurm), state

        # a new drain episode, and checks that fail: node2 stays drained, the operators are told
        _verdict(store, "node2", "ok", time.time() - 2)
        slurm.run("scontrol", "update", "nodename=node2", "state=drain", "reason=hpcwatch: drain: node2: xid")
        _verdict(store, "node2", "drain", time.time())
        actor, mail = _actor(slurm, tmp_path, store, "fail")
        steps = _until_concluded(actor)  # warned, then reserved after the delay, then judged
        assert steps[0] == "warn" and steps[-3:] == ["result", "drain", "release"], steps
        state, reason = node_state(slurm, "node2")
        assert "DRAIN" in state and reason.startswith("hpcwatch: checks failed"), (state, reason)
        assert any("failed its checks" in p.subject for p in mail.sent)
    finally:
        store.close()
        for line in reservations(slurm).splitlines():
            if line.startswith("ReservationName=hpcwatch-"):
                slurm.run(
                    "scontrol", "delete", line.split()[0].replace("ReservationName", "reservationname"), check=False
                )
        slurm.run("scontrol", "update", "nodename=node2", "state=resume", check=False)
    wait_until(lambda: "DRAIN" not in node_state(slurm, "node2")[0], timeout_s=10, what="node2 to resume")
