"""The live snapshot: what the web's cards and SSE stream show, and the GPU table of ``hpcwatch top``.

Latest values, per-second rates of counters (difference of the last two samples
of one series), counts. "Now" is the newest sample in the store, not the wall
clock, so a store replayed from yesterday still reads as live data of its own time.

Metric names are the real collectors':

- dcgm-exporter: ``DCGM_FI_DEV_GPU_UTIL`` (%), ``DCGM_FI_DEV_POWER_USAGE`` (W),
  ``DCGM_FI_DEV_FB_USED`` (MiB), ``DCGM_FI_DEV_GPU_TEMP`` (°C);
  https://github.com/NVIDIA/dcgm-exporter/blob/main/etc/default-counters.csv
- node-exporter: ``node_infiniband_port_data_{transmitted,received}_bytes_total``;
  perfquery as read by hpcwatch.sources: ``ib_PortXmitData_bytes``, ``ib_PortRcvData_bytes``
- Lustre job_stats: ``lustre_job_{read,write}_bytes_total`` (label ``jobid``).

The snapshot is a plain dict because its JSON contract (``GET /api/live``) is
documented in web/api.py; ``vectors`` here carry each newest finding's rule and
evidence, which the web turns into text in the page's languages.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from hpcwatch import vocab
from hpcwatch.errors import InputError
from hpcwatch.records import Job
from hpcwatch.reports.acting import remediation_states
from hpcwatch.reports.collectors import collector_statuses
from hpcwatch.reports.findings import findings_summary
from hpcwatch.reports.health import node_health
from hpcwatch.reports.healthwindow import KeptWindow
from hpcwatch.reports.liveevents import FollowedEventTallies
from hpcwatch.reports.livesamples import FollowedStoreSamples, LiveSamples, PromSamples, StoreSamples
from hpcwatch.reports.livetraining import FollowedTraining, live_training
from hpcwatch.reports.nccl import nccl_card
from hpcwatch.reports.steps import step_report
from hpcwatch.reports.timeline import node_timelines, timeline
from hpcwatch.reports.triage import SEVERITY_RANK, alert_groups, mark_of, natural_key
from hpcwatch.store import Store, queries
from hpcwatch.vocab import EventKind

__all__ = [
    "Collector",
    "COLLECTORS",
    "GPU_FIELDS",
    "RECENT_S",
    "LATEST_WINDOW_S",
    "RATE_WINDOW_S",
    "WEIGHT_HOOKS",
    "TOP_METRICS",
    "STALE_AFTER_S",
    "CHECKPOINT_RECENT_S",
    "STRAGGLER_RECENT_STEPS",
    "DataSeen",
    "SeenSoFar",
    "data_seen",
    "COLLECTOR_PREFIXES",
    "live_snapshot",
    "problems",
    "latest_t",
    "followed_samples",
    "collector_activity",
    "gpu_table",
    "GpuState",
    "GpuTable",
    "NodeState",
    "node_states",
    "apply_states",
    "state_inputs",
    "SLURM_STATE_FRESH_S",
]

#: Data older than this (relative to the newest sample) does not count as "arriving".
RECENT_S = 60.0
#: Tetragon's checkpoint policy reports only when a checkpoint is touched, so the eBPF collector counts as
#: arriving if it did in the last 30 min (ours: the longest checkpoint interval of the twin's jobs; LLM jobs
#: commonly save every 10-30 min; silent for longer is silent).
CHECKPOINT_RECENT_S = 1800.0
#: Latest values are searched this far back.
LATEST_WINDOW_S = 30.0
#: Counter rates use the last two samples found this far back (collectors scrape every 1-15 s).
RATE_WINDOW_S = 20.0
MIB = 1024**2
#: The page greys its tiles when the newest sample is older than this (wall clock). Ours: three times the
#: slowest usual scrape interval (15 s, dcgm-exporter's and Prometheus's default), so one missed scrape is not "stale".
STALE_AFTER_S = 45.0
#: The live job's straggler verdict is judged over its last this many steps (enough for the rule's per-step
#: outlier fraction, few enough to follow a straggler that comes and goes).
STRAGGLER_RECENT_STEPS = 20

#: dcgm-exporter metric -> (snapshot field, scale to SI units).
GPU_FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("util_pct", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_FB_USED": ("mem_used_bytes", MIB),
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1.0),
}
_IB_TX = (vocab.NODE_INFINIBAND_PORT_DATA_TRANSMITTED_BYTES_TOTAL, vocab.IB_PORTXMITDATA_BYTES)
_IB_RX = (vocab.NODE_INFINIBAND_PORT_DATA_RECEIVED_BYTES_TOTAL, vocab.IB_PORTRCVDATA_BYTES)
_LUSTRE_READ = vocab.LUSTRE_JOB_READ_BYTES_TOTAL
_LUSTRE_WRITE = vocab.LUSTRE_JOB_WRITE_BYTES_TOTAL
#: Tetragon hooks that reveal a file access (same list as hpcwatch.security.weights_access).
WEIGHT_HOOKS = ("security_file_permission", "security_mmap_file", "security_file_open")


@dataclass(frozen=True, slots=True, kw_only=True)
class Collector:
    """How to tell, from the store, that a collector's data is arriving."""

    id: str
    metric_prefixes: tuple[str, ...] = ()
    """Metric name prefixes, up to the first underscore (``DCGM`` for ``DCGM_FI_DEV_GPU_UTIL``)."""
    event_kinds: tuple[str, ...] = ()
    """Event kinds as the readers name them (``falco``, ``tetragon``, ``job_start``)."""
    spans: bool = False
    jobs: bool = False
    weights_reads: bool = False
    """Tetragon file hooks on a path under the model's weights directory (security/weights_access.py)."""


COLLECTORS: tuple[Collector, ...] = (
    Collector(
        id="slurm_exporter", metric_prefixes=("slurm",), event_kinds=(EventKind.JOB_START, EventKind.JOB_END), jobs=True
    ),
    Collector(id="dcgm_exporter", metric_prefixes=("DCGM",), event_kinds=("xid",)),
    Collector(id="node_host", metric_prefixes=("node",), event_kinds=(EventKind.FALCO, EventKind.TETRAGON)),
    Collector(
        id="torch_nccl",
        metric_prefixes=("train", "nccl"),
        event_kinds=(
            EventKind.NCCL_TEST,
            EventKind.NCCL_RANK,
            EventKind.NCCL_WARN,
            EventKind.NCCL_TIMEOUT,
            EventKind.FLIGHT_RECORDER_DUMP,
            EventKind.NCCL_INSPECTOR,
        ),
        spans=True,
    ),
    Collector(id="ib_tools", metric_prefixes=("ib",), event_kinds=("ib_write_bw",)),
    Collector(id="lustre_metrics", metric_prefixes=("lustre",)),
    Collector(id="ebpf_weights", weights_reads=True),
)
#: Every metric prefix a collector is recognised by: all a Prometheus is asked about (``reports.livesamples``).
COLLECTOR_PREFIXES: tuple[str, ...] = tuple(dict.fromkeys(p for c in COLLECTORS for p in c.metric_prefixes))


def followed_samples(store: Store) -> FollowedStoreSamples:
    """The store's answers to the snapshot's sample questions, kept as rows are committed: for a caller that
    takes a snapshot every second (``web.live.LiveView``). It keeps what the windows below reach, twice over."""
    return FollowedStoreSamples(
        store,
        latest=tuple(GPU_FIELDS),
        counters=(*_IB_TX, *_IB_RX, _LUSTRE_READ, _LUSTRE_WRITE),
        keep_s=2 * max(LATEST_WINDOW_S, RATE_WINDOW_S),
    )


def latest_t(store: Store, *, hint: float | None = None) -> float | None:
    """The newest sample's time; ``hint`` (the last one known) lets the search skip old row groups."""
    return StoreSamples(store).latest_t(hint=hint)


def live_snapshot(
    store: Store,
    *,
    weights_path: str,
    exclude_jobs: Sequence[str] = (),
    now: float | None = None,
    with_problems: bool = True,
    samples: LiveSamples | None = None,
    seen: DataSeen | None = None,
    nccl: list[dict[str, Any]] | None = None,
    collectors: dict[str, dict[str, Any]] | None = None,
    followed_training: FollowedTraining | None = None,
    gpu_table: GpuTable | None = None,
    event_tallies: FollowedEventTallies | None = None,
) -> dict[str, Any]:
    """The ``/api/live`` document (less the vectors' translated text): ``t`` (``now``, the newest sample's
    time), ``gpus``, ``nodes``, ``storage``, ``queue``, ``training``, ``collectors``, ``collect`` (the
    daemon's collectors, or None), ``vectors``, ``weights``, ``nccl`` (per job: NCCL version, transports,
    channels, NCCL_* variables, rule verdicts; ``reports.nccl.nccl_card``), ``problems`` (``problems()``; left
    empty with ``with_problems=False``, for a caller that refreshes them less often), ``alerts`` (those problems
    grouped and ranked, ``reports.triage.alert_groups``), ``job_gpus``, ``age_s``
    (wall clock minus ``now``) and ``stale_after_s``.

    ``gpus`` and ``nodes`` carry each element's true ``state`` and ``events`` the recent events
    (``apply_states``; done by the caller that refreshes problems less often, with ``with_problems=False``).

    ``samples`` answers the sample questions (``reports.livesamples``: the store by default, or a
    Prometheus); ``source`` says which. ``seen`` (``data_seen()``; computed when None) tells each collector's
    ``state``: ``answering``, ``silent`` (seen before, nothing recent) or ``not_configured`` (never seen).
    ``nccl``: ``nccl_card()`` (computed when None), for a caller that keeps it while the events do not change;
    ``collectors``: ``collector_activity()`` (computed when None), for a caller that refreshes it less often;
    ``followed_training``: the training card kept between snapshots (``reports.livetraining``; asked anew
    when None); ``gpu_table``: the GPU entries kept between snapshots (``GpuTable``; made anew when None);
    ``event_tallies``: the requeues and checkpoints counted between snapshots (``reports.liveevents``; counted
    anew from every event when None)."""
    samples = samples if samples is not None else StoreSamples(store)
    jobs = store.jobs_by_id()
    training = (
        followed_training.current()
        if followed_training is not None
        else live_training(store, exclude_jobs=exclude_jobs)
    )
    found = (
        problems(store, training_job=training.job if training is not None else None)
        if now is not None and with_problems
        else []
    )
    tallies = event_tallies if event_tallies is not None else FollowedEventTallies(store)  # new: reads every event
    checkpoints, last_checkpoint = tallies.checkpoint_activity()
    gpus = ((gpu_table or _gpus)(samples, now, jobs)) if now is not None else {}
    doc = {
        "t": now,
        "gpus": gpus,
        "nodes": _nodes(samples, now) if now is not None else {},
        "storage": _storage(samples, now, jobs)
        if now is not None
        else {"jobs": [], "read_bytes_s": 0.0, "write_bytes_s": 0.0},
        "queue": _queue(jobs, tallies.requeue_counts()),
        "training": asdict(training) if training is not None else None,
        "collectors": collectors
        if collectors is not None
        else collector_activity(
            store,
            samples,
            now,
            weights_path=weights_path,
            exclude_jobs=exclude_jobs,
            seen=seen if seen is not None else data_seen(store, samples, weights_path=weights_path),
        ),
        "source": samples.describe(),
        "collect": _collect_daemon(store),
        "vectors": {v: asdict(s) for v, s in findings_summary(store).items()},
        "weights": {"checkpoint_events": checkpoints, "last_checkpoint_t": last_checkpoint},
        "nccl": nccl if nccl is not None else nccl_card(store),
        "problems": found,
        "alerts": alert_groups(found),
        "job_gpus": gpu_table.job_gpus() if gpu_table is not None else _job_gpus(gpus, jobs),
        "age_s": max(0.0, time.time() - now) if now is not None else None,
        "stale_after_s": STALE_AFTER_S,
    }
    if with_problems:
        apply_states(doc, found, state_inputs(store, found, now=now))
    return doc


# -- true states: lost, drained, down; the recent events ----------------------------------------------

GpuState = Literal["ok", "lost", "drained", "down"]
NodeState = Literal["ok", "drained", "down"]
#: A Slurm answer older than this (samples' clock) no longer says what a node is now. Ours: twice the
#: ``collect`` Slurm poll's usual minute.
SLURM_STATE_FRESH_S = 120.0


def node_states(store: Store, problems: Sequence[dict[str, Any]], *, now: float | None) -> dict[str, dict[str, Any]]:
    """Each node's ``state`` (``NodeState``), ``slurm`` (the base state Slurm last gave it, or None), ``t``
    (when that was said), ``reasons`` (the rules that drain it) and ``remediation`` (where ``hpcwatch act``'s
    remediation of it stands, ``reports.acting.remediation_states``; None when none is under way). Down: Slurm says DOWN; drained: Slurm
    takes it out of service (``slurm_node_up`` 0: DRAIN, FAIL, MAINT, a reboot...) or a health check drains
    it (``problems`` of severity ``drain``)."""
    out: dict[str, dict[str, Any]] = {}
    since = None if now is None else now - SLURM_STATE_FRESH_S
    for host, up, label, t in _slurm_states(store, since):
        state: NodeState = "ok" if up >= 1 else ("down" if label == "down" else "drained")
        out[host] = {"state": state, "slurm": label, "t": t, "reasons": []}
    for p in problems:
        if p.get("kind") != "health" or p.get("severity") != "drain" or not p.get("node"):
            continue
        entry = out.setdefault(p["node"], {"state": "ok", "slurm": None, "t": None, "reasons": []})
        entry["reasons"].append(p["rule"])
        if entry["state"] == "ok":
            entry["state"] = "drained"
    for node, stage in remediation_states(store, now=time.time()).items():
        out.setdefault(node, {"state": "ok", "slurm": None, "t": None, "reasons": []})["remediation"] = stage
    for entry in out.values():
        entry.setdefault("remediation", None)
    return out


def _slurm_states(store: Store, since: float | None) -> list[tuple[str, float, str | None, float | None]]:
    rows = queries.latest_node_states(store, metric=vocab.SLURM_NODE_UP, since=since)
    return [(host, float(up), label, t) for host, up, label, t in rows]


def state_inputs(store: Store, found: Sequence[dict[str, Any]], *, now: float | None) -> dict[str, Any]:
    """What ``apply_states`` reads from the store (``node_states``, ``events``, ``node_events``): asked as
    often as the problems are, not every snapshot."""
    nodes = node_states(store, found, now=now)
    events = [] if now is None else timeline(store, now=now, problems=found, node_states=nodes)
    return {"node_states": nodes, "events": events, "node_events": node_timelines(events)}


def apply_states(doc: dict[str, Any], found: Sequence[dict[str, Any]], inputs: dict[str, Any]) -> None:
    """Give ``doc`` (a ``live_snapshot``) its true states from ``found`` (its problems) and ``inputs``
    (``state_inputs``): each GPU's ``state`` (``GpuState``; a lost GPU keeps no number: its last ones are
    not what it does now, and ``last_seen`` says when it last reported, or when its XID came), ``node_states``, each queued
    job's ``requeued`` (waiting to run again after Slurm requeued it), the recent ``events``
    (``reports.timeline.timeline``, newest first) and ``node_events`` (each node's, for its card)."""
    nodes = inputs["node_states"]
    gpus = doc["gpus"]
    reporting = {gid.split("/", 1)[0] for gid in gpus}
    # The rule's GPUs, and before it fires (it waits a minute) a GPU a problem names that has no recent
    # value while its node's other GPUs still report (an XID 79 GPU the exporter dropped).
    lost = {
        p["el"][4:]: p
        for p in found
        if str(p.get("el", "")).startswith("gpu:")
        and (p.get("rule") == "gpu_missing" or (p["el"][4:] not in gpus and p.get("node") in reporting))
    }
    # Entries are replaced, never changed: a ``GpuTable`` gives the next snapshot the very entries of this one.
    for gid, p in lost.items():
        evidence = p.get("evidence") or {}
        gpus[gid] = {
            **gpus.get(gid, {"job": None, "user": None, "account": None, "t": None}),
            **{field: None for field, _ in GPU_FIELDS.values()},
            # gpu_missing says when the GPU last reported; an XID, when it was first seen (the GPU died then).
            "last_seen": evidence.get("last_seen", evidence.get("first_seen")),
        }
    for gid, entry in gpus.items():
        state = "lost" if gid in lost else nodes.get(gid.split("/", 1)[0], {}).get("state", "ok")
        if entry.get("state") != state:
            gpus[gid] = {**entry, "state": state}
    for job in doc["queue"]["jobs"]:
        job["requeued"] = bool(job["restarts"]) and job["state"] == "PENDING"
    doc["node_states"], doc["events"], doc["node_events"] = nodes, inputs["events"], inputs["node_events"]


def _job_gpus(gpus: dict[str, dict[str, Any]], jobs: Mapping[str, Job]) -> dict[str, list[str]]:
    """Each job's GPUs (``node/index``): the ones dcgm-exporter labels with it (a GPU shared by jobs
    ``4101,4102`` counts for each)."""
    out: dict[str, list[str]] = {}
    for gid, entry in gpus.items():
        for job in _jobs_of(entry):
            out.setdefault(job, []).append(gid)
    return {job: sorted(ids) for job, ids in out.items()}


# -- problems: what the page's alert strip lists and marks on the drawing ------------------------------


def problems(store: Store, *, training_job: str | None, kept: KeptWindow | None = None) -> list[dict[str, Any]]:
    """What is wrong now, worst first, then in the natural order of the elements (``node2`` before
    ``node10``): node health checks that warn or drain (an XID names its GPU), the live job's straggler
    (``reports.steps``), and every threat vector with findings.

    Each entry: ``kind`` (``health``, ``straggler``, ``finding``), ``severity`` (``drain``/``warn`` for
    health; ``warn`` for a straggler; the finding's own), ``el`` (the page element that opens its card:
    ``gpu:node1/2``, ``node:node1``, ``vector:rdma_blind_spot``), ``node``, ``gpu``, ``job``, ``rule``,
    ``mark`` (the drawing's mark, ``reports.triage.mark_of``), ``title`` (English, from the rule) and
    ``evidence`` (the numbers the page words itself). ``alert_groups`` folds them for the alert list. ``kept``:
    the health window as the last judgement left it (``reports.healthwindow``)."""
    found = [*_health_problems(store, kept), *_straggler_problems(store, training_job), *_finding_problems(store)]
    for p in found:
        p["mark"] = mark_of(p)
    rank = SEVERITY_RANK
    return sorted(found, key=lambda p: (rank.get(p["severity"] or "", len(rank)), natural_key(p["el"])))


def _health_problems(store: Store, kept: KeptWindow | None) -> list[dict[str, Any]]:
    out = []
    for node in node_health(store, kept=kept).nodes:
        for check in node.checks:
            if check.verdict == "ok":
                continue
            gpu = check.evidence.get("gpu")
            el = f"gpu:{node.node}/{gpu}" if gpu is not None and str(gpu).isdigit() else f"node:{node.node}"
            out.append(
                {
                    "kind": "health",
                    "severity": check.verdict,
                    "el": el,
                    "node": node.node,
                    "gpu": str(gpu) if gpu is not None else None,
                    "job": str(check.evidence["job"]) if check.evidence.get("job") else None,
                    "rule": check.rule,
                    "title": check.title,
                    "evidence": _plain(check.evidence),
                }
            )
    return out


def _straggler_problems(store: Store, job: str | None) -> list[dict[str, Any]]:
    if job is None:
        return []
    try:
        found = step_report(store, job, recent_steps=STRAGGLER_RECENT_STEPS).straggler
    except InputError:
        return []
    if found is None or found.node is None:
        return []
    el = f"gpu:{found.node}/{found.gpu}" if found.gpu is not None else f"node:{found.node}"
    return [
        {
            "kind": "straggler",
            "severity": "warn",
            "el": el,
            "node": found.node,
            "gpu": str(found.gpu) if found.gpu is not None else None,
            "job": job,
            "rule": "straggler",
            "title": f"rank {found.rank} is the straggler ({found.phase})",
            "evidence": {"rank": found.rank, "phase": found.phase, "excess_ms": round(found.excess_s * 1000, 1)},
        }
    ]


def _finding_problems(store: Store) -> list[dict[str, Any]]:
    return [
        {
            "kind": "finding",
            "severity": v.severity,
            "el": f"vector:{v.vector}",
            "node": v.target,
            "gpu": None,
            "job": None,
            "rule": v.rule,
            "title": v.title,
            "evidence": {"findings": v.findings, "vector": v.vector},
        }
        for v in findings_summary(store).values()
        if v.findings > 0
    ]


def _plain(evidence: dict[str, Any]) -> dict[str, Any]:
    """Evidence values the JSON stream carries as they are (numbers, strings); others as text."""
    return {k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v) for k, v in evidence.items()}


def _gpus(samples: LiveSamples, now: float, jobs: Mapping[str, Job]) -> dict[str, dict[str, Any]]:
    return _gpu_entries(samples.latest_gpu_values(list(GPU_FIELDS), since=now - LATEST_WINDOW_S), jobs)[0]


def _gpu_entries(
    rows: Iterable[queries.GpuValueRow], jobs: Mapping[str, Job]
) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """Each GPU's entry (``node/index`` -> its fields, job and owner, ``t`` its newest value's time) from its
    newest values, and the time of its oldest value."""
    out: dict[str, dict[str, Any]] = {}
    oldest: dict[str, float] = {}
    for metric, host, gpu, value, job, t in rows:
        field, scale = GPU_FIELDS[metric]
        gid = f"{host}/{gpu}"
        entry = out.setdefault(gid, {"job": None, "user": None, "account": None, "t": t})
        entry[field] = value * scale
        entry["t"] = max(entry["t"], t)
        oldest[gid] = min(oldest.get(gid, t), t)
        if job and (metric == vocab.DCGM_FI_DEV_GPU_UTIL or entry["job"] is None):
            entry["job"] = job
    for entry in out.values():
        owner = jobs.get(_first_job(entry))
        if owner is not None:
            entry["user"], entry["account"], entry["job_name"] = owner.user, owner.account, owner.name
    return out, oldest


def _host_and_gpu(gid: str) -> tuple[str, str]:
    """A GPU id's node and GPU, split where ``apply_states`` splits it (the first ``/``)."""
    host, gpu = gid.split("/", 1)
    return host, gpu


class GpuTable:
    """The snapshot's GPU entries kept from one snapshot to the next (``live_snapshot``'s ``gpu_table``). Only
    the GPUs with a new value since the last snapshot (``FollowedStoreSamples.gpus_changed``), one whose oldest
    value left the window, one whose job's owner changed and a lost one are made again; every other is the very
    entry of the last snapshot, with the state ``apply_states`` gave it (it replaces an entry, never changes
    one), which the stream then passes over without comparing. At 1,024 nodes a tick brings new values for an
    eighth of the 8,192 GPUs, and making every entry again was a third of a snapshot (cProfile). Samples that
    cannot tell what changed (the store asked afresh, a Prometheus) make every entry each time."""

    def __init__(self) -> None:
        self._mark: object = None
        self._gpus: dict[str, dict[str, Any]] = {}
        """The entries last given (``apply_states`` may have replaced some since, and added lost GPUs)."""
        self._oldest: dict[str, float] = {}
        """The GPUs made from samples, each with its oldest value's time (in the order given)."""
        self._owners: dict[str, tuple[str, _Owner]] = {}
        """Each GPU's job (the first it names) and that job's owner, as its entry was made."""
        self._jobs = _JobGpus()

    def __call__(self, samples: LiveSamples, now: float, jobs: Mapping[str, Job]) -> dict[str, dict[str, Any]]:
        since, metrics = now - LATEST_WINDOW_S, list(GPU_FIELDS)
        self._mark, changed = samples.gpus_changed(self._mark, metrics=metrics, since=since)
        if changed is None or not isinstance(samples, FollowedStoreSamples):
            self._gpus, self._oldest = _gpu_entries(samples.latest_gpu_values(metrics, since=since), jobs)
            self._owners = {gid: _owned(entry, jobs) for gid, entry in self._gpus.items()}
            self._jobs = _JobGpus()
            self._jobs.update(self._gpus, self._gpus)
            return self._gpus
        redo = {f"{host}/{gpu}" for host, gpu in changed}
        for gid, first_t in self._oldest.items():  # out of the window, lost (it shows no value), owner changed
            job_id, owner = self._owners[gid]
            if first_t < since or _owner_of(jobs, job_id) != owner or self._gpus[gid].get("state") == "lost":
                redo.add(gid)
        rows = samples.latest_gpu_values_of([_host_and_gpu(gid) for gid in redo], metrics, since=since)
        made, oldest = _gpu_entries(rows, jobs)
        gpus: dict[str, dict[str, Any]] = {}
        for gid in self._oldest:  # in the order given before; a GPU made again without a value is gone
            if gid not in redo:
                gpus[gid] = self._gpus[gid]
            elif gid in made:
                gpus[gid] = made.pop(gid)
        gpus.update(made)  # GPUs seen for the first time
        self._oldest = {gid: oldest.get(gid, self._oldest.get(gid, since)) for gid in gpus}
        self._owners = {gid: self._owners[gid] if gid not in redo else _owned(gpus[gid], jobs) for gid in gpus}
        self._jobs.update(gpus, redo | made.keys())
        self._gpus = gpus
        return gpus

    def job_gpus(self) -> dict[str, list[str]]:
        """Each job's GPUs in the entries last given (``_job_gpus``'s answer): a job's list is made again only
        when one of its GPUs came or went, and is otherwise the very list of the last snapshot."""
        return self._jobs.lists()


class _JobGpus:
    """Each job's GPUs, kept as GPU entries are made again (``GpuTable``)."""

    def __init__(self) -> None:
        self._jobs_of: dict[str, tuple[str, ...]] = {}
        self._members: dict[str, set[str]] = {}
        self._lists: dict[str, list[str]] = {}

    def update(self, gpus: dict[str, dict[str, Any]], gids: Iterable[str]) -> None:
        """``gids`` were made again, came or went (absent from ``gpus``): their jobs' lists follow."""
        touched: set[str] = set()
        for gid in gids:
            entry = gpus.get(gid)
            now = _jobs_of(entry) if entry is not None else ()
            before = self._jobs_of.get(gid, ())
            if now == before:
                continue
            for job in before:
                self._members[job].discard(gid)
            for job in now:
                self._members.setdefault(job, set()).add(gid)
            touched.update(before, now)
            self._jobs_of[gid] = now
        for job in touched:
            if self._members.get(job):
                self._lists[job] = sorted(self._members[job])  # a new list: the last snapshot keeps its own
            else:
                self._members.pop(job, None)
                self._lists.pop(job, None)

    def lists(self) -> dict[str, list[str]]:
        return dict(self._lists)


def _jobs_of(entry: dict[str, Any]) -> tuple[str, ...]:
    """The jobs a GPU entry names (a GPU shared by jobs ``4101,4102`` is each one's), each once."""
    return tuple(dict.fromkeys(job for job in (entry.get("job") or "").split(",") if job))


_Owner = tuple[str | None, str | None, str | None] | None


def _owner(job: Job) -> _Owner:
    return job.user, job.account, job.name


def _owner_of(jobs: Mapping[str, Job], job_id: str) -> _Owner:
    job = jobs.get(job_id)
    return None if job is None else _owner(job)


def _owned(entry: dict[str, Any], jobs: Mapping[str, Job]) -> tuple[str, _Owner]:
    """A GPU entry's job (the first it names) and its owner as the entry was made."""
    job_id = _first_job(entry)
    return job_id, _owner_of(jobs, job_id)


def _first_job(entry: dict[str, Any]) -> str:
    """The job whose owner a GPU entry shows: the first its label names (``_gpu_entries``), and the one whose
    owner ``GpuTable`` compares (the two must agree)."""
    return str((entry["job"] or "").split(",")[0])


def _nodes(samples: LiveSamples, now: float) -> dict[str, dict[str, float]]:
    by_host: dict[str, dict[str, float]] = {}
    for metric, host, value in samples.counter_rates((*_IB_TX, *_IB_RX), since=now - RATE_WINDOW_S, group="host"):
        by_host.setdefault(host, {})[metric] = value
    # node-exporter and perfquery may both report a port: prefer node-exporter, do not add them.
    return {
        host: {
            "ib_tx_bytes_s": next((found[m] for m in _IB_TX if m in found), 0.0),
            "ib_rx_bytes_s": next((found[m] for m in _IB_RX if m in found), 0.0),
        }
        for host, found in by_host.items()
    }


def _storage(samples: LiveSamples, now: float, jobs: Mapping[str, Job]) -> dict[str, Any]:
    per_job: dict[str, dict[str, Any]] = {}
    for metric, job, value in samples.counter_rates(
        (_LUSTRE_READ, _LUSTRE_WRITE), since=now - RATE_WINDOW_S, group="job"
    ):
        entry = per_job.setdefault(job, {"job": job, "read_bytes_s": 0.0, "write_bytes_s": 0.0})
        entry["read_bytes_s" if metric == _LUSTRE_READ else "write_bytes_s"] += value
    for entry in per_job.values():
        owner = jobs.get(entry["job"])
        entry["user"] = owner.user if owner else None
        entry["name"] = owner.name if owner else None
    listed = sorted(per_job.values(), key=lambda e: -(e["read_bytes_s"] + e["write_bytes_s"]))
    return {
        "jobs": listed[:20],
        "read_bytes_s": sum(e["read_bytes_s"] for e in listed),
        "write_bytes_s": sum(e["write_bytes_s"] for e in listed),
    }


def _queue(jobs: Mapping[str, Job], restarts: dict[str, int]) -> dict[str, Any]:
    live = [j for j in jobs.values() if j.end is None]
    order = {"RUNNING": 0, "PENDING": 1}
    live.sort(key=lambda j: (order.get(j.state or "", 2), j.id))
    return {
        "running": sum(j.state == "RUNNING" for j in live),
        "pending": sum(j.state == "PENDING" for j in live),
        "jobs": [
            {
                "id": j.id,
                "name": j.name,
                "user": j.user,
                "account": j.account,
                "state": j.state,
                "nodes": list(j.nodes),
                "gpus": j.gpus,
                "restarts": restarts.get(j.id, 0),
            }
            for j in live[:50]
        ],
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class DataSeen:
    """What the sources ever held (``data_seen``): a collector never seen is not configured, not silent."""

    prefixes: frozenset[str]
    """Metric prefixes (up to the first underscore) in the store or the Prometheus."""
    event_kinds: frozenset[str]
    spans: bool
    jobs: bool
    weights_reads: bool = False
    """Tetragon file hooks on the weights were ever stored (needs the weights path)."""


def data_seen(store: Store, samples: LiveSamples | None = None, *, weights_path: str | None = None) -> DataSeen:
    """What the store (and ``samples``' backend, when it is a Prometheus) ever held. A full scan of the
    tables' key columns; a caller that asks again and again keeps a ``SeenSoFar``."""
    return SeenSoFar(weights_path=weights_path)(store, samples)


class SeenSoFar:
    """``data_seen``, kept: each call reads only the rows committed since the previous one (what a store ever
    held only grows), where ``data_seen`` scans every row's metric each time: at 1,024 nodes the live page's
    refresh of it grew with the store's age. A Prometheus backend's prefixes are asked whole each time."""

    def __init__(self, *, weights_path: str | None = None) -> None:
        self._hooks = (WEIGHT_HOOKS, weights_path.rstrip("/") + "/") if weights_path is not None else ((), "")
        self._version = 0
        self._prefixes: set[str] = set()
        self._kinds: set[str] = set()
        self._spans = self._jobs = self._reads = False

    def __call__(self, store: Store, samples: LiveSamples | None = None) -> DataSeen:
        hooks, path_prefix = self._hooks
        self._version, (prefixes, kinds, spans, jobs, reads) = queries.data_seen_since(
            store, self._version, hooks=hooks, path_prefix=path_prefix
        )
        self._prefixes |= prefixes
        self._kinds |= kinds
        self._spans, self._jobs, self._reads = (
            self._spans or spans > 0,
            self._jobs or jobs > 0,
            self._reads or reads > 0,
        )
        seen_prefixes = set(self._prefixes)
        if isinstance(samples, PromSamples):
            seen_prefixes |= samples.prefixes_seen(COLLECTOR_PREFIXES)
        return DataSeen(
            prefixes=frozenset(seen_prefixes),
            event_kinds=frozenset(self._kinds),
            spans=self._spans,
            jobs=self._jobs,
            weights_reads=self._reads,
        )


def _state(c: Collector, arriving: bool, seen: DataSeen) -> str:
    if arriving:
        return "answering"
    configured = (
        any(p in seen.prefixes for p in c.metric_prefixes)
        or any(k in seen.event_kinds for k in c.event_kinds)
        or (c.spans and seen.spans)
        or (c.jobs and seen.jobs)
        or (c.weights_reads and seen.weights_reads)
    )
    return "silent" if configured else "not_configured"


def collector_activity(
    store: Store,
    samples: LiveSamples,
    now: float | None,
    *,
    weights_path: str,
    exclude_jobs: Sequence[str],
    seen: DataSeen,
) -> dict[str, dict[str, Any]]:
    """Per collector (``COLLECTORS``): ``arriving`` (data in the last ``RECENT_S`` before ``now``), ``count``,
    ``last_t`` and ``state`` (``answering``, ``silent``, ``not_configured``). One grouped scan per table, then
    each collector sums the groups it owns."""
    since = (now if now is not None else time.time()) - RECENT_S
    by_prefix: dict[str, tuple[int, float | None]] = {}
    for metric, n, t in samples.metric_activity(since=since, prefixes=COLLECTOR_PREFIXES):
        prefix = metric.split("_", 1)[0]
        old_n, old_t = by_prefix.get(prefix, (0, None))
        by_prefix[prefix] = (old_n + n, _later(old_t, t))
    events = {k: (n, t) for k, n, t in queries.event_activity(store, since=since)}
    weights = queries.file_hook_activity(
        store,
        since=since + RECENT_S - CHECKPOINT_RECENT_S,
        hooks=WEIGHT_HOOKS,
        path_prefix=weights_path.rstrip("/") + "/",
    )
    span_n, span_t = queries.span_activity(store, since=since, exclude=exclude_jobs)
    open_jobs = queries.open_job_count(store)
    out = {}
    for c in COLLECTORS:
        found = [by_prefix.get(p, (0, None)) for p in c.metric_prefixes]
        found += [events.get(kind, (0, None)) for kind in c.event_kinds]
        found += [weights] if c.weights_reads else []
        found += [(span_n, span_t)] if c.spans else []
        found += [(open_jobs, None)] if c.jobs else []
        count = sum(n for n, _ in found)
        last: float | None = None
        for _, found_t in found:
            last = _later(last, found_t)
        out[c.id] = {"arriving": count > 0, "count": count, "last_t": last, "state": _state(c, count > 0, seen)}
    return out


def _collect_daemon(store: Store) -> list[dict[str, Any]] | None:
    """The collectors of ``hpcwatch collect`` on this store (reports/collectors.py); None when none runs."""
    status = collector_statuses(store)
    if status is None:
        return None
    return [
        {
            "name": c.name,
            "kind": c.kind,
            "daemon": c.daemon,
            "answering": c.answering,
            "last_success_s": c.last_success_s,
            "last_error": c.last_error,
            "lag_s": c.lag_s,
        }
        for c in status.collectors
    ]


def _later(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


# -- hpcwatch top --------------------------------------------------------------------------------

#: dcgm-exporter metric -> the GPU table's field.
TOP_METRICS = {
    "DCGM_FI_DEV_GPU_UTIL": "util_pct",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_FB_USED": "fb_used_mib",
    "DCGM_FI_DEV_FB_FREE": "fb_free_mib",
    "DCGM_FI_DEV_GPU_TEMP": "temp_c",
}


def gpu_table(store: Store, metrics: Iterable[str] = tuple(TOP_METRICS)) -> list[dict[str, Any]]:
    """The last scrape of every GPU: ``host``, ``gpu``, ``job``, ``user`` and the ``TOP_METRICS`` fields,
    sorted by host then GPU index."""
    gpus: dict[tuple[str, str], dict[str, Any]] = {}
    for host, gpu, job, metric, value, user in queries.last_gpu_scrape(
        store, list(metrics), clock_metric=vocab.DCGM_FI_DEV_GPU_UTIL
    ):
        row = gpus.setdefault((host, gpu), {"host": host, "gpu": gpu, "job": job, "user": user})
        row[TOP_METRICS[metric]] = value
    return sorted(gpus.values(), key=lambda r: (r["host"] or "", int(r["gpu"]) if (r["gpu"] or "").isdigit() else 0))
