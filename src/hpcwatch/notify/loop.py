"""The loop: compose what is new, keep it as pending deliveries, deliver what the channels and limits allow.

    run_once:  candidates ─ keys no delivery row names ─ build ─ one commit of pending rows
               pending rows ─ rate limit per recipient ─ channel up? ─ send ─ sent rows committed by 50 / 1 s

A delivery is written ``pending`` before its first try, so neither a crash nor an outage loses it;
it becomes ``sent`` in a commit after the channel took it (by 50, or after a second). A crash between
the two sends those deliveries again on the next run (at least once: a webhook receiver can drop a
repeated ``X-Hpcwatch-Delivery``). A channel that fails is left alone for ``retry_base_s``, doubled at
each failure up to ``retry_max_s``; the first failure logs one WARNING line (the outage), the
first success after it one INFO line (the recovery, with how long it lasted); the tries between
log nothing. A recipient past ``rate_per_hour`` deliveries in the last hour waits for a later run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hpcwatch.errors import BackendError, one_line
from hpcwatch.notify.channels import CHANNELS
from hpcwatch.notify.compose import Addressed, Candidate, candidates
from hpcwatch.notify.config import NotifyConfig
from hpcwatch.notify.message import Channel, Payload
from hpcwatch.notify.render import Renderer, check_templates
from hpcwatch.store import NoticeRow, Store, queries

__all__ = ["Notifier", "RunSummary", "RATE_WINDOW_S", "check_channels"]

log = logging.getLogger("hpcwatch.notify")

#: The rate limit's window: deliveries per recipient in the last hour.
RATE_WINDOW_S = 3600.0
#: Candidates checked against the store's delivery rows per query.
_KEY_BATCH = 500
#: Sent rows are committed by 50, or after 1 s: one commit per mail cost 35 ms (fsync) of each; a kill
#: before the commit sends at most that many again (at least once).
_SENT_BATCH = 50
_SENT_COMMIT_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    composed: int = 0
    """Notices built this run (new keys)."""
    sent: int = 0
    failed: int = 0
    """Deliveries tried that failed (kept pending)."""
    deferred: int = 0
    """Deliveries not tried: recipient over its rate, or channel in its back-off."""
    pending: int = 0
    """Deliveries still owed after the run."""
    unrouted: int = 0
    """New notices no channel carries or nobody receives (no address): kept so they are not built again."""
    down: tuple[str, ...] = ()
    """Channels in an outage after the run."""
    unbuilt: int = 0
    """New notices that could not be built this run (logged; tried again next run)."""

    def as_dict(self) -> dict[str, object]:
        return {
            "composed": self.composed,
            "sent": self.sent,
            "failed": self.failed,
            "deferred": self.deferred,
            "pending": self.pending,
            "unrouted": self.unrouted,
            "down": list(self.down),
            "unbuilt": self.unbuilt,
        }


@dataclass(slots=True)
class _Health:
    failures: int = 0
    next_try: float = 0.0
    down_since: float | None = None


class Notifier:
    """One store, one config, its channels; ``run_once`` as often as wanted (``collect`` keeps one)."""

    def __init__(
        self,
        store: Store,
        config: NotifyConfig,
        *,
        channels: dict[str, Channel] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store, self.config, self.clock = store, config, clock
        self.channels: dict[str, Channel] = (
            channels
            if channels is not None
            else {c.name: CHANNELS[c.type].make(c.name, c.options) for c in config.channels}
        )
        self._sections = {c.name: c for c in config.channels}
        self._health = {name: _Health() for name in self.channels}
        self.renderer = Renderer(config.templates)
        self._unbuilt = 0
        self._unbuildable: set[str] = set()
        """Keys whose build raised, logged once each."""

    def check(self) -> None:
        """At start: the template folder, then every channel's server (``ConfigError``: exit 2)."""
        check_templates(self.config.templates)
        for channel in self.channels.values():
            channel.check()

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()

    # -- one run ------------------------------------------------------------------------------------

    def run_once(self, *, job: str | None = None, mail_user: str = "") -> RunSummary:
        now = self.clock()
        found = candidates(self.store, self.config, self.renderer, now=now, job=job, mail_user=mail_user)
        return self.post(found, now=now)

    def post(self, found: Iterable[Candidate], *, now: float | None = None) -> RunSummary:
        """Compose these candidates (each key once, as ``run_once`` does: a key a delivery row names is
        skipped) and deliver what is pending: how ``hpcwatch act`` sends its warnings and notices."""
        now = self.clock() if now is None else now
        self._unbuilt = 0
        composed, unrouted = self._compose(iter(found), now)
        sent, failed, deferred = self._deliver()
        for channel in self.channels.values():
            channel.close()  # one SMTP session per run, not one held open between runs
        return RunSummary(
            composed=composed,
            sent=sent,
            failed=failed,
            deferred=deferred,
            pending=len(queries.pending_notices(self.store)),
            unrouted=unrouted,
            down=tuple(n for n, h in self._health.items() if h.down_since is not None),
            unbuilt=self._unbuilt,
        )

    def _compose(self, found: object, now: float) -> tuple[int, int]:
        batch: list[Candidate] = []
        composed = unrouted = 0
        for candidate in found:  # type: ignore[attr-defined]
            batch.append(candidate)
            if len(batch) >= _KEY_BATCH:
                c, u = self._compose_batch(batch, now)
                composed, unrouted, batch = composed + c, unrouted + u, []
        if batch:
            c, u = self._compose_batch(batch, now)
            composed, unrouted = composed + c, unrouted + u
        return composed, unrouted

    def _compose_batch(self, batch: list[Candidate], now: float) -> tuple[int, int]:
        seen = queries.notice_keys(self.store, [c.key for c in batch])
        rows: list[NoticeRow] = []
        composed = unrouted = 0
        for candidate in batch:
            if candidate.key in seen:
                continue
            seen.add(candidate.key)
            try:
                messages = candidate.build()
            except Exception as err:  # one notice that cannot be built must not hold back the others
                self._unbuilt += 1
                if candidate.key not in self._unbuildable:
                    self._unbuildable.add(candidate.key)
                    log.warning(
                        "notify: cannot compose %s: %s: %s", candidate.key, type(err).__name__, one_line(str(err))
                    )
                continue  # not stored: tried again next run
            routed = self._rows(candidate, messages, now)
            composed += 1
            if not routed:
                unrouted += 1
                # what would have been said (its first message), so a view can show the notice nobody received
                routed = [
                    NoticeRow(
                        key=f"{candidate.key}|-|-",
                        notice=candidate.key,
                        kind=candidate.kind,
                        channel="-",
                        recipient="-",
                        state="unrouted",
                        t=now,
                        payload=messages[0].payload.to_json() if messages else "{}",
                    )
                ]
            rows += routed
        if rows:
            self.store.add(rows)
        return composed, unrouted

    def _rows(self, candidate: Candidate, messages: list[Addressed], now: float) -> list[NoticeRow]:
        rows = []
        for section in self.config.channels:
            per_address = CHANNELS[section.type].per_address
            for m in messages:
                if m.audience not in section.audiences or bool(m.address) != per_address:
                    continue
                recipient = m.address or m.audience
                rows.append(
                    NoticeRow(
                        key=f"{candidate.key}|{section.name}|{recipient}",
                        notice=candidate.key,
                        kind=candidate.kind,
                        channel=section.name,
                        recipient=recipient,
                        state="pending",
                        t=now,
                        payload=m.payload.to_json(),
                    )
                )
        return rows

    def _deliver(self) -> tuple[int, int, int]:
        now = self.clock()
        counts = queries.sent_counts_by_recipient(self.store, since=now - RATE_WINDOW_S)
        tally = {"sent": 0, "failed": 0, "deferred": 0}
        done: list[NoticeRow] = []
        last_commit = time.monotonic()
        try:
            for row in queries.pending_notices(self.store):
                tally[self._deliver_one(row, counts, done)] += 1
                if done and (len(done) >= _SENT_BATCH or time.monotonic() - last_commit >= _SENT_COMMIT_S):
                    self.store.add(done)
                    done, last_commit = [], time.monotonic()
        finally:
            if done:
                self.store.add(done)
        return tally["sent"], tally["failed"], tally["deferred"]

    def _deliver_one(self, row: NoticeRow, counts: dict[str, int], done: list[NoticeRow]) -> str:
        """``sent`` (its row appended to ``done``), ``failed`` (kept pending, one more attempt) or ``deferred``."""
        channel = self.channels.get(row.channel)
        health = self._health.get(row.channel)
        if channel is None or health is None:
            return "deferred"  # its channel left the config: kept, sent if it comes back
        if self.clock() < health.next_try or counts.get(row.recipient, 0) >= self.config.rate_per_hour:
            return "deferred"
        try:
            channel.send(Payload.from_json(row.payload), delivery=row.key)
        except BackendError as err:
            self._failed(row, health, err)
            return "failed"
        counts[row.recipient] = counts.get(row.recipient, 0) + 1
        done.append(_moved(row, state="sent", t=self.clock()))
        self._recovered(row.channel, health)
        return "sent"

    def _failed(self, row: NoticeRow, health: _Health, err: BackendError) -> None:
        now = self.clock()
        health.failures += 1
        health.next_try = now + min(self.config.retry_base_s * 2 ** (health.failures - 1), self.config.retry_max_s)
        self.store.add([_moved(row, state="pending", t=row.t, attempts=row.attempts + 1)])
        if health.down_since is None:
            health.down_since = now
            log.warning(
                "notify: channel %s is down (%s); deliveries stay pending, retried with back-off",
                row.channel,
                one_line(str(err)),
            )

    def _recovered(self, name: str, health: _Health) -> None:
        if health.down_since is not None:
            log.info(
                "notify: channel %s is back after %.0f s and %d failed tries",
                name,
                self.clock() - health.down_since,
                health.failures,
            )
        health.failures, health.next_try, health.down_since = 0, 0.0, None


def _moved(row: NoticeRow, *, state: str, t: float, attempts: int | None = None) -> NoticeRow:
    return NoticeRow(
        key=row.key,
        notice=row.notice,
        kind=row.kind,
        channel=row.channel,
        recipient=row.recipient,
        state=state,
        t=t,
        attempts=row.attempts if attempts is None else attempts,
        payload=row.payload,
    )


def check_channels(config: NotifyConfig) -> None:
    """What ``Notifier.check`` checks, without a store (``hpcwatch collect`` before it starts its threads)."""
    check_templates(config.templates)
    for section in config.channels:
        channel = CHANNELS[section.type].make(section.name, section.options)
        try:
            channel.check()
        finally:
            channel.close()
