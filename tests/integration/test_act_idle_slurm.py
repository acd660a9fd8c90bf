"""hpcwatch act's idle policy against a real slurmctld: an idle job is warned, then held (or cancelled, its
fallback, when Slurm will not requeue it), and the hold is undone.

alice's batch job runs a ``sleep`` on the test cluster, without GPUs: the cluster's GPUs are GRES over stand-in
device files that report nothing, so the job's GPU samples are written into the store here (dcgm-exporter's
labels, 0 % utilisation, ``hpc_job`` the real job id), while its record (user, account, partition, nodes)
comes from the real ``squeue --json`` through ``hpcwatch.sources.slurm``. The actor's clock is the wall clock
moved forward by the test, so ``grace_minutes`` pass without waiting for them; the Slurm commands are the real
``scontrol requeuehold`` / ``scontrol release`` / ``scancel``, run as root (an operator may hold any job).

- a job submitted with ``--requeue``: warned, then held (``scontrol requeuehold``: pending, priority 0),
  then ``hpcwatch act undo`` of the hold releases it (priority back above 0);
- a job submitted with ``--no-requeue`` and ``fallback = "cancel"``: the hold is refused with Slurm's own words
  ("Requested operation is presently disabled for job N", what ``act.idle.NOT_REQUEUEABLE`` matches), alice
  and the operators are told, and the job is cancelled as a step of its own, which cannot be undone.
"""

from __future__ import annotations

import re
import time

import pytest

from hpcwatch import vocab
from hpcwatch.act.audit import recorded
from hpcwatch.act.config import parse_act_text
from hpcwatch.act.loop import Actor
from hpcwatch.errors import ConfigError
from hpcwatch.notify.loop import Notifier
from hpcwatch.records import Job, Sample
from hpcwatch.sources.slurm import parse_squeue_json
from hpcwatch.store import Store

from .conftest import wait_until
from .test_act_slurm import act_head

pytestmark = pytest.mark.integration

MIN = 60.0
#: squeue states of a job that still holds (or will hold) its nodes, as test_requeue_slurm waits them out.
_NOT_ENDED = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED")


class Recorder:
    def __init__(self) -> None:
        self.name, self.sent = "mail", []

    def check(self) -> None: ...
    def close(self) -> None: ...
    def send(self, payload, *, delivery: str) -> None:
        self.sent.append(payload)


class Clock:
    """The wall clock, moved forward by ``skip``: the grace period passes without being waited for."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def skip(self, seconds: float) -> None:
        self.offset += seconds


def _actor(slurm, store: Store, clock: Clock, extra: str = "") -> tuple[Actor, Recorder]:
    text = (
        act_head(notify='user_template = "{user}@example.org"', act='who = "ops-integration"')
        + f"""
[act.idle]
enabled = true
idle_minutes = 30
grace_minutes = 10
{extra}
"""
    )
    config, notify = parse_act_text(text, path="act.toml")
    mail = Recorder()
    notifier = Notifier(store, notify, channels={"mail": mail}, clock=clock)
    return Actor(store, config, notifier=notifier, clock=clock, env=slurm.env), mail


def _job_fields(slurm, job: str) -> dict[str, str]:
    line = slurm.run("scontrol", "-o", "show", "job", job).stdout.strip()
    return dict(f.split("=", 1) for f in line.split() if "=" in f)


def _state(slurm, job: str) -> str:
    return slurm.job_states().get(job, "")


def _store_job(slurm, store: Store, job: str) -> Job:
    """The job's record as Slurm reports it (squeue --json, through the project's reader)."""
    store.add(list(parse_squeue_json(slurm.run("squeue", "--json").stdout, path="squeue --json")))
    found = store.job(job)
    assert found is not None and found.user == "alice" and found.end is None, found
    return found


def _idle_samples(store: Store, job: Job, t0: float, t1: float) -> None:
    """0 % utilisation every 30 s on GPU 0 of the job's first node, labelled with its id (dcgm-exporter's names)."""
    node = job.nodes[0] if job.nodes else "node1"
    labels = {"Hostname": node, "gpu": "0", "hpc_job": job.id, "modelName": "NVIDIA H100 80GB HBM3"}
    n = int((t1 - t0) // 30.0) + 1
    store.add([Sample(metric=vocab.DCGM_FI_DEV_GPU_UTIL, labels=labels, t=t0 + 30.0 * i, value=0.0) for i in range(n)])


@pytest.fixture
def idle_job(slurm, request):
    """alice's job, its sbatch options from the test's parameter; cancelled and gone at the end."""
    job = slurm.sbatch("alice", "-N", "1", *request.param, "-J", "idle-gpus", wrap="sleep 600")
    wait_until(lambda: _state(slurm, job) == "RUNNING", timeout_s=30, what=f"job {job} running")
    yield job
    slurm.run("scancel", job, check=False)
    wait_until(
        lambda: _state(slurm, job) not in _NOT_ENDED, timeout_s=60, what=f"job {job} ended after the test's scancel"
    )


def _warned_then_past_grace(slurm, store: Store, actor: Actor, clock: Clock, job: str) -> list[str]:
    """The warning (no command), then the job still idle past ``grace_minutes``: what the acting run did."""
    record = _store_job(slurm, store, job)
    now = clock()
    _idle_samples(store, record, now - 35 * MIN, now)
    said = [s for s in actor.run_once().said if s.target == f"job {job}"]
    assert [s.step for s in said] == ["warn"], said
    assert _state(slurm, job) == "RUNNING"  # a warning touches nothing
    clock.skip(11 * MIN)
    _idle_samples(store, record, now + 30.0, clock())
    return [s.step for s in actor.run_once().said if s.target == f"job {job}"]


@pytest.mark.parametrize("idle_job", [("--requeue",)], indirect=True)
def test_an_idle_job_is_warned_then_held_and_the_undo_releases_it(slurm, tmp_path, idle_job):
    job, clock = idle_job, Clock()
    with Store(tmp_path / "store") as store:
        actor, mail = _actor(slurm, store, clock)
        steps = _warned_then_past_grace(slurm, store, actor, clock, job)
        hold = next(r.action for r in recorded(store) if r.action.step == "hold")
        assert steps == ["hold"] and hold.rc == 0, (hold.rc, hold.output)
        assert hold.argv[1:] == ("requeuehold", job) and hold.undo[1:] == ("release", job)

        def held() -> dict[str, str] | None:  # requeued (its steps killed, the job back in the queue) and held
            fields = _job_fields(slurm, job)
            return fields if fields.get("JobState") in ("PENDING", "REQUEUE_HOLD") else None

        fields = wait_until(held, timeout_s=30, what=f"job {job} requeued and pending")
        assert isinstance(fields, dict) and fields.get("Priority") == "0", fields  # held: priority 0
        assert any(p.to == "alice@example.org" and "held by hpcwatch act" in p.subject for p in mail.sent)

        _, undo = actor.undo(hold.id)
        assert undo.rc == 0 and undo.argv[1:] == ("release", job), undo
        released = _job_fields(slurm, job)
        assert re.fullmatch(r"[1-9][0-9]*", released.get("Priority", "")), released  # no longer held
        assert recorded(store)[-1].undone is not None
        assert [s.step for s in actor.run_once().said if s.target == f"job {job}"] in ([], ["skip"])  # acted once


@pytest.mark.parametrize("idle_job", [("--no-requeue",)], indirect=True)
def test_a_job_slurm_will_not_requeue_is_told_and_cancelled_only_as_written(slurm, tmp_path, idle_job):
    job, clock = idle_job, Clock()
    with Store(tmp_path / "store") as store:
        actor, mail = _actor(slurm, store, clock, 'fallback = "cancel"')
        steps = _warned_then_past_grace(slurm, store, actor, clock, job)
        assert steps == ["hold", "cancel"], [(r.action.step, r.action.output) for r in recorded(store)]
        acted = {r.action.step: r.action for r in recorded(store)}
        hold, cancel = acted["hold"], acted["cancel"]
        # Slurm's own words for a job that may not be requeued (ESLURM_DISABLED, scontrol's "%s for job %s")
        assert hold.rc == 1 and hold.output == f"Requested operation is presently disabled for job {job}", hold
        assert "may not be requeued" in hold.details["refused"] and hold.undo == ()
        assert cancel.rc == 0 and cancel.argv[1:] == (job,) and cancel.details["fallback_of"] == hold.id
        wait_until(lambda: _state(slurm, job) not in _NOT_ENDED, timeout_s=30, what=f"job {job} cancelled")
        refused = [p for p in mail.sent if "will not requeue" in p.subject]
        assert sorted(p.to for p in refused) == ["alice@example.org", "ops@example.org"]
        assert all(hold.output in p.text for p in refused)
        with pytest.raises(ConfigError, match="cannot be undone"):
            actor.undo(cancel.id)
