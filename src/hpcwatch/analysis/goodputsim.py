"""Failures at scale: a synchronous training job that dies when any of its parts does, simulated.

(The twin scenarios that make one node sick — XID 79, a flapping IB link, a stalled
collective — are in ``twin/failures.py``.)

Why: a 16k-GPU job is only as reliable as the product of its parts. One faulty
GPU stops every rank, the job restarts from its last checkpoint, and the steps
since then are lost. How much that costs depends on the failure rate, the
checkpoint cost C, the restart cost R and the checkpoint interval T.

The failure rates are calibrated on the only public record of this size, Meta's
Llama 3 405B pre-training: 16,384 H100 GPUs, 54 days, 419 unexpected interruptions
(about one every 3 hours), root causes in Table 5 of "The Llama 3 Herd of Models",
§3.3.4, https://arxiv.org/abs/2407.21783 (table reproduced at
https://glennklockwood.com/garden/component-reliability). Each cause's rate is its
count divided by the GPU-seconds of that run, so the job's rate grows linearly
with its GPU count; at 16,384 GPUs × 54 days the expected count is exactly 419.

The simulation is vectorised over incarnations (the stretches between two
failures): failure times are a Poisson process on the wall clock, and each
incarnation is start-up (or recovery + restore), then cycles of T of training
and C of checkpoint save, cut by the next failure::

    |--init--|===T===|C|===T===|C|==X  ..R..|rst|===T===|C|===T=...
                                 ^lost    recovery

The checkpoint interval is given in seconds or chosen by Young's rule
T = sqrt(2·C·M) (J. W. Young, "A first order approximation to the optimum
checkpoint interval", CACM 17(9), 1974, https://doi.org/10.1145/361147.361115) or
Daly's higher-order estimate (J. T. Daly, "A higher order estimate of the optimum
checkpoint interval for restart dumps", FGCS 22(3), 2006,
https://doi.org/10.1016/j.future.2004.11.016), with M the job's mean time between
failures. T is rounded to whole steps.

``GoodputRun.records()`` writes the run as the records a real cluster gives
(a ``Job``, one rank's ``Span``s per step, ``checkpoint_save`` /
``checkpoint_restore`` / ``failure`` ``Event``s) so that
``hpcwatch.analysis.goodput.account_goodput`` measures it through the same code
path as real data, and ``GoodputRun.step_table()`` gives the compact form.

Observable convention (shared with the accounting): time in an incarnation that
failed before finishing its first step counts as recovery (or init), because no
record shows that training had begun.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from hpcwatch.analysis.goodput import BADPUT_KINDS, StepTable
from hpcwatch.errors import ConfigError
from hpcwatch.records import Event, Job, Span
from hpcwatch.vocab import EventKind

__all__ = [
    "LLAMA3_INTERRUPTIONS",
    "LLAMA3_GPUS",
    "LLAMA3_DAYS",
    "LLAMA3_SOURCE",
    "FailureModel",
    "GoodputSimConfig",
    "GoodputRun",
    "simulate_goodput",
    "goodput_sweep",
    "young_interval_s",
    "daly_interval_s",
    "DEFAULT_SWEEP_GPUS",
]

LLAMA3_SOURCE = "https://arxiv.org/abs/2407.21783"
LLAMA3_GPUS = 16_384
LLAMA3_DAYS = 54.0

#: Unexpected interruptions by root cause during the 54-day Llama 3 405B pre-training
#: (Table 5 of "The Llama 3 Herd of Models", §3.3.4; they sum to 419). We use the counts: the
#: table prints 30.1 % for "faulty GPU" although 148/419 is 35.3 % (every other row's
#: percentage matches its count, e.g. HBM3 72/419 = 17.2 %).
LLAMA3_INTERRUPTIONS: dict[str, int] = {
    "faulty_gpu": 148,
    "gpu_hbm3_memory": 72,
    "software_bug": 54,
    "network_switch_cable": 35,
    "host_maintenance": 32,
    "gpu_sram_memory": 19,
    "gpu_system_processor": 17,
    "nic": 7,
    "nccl_watchdog_timeout": 7,
    "silent_data_corruption": 6,
    "gpu_thermal_interface_sensor": 6,
    "ssd": 3,
    "power_supply": 3,
    "server_chassis": 2,
    "io_expansion_board": 2,
    "dependency": 2,
    "cpu": 2,
    "system_memory": 2,
}

GPUS_PER_NODE = 8
"""Grand Teton servers hold 8 GPUs (Llama 3 paper, §3.3.1); used to name the failed node."""

# Defaults chosen so that the Llama 3 job lands above Meta's reported > 90 % effective training
# time: a 20 s checkpoint save (Meta reports cutting checkpoint time; 4 GB per GPU into a 2-7 TB/s
# store), 3 min to detect, requeue and restart, 1 min to restore, 5 min of first start-up.
DEFAULT_CHECKPOINT_COST_S = 20.0
DEFAULT_RESTART_COST_S = 180.0
DEFAULT_RESTORE_COST_S = 60.0
DEFAULT_INIT_S = 300.0
DEFAULT_STEP_S = 10.0
DEFAULT_LOAD_FRACTION = 0.005
"""Share of each step spent waiting for data (a well-fed job: 0.5 %)."""
DEFAULT_SWEEP_GPUS: tuple[int, ...] = (1024, 2048, 4096, 8192, 16_384, 32_768, 65_536, 100_000)

#: Fractions of a step's compute (after its data load) per phase, for the spans we write.
_PHASE_SHARES = (("forward", 0.30), ("backward", 0.50), ("allreduce", 0.15), ("optimizer", 0.05))


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureModel:
    """Failure rate of each cause, per GPU-second."""

    rates_per_gpu_s: dict[str, float]
    source: str = LLAMA3_SOURCE

    @staticmethod
    def llama3() -> FailureModel:
        exposure_gpu_s = LLAMA3_GPUS * LLAMA3_DAYS * 86_400.0
        return FailureModel(rates_per_gpu_s={c: n / exposure_gpu_s for c, n in LLAMA3_INTERRUPTIONS.items()})

    def job_rate_per_s(self, gpus: int) -> float:
        return gpus * sum(self.rates_per_gpu_s.values())

    def mtbf_s(self, gpus: int) -> float:
        return 1.0 / self.job_rate_per_s(gpus)


def young_interval_s(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Young (1974): T = sqrt(2·C·M)."""
    return math.sqrt(2.0 * checkpoint_cost_s * mtbf_s)


def daly_interval_s(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Daly (2006), eq. 37: sqrt(2CM)·[1 + sqrt(C/2M)/3 + (C/2M)/9] − C for C < 2M, else M."""
    c, m = checkpoint_cost_s, mtbf_s
    if c >= 2.0 * m:
        return m
    x = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c


Interval = float | Literal["young", "daly"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GoodputSimConfig:
    """One synchronous job under failures."""

    gpus: int = LLAMA3_GPUS
    """GPUs of the job; any one failing stops all."""
    days: float = LLAMA3_DAYS
    """Wall-clock length of the run."""
    checkpoint_cost_s: float = DEFAULT_CHECKPOINT_COST_S
    """C: time a synchronous checkpoint save stops training."""
    restart_cost_s: float = DEFAULT_RESTART_COST_S
    """R: from a failure to the job running again (detection, requeue, start-up)."""
    restore_cost_s: float = DEFAULT_RESTORE_COST_S
    """Time to load the last checkpoint after a restart."""
    init_s: float = DEFAULT_INIT_S
    """First start-up, before the first step."""
    interval: Interval = "young"
    """Checkpoint interval in seconds of training, or ``young`` / ``daly``."""
    step_s: float = DEFAULT_STEP_S
    """Duration of one training step."""
    load_fraction: float = DEFAULT_LOAD_FRACTION
    """Share of each step blocked on data loading."""
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("gpus", "days", "step_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("checkpoint_cost_s", "restart_cost_s", "restore_cost_s", "init_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.load_fraction < 1.0:
            raise ConfigError(f"load_fraction must be in [0, 1), got {self.load_fraction}")
        if isinstance(self.interval, str):
            if self.interval not in ("young", "daly"):
                raise ConfigError(f"interval must be seconds, 'young' or 'daly', got {self.interval!r}")
        elif self.interval <= 0:
            raise ConfigError(f"interval must be > 0 s, got {self.interval}")


@dataclass(frozen=True, slots=True, kw_only=True)
class GoodputRun:
    """A simulated run: ground-truth accounting plus the per-incarnation timeline to write records from.

    Incarnation arrays (length ``interruptions + 1``): ``inc_start_s`` (offset from the run start),
    ``inc_end_s``, ``inc_overhead_s`` (init, or recovery + restore, before the first step),
    ``inc_steps`` (completed steps), ``inc_saves`` (saves begun), ``inc_first_step`` (step number).
    """

    config: GoodputSimConfig
    checkpoint_interval_s: float
    steps_per_checkpoint: int
    mtbf_s: float
    wall_s: float
    productive_s: float
    badput_s: dict[str, float]
    failure_t_s: np.ndarray
    failure_cause: tuple[str, ...]
    failure_gpu: np.ndarray
    inc_start_s: np.ndarray
    inc_end_s: np.ndarray
    inc_overhead_s: np.ndarray
    inc_steps: np.ndarray
    inc_saves: np.ndarray
    inc_first_step: np.ndarray
    t_origin: float = 0.0

    @property
    def interruptions(self) -> int:
        return int(self.failure_t_s.size)

    @property
    def goodput(self) -> float:
        return self.productive_s / self.wall_s

    @property
    def effective_time(self) -> float:
        """Share of wall time spent in steps that count (their data loading included)."""
        return (self.productive_s + self.badput_s["data_loading"]) / self.wall_s

    def interruptions_by_cause(self) -> dict[str, int]:
        counts = dict.fromkeys(LLAMA3_INTERRUPTIONS, 0)
        for cause in self.failure_cause:
            counts[cause] = counts.get(cause, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.config.gpus,
            "days": self.config.days,
            "interruptions": self.interruptions,
            "interruptions_by_cause": self.interruptions_by_cause(),
            "mtbf_s": self.mtbf_s,
            "effective_time": self.effective_time,
            "goodput": self.goodput,
            "badput": {k: v / self.wall_s for k, v in self.badput_s.items()},
            "badput_s": dict(self.badput_s),
            "checkpoint_interval": self.checkpoint_interval_s,
            "checkpoint_cost_s": self.config.checkpoint_cost_s,
            "restart_cost_s": self.config.restart_cost_s,
            "restore_cost_s": self.config.restore_cost_s,
            "step_s": self.config.step_s,
            "seed": self.config.seed,
        }

    # -- the run as records ------------------------------------------------------------------

    def step_table(self) -> StepTable:
        """Every executed step (re-runs included), in UTC seconds from ``t_origin``."""
        parts = [self._inc_steps(k) for k in range(len(self.inc_start_s))]
        if not parts:
            return StepTable.empty()
        step = np.concatenate([p[0] for p in parts])
        start = np.concatenate([p[1] for p in parts])
        dur = np.full(step.size, self.config.step_s)
        return StepTable(step=step, start_s=start, dur_s=dur, load_s=dur * self.config.load_fraction)

    def _inc_steps(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        n, m = int(self.inc_steps[k]), self.steps_per_checkpoint
        j = np.arange(n)
        first = self.t_origin + self.inc_start_s[k] + self.inc_overhead_s[k]
        start = first + j * self.config.step_s + (j // m) * self.config.checkpoint_cost_s
        return self.inc_first_step[k] + j, start

    def events(self, job_id: str = "goodput-sim") -> Iterator[Event]:
        """Checkpoint saves and restores, then failures, as the training script and the scheduler would log them."""
        c = self.config
        for k in range(len(self.inc_start_s)):
            m = self.steps_per_checkpoint
            first = self.t_origin + self.inc_start_s[k] + self.inc_overhead_s[k]
            if k > 0 and self.inc_end_s[k] - self.inc_start_s[k] > c.restart_cost_s:
                yield Event(
                    kind=EventKind.CHECKPOINT_RESTORE,
                    t=self.t_origin + self.inc_start_s[k] + c.restart_cost_s,
                    source="twin.failures",
                    attrs={"job": job_id, "duration_s": c.restore_cost_s, "step": int(self.inc_first_step[k] - 1)},
                )
            for i in range(int(self.inc_saves[k])):
                t = first + (i + 1) * m * c.step_s + i * c.checkpoint_cost_s
                yield Event(
                    kind=EventKind.CHECKPOINT_SAVE,
                    t=t,
                    source="twin.failures",
                    attrs={
                        "job": job_id,
                        "duration_s": c.checkpoint_cost_s,
                        "step": int(self.inc_first_step[k] + (i + 1) * m - 1),
                    },
                )
        for i, t in enumerate(self.failure_t_s):
            gpu = int(self.failure_gpu[i])
            k = i  # failure i ends incarnation i
            yield Event(
                kind=EventKind.FAILURE,
                t=self.t_origin + float(t),
                source="twin.failures",
                attrs={
                    "job": job_id,
                    "cause": self.failure_cause[i],
                    "step": int(self.inc_first_step[k] + self.inc_steps[k]),
                    "node": f"node{gpu // GPUS_PER_NODE + 1:05d}",
                    "gpu": gpu % GPUS_PER_NODE,
                },
            )

    def job(self, job_id: str = "goodput-sim") -> Job:
        return Job(
            id=job_id,
            user="sim",
            account="twin",
            partition="gpu",
            gpus=self.config.gpus,
            start=self.t_origin,
            end=self.t_origin + self.wall_s,
            state="COMPLETED",
            name="llama3-like",
        )

    def records(self, job_id: str = "goodput-sim") -> Iterator[Job | Span | Event]:
        """The run as records: the job, rank 0's phase spans for every executed step, the events."""
        yield self.job(job_id)
        table = self.step_table()
        load = self.config.step_s * self.config.load_fraction
        compute = self.config.step_s - load
        for step, start in zip(table.step.tolist(), table.start_s.tolist()):
            yield Span(job=job_id, rank=0, step=step, phase="load", start=start, dur=load)
            t = start + load
            for phase, share in _PHASE_SHARES:
                yield Span(job=job_id, rank=0, step=step, phase=phase, start=t, dur=compute * share)
                t += compute * share
        yield from self.events(job_id)


def _interval_s(config: GoodputSimConfig, mtbf_s: float) -> float:
    if config.interval == "young":
        return young_interval_s(config.checkpoint_cost_s, mtbf_s)
    if config.interval == "daly":
        return daly_interval_s(config.checkpoint_cost_s, mtbf_s)
    return float(config.interval)


def _draw_failures(
    config: GoodputSimConfig, model: FailureModel, rng: np.random.Generator, wall_s: float
) -> tuple[np.ndarray, tuple[str, ...], np.ndarray]:
    causes = list(model.rates_per_gpu_s)
    rates = np.array([model.rates_per_gpu_s[c] for c in causes]) * config.gpus
    counts = rng.poisson(rates * wall_s)
    cause_idx = np.repeat(np.arange(len(causes)), counts)
    times = rng.uniform(0.0, wall_s, size=cause_idx.size)
    order = np.argsort(times)
    gpu = rng.integers(0, config.gpus, size=cause_idx.size)
    return times[order], tuple(causes[i] for i in cause_idx[order]), gpu[order]


def simulate_goodput(
    config: GoodputSimConfig = GoodputSimConfig(), *, model: FailureModel | None = None, t_origin: float = 0.0
) -> GoodputRun:
    """Simulate one run; all the time accounting is vectorised over incarnations."""
    model = model or FailureModel.llama3()
    rng = np.random.default_rng(config.seed)
    wall_s = config.days * 86_400.0
    mtbf_s = model.mtbf_s(config.gpus)
    steps_per_ckpt = max(1, round(_interval_s(config, mtbf_s) / config.step_s))
    fail_t, fail_cause, fail_gpu = _draw_failures(config, model, rng, wall_s)
    starts = np.concatenate([[0.0], fail_t])
    ends = np.concatenate([fail_t, [wall_s]])
    inc = _incarnations(config, ends - starts, steps_per_ckpt)
    badput = {kind: float(inc[kind].sum()) for kind in BADPUT_KINDS if kind not in ("init", "recovery")}
    badput["init"] = float(inc["startup"][0])
    badput["recovery"] = float(inc["startup"][1:].sum())
    badput = {kind: badput[kind] for kind in BADPUT_KINDS}
    first = np.arange(starts.size) == 0
    return GoodputRun(
        config=config,
        checkpoint_interval_s=steps_per_ckpt * config.step_s,
        steps_per_checkpoint=steps_per_ckpt,
        mtbf_s=mtbf_s,
        wall_s=wall_s,
        productive_s=float(inc["productive"].sum()),
        badput_s=badput,
        failure_t_s=fail_t,
        failure_cause=fail_cause,
        failure_gpu=fail_gpu,
        inc_start_s=starts,
        inc_end_s=ends,
        inc_overhead_s=np.where(first, config.init_s, config.restart_cost_s + config.restore_cost_s),
        inc_steps=inc["n_steps"],
        inc_saves=inc["n_saves"],
        inc_first_step=_first_steps(inc["full_cycles"], steps_per_ckpt),
        t_origin=t_origin,
    )


def _incarnations(config: GoodputSimConfig, g: np.ndarray, steps_per_ckpt: int) -> dict[str, np.ndarray]:
    """Per incarnation of length ``g`` (all but the last end in a failure): where its time went."""
    c = config
    tau = steps_per_ckpt * c.step_s
    failed = np.arange(g.size) < g.size - 1
    first = np.arange(g.size) == 0
    startup = np.minimum(g, np.where(first, c.init_s, c.restart_cost_s))
    restore = np.where(first, 0.0, np.clip(g - c.restart_cost_s, 0.0, c.restore_cost_s))
    w = np.maximum(g - np.where(first, c.init_s, c.restart_cost_s + c.restore_cost_s), 0.0)
    full_cycles = np.floor(w / (tau + c.checkpoint_cost_s))
    r = w - full_cycles * (tau + c.checkpoint_cost_s)
    in_save = r > tau
    train_tail = np.minimum(r, tau)
    tail_steps = np.floor(train_tail / c.step_s + 1e-9)
    n_steps = (full_cycles * steps_per_ckpt + tail_steps).astype(np.int64)
    n_saves = (full_cycles + in_save).astype(np.int64)
    # No finished step and no save: nothing shows training began, so it is start-up time.
    unseen = (n_steps == 0) & (n_saves == 0)
    kept_steps_s = np.where(failed, full_cycles * tau, full_cycles * tau + tail_steps * c.step_s)
    return {
        "startup": startup + np.where(unseen, w, 0.0),
        "checkpoint_restore": restore,
        "checkpoint_save": full_cycles * c.checkpoint_cost_s + np.where(in_save, r - tau, 0.0),
        "lost_progress": np.where(failed & ~unseen, train_tail, 0.0),
        "data_loading": kept_steps_s * c.load_fraction,
        "other": np.where(~failed & ~unseen, train_tail - tail_steps * c.step_s, 0.0),
        "productive": kept_steps_s * (1.0 - c.load_fraction),
        "n_steps": n_steps,
        "n_saves": n_saves,
        "full_cycles": full_cycles,
    }


def _first_steps(full_cycles: np.ndarray, steps_per_ckpt: int) -> np.ndarray:
    """Step number each incarnation starts at: one past the last completed checkpoint.

    Only the full cycles of an incarnation end with a completed save, so the kept
    step grows by ``full_cycles * steps_per_ckpt`` per incarnation.
    """
    kept = np.cumsum(full_cycles.astype(np.int64) * steps_per_ckpt)
    return 1 + np.concatenate([[0], kept[:-1]]).astype(np.int64)


def goodput_sweep(
    gpus: Sequence[int] = DEFAULT_SWEEP_GPUS,
    *,
    base: GoodputSimConfig = GoodputSimConfig(),
    model: FailureModel | None = None,
) -> list[GoodputRun]:
    """The same job at several sizes (same C, R, interval policy, seed): how goodput falls with scale."""
    return [simulate_goodput(replace(base, gpus=int(n)), model=model) for n in gpus]
