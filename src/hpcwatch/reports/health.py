"""Node health from the store (passive: samples and XID events in a window) plus benchmark results (active).

``active`` are the events of benchmark outputs the caller read (``dcgmi diag``,
nccl-tests, ib_write_bw; ``sources.healthtools``); stored ones of the same
kinds are judged too, whatever their time (a benchmark is run once, not scraped),
the newest of each kind on each node only: a later run of the same test
supersedes an earlier one (a node repaired and tested again is judged on the
new result).

What ``hpcwatch act``'s checks answered is not judged again
(``reports.acting.node_checks``): once a node's checks passed and released
it, what it showed before it was resumed into their reservation is left out;
while they run, the node is marked ``under_test`` (its verdict is kept, for
the record and for the episode, but a health check leaves it to the checks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import orjson
import pyarrow.compute as pc

from hpcwatch import vocab
from hpcwatch.analysis.health import (
    HOST_EVENT_KINDS,
    PASSIVE_METRICS,
    VERDICTS,
    Check,
    HealthConfig,
    HealthReport,
    health_report,
    nccl_log_checks,
    version_checks,
)
from hpcwatch.analysis.health_rules import HEALTH_RULES
from hpcwatch.analysis.xid import Verdict
from hpcwatch.records import Event
from hpcwatch.reports.acting import NodeChecks, node_checks
from hpcwatch.reports.healthwindow import KeptWindow
from hpcwatch.store import Store, queries
from hpcwatch.vocab import EventKind

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "node_health",
    "health_rules",
    "rule_verdicts",
    "verdict_event_attrs",
    "verdict_events",
    "StoredHealth",
    "latest_health",
    "VERDICT_NUMBERS",
    "DEFAULT_HEALTH_WINDOW_S",
    "ACTIVE_EVENT_KINDS",
]

#: Default look-back: the last 15 minutes before the newest sample.
DEFAULT_HEALTH_WINDOW_S = 900.0
#: A judgement that keeps its window (``KeptWindow``) judges the fleet's versions (driver, VBIOS, firmware, NCCL:
#: ``analysis.health.version_checks``) again once its data moved on this far: they change when a node is
#: upgraded or rebooted, and judging them took a sixth of each judgement at 1,024 nodes (every distinct label
#: set of the window read). Ours: a minute, as often as Prometheus' default rule evaluation.
FLEET_EVERY_S = 60.0
#: A verdict as a number, for ``/metrics`` and its alerting rules: its rank in ``analysis.health.VERDICTS``.
VERDICT_NUMBERS: dict[Verdict, int] = {v: i for i, v in enumerate(VERDICTS)}
ACTIVE_EVENT_KINDS = (
    EventKind.DCGM_DIAG,
    EventKind.NCCL_TEST,
    EventKind.IB_WRITE_BW,
    EventKind.NCCL_RANK,
    EventKind.NCCL_TIMEOUT,
)


def _stored_inputs(
    store: Store, node: str | None, window_s: float, kept: KeptWindow | None
) -> tuple[pa.Table, list[Event], float | None]:
    """The window's passive samples (from ``kept`` when given, for every node), events, the newest stored
    result of each active test, and the window's end (the newest sample's time)."""
    kept = kept if node is None else None
    newest = kept.newest(store) if kept is not None else store.time_range()[1]
    t0 = newest - window_s if newest is not None else None
    samples = kept.samples(store, PASSIVE_METRICS, t0=t0) if kept is not None and t0 is not None else None
    if samples is None:
        samples = queries.window_samples(store, PASSIVE_METRICS, host=node, t0=t0)
    window_kinds = (EventKind.XID, *HOST_EVENT_KINDS)
    if kept is not None:
        events = kept.events(store, window_kinds, t0=t0)
        events += _newest_results(kept.events(store, ACTIVE_EVENT_KINDS))
    else:
        events = [e for kind in window_kinds for e in store.events(kind, t0=t0)]
        events += _newest_results([e for kind in ACTIVE_EVENT_KINDS for e in store.events(kind)])
    return samples, events, newest


#: Test results of which only a node's newest counts (NCCL logs are a job's record: each is judged).
_SUPERSEDED_KINDS = frozenset({EventKind.DCGM_DIAG, EventKind.NCCL_TEST, EventKind.IB_WRITE_BW})


def _newest_results(events: list[Event]) -> list[Event]:
    """``events`` less the test results a newer run of the same test on the same node supersedes."""
    newest: dict[tuple[str, object], Event] = {}
    for e in events:
        key = (e.kind, e.attrs.get("node"))
        if e.kind in _SUPERSEDED_KINDS and (key not in newest or e.t >= newest[key].t):
            newest[key] = e
    kept = set(map(id, newest.values()))
    return [e for e in events if e.kind not in _SUPERSEDED_KINDS or id(e) in kept]


def _unanswered(samples: pa.Table, events: list[Event], checked: dict[str, NodeChecks]) -> tuple[pa.Table, list[Event]]:
    """Samples and events less what each node showed up to its passed checks' start (``answered_to``)."""
    answered = {node: c.answered_to for node, c in checked.items() if c.answered_to is not None}
    if not answered:
        return samples, events
    if samples.num_rows:
        seen_before = None
        for node, t in answered.items():
            rows = pc.and_(pc.equal(samples["host"], node), pc.less_equal(samples["t"], t))
            seen_before = rows if seen_before is None else pc.or_(seen_before, rows)
        samples = samples.filter(pc.invert(pc.fill_null(seen_before, False)))
    kept = [e for e in events if not (e.attrs.get("node") in answered and e.t <= answered[str(e.attrs["node"])])]
    return samples, kept


def _all_hosts_gpu_samples(store: Store, window_s: float) -> pa.Table:
    """Every host's passive samples of the window (the GPU ones carry the driver version label; PASSIVE_METRICS
    holds the fleet rules' own, analysis.health.FLEET_METRICS)."""
    _, newest = store.time_range()
    return queries.window_samples(store, PASSIVE_METRICS, t0=newest - window_s if newest is not None else None)


def _node_partitions(store: Store) -> dict[str, str]:
    """node -> the partition the fleet rules group it in: the partitions Slurm's node list gives it (sinfo --json,
    slurmrestd: ``slurm_node_up``'s ``partitions`` label, comma-joined when several), else the partition its
    stored jobs ran in."""
    out = {n: job.partition for job in store.jobs() if job.partition for n in job.nodes}
    for host, raw, _ in queries.newest_label_sets(store, vocab.SLURM_NODE_UP):  # oldest first: the newest wins
        listed = orjson.loads(raw or "{}").get("partitions")
        if host and listed:
            out[str(host)] = str(listed)
    return out


def _for_node(events: list[Event], node: str) -> list[Event]:
    """Events of ``node``; those that name no node are taken to be its (a benchmark run on it)."""
    mine = [e for e in events if e.attrs.get("node") in (node, None)]
    return [
        e if e.attrs.get("node") else Event(kind=e.kind, t=e.t, source=e.source, attrs={**e.attrs, "node": node})
        for e in mine
    ]


def _nccl_checks(store: Store, events: Sequence[Event]) -> list[Check]:
    """``nccl_log_checks`` with what the store knows: the Slurm jobs (to group the logs) and the hosts
    whose IB ports it holds (a Socket transport there is a fallback)."""
    from hpcwatch.reports.nccl import job_of_processes

    if not any(e.kind == EventKind.NCCL_RANK for e in events):
        return nccl_log_checks(events)
    ib_hosts = queries.hosts_with(store, [vocab.IB_PORT_UP, vocab.IB_PORT_RATE_GBPS])
    return nccl_log_checks(events, ib_hosts=ib_hosts, job_of=job_of_processes(store.jobs()))


def node_health(
    store: Store,
    *,
    node: str | None = None,
    window_s: float = DEFAULT_HEALTH_WINDOW_S,
    active: Sequence[Event] = (),
    link: str = "ndr",
    config: HealthConfig = HealthConfig(),
    kept: KeptWindow | None = None,
    fleet_every_s: float = FLEET_EVERY_S,
) -> HealthReport:
    """Every node's verdict (or ``node``'s only) over the last ``window_s`` seconds of samples; ``kept``: the
    window as the last call with it left it (a reader that judges again and again: ``reports.healthwindow``),
    which also keeps the fleet's version checks until its data moved on by ``fleet_every_s`` (0: judged each
    call)."""
    samples, events, newest = _stored_inputs(store, node, window_s, kept)
    checked = node_checks(store)
    samples, events = _unanswered(samples, events, checked)
    events = events + list(active)
    # the NCCL rules compare the job's hosts: judged over all of them (then kept for this node), job by job
    nccl_checks = _nccl_checks(store, events)

    # the fleet rules compare the nodes of a partition: judged over every host's GPU samples too
    def fleet_checks() -> list[Check]:
        all_hosts = samples if node is None else _all_hosts_gpu_samples(store, window_s)
        return version_checks(all_hosts, _node_partitions(store), events)

    if kept is not None and node is None:
        fleet = kept.every("fleet", newest, fleet_every_s, fleet_checks)
    else:
        fleet = fleet_checks()
    if node is not None:
        nccl_checks = [c for c in nccl_checks if c.node == node]
        fleet = [c for c in fleet if c.node == node]
        events = _for_node(events, node)
    report = health_report(
        samples,
        events,
        config=config,
        link=link,
        nodes=[node] if node else [],
        nccl_checks=nccl_checks,
        fleet_checks=fleet,
    )
    if node is not None:
        report = HealthReport(nodes=tuple(n for n in report.nodes if n.node == node))
    return _mark_under_test(report, checked, newest)


def _mark_under_test(report: HealthReport, checked: dict[str, NodeChecks], now: float | None) -> HealthReport:
    """Each node whose checks run (and whose reservation has not ended by ``now``) marked ``under_test``."""
    testing = {
        node: c.under_test
        for node, c in checked.items()
        if c.under_test and (now is None or c.test_ends is None or now < c.test_ends)
    }
    if not testing:
        return report
    return HealthReport(nodes=tuple(replace(n, under_test=testing.get(n.node, "")) for n in report.nodes))


def rule_verdicts(report: HealthReport) -> dict[tuple[str, str], Verdict]:
    """``{(node, rule): verdict}``: each rule's worst verdict on each node (a rule fires once per GPU or port;
    an alert is per node and rule), ``ok`` for the rules that looked and found nothing."""
    out: dict[tuple[str, str], Verdict] = {}
    for n in report.nodes:
        for c in n.checks:
            key = (n.node, c.rule)
            if key not in out or VERDICT_NUMBERS[c.verdict] > VERDICT_NUMBERS[out[key]]:
                out[key] = c.verdict
    return out


def verdict_event_attrs(report: HealthReport) -> list[dict[str, Any]]:
    """The attrs of the ``health_verdict`` events ``hpcwatch collect``'s health task stores, one per node:
    ``node``, ``verdict``, ``reason`` and ``rules`` (rule -> its worst verdict there, ``rule_verdicts``)."""
    by_node: dict[str, dict[str, Verdict]] = {}
    for (node, rule), v in sorted(rule_verdicts(report).items()):  # once, not once a node: 1,024 nodes x 30 rules
        by_node.setdefault(node, {})[rule] = v
    return [
        {"node": n.node, "verdict": n.verdict, "reason": n.reason(), "rules": by_node.get(n.node, {})}
        for n in report.nodes
    ]


def verdict_events(
    store: Store, *, t: float, source: str, window_s: float, kept: KeptWindow | None = None
) -> list[Event]:
    """One run of the health rules over the last ``window_s`` as ``health_verdict`` events dated ``t``, one per
    node (``verdict_event_attrs``): what ``collect``'s health task stores, and ``hpcwatch demo`` on its twin.
    ``kept``: the window as the last run left it (``node_health``)."""
    report = node_health(store, window_s=window_s, kept=kept)
    return [
        Event(kind=EventKind.HEALTH_VERDICT, t=t, source=source, attrs=attrs) for attrs in verdict_event_attrs(report)
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredHealth:
    """The newest run of ``hpcwatch collect``'s health task, as stored."""

    t: float
    """When that run judged (UTC seconds, the collector's clock)."""
    verdicts: dict[tuple[str, str], Verdict]
    """``{(node, rule): verdict}`` of that run."""


def latest_health(store: Store) -> StoredHealth | None:
    """The verdicts of the newest stored health run (``health_verdict`` events sharing the newest ``t``), None
    when no run was stored. What ``/metrics`` publishes as ``hpcwatch_health_verdict`` and the alerting rules
    (deploy/prometheus/hpcwatch-alerts.yml) route: the exporter shows the collector's verdicts, as it shows
    the stored assessment, instead of judging the window again on every scrape. One health task per store is
    assumed (the central daemon's, as deploy/hpcwatch.toml has it): two daemons' runs have two times, and only
    the newer run is shown."""
    events = queries.newest_events(store, EventKind.HEALTH_VERDICT)
    if not events:
        return None
    verdicts: dict[tuple[str, str], Verdict] = {}
    for e in events:
        rules = e.attrs.get("rules")
        if isinstance(rules, dict):
            verdicts.update(
                {(str(e.attrs.get("node")), str(r)): cast(Verdict, v) for r, v in rules.items() if v in VERDICT_NUMBERS}
            )
    return StoredHealth(t=events[0].t, verdicts=verdicts)


def health_rules(config: HealthConfig = HealthConfig()) -> list[dict[str, Any]]:
    """Every rule of ``HEALTH_RULES`` as ``--list-rules`` shows it, thresholds filled with ``config``'s values."""
    values = asdict(config)
    return [rule.to_dict(values) for rule in HEALTH_RULES]
