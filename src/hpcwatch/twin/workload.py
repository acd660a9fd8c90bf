"""The twin's workload: who runs what, where and when, decided by one seeded generator.

A small Slurm-like scheduler places a stream of jobs of several users and
accounts on the cluster's GPUs. The first job is always the big training job
(alice / proj-llm, several nodes, 6 of 8 GPUs per node on the reference
cluster) whose steps the twin times; around it, fine-tunes, RL rollouts, an
evaluation and an interactive notebook that holds a GPU and does nothing (the
"allocated but idle" case a job report must show).

Time is cut in ticks. A tick ``(t, t + dt]`` runs with the placement decided at
``t``; at ``t + dt`` jobs whose planned end has passed finish (``end = t + dt``)
and pending jobs that fit start (``start = t + dt``). So a sample at time ``t``
belongs to the job that held its GPU during ``(t - dt, t]``: ``start < t <= end``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hpcwatch.model import Cluster
from hpcwatch.records import Job

__all__ = ["JobKind", "KINDS", "PlannedJob", "Scheduler", "FIRST_JOB_ID", "TRAIN_GPUS_LEFT_FREE"]

#: Slurm job ids of the twin start here (a fresh Slurm starts at 1; a used one is higher).
FIRST_JOB_ID = 4101
#: GPUs per node the main training job leaves to the other users on the reference cluster.
TRAIN_GPUS_LEFT_FREE = 2
GIB = 1024**3


@dataclass(frozen=True, slots=True, kw_only=True)
class JobKind:
    """How a kind of job uses a GPU, the fabric and the file system."""

    name: str
    util_pct: float
    """Mean DCGM_FI_DEV_GPU_UTIL while it runs."""
    util_sd_pct: float
    tensor_active: float
    """DCGM_FI_PROF_PIPE_TENSOR_ACTIVE (0..1) at full compute."""
    fb_fraction: float
    """Share of HBM the job holds (DCGM_FI_DEV_FB_USED)."""
    read_bytes_s_per_gpu: float
    """Steady Lustre reads (data loading)."""
    load_bytes_per_gpu: float
    """Lustre reads in the first minutes (dataset shards, the last checkpoint)."""
    checkpoint_interval_s: float | None
    checkpoint_bytes_per_gpu: float
    """Weights + optimizer state written per GPU at each checkpoint."""
    distributed: bool
    """Ring AllReduce over InfiniBand when it spans nodes."""
    gradient_bytes: float = 0.0
    """Bytes one AllReduce moves per step (bf16 gradients: 2 bytes per parameter)."""


KINDS: dict[str, JobKind] = {
    k.name: k
    for k in (
        JobKind(
            name="pretrain",
            util_pct=98.0,
            util_sd_pct=1.0,
            tensor_active=0.62,
            fb_fraction=0.86,
            read_bytes_s_per_gpu=12e6,
            load_bytes_per_gpu=6 * GIB,
            checkpoint_interval_s=900.0,
            checkpoint_bytes_per_gpu=2 * GIB,
            distributed=True,
            gradient_bytes=200e6,
        ),
        JobKind(
            name="finetune",
            util_pct=88.0,
            util_sd_pct=5.0,
            tensor_active=0.45,
            fb_fraction=0.62,
            read_bytes_s_per_gpu=60e6,
            load_bytes_per_gpu=4 * GIB,
            checkpoint_interval_s=1200.0,
            checkpoint_bytes_per_gpu=1 * GIB,
            distributed=True,
            gradient_bytes=600e6,
        ),
        JobKind(
            name="rl",
            util_pct=35.0,
            util_sd_pct=15.0,
            tensor_active=0.12,
            fb_fraction=0.30,
            read_bytes_s_per_gpu=1e6,
            load_bytes_per_gpu=0.5 * GIB,
            checkpoint_interval_s=1800.0,
            checkpoint_bytes_per_gpu=0.25 * GIB,
            distributed=False,
        ),
        JobKind(
            name="eval",
            util_pct=62.0,
            util_sd_pct=18.0,
            tensor_active=0.30,
            fb_fraction=0.55,
            read_bytes_s_per_gpu=25e6,
            load_bytes_per_gpu=3 * GIB,
            checkpoint_interval_s=None,
            checkpoint_bytes_per_gpu=0.0,
            distributed=False,
        ),
        JobKind(
            name="notebook",
            util_pct=0.0,
            util_sd_pct=0.0,
            tensor_active=0.0,
            fb_fraction=0.006,
            read_bytes_s_per_gpu=0.0,
            load_bytes_per_gpu=0.0,
            checkpoint_interval_s=None,
            checkpoint_bytes_per_gpu=0.0,
            distributed=False,
        ),
    )
}


@dataclass(frozen=True, slots=True, kw_only=True)
class _Template:
    user: str
    uid: int
    account: str
    name: str
    kind: str
    nodes: tuple[int, int]
    """Range of node counts (inclusive)."""
    gpus_per_node: tuple[int, ...]
    duration_s: tuple[float, float]


_TEMPLATES = (
    _Template(
        user="alice",
        uid=1001,
        account="proj-llm",
        name="gpt-pretrain",
        kind="pretrain",
        nodes=(2, 4),
        gpus_per_node=(8,),
        duration_s=(4 * 3600.0, 12 * 3600.0),
    ),
    _Template(
        user="bob",
        uid=1002,
        account="proj-vision",
        name="vit-finetune",
        kind="finetune",
        nodes=(1, 1),
        gpus_per_node=(1, 2, 2, 4),
        duration_s=(1200.0, 5400.0),
    ),
    _Template(
        user="carol",
        uid=1003,
        account="proj-rl",
        name="ppo-rollouts",
        kind="rl",
        nodes=(1, 1),
        gpus_per_node=(1, 1, 2),
        duration_s=(900.0, 3600.0),
    ),
    _Template(
        user="dave",
        uid=1004,
        account="proj-vision",
        name="jupyter",
        kind="notebook",
        nodes=(1, 1),
        gpus_per_node=(1,),
        duration_s=(1800.0, 7200.0),
    ),
    _Template(
        user="erin",
        uid=1005,
        account="proj-llm",
        name="llm-eval",
        kind="eval",
        nodes=(1, 1),
        gpus_per_node=(1, 2),
        duration_s=(600.0, 2400.0),
    ),
)
_TEMPLATE_WEIGHTS = np.array([0.08, 0.34, 0.26, 0.10, 0.22])


@dataclass(slots=True, kw_only=True)
class PlannedJob:
    """A job as the scheduler tracks it (mutable: it waits, runs, ends)."""

    id: str
    user: str
    uid: int
    account: str
    name: str
    kind: JobKind
    n_nodes: int
    gpus_per_node: int
    duration_s: float
    submit: float
    start: float | None = None
    end: float | None = None
    state: str = "PENDING"
    gpus_by_node: dict[str, tuple[int, ...]] = field(default_factory=dict)
    restart_cnt: int = 0
    """Times Slurm requeued the job (squeue's ``restart_cnt``); a requeued job keeps its id."""
    wants_nodes: tuple[str, ...] = ()
    """A requeued job's nodes: the scheduler holds them for it (see ``Scheduler.requeue``)."""
    first_start: float | None = None
    """When its first attempt started (Slurm resets ``start`` at each requeue; see ``record``)."""
    attempts: list[tuple[float, float, tuple[str, ...]]] = field(default_factory=list)
    """The attempts Slurm requeued, in order: (start, end, nodes), each a REQUEUED record of ``sacct --json``."""

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self.gpus_by_node)

    @property
    def started_at(self) -> float:
        """``start`` of a job that runs or ran; asking it of a job still queued is a bug."""
        if self.start is None:
            raise ValueError(f"job {self.id} has not started")
        return self.start

    @property
    def gpus(self) -> int:
        return self.n_nodes * self.gpus_per_node

    @property
    def time_limit_min(self) -> int:
        """The ``--time`` the user asked for: the run plus a margin, in whole hours."""
        return int(np.ceil(self.duration_s * 1.25 / 3600.0)) * 60

    def record(self) -> Job:
        """The job as the twin stores it. A requeued job keeps the start of its first attempt: the store holds
        one record per job id, and its attempts are one job to account (goodput, attribution, the detectors'
        job windows); squeue/sacct JSON still show Slurm's own reset start (twin/slurm_out.py)."""
        return Job(
            id=self.id,
            user=self.user,
            account=self.account,
            partition="gpu",
            nodes=self.nodes,
            gpus=self.gpus,
            gpus_by_node=dict(self.gpus_by_node),
            start=self.record_start,
            end=self.end,
            state=self.state,
            name=self.name,
        )

    @property
    def record_start(self) -> float | None:
        """The start its record holds: its first attempt's, once it runs (``record``)."""
        return self.first_start if self.first_start is not None and self.start is not None else self.start


class Scheduler:
    """First-fit placement with backfill; every choice drawn from one generator."""

    def __init__(self, cluster: Cluster, rng: np.random.Generator, t0: float) -> None:
        self.cluster = cluster
        self.rng = rng
        self.jobs: list[PlannedJob] = []
        self.free: dict[str, list[int]] = {n.name: [g.index for g in n.gpus] for n in cluster.nodes}
        self._next_id = FIRST_JOB_ID
        self._arrivals: list[float] = []
        self._next_end = -np.inf
        self._requeued = False
        self.drained: dict[str, tuple[float, str]] = {}
        """Nodes out of service: name -> (time they return, Slurm's drain reason)."""
        self._initial_fill(t0)

    # -- the job stream ------------------------------------------------------------------------

    def _new_job(
        self,
        template: _Template,
        submit: float,
        *,
        n_nodes: int | None = None,
        gpus_per_node: int | None = None,
        duration_s: float | None = None,
    ) -> PlannedJob:
        max_gpus = max(len(n.gpus) for n in self.cluster.nodes)
        lo, hi = template.nodes
        n = n_nodes or int(self.rng.integers(lo, min(hi, len(self.cluster.nodes)) + 1))
        g = gpus_per_node or min(int(self.rng.choice(template.gpus_per_node)), max_gpus)
        dur = duration_s or float(self.rng.uniform(*template.duration_s))
        job = PlannedJob(
            id=str(self._next_id),
            user=template.user,
            uid=template.uid,
            account=template.account,
            name=template.name,
            kind=KINDS[template.kind],
            n_nodes=max(1, n),
            gpus_per_node=g,
            duration_s=round(dur),
            submit=submit,
        )
        self._next_id += 1
        self.jobs.append(job)
        return job

    def _random_template(self) -> _Template:
        return _TEMPLATES[int(self.rng.choice(len(_TEMPLATES), p=_TEMPLATE_WEIGHTS))]

    def _initial_fill(self, t0: float) -> None:
        """The cluster as found at t0: a long training job, smaller jobs around it, a queue."""
        nodes = self.cluster.nodes
        per_node = min(len(n.gpus) for n in nodes)
        train_gpus = per_node - TRAIN_GPUS_LEFT_FREE if per_node > TRAIN_GPUS_LEFT_FREE + 1 else per_node
        train_nodes = len(nodes) if len(nodes) <= 4 else max(2, len(nodes) // 4)
        main = self._new_job(
            _TEMPLATES[0], t0 - 7300.0, n_nodes=train_nodes, gpus_per_node=train_gpus, duration_s=7 * 86400.0
        )
        self._place(main, t0 - 7200.0, [n.name for n in nodes[:train_nodes]])
        # Everything else already running started at a random time before t0. Users take turns, one GPU
        # each at first, so the small reference cluster shows the idle notebook, an RL job and a fine-tune,
        # and the last GPU of the last node stays free (a free GPU is part of any real picture).
        rotation = (_TEMPLATES[3], _TEMPLATES[2], _TEMPLATES[1], _TEMPLATES[4])
        for k in range(10 * len(nodes)):
            job = self._new_job(rotation[k % len(rotation)], t0)
            if k < len(rotation) or self._fit(job) is None:
                job.gpus_per_node = 1
            elapsed = float(self.rng.uniform(0.05, 0.7)) * job.duration_s
            job.submit = round(t0 - elapsed - float(self.rng.uniform(5, 300)))
            if not self._try_start(job, round(t0 - elapsed)):
                self.jobs.remove(job)
                self._next_id -= 1
            if self._free_gpus() <= max(1, len(nodes) // 8):
                break
        # One job too big for what is free waits in the queue, as on any busy cluster.
        self._new_job(_TEMPLATES[1], t0 - 120.0, n_nodes=1, gpus_per_node=per_node, duration_s=3600.0)
        self._arrivals = sorted(t0 + float(x) for x in self.rng.uniform(60, 1800, size=max(2, len(nodes))))

    # -- placement -----------------------------------------------------------------------------

    def _free_gpus(self) -> int:
        return sum(len(v) for v in self.free.values())

    def _fit(self, job: PlannedJob) -> list[str] | None:
        if job.wants_nodes:  # a requeued job goes back where its ranks ran, once every node is back
            ok = all(n not in self.drained and len(self.free[n]) >= job.gpus_per_node for n in job.wants_nodes)
            return list(job.wants_nodes) if ok else None
        held = {n for j in self.jobs if j.state == "PENDING" for n in j.wants_nodes}
        fits = [
            name
            for name, free in self.free.items()
            if len(free) >= job.gpus_per_node and name not in self.drained and name not in held
        ]
        return fits[: job.n_nodes] if len(fits) >= job.n_nodes else None

    def _place(self, job: PlannedJob, t: float, nodes: list[str]) -> None:
        for name in nodes:
            free = self.free[name]
            taken, self.free[name] = free[: job.gpus_per_node], free[job.gpus_per_node :]
            job.gpus_by_node[name] = tuple(taken)
        job.start, job.state = float(t), "RUNNING"

    def _try_start(self, job: PlannedJob, t: float) -> bool:
        nodes = self._fit(job)
        if nodes is None:
            return False
        self._place(job, t, nodes)
        return True

    def _finish(self, job: PlannedJob, t: float) -> None:
        for name, gpus in job.gpus_by_node.items():
            self.free[name] = sorted(self.free[name] + list(gpus))
        job.end = float(t)
        # About one job in twelve fails (OOM, NaN, a bad node): real queues are not all COMPLETED.
        job.state = "FAILED" if self.rng.random() < 0.08 else "COMPLETED"

    def requeue(self, job: PlannedJob, t: float) -> None:
        """Slurm puts a failed job back in the queue (``RequeueExit`` or ``scontrol requeue``): same id,
        ``restart_cnt`` + 1, submit time reset to t (sacct(1): "If a job is requeued the submit time is
        reset"), its GPUs freed. Its nodes are held for it, as backfill holds the top job's resources, so
        it restarts where its ranks ran (the reference cluster has no spare node)."""
        for name, gpus in job.gpus_by_node.items():
            self.free[name] = sorted(self.free[name] + list(gpus))
        job.wants_nodes = job.nodes
        job.first_start = job.first_start if job.first_start is not None else job.start
        if job.start is not None:
            job.attempts.append((float(job.start), float(t), job.nodes))
        job.gpus_by_node = {}
        job.start, job.end, job.state = None, None, "PENDING"
        job.submit = float(t)
        job.restart_cnt += 1
        self._requeued = True

    def drain(self, node: str, *, until: float, reason: str) -> None:
        """Take ``node`` out of service until ``until`` (a health check's drain, then a reboot)."""
        self.drained[node] = (float(until), reason)

    def step(self, t: float) -> tuple[list[PlannedJob], list[PlannedJob]]:
        """Advance the queue to time t; returns (jobs that ended, jobs that started)."""
        back = [n for n, (until, _) in self.drained.items() if until <= t]
        for name in back:
            del self.drained[name]
        ended = (
            [j for j in self.jobs if j.state == "RUNNING" and j.started_at + j.duration_s <= t]
            if t >= self._next_end
            else []
        )
        for job in ended:
            self._finish(job, t)
            self._arrivals.append(t + float(self.rng.uniform(30, 600)))
        arrived, self._requeued = self._requeued, False  # a requeue is an arrival in the queue
        while self._arrivals and self._arrivals[0] <= t:
            submit = self._arrivals.pop(0)
            self._new_job(self._random_template(), round(submit))
            arrived = True
        self._arrivals.sort()
        started: list[PlannedJob] = []
        if not (ended or arrived or back):
            return ended, started  # nothing freed, nothing new: the queue cannot move
        biggest_hole = max(len(v) for v in self.free.values())
        for job in [j for j in self.jobs if j.state == "PENDING"]:
            if job.gpus_per_node <= biggest_hole and self._try_start(job, t):
                job.wants_nodes = ()
                started.append(job)
                biggest_hole = max(len(v) for v in self.free.values())
        self._next_end = min((j.started_at + j.duration_s for j in self.jobs if j.state == "RUNNING"), default=np.inf)
        return ended, started

    def running(self) -> list[PlannedJob]:
        return [j for j in self.jobs if j.state == "RUNNING"]
