"""The actor: each enabled policy once over the store (``run_once``), every step audited; ``undo`` of one action.

    run_once:  idle jobs ─ exempt? ─ decide (warn / wait / hold|cancel [refused: fallback]) ─┐
               drain episodes ─ in scope? ─ drained by hpcwatch? ─ warn ... start (reserve,   │─ audit event
                                 resume, check) or stand_down                                  │  per step
                                 or poll the check job ─ judge ─ release | drain ──────────────┘─ notices
                                                                                  (one Notifier.post)

Dry-run (``[act] dry_run`` or ``--dry-run``) decides the same way and says what it would do: it runs no Slurm
command (not even squeue), stores nothing and queues no notice. Every real step is written to the store as an
``act_action`` event before the next one runs, so a crash in between leaves the trail of what was done.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcwatch.act import checkjob, remediate
from hpcwatch.act import idle as idle_policy
from hpcwatch.act.audit import Action, Recorded, Undo, action_id, find, recorded
from hpcwatch.act.config import ActConfig
from hpcwatch.act.runner import Ran, Runner
from hpcwatch.errors import ConfigError, one_line
from hpcwatch.notify.compose import Candidate, action_notice
from hpcwatch.notify.config import NotifyConfig
from hpcwatch.notify.loop import Notifier
from hpcwatch.notify.render import fmt_duration
from hpcwatch.records import Job
from hpcwatch.store import Store

__all__ = ["Actor", "Said", "ActSummary", "DRAIN_REASON_MAX"]

#: What the undo of a warning does: no command; the policy leaves that job (that node's episode) alone.
STAND_DOWN = "hpcwatch act undo ID withdraws the warning: the policy leaves this alone (no command is run)"
#: Ours: what a drain reason keeps of the verdict's (``sinfo -R`` shows it on one line).
DRAIN_REASON_MAX = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class Said:
    """One line of what a run did, would do (dry-run), or why it left something alone."""

    policy: str
    target: str
    step: str
    text: str
    action: str = ""
    """The audit id of what was done (empty: nothing was done)."""
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "target": self.target,
            "step": self.step,
            "text": self.text,
            "action": self.action,
            "dry_run": self.dry_run,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ActSummary:
    said: tuple[Said, ...] = ()
    notices: int = 0
    """Notices queued (composed) this run."""

    @property
    def acted(self) -> int:
        return sum(1 for s in self.said if s.action)

    def as_dict(self) -> dict[str, Any]:
        return {"acted": self.acted, "notices": self.notices, "said": [s.to_dict() for s in self.said]}


@dataclass(slots=True)
class _Run:
    now: float
    dry_run: bool
    said: list[Said] = field(default_factory=list)
    notices: list[Candidate] = field(default_factory=list)


class Actor:
    def __init__(
        self,
        store: Store,
        config: ActConfig,
        *,
        notify: NotifyConfig | None = None,
        notifier: Notifier | None = None,
        runner: Runner | None = None,
        clock: Callable[[], float] = time.time,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.store, self.config, self.clock = store, config, clock
        self.notifier = notifier if notifier is not None else (Notifier(store, notify) if notify else None)
        self.runner = runner or Runner(config.commands, timeout_s=config.command_timeout_s, env=env)
        self.who = config.who or f"hpcwatch-act@{socket.gethostname()}"

    def close(self) -> None:
        if self.notifier is not None:
            self.notifier.close()

    # -- one run -----------------------------------------------------------------------------------

    def run_once(self, *, dry_run: bool | None = None) -> ActSummary:
        run = _Run(now=self.clock(), dry_run=self.config.dry_run if dry_run is None else dry_run)
        if self.config.idle.enabled:
            self._idle(run)
        if self.config.remediate.enabled:
            self._remediate(run)
        queued = 0
        if run.notices and not run.dry_run and self.notifier is not None:
            queued = self.notifier.post(run.notices).composed
        return ActSummary(said=tuple(run.said), notices=queued)

    def _record(self, action: Action) -> Action:
        self.store.add([action.to_event()])
        return action

    def _action(self, run: _Run, *, policy: str, step: str, episode: str, target: str, **kw: Any) -> Action:
        t = self.clock()
        return Action(
            id=action_id(episode, step, t),
            policy=policy,
            step=step,
            episode=episode,
            target=target,
            t=t,
            who=self.who,
            **kw,
        )

    def _ran(self, command: str, *args: str) -> Ran:
        return self.runner.run(self.runner.argv(command, args))

    def _notice(self, run: _Run, action: Action, topic: str, values: dict[str, Any], **kw: Any) -> None:
        if self.notifier is None:
            return
        rows = [("label.target", action.target), ("label.when", _utc(action.t)), ("label.reason", action.why)]
        if not action.ok:  # what the command answered: Slurm's own words, for whoever reads the notice
            rows.append(("label.answer", f"rc {action.rc}: {action.output}"))
        run.notices.append(
            action_notice(
                self.store,
                self.notifier.config,
                self.notifier.renderer,
                key=f"act/{action.policy}/{action.id}",
                t=action.t,
                topic=topic,
                values=values,
                rows=rows,
                document={"action": action.id, "policy": action.policy, "step": action.step, "target": action.target},
                **kw,
            )
        )

    # -- policy 1: idle allocated GPUs ---------------------------------------------------------------

    def _idle(self, run: _Run) -> None:
        p = self.config.idle
        for idle in idle_policy.idle_jobs(self.store, p):
            target = f"job {idle.job}"
            job = self.store.job(idle.job)
            why_not = idle_policy.exemption(p, job, idle)
            if why_not:
                run.said.append(
                    Said(policy=idle_policy.POLICY, target=target, step="skip", text=f"left alone: {why_not}")
                )
                continue
            episode = f"idle/{idle.job}"
            d = idle_policy.decide(p, idle, recorded(self.store, episode=episode), now=run.now)
            if d.step in ("skip", "wait") or run.dry_run:
                text = f"would {d.step}: {d.why}" if run.dry_run and d.step not in ("skip", "wait") else d.why
                run.said.append(
                    Said(policy=idle_policy.POLICY, target=target, step=d.step, text=text, dry_run=run.dry_run)
                )
                continue
            assert job is not None  # exemption() refused an unknown job
            user = dict(user=job.user, account=job.account, mail_user=job.mail_user or "")
            if d.step == "warn":
                done = [self._idle_warn(run, idle, job, episode, target, d.why, user)]
            else:
                done = self._idle_act(run, idle, episode, target, d.why, user)
            for action in done:
                run.said.append(
                    Said(policy=idle_policy.POLICY, target=target, step=action.step, text=action.why, action=action.id)
                )

    def _idle_warn(
        self, run: _Run, idle: idle_policy.IdleJob, job: Job, episode: str, target: str, why: str, user: dict[str, Any]
    ) -> Action:
        p = self.config.idle
        action = self._record(
            self._action(
                run,
                policy=idle_policy.POLICY,
                step="warn",
                episode=episode,
                target=target,
                why=why,
                evidence=idle.evidence() | {"user": job.user, "account": job.account, "partition": job.partition},
                undo_note=STAND_DOWN,
                details={"job": idle.job, "action": p.action, "fallback": p.fallback, "stand_down": True},
            )
        )
        values = {
            "job": idle.job,
            "gpus": len(idle.gpus),
            "idle": fmt_duration(idle.idle_s),
            "grace": fmt_duration(p.grace_minutes * 60.0),
            "action": ("act_action", p.action),
            "verb": ("act_verb", p.action),
            "fallback": ("act_if_refused", p.fallback if p.action == "hold" else "not_hold"),
        }
        self._notice(run, action, "act_warn", values, audiences=("operators",), **user)
        return action

    def _idle_act(
        self, run: _Run, idle: idle_policy.IdleJob, episode: str, target: str, why: str, user: dict[str, Any]
    ) -> list[Action]:
        """The action (hold or cancel), audited and told; after a hold Slurm refused as not requeueable, the
        fallback (``fallback = "cancel"``) as a step of its own."""
        p = self.config.idle
        action = self._record(self._idle_command(run, idle, episode, target, why, p.action))
        self._idle_told(run, action, user)
        if action.ok or not action.details.get("refused") or p.fallback == "none":
            return [action]
        why = f"fallback = cancel: Slurm refused the hold ({action.id}): {action.details['refused']}"
        cancel = self._record(self._idle_command(run, idle, episode, target, why, "cancel", fallback_of=action.id))
        self._idle_told(run, cancel, user)
        return [action, cancel]

    def _idle_command(
        self, run: _Run, idle: idle_policy.IdleJob, episode: str, target: str, why: str, step: str, **details: str
    ) -> Action:
        hold = step == "hold"
        ran = self._ran("scontrol", "requeuehold", idle.job) if hold else self._ran("scancel", idle.job)
        undo = self.runner.argv("scontrol", ("release", idle.job)) if hold and ran.ok else ()
        note = (
            "scontrol release: it is queued again and starts from its script"
            if hold
            else ("a cancelled job cannot be brought back: its user resubmits it")
        )
        refused = idle_policy.refusal(ran.note()) if hold and not ran.ok else ""
        return self._action(
            run,
            policy=idle_policy.POLICY,
            step=step,
            episode=episode,
            target=target,
            why=why,
            evidence=idle.evidence(),
            argv=ran.argv,
            rc=ran.rc,
            output=ran.note(),
            undo=undo,
            undo_note=note if ran.ok else "the command failed: nothing to undo",
            details={"job": idle.job, **details} | ({"refused": refused} if refused else {}),
        )

    def _idle_told(self, run: _Run, action: Action, user: dict[str, Any]) -> None:
        """Done: its user and the operators. Refused by Slurm as not requeueable: both, with what follows. Failed
        otherwise (a timeout, the controller down): the operators, whose business that is."""
        job = str(action.details.get("job", ""))
        values: dict[str, Any]
        if action.ok:
            values = {"target": action.target, "step": ("act_action", action.step)}
            self._notice(run, action, "act_done", values, audiences=("operators",), **user)
        elif action.details.get("refused"):
            values = {"job": job, "next": ("act_fallback", self.config.idle.fallback)}
            self._notice(run, action, "act_refused", values, audiences=("operators",), **user)
        else:
            values = {"target": action.target, "step": action.step, "rc": action.rc}
            self._notice(run, action, "act_error", values, audiences=("operators",))

    # -- policy 2: remediation of drained nodes ------------------------------------------------------

    def _remediate(self, run: _Run) -> None:
        p = self.config.remediate
        listed = remediate.drain_episodes(self.store)
        for ep in listed + remediate.open_episodes(self.store, listed):
            target = f"node {ep.node}"
            why_not = remediate.out_of_scope(p, ep.node)
            if why_not:
                run.said.append(
                    Said(policy=remediate.POLICY, target=target, step="skip", text=f"left alone: {why_not}")
                )
                continue
            past = recorded(self.store, episode=ep.episode)
            steps = {r.action.step: r.action for r in past}
            over = remediate.episode_over(past)
            if over:
                run.said.append(Said(policy=remediate.POLICY, target=target, step="done", text=f"episode over: {over}"))
            elif not past:
                self._warn_node(run, ep, target)
            elif "reserve" not in steps:
                self._after_warning(run, ep, target, steps["warn"])
            elif "check" in steps and "result" not in steps:
                self._poll(run, ep, target, steps["check"])
            elif "result" in steps:
                self._conclude(run, ep, target, steps["result"], steps["check"])

    def _node_not_ours(self, node: str) -> str:
        """Why the node is not (or no longer) hpcwatch's to test, from Slurm now ("" when it is)."""
        ran = self._ran("scontrol", "-o", "show", "node", node)
        if not ran.ok:
            return f"scontrol -o show node {node} failed (rc {ran.rc}): {ran.note()}"
        return remediate.node_state(ran.stdout, node).not_ours()

    def _warn_node(self, run: _Run, ep: remediate.DrainEpisode, target: str) -> None:
        """The notice before anything is done: what, when, how to stop it. Not on a node an operator holds."""
        p = self.config.remediate
        plan = (
            f"in {p.warn_minutes:g} min: reserve {ep.node} (flags=maint,ignore_jobs, {p.reservation_minutes:g} min), resume it into "
            f"the reservation, sbatch dcgmi diag -r {p.diag_level}, all_reduce_perf, ib_write_bw; resumed if they pass"
        )
        why = f"drain verdict since {_utc(ep.start)}: {ep.reason}"
        if run.dry_run:
            text = f"would warn the operators, then {plan} ({why})"
            run.said.append(Said(policy=remediate.POLICY, target=target, step="warn", text=text, dry_run=True))
            return
        not_ours = self._node_not_ours(ep.node)
        if not_ours:
            run.said.append(Said(policy=remediate.POLICY, target=target, step="skip", text=f"left alone: {not_ours}"))
            return
        warn = self._record(
            self._action(
                run,
                policy=remediate.POLICY,
                step="warn",
                episode=ep.episode,
                target=target,
                why=f"{why}: {plan}",
                evidence={"verdict": "drain", "reason": ep.reason, "since": ep.start},
                undo_note=STAND_DOWN,
                details={"stand_down": True, "warn_minutes": p.warn_minutes},
            )
        )
        self._say(run, target, warn)
        values = {
            "node": ep.node,
            "delay": fmt_duration(p.warn_minutes * 60.0),
            "action": warn.id,
            "prefix": remediate.DRAINED_BY,
        }
        self._notice(run, warn, "act_remediate_warn", values, audiences=("operators",))

    def _after_warning(self, run: _Run, ep: remediate.DrainEpisode, target: str, warn: Action) -> None:
        """Past the delay, and Slurm still shows hpcwatch's drain: the checks start; else the policy stands down."""
        left_s = warn.t + self.config.remediate.warn_minutes * 60.0 - run.now
        if left_s > 0:
            text = f"warned by {warn.id}: {left_s / 60:.0f} min before the reservation"
            run.said.append(Said(policy=remediate.POLICY, target=target, step="wait", text=text, dry_run=run.dry_run))
            return
        if run.dry_run:
            self._start(run, ep, target)
            return
        not_ours = self._node_not_ours(ep.node)
        if not_ours:
            stand_down = self._record(
                self._action(
                    run,
                    policy=remediate.POLICY,
                    step="stand_down",
                    episode=ep.episode,
                    target=target,
                    why=f"warned by {warn.id}; {not_ours}: nothing done, the episode is over",
                    evidence={"warn": warn.id},
                    undo_note="nothing was done",
                )
            )
            self._say(run, target, stand_down)
            return
        self._start(run, ep, target)

    def _say(self, run: _Run, target: str, action: Action) -> None:
        text = action.why if action.ok else f"{action.why}: failed (rc {action.rc}): {action.output}"
        run.said.append(Said(policy=remediate.POLICY, target=target, step=action.step, text=text, action=action.id))

    def _start(self, run: _Run, ep: remediate.DrainEpisode, target: str) -> None:
        p = self.config.remediate
        why = f"drain verdict since {_utc(ep.start)}: {ep.reason}"
        if run.dry_run:
            run.said.append(
                Said(
                    policy=remediate.POLICY,
                    target=target,
                    step="reserve",
                    dry_run=True,
                    text=f"would reserve {ep.node} (flags=maint,ignore_jobs, {p.reservation_minutes:g} min), resume it "
                    f"into the reservation and sbatch dcgmi diag -r {p.diag_level}, all_reduce_perf, ib_write_bw ({why})",
                )
            )
            return
        first = action_id(ep.episode, "reserve", run.now)
        name = remediate.reservation_name(ep.node, first)
        common: dict[str, Any] = dict(
            policy=remediate.POLICY,
            episode=ep.episode,
            target=target,
            evidence={"verdict": "drain", "reason": ep.reason, "since": ep.start},
        )
        ran = self._ran(
            "scontrol",
            *checkjob.reservation_args(
                name, ep.node, minutes=p.reservation_minutes, user=p.reservation_user, flags="maint,ignore_jobs"
            ),
        )
        reserve = self._record(
            self._action(
                run,
                step="reserve",
                why=f"{why}: a reservation so that only the checks run there",
                argv=ran.argv,
                rc=ran.rc,
                output=ran.note(),
                undo=self.runner.argv("scontrol", ("delete", f"reservationname={name}")) if ran.ok else (),
                details={"reservation": name},
                **common,
            )
        )
        self._say(run, target, reserve)
        if not reserve.ok:
            return self._failed(run, reserve, ep)
        ran = self._ran("scontrol", "update", f"nodename={ep.node}", "state=resume")
        resume = self._record(
            self._action(
                run,
                step="resume",
                why=f"into reservation {name}: Slurm starts no job on a drained node",
                argv=ran.argv,
                rc=ran.rc,
                output=ran.note(),
                undo=self._drain_argv(ep.node, f"hpcwatch: {ep.reason}") if ran.ok else (),
                details={"reservation": name},
                **common,
            )
        )
        self._say(run, target, resume)
        if not resume.ok:
            return self._failed(run, resume, ep)
        self._submit(run, ep, target, name, common)

    def _submit(self, run: _Run, ep: remediate.DrainEpisode, target: str, name: str, common: dict[str, Any]) -> None:
        p = self.config.remediate
        out_dir = Path(p.work_dir) / action_id(ep.episode, "check", run.now)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "check.sh").write_text(remediate.check_script(p, out_dir, reservation=name))
        except OSError as err:
            raise ConfigError(f"{p.work_dir}: cannot write the check job's folder: {err.strerror or err}") from err
        args = checkjob.sbatch_args(out_dir / "check.sh", reservation=name, node=ep.node, partition=p.partition)
        ran = self._ran("sbatch", *args)
        job = checkjob.job_id(ran)
        check = self._record(
            self._action(
                run,
                step="check",
                why=f"dcgmi diag -r {p.diag_level}, all_reduce_perf, ib_write_bw on {ep.node}",
                argv=ran.argv,
                rc=ran.rc if ran.ok and job else (ran.rc or 1),
                output=ran.note(),
                undo=self.runner.argv("scancel", (job,)) if job else (),
                details={"reservation": name, "job": job, "dir": str(out_dir)},
                **common,
            )
        )
        self._say(run, target, check)
        if not check.ok:
            self._failed(run, check, ep)

    def _drain_argv(self, node: str, reason: str) -> tuple[str, ...]:
        """``reason`` from the store's verdict: made one visible line, bounded (scontrol keeps it as typed)."""
        shown = one_line(reason)[:DRAIN_REASON_MAX]
        return self.runner.argv("scontrol", ("update", f"nodename={node}", "state=drain", f"reason={shown}"))

    def _poll(self, run: _Run, ep: remediate.DrainEpisode, target: str, check: Action) -> None:
        p = self.config.remediate
        job, out_dir = str(check.details.get("job", "")), Path(str(check.details.get("dir", "")))
        if run.dry_run:
            text = f"check job {job}: would read its results in {out_dir} once it left the queue"
            run.said.append(Said(policy=remediate.POLICY, target=target, step="wait", text=text, dry_run=True))
            return
        problems: list[str] = []
        if not (out_dir / "done").exists() and checkjob.queued(self.runner, job):
            if run.now - check.t < p.check_timeout_minutes * 60.0:
                text = f"check job {job} still queued or running ({check.id})"
                run.said.append(Said(policy=remediate.POLICY, target=target, step="wait", text=text))
                return
            ran = self._ran("scancel", job)
            problems.append(
                f"check job {job} still running after {p.check_timeout_minutes:g} min: cancelled (rc {ran.rc})"
            )
        events, unread = remediate.read_results(out_dir, ep.node, p)
        if events:
            self.store.add(events)  # the results join the store: the health rules see them from now on
        outcome = remediate.judge_results(events, problems + unread, ep.node, link=p.link)
        result = self._record(
            self._action(
                run,
                policy=remediate.POLICY,
                step="result",
                episode=ep.episode,
                target=target,
                why=f"checks {'passed' if outcome.passed else 'failed'}: verdict {outcome.verdict}"
                + (f": {outcome.reason}" if outcome.reason else ""),
                evidence={
                    "verdict": outcome.verdict,
                    "passed": outcome.passed,
                    "checks": list(outcome.checks),
                    "problems": problems + unread,
                    "results": str(out_dir),
                },
                undo_note="a judgement, not an action",
                details=dict(check.details),
            )
        )
        self._say(run, target, result)
        self._conclude(run, ep, target, result, check)

    def _conclude(self, run: _Run, ep: remediate.DrainEpisode, target: str, result: Action, check: Action) -> None:
        if run.dry_run:
            text = f"would {'release' if result.evidence.get('passed') else 'drain'} ({result.id})"
            run.said.append(Said(policy=remediate.POLICY, target=target, step="wait", text=text, dry_run=True))
            return
        name = str(check.details.get("reservation", ""))
        common: dict[str, Any] = dict(
            policy=remediate.POLICY, episode=ep.episode, target=target, evidence={"result": result.id}
        )
        passed = bool(result.evidence.get("passed"))
        if not passed:
            reason = f"{remediate.FAILED_CHECKS} ({result.id}): {result.evidence.get('verdict')}"
            ran = self.runner.run(self._drain_argv(ep.node, reason))
            drain = self._record(
                self._action(
                    run,
                    step="drain",
                    why=f"{result.why}: kept drained",
                    argv=ran.argv,
                    rc=ran.rc,
                    output=ran.note(),
                    undo=self.runner.argv("scontrol", ("update", f"nodename={ep.node}", "state=resume"))
                    if ran.ok
                    else (),
                    **common,
                )
            )
            self._say(run, target, drain)
            self._notice(run, drain, "act_failed", {"node": ep.node}, audiences=("operators",))
        ran = self._ran("scontrol", "delete", f"reservationname={name}")
        undo = self._drain_argv(ep.node, f"hpcwatch: undo of the release of {ep.node}") if passed and ran.ok else ()
        release = self._record(
            self._action(
                run,
                step="release",
                why=f"reservation {name} deleted: "
                + ("the node takes jobs again" if passed else "the node stays drained"),
                argv=ran.argv,
                rc=ran.rc,
                output=ran.note(),
                undo=undo,
                undo_note="" if undo else "the reservation is not recreated",
                **common,
            )
        )
        self._say(run, target, release)
        if passed:
            self._notice(run, release, "act_done", {"target": target, "step": "resume"}, audiences=("operators",))

    def _failed(self, run: _Run, action: Action, ep: remediate.DrainEpisode) -> None:
        self._notice(run, action, "act_failed", {"node": ep.node}, audiences=("operators",))

    # -- undo ---------------------------------------------------------------------------------------

    def undo(self, action: str) -> tuple[Recorded, Undo]:
        """Run the recorded undo of ``action`` and audit it; ``ConfigError`` (exit 2) when there is none."""
        r = find(recorded(self.store), action)
        a = r.action
        if r.undone is not None:
            raise ConfigError(f"{a.id} ({a.step} {a.target}) was undone at {_utc(r.undone.t)} by {r.undone.who}")
        if a.details.get("stand_down"):  # a warning: withdrawn, no command; the policy reads the undo and stands down
            undo = Undo(of=a.id, t=self.clock(), who=self.who, argv=(), rc=0, output="warning withdrawn: left alone")
            self.store.add([undo.to_event()])
            return r, undo
        if not a.undo:
            raise ConfigError(f"{a.id} ({a.step} {a.target}) cannot be undone: {a.undo_note or 'no undo recorded'}")
        ran = self.runner.run(a.undo)
        undo = Undo(of=a.id, t=self.clock(), who=self.who, argv=ran.argv, rc=ran.rc, output=ran.note())
        self.store.add([undo.to_event()])
        return r, undo


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
