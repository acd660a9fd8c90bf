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
lines, as a real exporter does. The writers of the real formats live in ``exposition`` and
``slurm_out``; ``Twin.dcgm_text`` and friends delegate to them.

Time semantics (see workload.py): a sample at t stands for ``(t - dt, t]`` and
carries the job that held the GPU during that interval.

The first job is the training job whose steps are timed (``step_phases``): a
seed step of ~42 ms (load, forward, backward, the ring AllReduce from the link
model, optimizer) with 1 % jitter per rank; the collective waits for the slowest
rank, so a straggler shows up as everyone else's ``barrier_wait``. Like a
profiler schedule, one finished step per tick becomes spans (``finished_spans``).

The twin also keeps its own ground truth per job (``Twin.truth()``), computed
from the very counters it writes, so a round trip through files and readers can
be checked number for number.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from hpcwatch import vocab
from hpcwatch.errors import ConfigError
from hpcwatch.model import Cluster
from hpcwatch.model.catalog import GPU_SLOWDOWN_TEMP_C
from hpcwatch.records import Event, Job, Sample, Span
from hpcwatch.twin.scenarios import Scenario, get_scenario
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

#: Simulated time starts here unless told otherwise (2026-11-29 ~ the Slurm samples' epoch), so runs are reproducible.
DEFAULT_START_S = 1_796_000_000.0

#: The seed's training step (seconds per phase, before the AllReduce which comes from the ring model): ~42 ms.
SEED_PHASES_S = {"load": 0.002, "forward": 0.011, "backward": 0.020, "optimizer": 0.002}
#: The seed step without its AllReduce: a job's kind reads ``read_bytes_s_per_gpu`` x this per step.
SEED_STEP_S = sum(SEED_PHASES_S.values())
#: NCCL per-hop latency alpha of the ring model T = 2(p-1)alpha + 2(p-1)/p n/B (docs/reference.md, "Ring all-reduce and busbw").
RING_ALPHA_S = 5e-6
#: The order the phases of a step run in (columns of ``step_phases`` are in ``records.PHASES`` order).
SPAN_ORDER = ("load", "forward", "backward", "barrier_wait", "allreduce", "optimizer")
_SPAN_COLUMNS = [("load", "forward", "backward", "allreduce", "optimizer", "barrier_wait").index(p) for p in SPAN_ORDER]
#: Relative per-phase jitter of one rank's compute (1 %).
PHASE_JITTER = 0.01

#: A data-centre driver as dcgm-exporter puts it in DCGM_FI_DRIVER_VERSION: R580 at its first release with the
#: May 2026 security fixes (NVIDIA bulletin a_id 5821; the floor ClusterMAX pins, see assess/versions.py).
DRIVER_VERSION = "580.159.03"
#: Max SM clock (MHz) as ``nvidia-smi -q`` reports it; H200 seen in data/real/h200/nvml_timeseries.csv (1980).
#: H100 SXM: https://www.nvidia.com/en-us/data-center/h100/ (same GH100 boost), A100: 1410 (A100 datasheet).
SM_CLOCK_MAX_MHZ = {"h100-sxm": 1980.0, "h200": 1980.0, "a100-sxm": 1410.0}
#: Idle SM clock of an H100 with no process, dcgm-exporter README sample (345 MHz).
SM_CLOCK_IDLE_MHZ = 345.0
#: Fraction of TDP above which the GPU starts to pull its clock down (power capping).
POWER_THROTTLE_FRACTION = 0.93
#: Temperature model: T -> inlet + c_per_w x P, first order with the cooling's time constant; the cluster model's
#: ``cooling`` (model/catalog.py COOLING: liquid = the fit of the H200 capture, 56 C at 680 W; air hotter, slower).
#: At the GPU's slowdown temperature (catalog GPU_SLOWDOWN_TEMP_C) the clocks drop by half: nvidia-smi(1) says HW
#: thermal slowdown "reduc[es] the core clocks by a factor of 2 or more" (clocks_event_reasons.hw_thermal_slowdown).
THERMAL_SLOWDOWN_CLOCK_FACTOR = 0.5
#: InfiniBand MTU used to turn bytes into packets (NDR, 4 KiB).
IB_MTU_BYTES = 4096
#: Lustre: largest bulk RPC (4 MiB) and the default ``job_cleanup_interval`` (600 s) after which idle entries go.
LUSTRE_RPC_BYTES, LUSTRE_CLEANUP_S = 4 * 1024**2, 600.0
#: How long a job reads its dataset shards / last checkpoint after it starts.
LOAD_PHASE_S = 300.0
#: The twin's jobs save asynchronously (torch.distributed.checkpoint.async_save,
#: https://pytorch.org/docs/stable/distributed.checkpoint.html): training stops only while each GPU's
#: shard is copied to host memory over PCIe 5.0 x16 (32 GT/s a lane, ~63 GB/s a direction,
#: https://en.wikipedia.org/wiki/PCI_Express#Comparison_table; ~50 GB/s achieved). That stop is a
#: checkpoint event's ``duration_s``.
CHECKPOINT_STAGING_BYTES_S = 50e9
#: A restarted job's start-up before it reads its checkpoint (torchrun rendezvous, NCCL init, model build).
#: Ours: tens of seconds on a small job; the goodput simulator's first start-up is 5 min (analysis/goodputsim).
RESTART_STARTUP_S = 30.0
#: Checkpoint read-back per GPU from Lustre. Ours: a Lustre client streams a few GB/s per NDR port
#: (one port per GPU rail, 50 GB/s line rate); 2.5 GB/s per GPU is a loaded file system's share.
RESTORE_BYTES_S_PER_GPU = 2.5e9

#: dcgm-exporter fields the twin produces, in the order dcgm-exporter writes them (etc/default-counters.csv).
DCGM_FIELDS = (
    vocab.DCGM_FI_DEV_SM_CLOCK,
    vocab.DCGM_FI_DEV_GPU_TEMP,
    vocab.DCGM_FI_DEV_POWER_USAGE,
    vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    vocab.DCGM_FI_DEV_GPU_UTIL,
    vocab.DCGM_FI_DEV_XID_ERRORS,
    vocab.DCGM_FI_DEV_FB_FREE,
    vocab.DCGM_FI_DEV_FB_USED,
    vocab.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,
)
_F = {name: i for i, name in enumerate(DCGM_FIELDS)}

#: perfquery -x counters the twin keeps per port (data counters in 4-byte words, as the HCA counts them).
IB_COUNTERS = (
    "PortXmitData",
    "PortRcvData",
    "PortXmitPkts",
    "PortRcvPkts",
    "PortUnicastXmitPkts",
    "PortUnicastRcvPkts",
    "PortMulticastXmitPkts",
    "PortMulticastRcvPkts",
    "SymbolErrorCounter",
    "LinkErrorRecoveryCounter",
    "LinkDownedCounter",
    "PortRcvErrors",
    "PortRcvRemotePhysicalErrors",
    "PortRcvSwitchRelayErrors",
    "PortXmitDiscards",
    "PortXmitConstraintErrors",
    "PortRcvConstraintErrors",
    "LocalLinkIntegrityErrors",
    "ExcessiveBufferOverrunErrors",
    "VL15Dropped",
    "PortXmitWait",
    "QP1Dropped",
)
_C = {name: i for i, name in enumerate(IB_COUNTERS)}

# HGX H100 8-GPU baseboard PCI bus ids (as nvidia-smi shows them on a DGX H100).
_HGX_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")


@dataclass(slots=True)
class JobTruth:
    """What the twin knows happened to one job since the twin started (its own ground truth)."""

    id: str
    energy_mj: int = 0
    ib_tx_bytes: int = 0
    ib_rx_bytes: int = 0
    xid_errors: int = 0
    util_sum: float = 0.0
    util_samples: int = 0
    lustre_read_bytes: int = 0
    lustre_write_bytes: int = 0

    @property
    def energy_kwh(self) -> float:
        return self.energy_mj / 3.6e9

    @property
    def mean_gpu_util(self) -> float | None:
        return self.util_sum / self.util_samples if self.util_samples else None


def _overrides(scenario: Scenario, hook: str) -> bool:
    return getattr(type(scenario), hook) is not getattr(Scenario, hook)


def _gpu_uuid(cluster: str, node: str, index: int) -> str:
    h = hashlib.sha1(f"{cluster}/{node}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _bus_id(index: int) -> str:
    bus = _HGX_BUS_IDS[index] if index < len(_HGX_BUS_IDS) else f"{0xC0 + index:02X}"
    return f"00000000:{bus}:00.0"


class Twin:
    """A simulated cluster. ``advance(dt_s)`` moves it; the ``*_text`` / ``*_json`` methods write real formats."""

    def __init__(
        self, cluster: Cluster, *, seed: int = 0, scenarios: Iterable[str | Scenario] = (), start: float | None = None
    ) -> None:
        self.cluster = cluster
        self.seed = int(seed)
        self.rng = np.random.default_rng(self.seed)
        self.scenarios: tuple[Scenario, ...] = tuple(get_scenario(s) if isinstance(s, str) else s for s in scenarios)
        self.now = float(DEFAULT_START_S if start is None else start)
        self.t0 = self.now
        self.dt = 0.0
        self._tick = 0
        self._layout()
        self.scheduler = Scheduler(cluster, self.rng, self.t0)
        self._job_index: dict[str, int] = {}
        # Per job index: energy_mj, util_sum, util_samples, xid_errors, ib_tx_bytes, ib_rx_bytes (ground truth).
        self._acc = np.zeros((0, 6))
        # Per job index: util mean, util sd, tensor activity, HBM share (what its kind does to a GPU).
        self._params = np.zeros((0, 4))
        self._events: list[Event] = []
        # What the job's own log says of the time before t0, reported with the first tick.
        self._before_t0: list[Event] = []
        self._nccl_told: set[str] = set()
        """Training jobs whose ranks' nccl_rank events were given (once each, as a followed log stores them)."""
        self._last_step: tuple[int, float] | None = None
        self._steps_done: dict[str, float] = {}
        self._tick_steps: dict[int, float] = {}
        """Steps each timed job (by index) made in the last tick: what its data loader read."""
        self._halted: set[str] = set()
        """Jobs a failure killed that Slurm has not requeued yet."""
        self._resume_at: dict[str, float] = {}
        """Restarted jobs: when they step again (start-up and checkpoint read done)."""
        self._saved: dict[str, tuple[int, str]] = {}
        """Per job: the step and path of its last checkpoint (what a restart reads back)."""
        self._lustre = np.zeros((0, max(1, cluster.storage.osts), 5))
        self._lustre_seen = np.zeros(0)
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
        self._tdp = np.array([g.spec.tdp_w for g in gpus])
        self._idle_w = np.array([g.spec.idle_power_w for g in gpus])
        self._hbm_mib = np.array([g.spec.hbm_bytes / 1024**2 for g in gpus])
        self._sm_max = np.array([SM_CLOCK_MAX_MHZ.get(g.spec.key, np.nan) for g in gpus])
        self._slowdown_c = np.array([GPU_SLOWDOWN_TEMP_C.get(g.spec.key, np.nan) for g in gpus])
        cooling = c.cooling
        self._inlet_c, self._c_per_w, self._tau_s = cooling.inlet_c, cooling.spec.c_per_w, cooling.spec.tau_s
        self.gpu_labels: list[dict[str, str]] = [
            {
                "gpu": str(g.index),
                "UUID": _gpu_uuid(c.name, g.node, g.index),
                "pci_bus_id": _bus_id(g.index),
                "device": f"nvidia{g.index}",
                "modelName": g.spec.name,
                "Hostname": g.node,
                "DCGM_FI_DRIVER_VERSION": DRIVER_VERSION,
            }
            for g in gpus
        ]
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
        self._label_text = [",".join(f'{k}="{v}"' for k, v in labels.items()) for labels in self.gpu_labels]

    def _init_state(self) -> None:
        n = self.n_gpus
        self.fields = np.zeros((n, len(DCGM_FIELDS)))
        #: Per row of ``fields``: dcgm-exporter no longer exports this GPU (see ``absent_gpus`` above).
        self.absent = np.zeros(n, dtype=bool)
        self._temp = np.full(n, self._inlet_c + self._c_per_w * self._idle_w)
        # Energy since boot: the nodes booted a few days before t0.
        boot_s = self.rng.uniform(2, 9, size=n) * 86400
        self.fields[:, _F[vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION]] = np.round(boot_s * self._idle_w * 1.6 * 1000)
        self.ib = np.zeros((len(self.ports), len(IB_COUNTERS)))
        # The ports carried traffic before t0 too; start the counters somewhere realistic (words).
        self.ib[:, _C["PortXmitData"]] = np.round(self.rng.uniform(1e12, 5e12, size=len(self.ports)))
        self.ib[:, _C["PortRcvData"]] = self.ib[:, _C["PortXmitData"]] + np.round(
            self.rng.uniform(0, 1e9, len(self.ports))
        )
        self.ib[:, _C["PortXmitPkts"]] = np.round(self.ib[:, _C["PortXmitData"]] * 4 / IB_MTU_BYTES)
        self.ib[:, _C["PortRcvPkts"]] = np.round(self.ib[:, _C["PortRcvData"]] * 4 / IB_MTU_BYTES)
        self._prev_xid = np.zeros(n)
        self._lustre_backfill()

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

    @property
    def training_job(self) -> PlannedJob:
        """The big training job whose steps the twin times (the first job)."""
        return self.scheduler.jobs[0]

    def gpu_row(self, node: str, gpu: int) -> int:
        """The row of ``fields`` that holds GPU ``gpu`` of ``node``."""
        return self._gpu_flat[(node, gpu)]

    def port_row(self, node: str, gpu: int) -> int:
        """The row of ``ib`` of the HCA on that GPU's rail."""
        return int(self._port_of_gpu[self._gpu_flat[(node, gpu)]])

    def busy(self) -> np.ndarray:
        """Per row of ``fields``: whether a job held the GPU during the last tick."""
        return self._label_job >= 0

    def steps_done(self, job_id: str) -> int:
        """Training steps a distributed job has finished (since it started), as the twin counts them."""
        return int(self._steps_done.get(job_id, 0.0))

    def gpus_of_node(self, node: str) -> list[int]:
        """Flat GPU positions (rows of ``fields``) of a node, in GPU index order."""
        return self._node_gpus[node]

    def ports_of_node(self, node: str) -> list[int]:
        """Rows of ``ib`` (HCAs) of a node, in HCA order."""
        return self._node_ports[node]

    def dcgm_label_text(self, g: int) -> str:
        """The label text of flat GPU g as dcgm-exporter writes it, hpc_job included when held."""
        j = int(self._label_job[g])
        base = self._label_text[g]
        return f'{base},hpc_job="{self.scheduler.jobs[j].id}"' if j >= 0 else base

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
        from hpcwatch.twin.nccl import nccl_rank_events, socket_nodes_of  # twin.nccl draws on exposition

        job = self.training_job if self.scheduler.jobs else None
        if job is None or job.state != "RUNNING" or job.id in self._nccl_told:
            return []
        self._nccl_told.add(job.id)
        return nccl_rank_events(self, t=self.now, socket_nodes=socket_nodes_of(self.scenarios))

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
        f[:, _F[vocab.DCGM_FI_DEV_GPU_UTIL]] = util
        f[:, _F[vocab.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE]] = np.round(tensor, 6)
        activity = (util / 100.0) * (0.55 + 0.45 * np.minimum(tensor / 0.62, 1.0))
        power = self._idle_w + (self._tdp - self._idle_w) * (0.05 * busy + 0.92 * activity) + 2.0 * z[1]
        power = np.round(np.clip(power, 0.9 * self._idle_w, self._tdp), 3)
        f[:, _F[vocab.DCGM_FI_DEV_POWER_USAGE]] = power
        fb = np.round(np.clip(fb_frac * self._hbm_mib * (1 + 0.002 * z[2]), 0, self._hbm_mib))
        f[:, _F[vocab.DCGM_FI_DEV_FB_USED]] = fb
        f[:, _F[vocab.DCGM_FI_DEV_FB_FREE]] = np.round(self._hbm_mib - fb)
        target = self._inlet_c + self._c_per_w * power
        # At t0 the GPUs have been at their load for a while: start at the steady temperature.
        lag = np.exp(-dt / self._tau_s) if dt > 0 else 0.0
        self._temp = target + (self._temp - target) * lag + 0.3 * z[4]
        f[:, _F[vocab.DCGM_FI_DEV_GPU_TEMP]] = np.round(self._temp)
        throttled = busy & (power >= POWER_THROTTLE_FRACTION * self._tdp)
        clock = np.where(
            busy,
            self._sm_max - throttled * np.round(np.abs(z[3]) * 8) * 15.0,
            np.minimum(SM_CLOCK_IDLE_MHZ, self._sm_max),
        )
        too_hot = self._temp >= self._slowdown_c  # NaN (unknown GPU) is never too hot
        f[:, _F[vocab.DCGM_FI_DEV_SM_CLOCK]] = np.where(too_hot, np.round(clock * THERMAL_SLOWDOWN_CLOCK_FACTOR), clock)
        f[:, _F[vocab.DCGM_FI_DEV_XID_ERRORS]] = 0.0
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
        hooked = [s for s in self.scenarios if _overrides(s, "adjust_gpu")]
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
        hooked = [s for s in self.scenarios if _overrides(s, "adjust_ib")]
        for p, (node, hca) in enumerate(self.ports) if hooked else ():
            counters = dict(zip(IB_COUNTERS, self.ib[p].tolist()))
            for scenario in hooked:
                scenario.adjust_ib(node=node, port=hca, t=self.now, counters=counters)
            self.ib[p] = [counters[name] for name in IB_COUNTERS]

    def _account(self, energy_inc: np.ndarray, ib_delta_bytes: np.ndarray) -> None:
        """Ground truth, attributed by the same rules as analysis/attribution.py."""
        assign = self._label_job
        xid = self.fields[:, _F[vocab.DCGM_FI_DEV_XID_ERRORS]]
        new_xid = (xid != 0) & (xid != self._prev_xid)
        self._prev_xid = xid.copy()
        busy = assign >= 0
        if not busy.any():
            return
        idx = assign[busy]
        n = self._acc.shape[0]
        # A port's bytes go to the jobs on its rail GPUs, shared equally (floor) between those GPUs.
        ports = self._port_of_gpu[busy]
        share = ib_delta_bytes[ports] // self._gpus_per_port[ports][:, None]
        for col, weights in enumerate(
            (
                energy_inc[busy],
                self.fields[busy, _F[vocab.DCGM_FI_DEV_GPU_UTIL]],
                None,
                new_xid[busy].astype(float),
                share[:, 0],
                share[:, 1],
            )
        ):
            self._acc[:, col] += np.bincount(idx, weights=weights, minlength=n)

    # -- training steps ------------------------------------------------------------------------------

    def _ring_allreduce_s(self, job: PlannedJob) -> float:
        p = job.gpus
        if p < 2:
            return 0.0
        # Across nodes the ring is limited by one NDR port per rail; inside a node by NVLink (one direction).
        bw = self.link_bytes_s if job.n_nodes > 1 else self._nvlink_bytes_s / 2
        return 2 * (p - 1) * RING_ALPHA_S + 2 * (p - 1) / p * job.kind.gradient_bytes / bw

    def ranks(self, job: PlannedJob) -> list[tuple[int, str, int]]:
        """(rank, node, gpu) in Slurm's order: node by node, GPU index order."""
        out: list[tuple[int, str, int]] = []
        for node, gpus in job.gpus_by_node.items():
            out.extend((len(out) + i, node, g) for i, g in enumerate(gpus))
        return [(i, node, g) for i, (_, node, g) in enumerate(out)]

    def step_phases(self, job: PlannedJob, step: int) -> tuple[list[tuple[int, str, int]], np.ndarray]:
        """Per-rank phase durations (seconds) of one step, columns in ``records.PHASES`` order.

        Each rank's compute jitters by 1 %; scenarios' ``adjust_step`` bend it. The AllReduce is a
        collective: it moves data only once the last rank arrives, so every other rank waits in it
        (as NCCL and the step anatomy of analysis/steps.py see it) for the slowest one::

            rank 0  |load|fwd|--bwd--|....barrier_wait....|allreduce|opt|
            rank 2  |load|fwd|------bwd x2-----------------|allreduce|opt|   <- the straggler sets the pace

        ``SPAN_ORDER`` is the order the phases run in.
        """
        ranks = self.ranks(job)
        rng = np.random.default_rng([self.seed, int(job.id), int(step)])
        jitter = 1.0 + PHASE_JITTER * rng.standard_normal((len(ranks), 4))
        base = np.array([SEED_PHASES_S[p] for p in ("load", "forward", "backward", "optimizer")])
        compute = base * jitter
        table = np.zeros((len(ranks), 6))
        table[:, [0, 1, 2, 4]] = compute
        table[:, 3] = self._ring_allreduce_s(job)
        hooked = [s for s in self.scenarios if _overrides(s, "adjust_step")]
        for r, node, g in ranks if hooked else ():
            phases = {
                "load": table[r, 0],
                "forward": table[r, 1],
                "backward": table[r, 2],
                "allreduce": table[r, 3],
                "optimizer": table[r, 4],
            }
            for scenario in hooked:
                scenario.adjust_step(rank=r, node=node, gpu=g, step=step, phases=phases)
            table[r, :5] = [phases[p] for p in ("load", "forward", "backward", "allreduce", "optimizer")]
        before_collective = table[:, :3].sum(axis=1)
        table[:, 5] = before_collective.max() - before_collective
        return ranks, table

    def _train_steps(self, dt: float) -> tuple[np.ndarray, np.ndarray]:
        """Per GPU: share of the step spent in compute (scales tensor activity) and IB bytes this tick."""
        share = np.ones(self.n_gpus)
        gpu_bytes = np.zeros(self.n_gpus)
        jobs = self.scheduler.jobs
        self._tick_steps = {}
        step_hooks = any(_overrides(s, "adjust_step") for s in self.scenarios)
        for j in np.unique(self._label_job[self._label_job >= 0]).tolist():
            job = jobs[j]
            # Single-node jobs are timed only when a scenario may bend their steps (they move no IB bytes).
            if not job.kind.distributed or job.gpus < 2 or (job.n_nodes < 2 and not step_hooks and j != 0):
                continue
            done = self._steps_done.setdefault(
                job.id, max(0.0, self.now - dt - job.start) / sum(SEED_PHASES_S.values())
            )
            step = int(done)
            ranks, table = self.step_phases(job, step)
            step_s = float(table.sum(axis=1).max())
            nominal = sum(SEED_PHASES_S[p] for p in ("forward", "backward")) / (
                sum(SEED_PHASES_S.values()) + table[:, 3].mean()
            )
            flat = [self._gpu_flat[(node, g)] for _, node, g in ranks]
            share[flat] = (table[:, 1] + table[:, 2]) / step_s / nominal
            active_s = self._stepping_s(job, dt)
            if active_s < dt:  # its ranks are dead, waiting in the queue, or restoring: no compute
                share[flat] = share[flat] * active_s / dt if dt > 0 else 0.0
            self._tick_steps[j] = 0.0
            if active_s <= 0:
                continue
            steps = active_s / step_s
            self._steps_done[job.id] = done + steps
            self._tick_steps[j] = steps
            if job.n_nodes > 1:
                p = job.gpus
                gpu_bytes[flat] = steps * 2 * (p - 1) / p * job.kind.gradient_bytes
            if j == 0 and int(done + steps) > int(done):
                self._last_step = (int(done + steps) - 1, self.now)
        return share, gpu_bytes

    def _stepping_s(self, job: PlannedJob, dt: float) -> float:
        """Seconds of the last tick in which ``job`` trained: none once a failure killed its ranks, none
        before a restarted job has started up and read back its checkpoint."""
        if job.id in self._halted:
            return 0.0
        resume = self._resume_at.get(job.id)
        if resume is None:
            return dt
        return float(np.clip(self.now - resume, 0.0, dt))

    # -- failures and restarts -----------------------------------------------------------------------

    def fail_job(self, job_id: str, *, cause: str, node: str, **attrs: Any) -> Event:
        """A failure kills ``job_id``'s ranks now: it stops stepping (a synchronous job cannot go on
        without one rank). Returns the ``failure`` event, with the step it had reached."""
        job = self.planned(job_id)
        self._halted.add(job.id)
        return Event(
            kind=EventKind.FAILURE,
            t=self.now,
            source="twin.failures",
            attrs={"job": job.id, "cause": cause, "node": node, "step": self.steps_done(job.id), **attrs},
        )

    def requeue_job(
        self, job_id: str, *, drain: str | None = None, down_s: float = 0.0, reason: str = ""
    ) -> list[Event]:
        """Slurm requeues the failed job (``Scheduler.requeue``) and, when ``drain`` is given, the health
        check drains that node for ``down_s`` (its reboot). The job restarts from its last checkpoint
        once its nodes are back (``_restarted``). Returns the ``job_end`` event of the lost attempt, whose
        state is the one ``sacct -D`` gives it: ``REQUEUED``."""
        job = self.planned(job_id)
        attempt_start, attempt_nodes = job.start, list(job.nodes)
        self._job_of_gpu[[self._gpu_flat[(node, g)] for node, gpus in job.gpus_by_node.items() for g in gpus]] = -1
        self.scheduler.requeue(job, self.now)
        if drain is not None:
            self.scheduler.drain(drain, until=self.now + down_s, reason=reason)
        self._halted.discard(job.id)
        if job is self.training_job:  # its ranks are gone: no step of it finished in this tick
            self._last_step = None
        return [
            Event(
                kind=EventKind.JOB_END,
                t=self.now,
                source="slurm",
                attrs={
                    "job": job.id,
                    "user": job.user,
                    "state": "REQUEUED",
                    "restart_cnt": job.restart_cnt,
                    "start": attempt_start,
                    "end": self.now,
                    "nodes": attempt_nodes,
                },
            )
        ]

    def _restarted(self, job: PlannedJob) -> list[Event]:
        """A requeued job runs again: start-up, then it reads its last checkpoint back and resumes from the
        step after it (the steps since then are done again)."""
        saved = self._saved.get(job.id)
        step = saved[0] if saved is not None else 0
        self._steps_done[job.id] = float(step)
        restore_s = job.kind.checkpoint_bytes_per_gpu / RESTORE_BYTES_S_PER_GPU
        t_restore = self.now + RESTART_STARTUP_S
        self._resume_at[job.id] = t_restore + restore_s
        return [
            Event(
                kind=EventKind.CHECKPOINT_RESTORE,
                t=t_restore,
                source="twin",
                attrs={
                    "job": job.id,
                    "step": step,
                    "duration_s": round(restore_s, 6),
                    "restart_cnt": job.restart_cnt,
                    "bytes": int(job.kind.checkpoint_bytes_per_gpu * job.gpus),
                    "path": saved[1] if saved is not None else "",
                },
            )
        ]

    def planned(self, job_id: str) -> PlannedJob:
        """The scheduler's job ``job_id`` (``ConfigError`` when the twin has none)."""
        for job in self.scheduler.jobs:
            if job.id == job_id:
                return job
        raise ConfigError(f"the twin has no job {job_id!r}")

    def _span_table(self, job: PlannedJob, step: int, end: float | None):
        ranks, table = self.step_phases(job, step)
        step_s = float(table.sum(axis=1).max())
        start = (end if end is not None else job.started_at + (step + 1) * sum(SEED_PHASES_S.values())) - step_s
        return job.id, step, ranks, table, start

    def finished_span_table(self):
        """(job id, step, ranks, phase table, step start) of the step that finished in the last tick, or None;
        the columnar form of ``finished_spans()`` (columns of the table in ``records.PHASES`` order)."""
        if self._last_step is None:
            return None
        step, end = self._last_step
        return self._span_table(self.training_job, step, end)

    def _spans_of(self, job: PlannedJob, step: int, *, end: float | None = None) -> list[Span]:
        job_id, step, ranks, table, start = self._span_table(job, step, end)
        starts = start + np.cumsum(table[:, _SPAN_COLUMNS], axis=1) - table[:, _SPAN_COLUMNS]
        spans = []
        for r, node, g in ranks:
            for k, phase in enumerate(SPAN_ORDER):
                spans.append(
                    Span(
                        job=job_id,
                        rank=r,
                        step=step,
                        phase=phase,
                        start=round(float(starts[r, k]), 6),
                        dur=float(table[r, _SPAN_COLUMNS[k]]),
                        attrs={"node": node, "gpu": g},
                    )
                )
        return spans

    def finished_spans(self) -> list[Span]:
        """Spans of the training job's step that finished in the last tick (one step per tick, like a
        profiler's schedule), or nothing."""
        if self._last_step is None:
            return []
        step, end = self._last_step
        return self._spans_of(self.training_job, step, end=end)

    def spans(self, step: int | None = None) -> list[Span]:
        """Spans (every rank, every phase) of one step of the training job; default: the last one finished."""
        job = self.training_job
        if step is None:
            if self._last_step is not None:
                return self.finished_spans()
            step = max(0, int(self._steps_done.get(job.id, 1.0)) - 1)
        return self._spans_of(job, step)

    # -- Lustre --------------------------------------------------------------------------------------

    def _lustre_rows(self, n: int) -> np.ndarray:
        """The cumulative job_stats array, grown to hold job index n - 1."""
        c = self._lustre
        if c.shape[0] < n:
            grown = np.zeros((max(n, 2 * c.shape[0]), c.shape[1], c.shape[2]))
            grown[: c.shape[0]] = c
            self._lustre = c = grown
            seen = np.full(grown.shape[0], np.nan)
            seen[: self._lustre_seen.shape[0]] = self._lustre_seen
            self._lustre_seen = seen
        return c

    def _lustre_backfill(self) -> None:
        """Jobs running before t0 have already loaded their data and written their checkpoints."""
        for j, job in enumerate(self.scheduler.jobs):
            if job.state != "RUNNING":
                continue
            elapsed = self.now - job.started_at
            kind = job.kind
            read = job.gpus * (kind.load_bytes_per_gpu + kind.read_bytes_s_per_gpu * max(0.0, elapsed - LOAD_PHASE_S))
            writes = int(elapsed // kind.checkpoint_interval_s) if kind.checkpoint_interval_s else 0
            self._lustre_add(
                np.array([j]),
                np.array([read]),
                np.array([writes * kind.checkpoint_bytes_per_gpu * job.gpus]),
                np.array([writes]),
            )

    def _lustre_add(self, idx: np.ndarray, read: np.ndarray, write: np.ndarray, syncs: np.ndarray) -> None:
        """Add bytes of jobs idx, striped over every OST (the first total mod osts OSTs get a byte more)."""
        c = self._lustre_rows(int(idx.max()) + 1 if len(idx) else 0)
        osts = c.shape[1]
        first = np.arange(osts)[None, :]
        for col, total in ((0, np.floor(read)), (2, np.floor(write))):
            q, r = np.divmod(total, osts)
            c[idx, :, col] += q[:, None] + (first < r[:, None])
            c[idx, :, col + 1] += np.ceil((q + (r > 0)) / LUSTRE_RPC_BYTES)[:, None]
        c[idx, :, 4] += syncs[:, None]
        active = (read > 0) | (write > 0) | (syncs > 0)
        self._lustre_seen[idx[active]] = self.now

    def _lustre_tick(self, dt: float) -> None:
        if dt <= 0:
            return
        t0, t1 = self.now - dt, self.now
        idx = np.unique(self._label_job[self._label_job >= 0])
        if not len(idx):
            return
        jobs = [self.scheduler.jobs[j] for j in idx.tolist()]
        start = np.array([j.start for j in jobs])
        gpus = np.array([j.gpus for j in jobs], dtype=float)
        rate = np.array([j.kind.read_bytes_s_per_gpu for j in jobs])
        load = np.array([j.kind.load_bytes_per_gpu for j in jobs])
        every = np.array([j.kind.checkpoint_interval_s or np.inf for j in jobs])
        ckpt = np.array([j.kind.checkpoint_bytes_per_gpu for j in jobs])
        loading = np.clip(np.minimum(t1, start + LOAD_PHASE_S) - np.maximum(t0, start), 0.0, None)
        # A timed job's loader reads a batch per step, so its reads follow its step rate (and stop with it);
        # the others read at their kind's steady rate.
        steady_s = np.array([self._tick_steps[j] * SEED_STEP_S if j in self._tick_steps else dt for j in idx.tolist()])
        read = gpus * (rate * np.maximum(steady_s - loading, 0.0) + load * loading / LOAD_PHASE_S)
        read += gpus * np.array([self._restore_read(j, t0, t1) for j in jobs])
        stepping = np.array([j not in self._tick_steps or self._tick_steps[j] > 0 for j in idx.tolist()])
        due = (np.floor((t1 - start) / every) > np.floor((t0 - start) / every)) & stepping
        write = np.where(due, ckpt * gpus, 0.0)
        for k in np.flatnonzero(due).tolist():
            self._events.append(self._checkpoint_event(jobs[k], t1, int(self._steps_done.get(jobs[k].id, 0))))
        self._lustre_add(idx, read, write, due.astype(float))

    def _restore_read(self, job: PlannedJob, t0: float, t1: float) -> float:
        """Bytes per GPU a restarted job read back from its checkpoint in (t0, t1]."""
        resume = self._resume_at.get(job.id)
        if resume is None:
            return 0.0
        restore_s = job.kind.checkpoint_bytes_per_gpu / RESTORE_BYTES_S_PER_GPU
        overlap = max(0.0, min(t1, resume) - max(t0, resume - restore_s))
        return job.kind.checkpoint_bytes_per_gpu * overlap / restore_s if restore_s > 0 else 0.0

    def _checkpoint_event(self, job: PlannedJob, t: float, step: int) -> Event:
        """A job saved step ``step`` at ``t``: the write seen on Lustre, with how long training stopped."""
        per_gpu = job.kind.checkpoint_bytes_per_gpu
        path = f"{self.cluster.weights.path}/{job.id}/step_{step}.pt"
        self._saved[job.id] = (step, path)
        return Event(
            kind=EventKind.CHECKPOINT,
            t=t,
            source="twin",
            attrs={
                "job": job.id,
                "bytes": int(per_gpu * job.gpus),
                "step": step,
                "duration_s": round(per_gpu / CHECKPOINT_STAGING_BYTES_S, 6),
                "path": path,
            },
        )

    def _checkpoints_before_t0(self) -> list[Event]:
        """The training job's last checkpoint before t0 (``_lustre_backfill`` wrote its bytes), so that a
        failure early in the run loses only the steps since then; its step is counted as the first tick
        counts the steps done before t0."""
        job = self.training_job
        every = job.kind.checkpoint_interval_s
        if job.state != "RUNNING" or job.start is None or not every or not job.kind.distributed:
            return []
        saves = int((self.t0 - job.start) // every)
        if saves < 1:
            return []
        t = job.start + saves * every
        return [self._checkpoint_event(job, t, int((t - job.start) / sum(SEED_PHASES_S.values())))]

    def lustre_counters(self) -> dict[str, np.ndarray]:
        """Cumulative obdfilter job_stats per job still listed: rows = OSTs, columns =
        read_sum, read_rpcs, write_sum, write_rpcs, syncs (bytes and counts)."""
        seen = self._lustre_seen
        listed = np.flatnonzero(~np.isnan(seen) & (self.now - np.nan_to_num(seen) <= LUSTRE_CLEANUP_S))
        jobs = self.scheduler.jobs
        return {jobs[j].id: self._lustre[j] for j in listed.tolist()}

    # -- ground truth --------------------------------------------------------------------------------

    def truth(self) -> dict[str, JobTruth]:
        """Per job, what the twin did since t0 (energy, IB bytes, XID errors...) plus cumulative Lustre bytes."""
        out = {}
        for j, job in enumerate(self.scheduler.jobs):
            if job.start is None:
                continue
            energy, util, n, xid, tx, rx = (self._acc[j] if j < self._acc.shape[0] else np.zeros(6)).tolist()
            lustre = self._lustre[j] if j < self._lustre.shape[0] else np.zeros((1, 5))
            out[job.id] = JobTruth(
                id=job.id,
                energy_mj=int(energy),
                ib_tx_bytes=int(tx),
                ib_rx_bytes=int(rx),
                xid_errors=int(xid),
                util_sum=util,
                util_samples=int(n),
                lustre_read_bytes=int(lustre[:, 0].sum()),
                lustre_write_bytes=int(lustre[:, 2].sum()),
            )
        return out

    def gpu_hours(self, job_id: str) -> float:
        """GPUs x (end or now - start), as Slurm accounts it (jobstats' GPU-hours)."""
        job = next(j for j in self.scheduler.jobs if j.id == job_id)
        if job.start is None:
            return 0.0
        return job.gpus * ((job.end if job.end is not None else self.now) - job.start) / 3600.0

    # -- the real formats -----------------------------------------------------------------------------

    def labels_by_gpu(self, node: str, *, jobs_by_gpu: Mapping[int | str, str] | None = None) -> list[dict[str, str]]:
        """dcgm-exporter label sets of a node's GPUs, with ``hpc_job`` where a job holds the GPU."""
        out = []
        for g in range(len(self.gpus_of_node(node))):
            labels = dict(self.gpu_labels[self._gpu_flat[(node, g)]])
            job = jobs_by_gpu.get(g) if jobs_by_gpu is not None else self.job_of(node, g)
            if job:
                labels["hpc_job"] = job
            out.append(labels)
        return out

    def dcgm_text(
        self, node: str, *, jobs_by_gpu: Mapping[int | str, str] | None = None, timestamp: bool = False
    ) -> str:
        """One dcgm-exporter scrape of a node (``timestamp``: add the sample time in ms to each line)."""
        from hpcwatch.twin import exposition

        return exposition.dcgm_text(self, node, jobs_by_gpu=jobs_by_gpu, timestamp=timestamp)

    def node_exporter_text(self, node: str, *, timestamp: bool = False, target_labels: bool = False) -> str:
        """node-exporter's InfiniBand collector output for a node (``target_labels``: add instance/node)."""
        from hpcwatch.twin import exposition

        return exposition.node_exporter_text(self, node, timestamp=timestamp, target_labels=target_labels)

    def perfquery_text(self, node: str, port: int) -> str:
        """``perfquery -x`` of one HCA (``port`` = the HCA's index on the node, mlx5_<port> port 1)."""
        from hpcwatch.twin import exposition

        return exposition.perfquery_text(self, node, port)

    def lustre_job_stats_text(self) -> str:
        """``lctl get_param obdfilter.*.job_stats`` on the OSS, all OSTs."""
        from hpcwatch.twin import exposition

        return exposition.lustre_job_stats_text(self)

    def squeue_json(self) -> str:
        from hpcwatch.twin import slurm_out

        return slurm_out.squeue_json(self)

    def sacct_json(self) -> str:
        from hpcwatch.twin import slurm_out

        return slurm_out.sacct_json(self)

    # -- records ---------------------------------------------------------------------------------------

    def events(self) -> list[Event]:
        """Events of the last tick (job start/end, checkpoints, what scenarios planted)."""
        return list(self._events)

    def samples(self) -> Iterator[Sample]:
        """The current state as samples, labelled as the real collectors label them."""
        absent = self.absent.tolist()
        for g, labels in enumerate(self.labels_of_all()):
            if absent[g]:
                continue
            row = self.fields[g].tolist()
            for name, value in zip(DCGM_FIELDS, row):
                yield Sample(metric=name, labels=labels, t=self.now, value=value)
        from hpcwatch.twin.exposition import ib_samples, lustre_samples

        yield from ib_samples(self)
        yield from lustre_samples(self)

    def labels_of_all(self) -> list[dict[str, str]]:
        out = []
        jobs = self.scheduler.jobs
        for g, j in enumerate(self._label_job.tolist()):
            labels = self.gpu_labels[g]
            out.append({**labels, "hpc_job": jobs[j].id} if j >= 0 else labels)
        return out

    def sample_table(self) -> pa.Table:
        """``samples()`` as one table with the store's columns (``hpcwatch.store.SAMPLE_SCHEMA``): the fast
        way to put a tick of a large cluster into a Store (``Store.add_sample_table``)."""
        from hpcwatch.schemas import SAMPLE_SCHEMA, sample_keys
        from hpcwatch.twin.exposition import ib_samples, lustre_samples

        n, m = self.n_gpus, len(DCGM_FIELDS)
        labels = self.labels_of_all()
        fields = self.fields
        if self.absent.any():  # GPUs dcgm-exporter lost write no rows
            present = ~self.absent
            labels = [lab for lab, keep in zip(labels, present.tolist()) if keep]
            fields, n = fields[present], int(present.sum())
        label_json = [orjson.dumps(lab).decode() for lab in labels]
        hosts = [lab["Hostname"] for lab in labels]
        jobs = [lab.get("hpc_job") for lab in labels]
        gpus = [lab["gpu"] for lab in labels]
        cols = {
            "metric": np.repeat(np.array(DCGM_FIELDS, dtype=object)[None, :], n, axis=0).ravel().tolist(),
            "t": [self.now] * (n * m),
            "value": fields.ravel().tolist(),
            "host": [h for h in hosts for _ in range(m)],
            "gpu": [g for g in gpus for _ in range(m)],
            "job": [j for j in jobs for _ in range(m)],
            "labels": [lab for lab in label_json for _ in range(m)],
        }
        for sample in [*ib_samples(self), *lustre_samples(self)]:
            host, gpu, job = sample_keys(sample.labels, sample.metric)
            for key, value in (
                ("metric", sample.metric),
                ("t", sample.t),
                ("value", sample.value),
                ("host", host),
                ("gpu", gpu),
                ("job", job),
                ("labels", orjson.dumps(dict(sample.labels)).decode()),
            ):
                cols[key].append(value)
        return pa.table(cols, schema=SAMPLE_SCHEMA)

    def records(self) -> Iterator[Sample | Event | Span | Job]:
        """The current tick as records: samples, every job, spans of the step that finished, events."""
        yield from self.samples()
        yield from self.jobs
        yield from self.finished_spans()
        yield from self._events

    def describe(self) -> dict[str, Any]:
        return {
            "nodes": len(self.node_names),
            "gpus": self.n_gpus,
            "ports": len(self.ports),
            "now": self.now,
            "seed": self.seed,
            "scenarios": [s.name for s in self.scenarios],
        }
