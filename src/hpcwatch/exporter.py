"""hpcwatch's derived metrics on ``/metrics``, for the Prometheus that already scrapes the cluster.

Why: dcgm-exporter says what each GPU does; it cannot say what a *job* cost, whether its GPUs sat
idle, which rank slows the others or which threat fired. hpcwatch computes those from its store;
this module hands them to Prometheus (and Grafana, deploy/grafana/hpcwatch.json) in its own format.

A custom collector (https://prometheus.github.io/client_python/collector/custom/) reads the store on
every scrape and calls the reports (hpcwatch.reports, the same the CLI and the web call), so a scrape shows the
store as it is. What a scrape costs does not grow with the store's age (``ScrapesKept``, one for every scope):
the per-job sums read on from the checkpoints the last scrape left (``reports.storestretches``; read whole, a
1,024-node store ten minutes old took 6.7 s a scrape, and more as it aged), and the training figures are
computed again only for the jobs whose spans, goodput events or record changed (``reports.training``).
The per-job and training families show the running jobs and those that ended within a day before the store's
newest sample (``DEFAULT_ENDED_WITHIN_S``, ``hpcwatch exporter --ended-within``): Prometheus keeps the older
ones' last values in its history, and the scrapes keep nothing of them.
Every family is a gauge: each value is recomputed from the store, none counts events itself.

    hpcwatch_job_info{hpc_job,user,account,partition,state} 1     join key for dcgm-exporter's hpc_job
    hpcwatch_gpu_allocation_info{hpc_job,user,account,host,gpu} 1  one per GPU a running job holds (Slurm's
                                                             gres indices): the join key when dcgm-exporter
                                                             runs without the hpc_job label (deploy/prometheus/)
    hpcwatch_job_gpus{hpc_job,user,account}                  GPUs allocated
    hpcwatch_job_gpu_hours{hpc_job,user,account}             GPU-hours (GPUs x wall time)
    hpcwatch_job_energy_joules{hpc_job,user,account}         GPU energy
    hpcwatch_job_gpu_utilization_percent{hpc_job,user,account}   mean DCGM_FI_DEV_GPU_UTIL
    hpcwatch_job_idle_gpus{hpc_job,user,account}             allocated GPUs that stayed idle
    hpcwatch_job_step_seconds{hpc_job}                       median training step (slowest rank)
    hpcwatch_job_stragglers{hpc_job}                         ranks named stragglers
    hpcwatch_rank_straggler{hpc_job,rank,node,gpu} 1         one per rank named a straggler (the alert's node)
    hpcwatch_rank_relative_score{hpc_job,rank,node,gpu}      fastest rank's work / this rank's (1 = best)
    hpcwatch_job_goodput_ratio{hpc_job}                      productive time / wall time
    hpcwatch_findings{vector,severity}                       findings in the store (every pair, 0 included)
    hpcwatch_finding_rules{vector,rule,severity}             the same by detector rule (the triples with findings)
    hpcwatch_health_verdict{node,rule}                       each health rule's worst verdict on each node in the
                                                             newest stored health run (``hpcwatch collect``'s
                                                             ``task = "health"``): 0 ok, 1 warn, 2 drain
                                                             (reports/health.VERDICT_NUMBERS); not judged again
                                                             per scrape (benchmarks/RESULTS.md: 1.6 s at 128
                                                             nodes live, 5 ms stored)
    hpcwatch_health_verdict_timestamp_seconds                when that run judged (UTC s)
    hpcwatch_assessment_tier{category}                       the newest stored assessment (``hpcwatch collect``'s
                                                             ``task = "assess"``): 4 Platinum, 3 Gold, 2 Silver,
                                                             1 Bronze, 0 Underperform; ``category="overall"`` is the
                                                             cluster's tier (reports/assess.TIER_NUMBERS)
    hpcwatch_exporter_collect_seconds, hpcwatch_exporter_collect_errors   the exporter itself
    hpcwatch_exporter_computed_timestamp_seconds{part}       when the per-job (part="jobs") and training figures
                                                             served were computed: a scrape waits ``COMPUTE_WAIT_S``
                                                             for them, then serves the last ones computed
    hpcwatch_collector_up{collector,kind,daemon}             1 when a collector of ``hpcwatch collect`` answers
    hpcwatch_collector_last_success_timestamp_seconds{...}   its last run that succeeded (UTC s)
    hpcwatch_collector_interval_seconds{...}                 its polling interval (freshness: the last success is
                                                             due within 3 intervals, reports/collectors.py)
    hpcwatch_collector_lag_seconds{...}, hpcwatch_collector_errors_total{...}, hpcwatch_collector_records_total{...}

The Slurm job is labelled ``hpc_job``, as dcgm-exporter labels it, not ``job``: Prometheus owns
``job`` (the scrape job) and would rename ours to ``exported_job``, breaking every join.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any, Final, Generic, TypeVar
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from hpcwatch.access.scope import FULL, Scope
from hpcwatch.errors import HpcwatchError
from hpcwatch.httpguard import DEFAULT_LIMITS, SECURITY_HEADERS, Limits, allowed_hosts, host_allowed
from hpcwatch.records import Job
from hpcwatch.reports.assess import latest_assessment
from hpcwatch.reports.collectors import collector_statuses
from hpcwatch.reports.findings import finding_counts, finding_rule_counts
from hpcwatch.reports.health import VERDICT_NUMBERS, latest_health
from hpcwatch.reports.jobs import DCGM_METRICS, jobs_report
from hpcwatch.reports.scoped import scoped_jobs
from hpcwatch.reports.steps import DEFAULT_RECENT_STEPS
from hpcwatch.reports.storestretches import KeptStore
from hpcwatch.reports.text import visible
from hpcwatch.reports.training import KeptTraining
from hpcwatch.store import Store

log = logging.getLogger(__name__)

_T = TypeVar("_T")

__all__ = [
    "StoreCollector",
    "JobUsage",
    "allocation_rows",
    "ALLOCATION_LABELS",
    "METRIC_NAMES",
    "DEFAULT_PORT",
    "DEFAULT_RECENT_STEPS",
    "registry_for",
    "serve_metrics",
]

DEFAULT_PORT = 9977
"""Unassigned in the Prometheus default port allocations (https://github.com/prometheus/prometheus/wiki/Default-port-allocations)."""
JOB_LABELS = ("hpc_job", "user", "account")
ALLOCATION_LABELS = ("hpc_job", "user", "account", "host", "gpu")
J_PER_KWH = 3.6e6

METRIC_NAMES = (
    "hpcwatch_job_info",
    "hpcwatch_gpu_allocation_info",
    "hpcwatch_job_gpus",
    "hpcwatch_job_gpu_hours",
    "hpcwatch_job_energy_joules",
    "hpcwatch_job_gpu_utilization_percent",
    "hpcwatch_job_idle_gpus",
    "hpcwatch_job_step_seconds",
    "hpcwatch_job_stragglers",
    "hpcwatch_rank_straggler",
    "hpcwatch_rank_relative_score",
    "hpcwatch_job_goodput_ratio",
    "hpcwatch_findings",
    "hpcwatch_finding_rules",
    "hpcwatch_health_verdict",
    "hpcwatch_health_verdict_timestamp_seconds",
    "hpcwatch_assessment_tier",
    "hpcwatch_exporter_collect_seconds",
    "hpcwatch_exporter_collect_errors",
    "hpcwatch_exporter_computed_timestamp_seconds",
    "hpcwatch_collector_up",
    "hpcwatch_collector_last_success_timestamp_seconds",
    "hpcwatch_collector_interval_seconds",
    "hpcwatch_collector_lag_seconds",
    "hpcwatch_collector_errors_total",
    "hpcwatch_collector_records_total",
)
"""Every family this exporter can emit (the Grafana dashboard test checks its queries against it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobUsage:
    """What the exporter shows per job; built from the attribution analysis."""

    job: Job
    gpu_hours: float
    energy_j: float | None
    mean_util_percent: float | None
    idle_gpus: int


UsageFn = Callable[[Store], list[JobUsage]]


#: The jobs a scrape shows: those running and those that ended within this many seconds before the store's newest
#: sample. Prometheus keeps an ended job's last values in its own history; exported for ever, the 100,000 jobs of a
#: store months old at 1,024 nodes made a scrape of 436,000 lines and 10-12 s (benchmarks/RESULTS.md). A day: a
#: daily report or a morning look at the night's jobs finds them. Ours.
DEFAULT_ENDED_WITHIN_S: Final = 86_400.0


class ScrapesKept:
    """What the scrapes keep of the reports from one to the next: the per-job sums of the store's recent jobs
    (``reports.storestretches``) and their training figures (``reports.training``). The figures are the same
    whatever the scope, which only filters them: one for every scope's collector."""

    def __init__(self, *, ended_within_s: float = DEFAULT_ENDED_WITHIN_S) -> None:
        """``ended_within_s``: the jobs shown, running or ended within this many seconds before the newest sample
        (inf: all)."""
        self.jobs = KeptStore(ended_within_s=ended_within_s, on_disk=True)
        """Its newest settled checkpoint also in the store's folder: a restarted exporter reads on from it."""
        self.training = KeptTraining(ended_within_s=ended_within_s)


#: How long a scrape waits for the per-job and the training figures before it serves the last ones computed (none
#: before the first): the first scrape of a store without a checkpoint in its folder reads the store's life (a day
#: at 1,024 nodes: a quarter of an hour), and a scrape that waited past Prometheus' ``scrape_timeout`` (10 s by
#: default) would lose every family, the health verdicts the alerts route among them. The computation goes on and
#: the next scrape takes it. Ours.
COMPUTE_WAIT_S: Final = 5.0


class _Newest(Generic[_T]):
    """A computation run in a thread of its own, one at a time: ``get`` waits for the one running (started if
    none is) and gives its result with the time it was computed, else, past the wait, the last one's (None:
    none yet). The computation's error comes out of the ``get`` that sees it end."""

    def __init__(self, compute: Callable[[], _T], name: str) -> None:
        self._compute, self._name = compute, name
        self._lock = threading.Lock()
        self._running: Future[tuple[_T, float]] | None = None
        self._newest: tuple[_T, float] | None = None

    def start(self) -> None:
        """Start a computation unless one is running."""
        with self._lock:
            if self._running is None:
                self._running = self._start()

    def get(self, wait_s: float) -> tuple[_T, float] | None:
        self.start()
        with self._lock:
            running = self._running
        if running is None:  # taken and cleared by another scrape since: what it took is the newest
            return self._newest
        try:
            found = running.result(timeout=wait_s)
        except FutureTimeout:
            return self._newest
        finally:
            with self._lock:
                if running.done() and self._running is running:
                    self._running = None
        with self._lock:
            if self._newest is None or found[1] >= self._newest[1]:
                self._newest = found
            return self._newest

    def _start(self) -> Future[tuple[_T, float]]:
        future: Future[tuple[_T, float]] = Future()

        def run() -> None:
            try:
                future.set_result((self._compute(), time.time()))
            except BaseException as err:  # handed to the scrape that takes it, which counts it
                future.set_exception(err)

        threading.Thread(target=run, name=f"hpcwatch-exporter-{self._name}", daemon=True).start()
        return future


class StoreCollector(Collector):
    """Reads ``store`` on each scrape and yields hpcwatch's metric families."""

    def __init__(
        self,
        store: Store,
        *,
        usage: UsageFn | None = None,
        recent_steps: int = DEFAULT_RECENT_STEPS,
        scope: Scope = FULL,
        kept: ScrapesKept | None = None,
        ended_within_s: float = DEFAULT_ENDED_WITHIN_S,
    ) -> None:
        self.store = store
        self.scope = scope
        """Whose labels a scrape carries (``reports.scoped.scoped_jobs``): ``FULL`` for a local exporter, a
        decider token's scope pseudonymises user and account, a user's keeps their jobs only."""
        self.kept = kept if kept is not None else ScrapesKept(ended_within_s=ended_within_s)
        """What the scrapes keep of the reports (several collectors, one a scope, share one); its window
        (``ended_within_s``) says which jobs a scrape shows."""
        self._usage = usage or (lambda store: job_usage(store, kept=self.kept.jobs))
        self.recent_steps = recent_steps
        self.errors = 0
        self._computed: dict[str, float] = {}
        """When the figures this scrape serves were computed, per part (``hpcwatch_exporter_computed_…``)."""
        self._wait_until = 0.0
        """The monotonic time past which this scrape waits for no computation."""
        self._usage_in_time = _Newest(lambda: self._usage(self.store), "jobs")
        self._training_in_time = _Newest(
            lambda: self.kept.training.reports(self.store, recent_steps=self.recent_steps), "training"
        )

    def describe(self) -> Iterable[Metric]:
        return []  # no scrape at registration time: the store may be large

    def collect(self) -> Iterator[Metric]:
        t0 = time.perf_counter()
        families: list[Metric] = []
        parts = self._parts()
        # Both computations at once, and one wait for both: a scrape lasts COMPUTE_WAIT_S more at most.
        self._wait_until = time.monotonic() + COMPUTE_WAIT_S
        self._usage_in_time.start()
        if self._training in parts:
            self._training_in_time.start()
        for part in parts:
            try:
                families.extend(part())
            except HpcwatchError as err:  # one failing part must not blank the others
                self.errors += 1
                print(f"hpcwatch exporter: {part.__name__.strip('_')}: {err}", file=sys.stderr)
        yield from families
        yield _gauge(
            "hpcwatch_exporter_collect_seconds",
            "Time the last scrape spent reading the store.",
            [],
            [([], time.perf_counter() - t0)],
        )
        yield _gauge(
            "hpcwatch_exporter_collect_errors",
            "Scrape parts that failed since start (see stderr).",
            [],
            [([], float(self.errors))],
        )
        yield _gauge(
            "hpcwatch_exporter_computed_timestamp_seconds",
            f"When the figures served were computed (UTC s): a scrape waits {COMPUTE_WAIT_S:g} s for them, "
            "then serves the last ones computed (the first scrape after a start may read the whole store).",
            ["part"],
            [([part], at) for part, at in sorted(self._computed.items())],
        )

    def _parts(self) -> list[Callable[[], list[Metric]]]:
        """The families the scope may read: findings need ``findings``, health and collectors ``health``."""
        can = self.scope.can
        parts: list[Callable[[], list[Metric]]] = [self._jobs]
        parts += [self._training] if self.scope.all_jobs else []
        parts += [self._findings] if can("findings") else []
        parts += [self._health, self._collectors] if can("health") else []
        parts += [self._assessment] if can("aggregates") or can("health") else []
        return parts

    # -- parts ---------------------------------------------------------------------------------------

    def _in_time(self, part: str, newest: _Newest[list[_T]]) -> list[_T] | None:
        """``newest``'s figures if ready within the scrape's wait (``COMPUTE_WAIT_S`` from its start), else the
        last ones computed (None: none yet); when they were computed is served beside them."""
        found = newest.get(max(0.0, self._wait_until - time.monotonic()))
        if found is None:
            self._computed.pop(part, None)
            return None
        self._computed[part] = found[1]
        return found[0]

    def _jobs(self) -> list[Metric]:
        computed = self._in_time("jobs", self._usage_in_time)
        if computed is None:
            return []
        usage = self._scoped(computed)
        info = [
            ([u.job.id, u.job.user or "", u.job.account or "", u.job.partition or "", u.job.state or ""], 1.0)
            for u in usage
        ]
        keyed = [([u.job.id, u.job.user or "", u.job.account or ""], u) for u in usage]
        return [
            _gauge(
                "hpcwatch_job_info",
                "Slurm job metadata; join on hpc_job with dcgm-exporter series.",
                ["hpc_job", "user", "account", "partition", "state"],
                info,
            ),
            _gauge(
                "hpcwatch_gpu_allocation_info",
                "One per GPU a running job holds; join on (host, gpu) with "
                "dcgm-exporter series (deploy/prometheus/hpcwatch-rules.yml).",
                ALLOCATION_LABELS,
                [(row, 1.0) for row in allocation_rows(u.job for u in usage)],
            ),
            _gauge(
                "hpcwatch_job_gpus",
                "GPUs allocated to the job.",
                JOB_LABELS,
                [(k, float(u.job.gpus)) for k, u in keyed],
            ),
            _gauge(
                "hpcwatch_job_gpu_hours",
                "GPU-hours: allocated GPUs x wall time.",
                JOB_LABELS,
                [(k, u.gpu_hours) for k, u in keyed],
            ),
            _gauge(
                "hpcwatch_job_energy_joules",
                "Energy of the job's GPUs (DCGM counters).",
                JOB_LABELS,
                [(k, u.energy_j) for k, u in keyed if u.energy_j is not None],
            ),
            _gauge(
                "hpcwatch_job_gpu_utilization_percent",
                "Mean GPU utilisation over the job's GPUs and time.",
                JOB_LABELS,
                [(k, u.mean_util_percent) for k, u in keyed if u.mean_util_percent is not None],
            ),
            _gauge(
                "hpcwatch_job_idle_gpus",
                "Allocated GPUs whose utilisation stayed idle.",
                JOB_LABELS,
                [(k, float(u.idle_gpus)) for k, u in keyed],
            ),
        ]

    def _training(self) -> list[Metric]:
        step_s, stragglers, named, scores, goodput = [], [], [], [], []
        for found in self._in_time("training", self._training_in_time) or []:
            job_id, report = found.job, found.steps
            assert report.step_time_s is not None  # a job without one is not among them
            step_s.append(([job_id], report.step_time_s))
            stragglers.append(([job_id], float(len(report.stragglers.stragglers))))
            named += [
                ([job_id, str(r.rank), r.node or "", "" if r.gpu is None else str(r.gpu)], 1.0)
                for r in report.stragglers.stragglers
            ]
            scores += [
                ([job_id, str(r.rank), r.node or "", "" if r.gpu is None else str(r.gpu)], r.score)
                for r in report.stragglers.ranks
            ]
            goodput.append(([job_id], found.goodput))
        return [
            _gauge(
                "hpcwatch_job_step_seconds",
                "Median training step time (the slowest rank's), recent steps.",
                ["hpc_job"],
                step_s,
            ),
            _gauge("hpcwatch_job_stragglers", "Ranks named stragglers over the recent steps.", ["hpc_job"], stragglers),
            _gauge(
                "hpcwatch_rank_straggler",
                "1 for each rank named a straggler over the recent steps (absent: not one).",
                ["hpc_job", "rank", "node", "gpu"],
                named,
            ),
            _gauge(
                "hpcwatch_rank_relative_score",
                "Fastest rank's work time / this rank's (1 = fastest).",
                ["hpc_job", "rank", "node", "gpu"],
                scores,
            ),
            _gauge("hpcwatch_job_goodput_ratio", "Productive training time / wall time.", ["hpc_job"], goodput),
        ]

    def _findings(self) -> list[Metric]:
        counts = finding_counts(self.store)
        return [
            _gauge(
                "hpcwatch_findings",
                "Security findings in the store, by threat vector and severity.",
                ["vector", "severity"],
                [([v, s], float(n)) for (v, s), n in counts.items()],
            ),
            _gauge(
                "hpcwatch_finding_rules",
                "Security findings in the store, by threat vector, detector rule and severity.",
                ["vector", "rule", "severity"],
                [([v, r, s], float(n)) for (v, r, s), n in sorted(finding_rule_counts(self.store).items())],
            ),
        ]

    def _health(self) -> list[Metric]:
        latest = latest_health(self.store)
        verdicts = sorted(latest.verdicts.items()) if latest is not None else []
        return [
            _gauge(
                "hpcwatch_health_verdict",
                "Worst verdict of each health rule on each node in the newest stored health run "
                "(hpcwatch collect's task = health): 0 ok, 1 warn, 2 drain.",
                ["node", "rule"],
                [([node, rule], float(VERDICT_NUMBERS[v])) for (node, rule), v in verdicts],
            ),
            _gauge(
                "hpcwatch_health_verdict_timestamp_seconds",
                "When the newest stored health run judged (UTC s).",
                [],
                [([], latest.t)] if latest is not None else [],
            ),
        ]

    def _assessment(self) -> list[Metric]:
        latest = latest_assessment(self.store)
        numbers = latest.tier_numbers() if latest is not None else {}
        return [
            _gauge(
                "hpcwatch_assessment_tier",
                "Newest stored assessment tier: 4 Platinum, 3 Gold, 2 Silver, "
                "1 Bronze, 0 Underperform; category=overall is the cluster's.",
                ["category"],
                [([name], float(n)) for name, n in numbers.items()],
            )
        ]

    def _collectors(self) -> list[Metric]:
        status = collector_statuses(self.store)
        rows = [([c.name, c.kind, c.daemon], c) for c in (status.collectors if status else ())]
        labels = ["collector", "kind", "daemon"]
        return [
            _gauge(
                "hpcwatch_collector_up",
                "1 when the collector's last run succeeded within 3 intervals.",
                labels,
                [(k, float(c.answering)) for k, c in rows],
            ),
            _gauge(
                "hpcwatch_collector_last_success_timestamp_seconds",
                "End of the collector's last good run.",
                labels,
                [(k, c.last_success_s) for k, c in rows if c.last_success_s is not None],
            ),
            _gauge(
                "hpcwatch_collector_interval_seconds",
                "Seconds between the collector's runs, as configured.",
                labels,
                [(k, c.interval_s) for k, c in rows],
            ),
            _gauge(
                "hpcwatch_collector_lag_seconds",
                "How far behind its source the collector is.",
                labels,
                [(k, c.lag_s) for k, c in rows if c.lag_s is not None],
            ),
            _gauge(
                "hpcwatch_collector_errors_total",
                "Failed runs since the daemon started.",
                labels,
                [(k, float(c.errors)) for k, c in rows],
            ),
            _gauge(
                "hpcwatch_collector_records_total",
                "Records stored since the daemon started.",
                labels,
                [(k, float(c.records)) for k, c in rows],
            ),
        ]

    def _scoped(self, usage: list[JobUsage]) -> list[JobUsage]:
        if self.scope.everything:
            return usage
        shown = {j.id: j for j in scoped_jobs((u.job for u in usage), self.scope)}
        return [dataclasses.replace(u, job=shown[u.job.id]) for u in usage if u.job.id in shown]


def allocation_rows(jobs: Iterable[Job]) -> list[list[str]]:
    """(hpc_job, user, account, host, gpu) for each GPU of each running job (``end`` None) whose indices
    Slurm gave (``gpus_by_node``); a job known only by its GPU count has no row: nothing to join on."""
    return [
        [j.id, j.user or "", j.account or "", node, str(gpu)]
        for j in jobs
        if j.start is not None and j.end is None
        for node, gpus in sorted(j.gpus_by_node.items())
        for gpu in gpus
    ]


def job_usage(store: Store, *, kept: KeptStore | None = None) -> list[JobUsage]:
    """Per-job usage from the store, through the jobs report (reports/jobs.py); ``kept``: read on from what the
    last scrape kept."""
    by_id = store.jobs_by_id()
    # A workload known only from its samples (an hpc_job label, a pod) has no record: one from its report.
    return [
        JobUsage(
            job=by_id.get(r.id) or Job(id=r.id, user=r.user, account=r.account, gpus=r.gpus, nodes=r.nodes),
            gpu_hours=r.gpu_hours,
            energy_j=r.energy_kwh * J_PER_KWH if r.per_gpu else None,
            mean_util_percent=r.mean_gpu_util,
            idle_gpus=r.idle_gpus,
        )
        for r in jobs_report(store, metrics=DCGM_METRICS, kept=kept)
    ]


def _gauge(name: str, doc: str, labels: Iterable[str], rows: Iterable[tuple[list[str], float]]) -> GaugeMetricFamily:
    """One gauge family; label values from data are made visible (no raw control character reaches a scraper:
    client_python escapes only backslash, quote and newline)."""
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for values, value in rows:
        family.add_metric([visible(v) for v in values], value)
    return family


def registry_for(store: Store, **options) -> CollectorRegistry:
    """A registry holding only hpcwatch's collector (no process or platform metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, **options))
    return registry


def serve_metrics(
    store: Store,
    *,
    port: int = DEFAULT_PORT,
    host: str = "127.0.0.1",
    allow_hosts: Iterable[str] = (),
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    limits: Limits = DEFAULT_LIMITS,
    authenticate: Callable[[str | None], Any] | None = None,
    scope_of: Callable[[Any], Scope] | None = None,
    **options,
) -> tuple[WSGIServer, threading.Thread]:
    """Start the /metrics server in a background thread; returns (server, thread).

    client_python's ``make_wsgi_app`` on our own ``wsgiref`` server rather than its ``start_http_server``:
    that one answers any ``Host``, holds every connection a thread for as long as the client likes, and
    with TLS does the handshake in its accept loop, so one silent client stops every scrape. Here
    (hpcwatch.httpguard): the security headers, the Host allow-list (400), at most
    ``limits.max_connections`` connections (the next: 503 and closed), and each connection closed if its
    handshake and request head are not in within ``limits.header_timeout_s``.

    ``authenticate`` (``--auth``: the ``Authorization`` header → a ``Principal`` or None) makes every scrape
    show a bearer token of scope ``metrics`` (``hpcwatch token create --scope metrics``): 401 without one;
    the principal is in the WSGI environ as ``hpcwatch.principal``, and ``scope_of`` (``access.deployment
    .Access.scope``) turns it into the ``Scope`` its scrape's labels are filtered by (a decider's token:
    pseudonyms; a user's: their own jobs). Without ``authenticate`` every scrape is ``FULL``."""
    kept = ScrapesKept(ended_within_s=options.pop("ended_within_s", DEFAULT_ENDED_WITHIN_S))
    apps = _ScopedApps(store, {"kept": kept, **options})
    app = _guarded_wsgi(apps, allowed_hosts(host, allow_hosts), authenticate=authenticate, scope_of=scope_of)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("MetricsServer", (_MetricsServer,), {"limits": limits, "address_family": family})
    handler = type("MetricsHandler", (_MetricsHandler,), {"timeout": limits.header_timeout_s})
    server: WSGIServer = make_server(host, port, app, server_class=server_class, handler_class=handler)
    if tls_cert is not None and tls_key is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certfile=tls_cert, keyfile=tls_key)
        # The handshake in the connection's thread, under its deadline (_MetricsHandler.setup), not in accept.
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    thread = threading.Thread(target=server.serve_forever, name="hpcwatch-exporter", daemon=True)
    thread.start()
    return server, thread


class _ScopedApps:
    """One client_python WSGI app per scope a scrape came with, made on its first scrape: a registry holds
    one collector, and a collector one scope. Few scopes scrape (Prometheus' tokens), so the last
    ``MAX_SCOPES`` are kept. Their collectors share the ``ScrapesKept`` of ``options``."""

    MAX_SCOPES: Final = 64

    def __init__(self, store: Store, options: dict[str, Any]) -> None:
        self.store, self.options = store, options
        self._apps: dict[Scope, Callable] = {}
        self._lock = threading.Lock()

    def __call__(self, scope: Scope) -> Callable:
        from prometheus_client import make_wsgi_app

        with self._lock:
            app = self._apps.pop(scope, None)
            if app is None:
                app = make_wsgi_app(registry_for(self.store, scope=scope, **self.options))
            self._apps[scope] = app  # re-inserted: the dict's order is the order of last use
            while len(self._apps) > self.MAX_SCOPES:
                del self._apps[next(iter(self._apps))]
            return app


def _guarded_wsgi(
    apps: Callable[[Scope], Callable],
    hosts: frozenset[str],
    *,
    authenticate: Callable | None = None,
    scope_of: Callable[[Any], Scope] | None = None,
) -> Callable:
    headers = [(name.title(), value) for name, value in SECURITY_HEADERS]

    def guarded(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if not host_allowed(environ.get("HTTP_HOST"), hosts):
            body = b"this server does not answer that Host name (see --allow-host)\n"
            start_response("400 Bad Request", [("Content-Type", "text/plain"), *headers])
            return [body]
        if authenticate is not None:
            principal = authenticate(environ.get("HTTP_AUTHORIZATION"))
            if principal is None:
                challenge = ("WWW-Authenticate", 'Bearer realm="hpcwatch metrics"')
                start_response("401 Unauthorized", [("Content-Type", "text/plain"), challenge, *headers])
                return [b"a bearer token of scope metrics is required (hpcwatch token create --scope metrics)\n"]
            environ["hpcwatch.principal"] = principal
            scope = scope_of(principal) if scope_of is not None else FULL
        else:
            scope = FULL

        def start(status: str, response_headers: list, exc_info: Any = None) -> Callable:
            return start_response(status, [*response_headers, *headers], exc_info)

        return apps(scope)(environ, start)

    return guarded


class _MetricsServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most ``limits.max_connections`` of them."""

    daemon_threads = True
    request_queue_size = 1024  # socketserver's 5 leaves a burst of clients in SYN retries, unanswered
    limits: Limits = DEFAULT_LIMITS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._active, self._lock = 0, threading.Lock()
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            full = self._active >= self.limits.max_connections
            if not full:
                self._active += 1
        if full:
            _refuse_connection(request, self.limits.retry_after_s)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._active -= 1

    def shutdown(self) -> None:
        """Stop serving and free the port: a caller that stops an exporter means to bind that port again."""
        super().shutdown()
        self.server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up, timed out or failed its TLS handshake: not worth a traceback."""
        log.debug("exporter: connection from %s ended: %s", client_address, sys.exc_info()[1])


def _refuse_connection(request: Any, retry_after_s: int) -> None:
    if isinstance(request, ssl.SSLSocket):
        return  # no handshake done: writing would block the accept loop; closing is the refusal
    try:
        request.settimeout(0)
        request.send(
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: %d\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            % retry_after_s
        )
    except OSError:
        pass


class _MetricsHandler(WSGIRequestHandler):
    """``timeout`` (set per server) bounds each read; a timer bounds handshake and request head together."""

    def setup(self) -> None:
        self._deadline = threading.Timer(self.timeout or 10.0, self._expire)
        self._deadline.daemon = True
        self._deadline.start()
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()

    def _expire(self) -> None:
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self._deadline.cancel()
        return ok

    def finish(self) -> None:
        self._deadline.cancel()
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing (each scrape would be a line)."""
