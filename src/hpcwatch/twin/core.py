"""The twin: a simulated cluster, from the model, that produces what real collectors produce.

One ``Twin`` holds the state of every GPU, InfiniBand port, Lustre job counter
and Slurm job of a cluster, and moves it forward one tick at a time with
vectorised numpy (a 128-node cluster is a few arrays of 1,024 GPUs). Values are
physically plausible for the GPU of the catalog and consistent with each other:
a busy GPU draws power and heats up, the energy counter integrates the power,
an idle node moves no InfiniBand bytes, a training job's ports carry its ring
AllReduce (2(p-1)/p x gradient bytes per step), checkpoints are Lustre write
bursts. Everything is drawn from one seeded ``numpy.random.Generator``; the
simulated clock never looks at the real one.

Scenarios (twin/scenarios.py) bend the state through their hooks before it is
written. A scenario may also have a method ``absent_gpus(*, t)`` returning the
(node, gpu index) pairs dcgm-exporter no longer exports at time t (a GPU NVML
lost, as after XID 79): ``Twin.absent`` marks them and every writer skips their
lines, as a real exporter does.

Time semantics (see workload.py): a sample at t stands for ``(t - dt, t]`` and
carries the job that held the GPU during that interval.

This module holds the cluster's layout, its jobs' placement and the tick; the rest of the Twin is
one module per part, each saying why it is a mixin (it reads the Twin's shared arrays throughout)
or an object the Twin holds (it owns its state):

- twin/devices.py      the fields, counters and GPU identities the exporters name (constants)
- twin/gpus.py         ``GpuPhysics``: power, memory, temperature and clocks from a GPU's load
- twin/training.py     ``TrainingSteps``: step timing of distributed jobs, the training job's spans
- twin/restarts.py     ``Restarts``: checkpoints, ``fail_job`` / ``requeue_job``, the restart
- twin/lustre.py       ``LustreState``: the OSS's job_stats counters (held as ``Twin._lustre``)
- twin/truth.py        ``GroundTruth``: the per-job accounting behind ``Twin.truth()``
- twin/records_out.py  ``TwinOutputs``: the real formats (via exposition / slurm_out) and records

Every name this module held before the split is still importable from here (hence the ``noqa: F401`` imports).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np

from hpcwatch import vocab
from hpcwatch.errors import ConfigError
from hpcwatch.model import Cluster, Gpu
from hpcwatch.records import Event, Job
from hpcwatch.twin.devices import (  # noqa: F401
    AMD_DRIVER_VERSION,
    AMD_VBIOS_VERSION,
    COUNTER,
    DCGM_FIELDS,
    DRIVER_VERSION,
    FIELD,
    HGX_BUS_IDS,
    IB_COUNTERS,
    IB_MTU_BYTES,
    SM_CLOCK_IDLE_MHZ,
    SM_CLOCK_MAX_MHZ,
    amd_uuid,
    bus_id,
    gpu_uuid,
)
from hpcwatch.twin.gpus import POWER_THROTTLE_FRACTION, THERMAL_SLOWDOWN_CLOCK_FACTOR, GpuPhysics  # noqa: F401
from hpcwatch.twin.lustre import LOAD_PHASE_S, LUSTRE_CLEANUP_S, LUSTRE_RPC_BYTES, LustreState  # noqa: F401
from hpcwatch.twin.records_out import TwinOutputs
from hpcwatch.twin.restarts import CHECKPOINT_STAGING_BYTES_S, RESTART_STARTUP_S, RESTORE_BYTES_S_PER_GPU, Restarts  # noqa: F401
from hpcwatch.twin.scenarios import Scenario, get_scenario
from hpcwatch.twin.training import (  # noqa: F401
    _SPAN_COLUMNS,
    PHASE_JITTER,
    RING_ALPHA_S,
    SEED_PHASES_S,
    SEED_STEP_S,
    SPAN_ORDER,
    TrainingSteps,
)
from hpcwatch.twin.truth import GroundTruth, JobTruth
from hpcwatch.twin.workload import PlannedJob, Scheduler
from hpcwatch.vocab import EventKind

__all__ = [
    "Twin",
    "JobTruth",
    "DEFAULT_START_S",
    "SEED_PHASES_S",
    "SPAN_ORDER",
    "DCGM_FIELDS",
    "IB_COUNTERS",
    "DRIVER_VERSION",
]

#: Short names of the columns of ``fields`` and ``ib`` (the simulation indexes them on most lines).
_F, _C = FIELD, COUNTER
# Private names this module held before its parts moved out, still importable from here.
_HGX_BUS_IDS, _gpu_uuid, _bus_id = HGX_BUS_IDS, gpu_uuid, bus_id

#: Simulated time starts here unless told otherwise (2026-11-29 ~ the Slurm samples' epoch), so runs are reproducible.
DEFAULT_START_S = 1_796_000_000.0


def _overrides(scenario: Scenario, hook: str) -> bool:
    return getattr(type(scenario), hook) is not getattr(Scenario, hook)


class Twin(TrainingSteps, Restarts, GroundTruth, TwinOutputs):
    """A simulated cluster. ``advance(dt_s)`` moves it; the ``*_text`` / ``*_json`` methods write real formats."""

    def __init__(
        self, cluster: Cluster, *, seed: int = 0, scenarios: Iterable[str | Scenario] = (), start: float | None = None
    ) -> None:
        self.cluster = cluster
        self.seed = int(seed)
        self.rng = np.random.default_rng(self.seed)
        self.scenarios = tuple(get_scenario(s) if isinstance(s, str) else s for s in scenarios)
        self.now = float(DEFAULT_START_S if start is None else start)
        self.t0 = self.now
        self.dt = 0.0
        self._tick = 0
        self._layout()
        self.scheduler = Scheduler(cluster, self.rng, self.t0)
        self._job_index: dict[str, int] = {}
        self._acc = np.zeros((0, 6))  # per job index: the sums behind truth() (twin/truth.py)
        # Per job index: util mean, util sd, tensor activity, HBM share (what its kind does to a GPU).
        self._params = np.zeros((0, 4))
        self._events = []
        # What the job's own log says of the time before t0, reported with the first tick.
        self._before_t0: list[Event] = []
        self._nccl_told: set[str] = set()
        """Training jobs whose ranks' nccl_rank events were given (once each, as a followed log stores them)."""
        self._init_steps()
        self._init_restarts()
        self._lustre = LustreState(cluster.storage.osts)
        self._assign()
        self._label_job = self._job_of_gpu.copy()
        self._init_state()
        for scenario in self.scenarios:
            bind = getattr(scenario, "bind", None)
            if callable(bind):
                bind(self)
        self._simulate(0.0)
        self._before_t0 = self._checkpoints_before_t0()

    # -- layout ----------------------------------------------------------------------------------

    def _layout(self) -> None:
        c = self.cluster
        self.node_names: tuple[str, ...] = tuple(n.name for n in c.nodes)
        gpus = c.gpus
        self.n_gpus = len(gpus)
        node_pos = {name: i for i, name in enumerate(self.node_names)}
        self._gpu_node = np.array([node_pos[g.node] for g in gpus], dtype=np.int64)
        self._gpu_index = np.array([g.index for g in gpus], dtype=np.int64)
        self._gpu_flat = {(g.node, g.index): i for i, g in enumerate(gpus)}
        self._physics = GpuPhysics(gpus, c.cooling)
        self.gpu_labels: list[dict[str, str]] = [
            _amd_labels(c.name, g) if g.spec.vendor == "amd" else _dcgm_labels(c.name, g) for g in gpus
        ]
        #: Per GPU: its node's exporter writes AMD device-metrics-exporter text (else dcgm-exporter's).
        self.gpu_is_amd = np.array([g.spec.vendor == "amd" for g in gpus], dtype=bool)
        # One HCA per rail: HCA h of a node serves the GPUs g with g * H // G == h (rail-optimised).
        ports: list[tuple[str, int]] = []
        port_of_gpu = np.zeros(self.n_gpus, dtype=np.int64)
        for node in c.nodes:
            base = len(ports)
            hcas = max(1, node.hcas)
            ports.extend((node.name, h) for h in range(hcas))
            for g in node.gpus:
                port_of_gpu[self._gpu_flat[(node.name, g.index)]] = base + g.index * hcas // max(1, len(node.gpus))
        self.ports: tuple[tuple[str, int], ...] = tuple(ports)
        self._port_of_gpu = port_of_gpu
        self._port_node = np.array([node_pos[n] for n, _ in ports], dtype=np.int64)
        self.link_bytes_s = c.fabric.link.rate_bits_s / 8
        self._nvlink_bytes_s = gpus[0].spec.nvlink_bandwidth_bytes_s if gpus else 0.0
        self._gpus_per_port = np.bincount(self._port_of_gpu, minlength=len(self.ports))
        self._node_gpus = {n.name: [self._gpu_flat[(n.name, g.index)] for g in n.gpus] for n in c.nodes}
        self._node_ports = {name: [p for p, (n, _) in enumerate(ports) if n == name] for name in self.node_names}
        self._label_text = [
            _exporter_label_text(c.name, g)
            if g.spec.vendor == "amd"
            else ",".join(f'{k}="{v}"' for k, v in lab.items())
            for g, lab in zip(gpus, self.gpu_labels)
        ]

    def _init_state(self) -> None:
        n = self.n_gpus
        self.fields = np.zeros((n, len(DCGM_FIELDS)))
        #: Per row of ``fields``: dcgm-exporter no longer exports this GPU (see ``absent_gpus`` above).
        self.absent = np.zeros(n, dtype=bool)
        # Energy since boot: the nodes booted a few days before t0.
        boot_s = self.rng.uniform(2, 9, size=n) * 86400
        self.fields[:, _F[vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION]] = np.round(
            boot_s * self._physics.idle_w * 1.6 * 1000
        )
        self.ib = np.zeros((len(self.ports), len(IB_COUNTERS)))
        # The ports carried traffic before t0 too; start the counters somewhere realistic (words).
        self.ib[:, _C["PortXmitData"]] = np.round(self.rng.uniform(1e12, 5e12, size=len(self.ports)))
        self.ib[:, _C["PortRcvData"]] = self.ib[:, _C["PortXmitData"]] + np.round(
            self.rng.uniform(0, 1e9, len(self.ports))
        )
        self.ib[:, _C["PortXmitPkts"]] = np.round(self.ib[:, _C["PortXmitData"]] * 4 / IB_MTU_BYTES)
        self.ib[:, _C["PortRcvPkts"]] = np.round(self.ib[:, _C["PortRcvData"]] * 4 / IB_MTU_BYTES)
        self._prev_xid = np.zeros(n)
        self._lustre.backfill(self.scheduler.jobs, self.now)

    # -- jobs ----------------------------------------------------------------------------------------

    def _assign(self, ended: Iterable[PlannedJob] = (), started: Iterable[PlannedJob] | None = None) -> None:
        """Job index per GPU (into scheduler.jobs) for the placement in force now; -1 when free.

        Incremental: the GPUs of ``ended`` jobs are freed, those of ``started`` taken (all running
        jobs when ``started`` is None)."""
        jobs = self.scheduler.jobs
        for job in jobs[len(self._job_index) :]:
            self._job_index[job.id] = len(self._job_index)
        if started is None:
            self._job_of_gpu = np.full(self.n_gpus, -1, dtype=np.int64)
            started = self.scheduler.running()
        for job, value in [(j, -1) for j in ended] + [(j, None) for j in started]:
            flat = [self._gpu_flat[(node, g)] for node, gpus in job.gpus_by_node.items() for g in gpus]
            self._job_of_gpu[flat] = self._job_index[job.id] if value is None else -1
        self._grow(len(jobs))

    @property
    def jobs(self) -> list[Job]:
        """Every job the twin's Slurm knows (pending, running, finished), as records."""
        return [j.record() for j in self.scheduler.jobs]

    def gpu_row(self, node: str, gpu: int) -> int:
        """The row of ``fields`` that holds GPU ``gpu`` of ``node``."""
        return self._gpu_flat[(node, gpu)]

    def port_row(self, node: str, gpu: int) -> int:
        """The row of ``ib`` of the HCA on that GPU's rail."""
        return int(self._port_of_gpu[self._gpu_flat[(node, gpu)]])

    def busy(self) -> np.ndarray:
        """Per row of ``fields``: whether a job held the GPU during the last tick."""
        return self._label_job >= 0

    def gpus_of_node(self, node: str) -> list[int]:
        """Flat GPU positions (rows of ``fields``) of a node, in GPU index order."""
        return self._node_gpus[node]

    def ports_of_node(self, node: str) -> list[int]:
        """Rows of ``ib`` (HCAs) of a node, in HCA order."""
        return self._node_ports[node]

    def dcgm_label_text(self, g: int) -> str:
        """The label text of flat GPU g as its exporter writes it, with the job that holds it: dcgm-exporter's
        ``hpc_job``, or the ``job_id`` AMD's device-metrics-exporter takes from its Slurm prolog."""
        j = int(self._label_job[g])
        return self.exporter_label_text(g, self.scheduler.jobs[j].id if j >= 0 else None)

    def exporter_label_text(self, g: int, job: str | None) -> str:
        """The label text of flat GPU g as its exporter writes it, held by ``job`` (None: free)."""
        base = self._label_text[g]
        if not job:
            return base
        if self.gpu_is_amd[g]:  # device-metrics-exporter sorts its labels: job_id comes before vbios_version
            return base.replace(',vbios_version="', f',job_id="{job}",vbios_version="', 1)
        return f'{base},hpc_job="{job}"'

    def node_is_amd(self, node: str) -> bool:
        """Whether the node's GPUs are AMD ones (its exporter is device-metrics-exporter)."""
        flat = self._node_gpus[node]
        return bool(flat) and bool(self.gpu_is_amd[flat].all())

    def set_gpu_label(self, node: str, name: str, value: str) -> None:
        """Give every GPU of ``node`` the label ``name`` = ``value`` wherever its exporter and records carry it
        (a scenario's other driver or firmware on one node: ``DCGM_FI_DRIVER_VERSION``, AMD's ``driver_version``,
        ``vbios_version``). ``ConfigError`` if the node's exporter writes no such label."""
        pattern = re.compile(rf'(^|,){re.escape(name)}="[^"]*"')
        for g in self._node_gpus[node]:
            text, found = pattern.subn(lambda m: f'{m.group(1)}{name}="{value}"', self._label_text[g])
            if not found:
                raise ConfigError(f"{node}: its GPU exporter writes no label {name!r}")
            self._label_text[g] = text
            if name in self.gpu_labels[g]:
                self.gpu_labels[g][name] = value
        from hpcwatch.twin.exposition import forget_templates  # exposition draws on this module

        forget_templates(self)

    def job_of(self, node: str, gpu: int) -> str | None:
        """The job id on that GPU during the last tick (what dcgm-exporter's hpc_job label says)."""
        j = int(self._label_job[self._gpu_flat[(node, gpu)]])
        return self.scheduler.jobs[j].id if j >= 0 else None

    # -- time ----------------------------------------------------------------------------------------

    def advance(self, dt_s: float) -> None:
        """Move simulated time forward by dt_s (one tick): simulate, then let Slurm end and start jobs."""
        if dt_s <= 0:
            raise ConfigError(f"dt_s must be > 0, got {dt_s}")
        t_prev = self.now
        self._events, self._last_step = self._before_t0, None
        self._before_t0 = []
        self._label_job = self._job_of_gpu.copy()
        self.now = t_prev + float(dt_s)
        self.dt = float(dt_s)
        self._tick += 1
        self._simulate(float(dt_s))
        ended, started = self.scheduler.step(self.now)
        if ended or started:
            self._assign(ended, started)
        for job in ended:
            self._events.append(
                Event(
                    kind=EventKind.JOB_END,
                    t=self.now,
                    source="slurm",
                    attrs={"job": job.id, "user": job.user, "state": job.state},
                )
            )
        for job in started:
            self._events.append(
                Event(
                    kind=EventKind.JOB_START,
                    t=self.now,
                    source="slurm",
                    attrs={"job": job.id, "user": job.user, "nodes": list(job.nodes)},
                )
            )
            if job.restart_cnt:
                self._events.extend(self._restarted(job))
        self._events.extend(self._nccl_events())
        for scenario in self.scenarios:
            self._events.extend(scenario.events(twin=self, t0=t_prev, t1=self.now))

    def _nccl_events(self) -> list[Event]:
        """The training job's ``nccl_rank`` events, on the first tick it runs (its ranks' NCCL init)."""
        from hpcwatch.twin.nccl import nccl_conf_of, nccl_rank_events, socket_nodes_of  # draws on exposition

        job = self.training_job if self.scheduler.jobs else None
        if job is None or job.state != "RUNNING" or job.id in self._nccl_told:
            return []
        self._nccl_told.add(job.id)
        return nccl_rank_events(
            self, t=self.now, socket_nodes=socket_nodes_of(self.scenarios), conf=nccl_conf_of(self.scenarios)
        )

    def _grow(self, n: int) -> None:
        """Make room for jobs up to index n - 1 in the per-job arrays and fill the new rows."""
        old = self._params.shape[0]
        if old >= n:
            return
        cap = max(n, 2 * old, 64)
        self._acc = np.vstack([self._acc, np.zeros((cap - old, self._acc.shape[1]))])
        params = np.zeros((cap, self._params.shape[1]))
        params[:old] = self._params
        for j, job in enumerate(self.scheduler.jobs[old:], start=old):
            k = job.kind
            params[j] = (k.util_pct, k.util_sd_pct, k.tensor_active, k.fb_fraction)
        self._params = params
        self._filled = len(self.scheduler.jobs)

    def _kind_arrays(self) -> np.ndarray:
        """Per GPU: util mean, util sd, tensor activity, HBM share of the job on it."""
        assign = self._label_job
        # A requeued job can join the scheduler between two starts or ends (where the arrays grow otherwise).
        self._grow(len(self.scheduler.jobs))
        if getattr(self, "_filled", 0) < len(self.scheduler.jobs):
            old = getattr(self, "_filled", 0)
            for j, job in enumerate(self.scheduler.jobs[old:], start=old):
                k = job.kind
                self._params[j] = (k.util_pct, k.util_sd_pct, k.tensor_active, k.fb_fraction)
            self._filled = len(self.scheduler.jobs)
        rows = np.where((assign >= 0)[:, None], self._params[np.maximum(assign, 0)], 0.0)
        return rows.T

    def _simulate(self, dt: float) -> None:
        assign = self._label_job
        busy = assign >= 0
        util_mean, util_sd, tensor, fb_frac = self._kind_arrays()
        z = self.rng.standard_normal((5, self.n_gpus))
        util = np.where(busy, np.clip(np.round(util_mean + util_sd * z[0]), 0, 100), 0.0)
        compute_share, gpu_bytes = self._train_steps(dt)
        tensor = np.where(busy, tensor * compute_share * (util > 0), 0.0)
        f = self.fields
        self._physics.write(f, dt, busy=busy, util=util, tensor=tensor, fb_frac=fb_frac, z=z)
        self._apply_gpu_hooks()
        self._apply_absent()
        energy_inc = np.round(f[:, _F[vocab.DCGM_FI_DEV_POWER_USAGE]] * dt * 1000.0)
        f[:, _F[vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION]] += energy_inc
        ib_before = self.ib[:, [_C["PortXmitData"], _C["PortRcvData"]]].copy()
        self._ib_traffic(gpu_bytes)
        ib_delta = (self.ib[:, [_C["PortXmitData"], _C["PortRcvData"]]] - ib_before) * 4
        self._account(energy_inc, ib_delta)
        self._lustre_tick(dt)

    def _apply_gpu_hooks(self) -> None:
        hooked = self._hooked("adjust_gpu")
        if not hooked:
            return
        f = self.fields
        for i, labels in enumerate(self.gpu_labels):
            values = dict(zip(DCGM_FIELDS, f[i].tolist()))
            for scenario in hooked:
                scenario.adjust_gpu(node=labels["Hostname"], gpu=int(labels["gpu"]), t=self.now, fields=values)
            f[i] = [values[name] for name in DCGM_FIELDS]

    def _apply_absent(self) -> None:
        """Mark the GPUs scenarios say dcgm-exporter has lost (``absent_gpus``), afresh every tick."""
        hooked = [hook for s in self.scenarios if callable(hook := getattr(s, "absent_gpus", None))]
        if not hooked:
            return
        absent = np.zeros(self.n_gpus, dtype=bool)
        for absent_gpus in hooked:
            for node, gpu in absent_gpus(t=self.now):
                absent[self._gpu_flat[(node, int(gpu))]] = True
        self.absent = absent

    def _ib_traffic(self, gpu_bytes: np.ndarray) -> None:
        words = np.round(np.bincount(self._port_of_gpu, weights=gpu_bytes, minlength=len(self.ports)) / 4)
        pkts = np.ceil(words * 4 / IB_MTU_BYTES)
        for name, inc in (
            ("PortXmitData", words),
            ("PortRcvData", words),
            ("PortXmitPkts", pkts),
            ("PortRcvPkts", pkts),
            ("PortUnicastXmitPkts", pkts),
            ("PortUnicastRcvPkts", pkts),
        ):
            self.ib[:, _C[name]] += inc
        hooked = self._hooked("adjust_ib")
        for p, (node, hca) in enumerate(self.ports) if hooked else ():
            counters = dict(zip(IB_COUNTERS, self.ib[p].tolist()))
            for scenario in hooked:
                scenario.adjust_ib(node=node, port=hca, t=self.now, counters=counters)
            self.ib[p] = [counters[name] for name in IB_COUNTERS]

    def _hooked(self, hook: str) -> list[Scenario]:
        """The active scenarios that override ``hook`` (the others' hook does nothing: skip the call)."""
        return [s for s in self.scenarios if _overrides(s, hook)]

    def _lustre_tick(self, dt: float) -> None:
        """What the jobs on GPUs read and wrote on Lustre in the tick; a checkpoint one saved is an event."""
        if dt <= 0:
            return
        idx = np.unique(self._label_job[self._label_job >= 0])
        if not len(idx):
            return
        jobs = [self.scheduler.jobs[j] for j in idx.tolist()]
        restored = np.array([self._restore_read(j, self.now - dt, self.now) for j in jobs])
        due = self._lustre.tick(jobs, idx, now=self.now, dt=dt, steps=self._tick_steps, restored=restored)
        for k in np.flatnonzero(due).tolist():
            self._events.append(self._checkpoint_event(jobs[k], self.now, int(self._steps_done.get(jobs[k].id, 0))))

    def lustre_counters(self) -> dict[str, np.ndarray]:
        """Cumulative obdfilter job_stats per job still listed: rows = OSTs, columns =
        read_sum, read_rpcs, write_sum, write_rpcs, syncs (bytes and counts)."""
        return self._lustre.listed(self.scheduler.jobs, self.now)

    def lustre_listing(self) -> tuple[list[str], np.ndarray]:
        """``lustre_counters()`` in one array: (the job ids, their counters as jobs x OSTs x columns)."""
        listed = self._lustre.listed_indexes(self.now)
        jobs = self.scheduler.jobs
        return [jobs[j].id for j in listed.tolist()], self._lustre.counters_of(listed)


def _dcgm_labels(cluster: str, g: Gpu) -> dict[str, str]:
    """dcgm-exporter's labels of an NVIDIA GPU."""
    return {
        "gpu": str(g.index),
        "UUID": gpu_uuid(cluster, g.node, g.index),
        "pci_bus_id": bus_id(g.index),
        "device": f"nvidia{g.index}",
        "modelName": g.spec.name,
        "Hostname": g.node,
        "DCGM_FI_DRIVER_VERSION": DRIVER_VERSION,
    }


def _amd_labels(cluster: str, g: Gpu) -> dict[str, str]:
    """An AMD GPU's labels as the AMD readers give them (sources/amd_gpu.py): the same keys the analyses read."""
    return {
        "gpu": str(g.index),
        "UUID": amd_uuid(cluster, g.node, g.index),
        "modelName": g.spec.name,
        "Hostname": g.node,
        "vendor": "amd",
        "driver_version": AMD_DRIVER_VERSION,
        "vbios_version": AMD_VBIOS_VERSION,
    }


def _exporter_label_text(cluster: str, g: Gpu) -> str:
    """The label text device-metrics-exporter writes for a GPU (labels of ROCm/device-metrics-exporter
    issue #171's MI300X scrape, sorted as the exporter sorts them); the job label is added per scrape."""
    return (
        f'card_model="",card_series="{g.spec.name}",driver_version="{AMD_DRIVER_VERSION}",'
        f'gpu_compute_partition_type="spx",gpu_id="{g.index}",gpu_memory_partition_type="nps1",gpu_partition_id="0",'
        f'gpu_uuid="{amd_uuid(cluster, g.node, g.index)}",hostname="{g.node}",vbios_version="{AMD_VBIOS_VERSION}"'
    )
