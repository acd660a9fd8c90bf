"""The remediation loop ``hpcwatch demo`` plays on its twin: a drain verdict, the warning, the reservation, the
check job, then the node resumed or kept drained, every step an ``act_action`` event in the store.

    every HEALTH_EVERY_S simulated   the health rules (reports.health.verdict_events): health_verdict events in
                                     the store, and the twin's Slurm drains a node whose verdict turns drain
                                     (its HealthCheckProgram, twin/slurmctl.py)
    every ACT_EVERY_S simulated      act.loop.Actor.run_once with [act.remediate] only, not a dry run: its
                                     commands answered by the twin's Slurm, in this process; its clock the twin's

Nothing real is touched: no command leaves the process, and the check job's script and outputs go to a temporary
folder removed at the end. The actor's notices are composed and recorded; the demo has no channel, so they are
``unrouted`` (the job page says "no channel"). This sits in ``cli`` because it joins ``act`` and ``twin``, and
only the views may import both (docs/architecture.md).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hpcwatch.act.config import DEFAULT_INTERVAL_S, ActConfig, RemediatePolicy
from hpcwatch.act.loop import Actor
from hpcwatch.act.runner import Runner
from hpcwatch.notify.config import NotifyConfig
from hpcwatch.notify.loop import Notifier
from hpcwatch.reports.health import DEFAULT_HEALTH_WINDOW_S, verdict_events
from hpcwatch.reports.healthwindow import KeptWindow
from hpcwatch.store import Store
from hpcwatch.twin.live import LiveTwin
from hpcwatch.twin.slurmctl import TwinSlurm
from hpcwatch.web.demo import Periodic

__all__ = ["DemoRemediation", "DEMO_WARN_MINUTES", "HEALTH_EVERY_S", "ACT_EVERY_S", "HEALTH_BUSY_SHARE"]

#: Ours: the operators' delay before a drained node is reserved ([act.remediate] warn_minutes, 15 by default).
#: Long enough that the xid79 node's reboot (Xid79.TEARDOWN_S + REBOOT_S, 190 s) is over when its checks run, as
#: it would be after 15 min; short enough that ``--speed 20`` plays the whole loop in under a minute.
DEMO_WARN_MINUTES = 5.0
#: Ours: simulated seconds between two runs of the health rules (deploy/hpcwatch.toml: 600): a verdict follows
#: the twin's fault within 5 simulated minutes. Every minute, a 128-node demo spent a sixth more CPU than
#: without the loop on a loaded 2-core machine (its snapshot runs the same rules each tick for the page).
HEALTH_EVERY_S = 300.0
#: Simulated seconds between two runs of the actor: ``[act] interval_s``'s default.
ACT_EVERY_S = DEFAULT_INTERVAL_S
#: Ours: the health rules run at most this share of the time (a run over 128 nodes' last 15 min takes ~1.8 s:
#: one every simulated minute at --speed 20 would keep most of a core busy; this spaces the runs out instead).
HEALTH_BUSY_SHARE = 0.1


class DemoRemediation:
    """The health rules and the actor on ``live``'s twin, each in its thread: ``start()``, ``stop()``."""

    def __init__(self, store: Store, live: LiveTwin, *, warn_minutes: float = DEMO_WARN_MINUTES) -> None:
        self.store = store
        self.slurm = TwinSlurm(live)
        self.work_dir = Path(tempfile.mkdtemp(prefix="hpcwatch-demo-act-"))
        policy = RemediatePolicy(enabled=True, work_dir=str(self.work_dir), warn_minutes=warn_minutes)
        config = ActConfig(who="hpcwatch-demo", remediate=policy)
        runner = Runner(config.commands, timeout_s=config.command_timeout_s, in_process=self.slurm.answer)
        notifier = Notifier(store, NotifyConfig(), channels={}, clock=self.slurm.now)
        self.actor = Actor(store, config, runner=runner, notifier=notifier, clock=self.slurm.now)
        # Nothing changes between two ticks of the twin: no run comes more often than one a tick.
        every = {
            what: max(live.tick_s, s / live.speed) for what, s in (("health", HEALTH_EVERY_S), ("act", ACT_EVERY_S))
        }
        self.health = Periodic("health rules", self.judge, every_s=every["health"], busy_share=HEALTH_BUSY_SHARE)
        self._window = KeptWindow()  # each run reads only what the twin wrote since the last
        self.acting = Periodic("remediation", self.actor.run_once, every_s=every["act"])

    def judge(self) -> int:
        """One run of the health rules: its verdicts stored, and given to the twin's Slurm health check."""
        t = self.slurm.now()
        events = verdict_events(
            self.store, t=t, source="hpcwatch demo", window_s=DEFAULT_HEALTH_WINDOW_S, kept=self._window
        )
        self.store.add(events)
        self.slurm.health_check(e.attrs for e in events)
        return len(events)

    def start(self) -> DemoRemediation:
        self.health.start()
        self.acting.start()
        return self

    def stop(self) -> None:
        self.acting.stop()
        self.health.stop()
        self.actor.close()
        shutil.rmtree(self.work_dir, ignore_errors=True)
