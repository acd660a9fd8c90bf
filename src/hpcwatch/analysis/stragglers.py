"""Stragglers: the rank the others wait for, with a score, its place and its slow phase.

In a synchronous data-parallel job every step waits for the slowest rank at the
gradient all-reduce, so one slow GPU slows all of them. Its signature in the step
anatomy: it does the *most* own work (load + forward + backward + optimizer) and
waits the *least* in the collective, while every other rank waits about the
difference::

    rank 0  ─work─┤wait·······│xfer│
    rank 2  ─work──────────────┤xfer│   ← most work, no wait: the straggler

Scores follow NVIDIA's resiliency extension (nvidia-resiliency-ext, straggler
detection, https://nvidia.github.io/nvidia-resiliency-ext/straggler_det/usage_guide.html):
a performance score in [0, 1] is reference time / this rank's time;

- relative score: the reference is the best rank of the job (0.5 = twice as slow
  as the fastest rank);
- individual score: the reference is the rank's own best step (0.5 = twice as
  slow as it once was).

Detection is robust to a few bad ranks and steps: per step, a rank's work time is
compared with the median of the ranks using the modified z-score
0.6745·(x − median)/MAD (Iglewicz & Hoaglin, "How to Detect and Handle Outliers",
1993; https://www.itl.nist.gov/div898/handbook/eda/section3/eda35h.htm), flagged above
3.5 and at least ``min_excess`` (relative) above the median; a rank is a straggler when
it is flagged in at least ``min_step_fraction`` of the steps.

On kernel-level GPU traces the host's timeline is the wrong clock: launches are
asynchronous, so a rank whose GPU is slow can look exactly like the others on the host
(and with gloo its own collective even looks long). There, two GPU-side pieces of
evidence come first, each named in the verdict's ``evidence``:

- ``gpu_compute``: the rank's GPU compute time (union of its compute kernels) per step,
  scored the same way (modified z over ranks, NVRx relative and individual scores),
  with an excess of at least ``min_gpu_excess`` of the step;
- ``late_arrival``: at the k-th collective of a step the rank's NCCL kernel starts last
  (HTA's "potential stragglers"), in at least ``min_last_fraction`` of the collectives,
  late by at least ``min_gpu_excess`` of the step over the median rank;
- ``host``: the host-side rule above, the only evidence on CPU-only traces; on GPU
  traces a verdict with only this evidence is labelled host-side only.

Whatever the evidence, a rank is only named when the set can carry a verdict, and the report
says why when it cannot (``StragglerReport.no_verdict``):

- at least ``min_ranks`` ranks seen (a median and a MAD over 2 or 3 ranks are those ranks: over
  two, every modified z is ±0.67) and ``min_steps`` steps ("flagged in half the steps" of two
  steps is one step);
- a robust z above ``z_threshold`` on the evidence: the work or GPU compute z of each flagged
  step, and for a late arrival the z of its lateness over the ranks;
- an impact of at least ``min_impact`` of the step: its extra time per step (work, GPU compute or
  lateness, the largest of those that named it) over the median step time.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import msgspec
import numpy as np

from hpcwatch.analysis.steps import WORK_PHASES, Anatomy, step_times_s
from hpcwatch.errors import ConfigError
from hpcwatch.records import PHASES

__all__ = [
    "StragglerConfig",
    "RankScore",
    "Straggler",
    "SlowStep",
    "StragglerReport",
    "find_stragglers",
    "modified_z",
    "DEFAULT_Z_THRESHOLD",
    "EVIDENCE_GPU_COMPUTE",
    "EVIDENCE_LATE_ARRIVAL",
    "EVIDENCE_HOST",
]

#: Iglewicz & Hoaglin's cut-off for the modified z-score (NIST handbook, section 1.3.5.17).
DEFAULT_Z_THRESHOLD = 3.5
#: 0.6745 = Φ⁻¹(0.75): makes the MAD estimate σ for normal data (same source).
_MAD_TO_SIGMA = 0.6745


class StragglerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """How sure detection must be before it names a rank."""

    z_threshold: float = DEFAULT_Z_THRESHOLD
    """Modified z-score above which a rank's step is an outlier."""
    min_excess: float = 0.10
    """...and its work must exceed the step's median by at least this fraction (noise on tiny steps)."""
    min_step_fraction: float = 0.5
    """Fraction of the steps a rank must be an outlier in to be called a straggler."""
    mad_floor: float = 0.01
    """MAD never taken below this fraction of the median (identical ranks give MAD 0)."""
    min_gpu_excess: float = 0.03
    """GPU evidence: extra GPU compute (or lateness) per step, as a fraction of the step time. Ours: 3× the
    ~1 % step-to-step jitter of a GPU's kernels, under the ≈ 8 % GPU-only slowdown the detector must name."""
    min_last_fraction: float = 0.5
    """Late arrival: fraction of the collectives the rank must reach last (ours: most of them)."""
    min_ranks: int = 4
    """Ranks a verdict needs. Ours: with 4, the median and MAD of a step come from at least 3 other ranks;
    HTA's 2 of a 128-rank job named a rank at z = 0.25 with 0.35 % of the step as its excess."""
    min_steps: int = 3
    """Steps a verdict needs (ours: with 2, a rank flagged in one step is flagged in half of them)."""
    min_impact: float = 0.03
    """The straggler's extra time per step, as a fraction of the median step time, a verdict needs. Ours:
    the GPU evidence's 3 % (``min_gpu_excess``): under it the job would gain less than its jitter."""

    def __post_init__(self) -> None:
        if self.z_threshold <= 0:
            raise ConfigError(f"StragglerConfig.z_threshold must be > 0, got {self.z_threshold}")
        if not 0 < self.min_step_fraction <= 1:
            raise ConfigError(f"StragglerConfig.min_step_fraction must be in (0, 1], got {self.min_step_fraction}")
        if self.min_excess < 0 or self.mad_floor <= 0:
            raise ConfigError("StragglerConfig.min_excess must be >= 0 and mad_floor > 0")
        if self.min_ranks < 2 or self.min_steps < 1 or self.min_impact < 0:
            raise ConfigError(
                "StragglerConfig.min_ranks must be >= 2, min_steps >= 1 and min_impact >= 0, got "
                f"{self.min_ranks}, {self.min_steps}, {self.min_impact}"
            )
        if self.min_gpu_excess < 0 or not 0 < self.min_last_fraction <= 1:
            raise ConfigError(
                "StragglerConfig.min_gpu_excess must be >= 0 and min_last_fraction in (0, 1], got "
                f"{self.min_gpu_excess}, {self.min_last_fraction}"
            )


class RankScore(msgspec.Struct, frozen=True, kw_only=True):
    """One rank over the analysed steps (medians over steps, seconds)."""

    rank: int
    node: str | None
    gpu: int | None
    phases: Mapping[str, float]
    """Median seconds per phase of ``records.PHASES``."""
    work_s: float
    step_s: float
    score: float
    """Relative performance score: fastest rank's work / this rank's work, in [0, 1]."""
    individual_score: float
    """This rank's best step work / its median step work, in [0, 1]."""
    phase_scores: Mapping[str, float]
    """Relative score per work phase."""
    z: float
    """Median over steps of the modified z-score of the work time."""
    outlier_steps: int
    gpu_compute_s: float | None = None
    """Median GPU compute time per step (kernel-level traces)."""
    gpu_score: float | None = None
    """Relative score on GPU compute: fastest rank's / this rank's."""
    gpu_individual_score: float | None = None
    """This rank's best step's GPU compute / its median."""
    gpu_z: float | None = None
    late_s: float | None = None
    """Median per step of its lateness at the collectives (start after the median rank's)."""
    last_fraction: float | None = None
    """Fraction of the collectives it reached last."""


EVIDENCE_GPU_COMPUTE, EVIDENCE_LATE_ARRIVAL, EVIDENCE_HOST = "gpu_compute", "late_arrival", "host"


class Straggler(msgspec.Struct, frozen=True, kw_only=True):
    """A rank named as the straggler, and why."""

    rank: int
    node: str | None
    gpu: int | None
    phase: str
    """The work phase with the largest excess over the other ranks."""
    score: float
    individual_score: float
    z: float
    excess_s: float
    """Median extra work per step over the median rank."""
    steps_flagged: float
    """Fraction of steps in which it was an outlier."""
    signature: bool
    """Most work and least collective wait while the others wait: the synchronous-job signature."""
    others_wait_s: float
    """Median barrier wait of the other ranks per step."""
    evidence: tuple[str, ...] = (EVIDENCE_HOST,)
    """What named it: ``gpu_compute``, ``late_arrival``, ``host`` (GPU evidence first)."""
    host_only: bool = False
    """The trace has GPU time but only the host's timeline names the rank."""
    others_lost_s: float = 0.0
    """Median per step of the time all the other ranks together waited at the collectives."""
    gpu_excess_s: float | None = None
    """Median extra GPU compute per step over the median rank."""
    late_s: float | None = None
    last_fraction: float | None = None
    impact: float = 0.0
    """Its extra time per step (work, GPU compute or lateness, the largest that named it) / the median step."""


class SlowStep(msgspec.Struct, frozen=True, kw_only=True):
    """A step in which one rank was far slower than in its other steps (a pause, a hiccup)."""

    rank: int
    step: int
    work_s: float
    median_work_s: float
    """The rank's median work over the steps."""
    z: float
    """Modified z-score over the rank's own steps."""


class StragglerReport(msgspec.Struct, frozen=True, kw_only=True):
    world_size: int
    steps: tuple[int, ...]
    ranks: tuple[RankScore, ...]
    stragglers: tuple[Straggler, ...]
    """Most severe first."""
    slow_steps: tuple[SlowStep, ...] = ()
    """Outliers over time, each rank against its own steps (needs at least 3 steps)."""
    no_verdict: str | None = None
    """Why no straggler is named when the set cannot carry a verdict (too few ranks or steps) or the
    rank it points at costs under ``min_impact`` of the step; ``None`` otherwise."""


@contextmanager
def _nan_slices_expected() -> Iterator[None]:
    """A step in which no rank has GPU work on record is a column of NaN (the real MI250 trace has one); its
    median is NaN on purpose, and numpy's "All-NaN slice" warning would only reach the user's terminal."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "All-NaN slice encountered", RuntimeWarning)
        yield


def modified_z(values: np.ndarray, *, mad_floor: float = 0.01, axis: int = 0) -> np.ndarray:
    """0.6745·(x − median)/MAD along ``axis``; MAD floored at ``mad_floor`` × |median|."""
    with _nan_slices_expected():
        med = _nanmedian(values, axis=axis, keepdims=True)
        mad = _nanmedian(np.abs(values - med), axis=axis, keepdims=True)
    mad = np.maximum(mad, np.maximum(mad_floor * np.abs(med), 1e-12))
    z: np.ndarray = _MAD_TO_SIGMA * (values - med) / mad  # numpy's stubs say Any
    return z


def find_stragglers(
    anatomy: Anatomy,
    config: StragglerConfig | None = None,
    *,
    placement: Mapping[int, tuple[str | None, int | None]] | None = None,
) -> StragglerReport:
    """Score every rank and name the stragglers of a job's step anatomy.

    ``placement`` (rank → (node, GPU index), e.g. from the scheduler's job record) overrides
    what the traces or spans said.
    """
    cfg = config or StragglerConfig()
    if placement:
        anatomy = msgspec.structs.replace(anatomy, placement={**anatomy.placement, **placement})
    work = anatomy.matrix("work")  # ranks × steps
    z = modified_z(work, mad_floor=cfg.mad_floor, axis=0)
    med_step = _nanmedian(work, axis=0, keepdims=True)
    outlier = (z > cfg.z_threshold) & (work > med_step * (1 + cfg.min_excess))
    phases: dict[str, np.ndarray] = {p: anatomy.matrix(p) for p in PHASES}
    with _nan_slices_expected():
        gpu = _gpu_evidence(anatomy, cfg) if anatomy.has_gpu else None
    scores = _rank_scores(anatomy, work, z, outlier, phases, gpu)
    evidence = _evidence(outlier, gpu, cfg) if anatomy.steps else {}
    found = [
        _straggler(anatomy, i, scores[i], work, phases, outlier, gpu, named) for i, named in evidence.items() if named
    ]
    found.sort(key=lambda s: (s.host_only, s.score))
    named, no_verdict = _verdicts(anatomy, found, cfg)
    return StragglerReport(
        world_size=anatomy.world_size,
        steps=anatomy.steps,
        ranks=tuple(scores),
        stragglers=named,
        slow_steps=_slow_steps(anatomy, work, cfg),
        no_verdict=no_verdict,
    )


def _verdicts(
    anatomy: Anatomy, found: list[Straggler], cfg: StragglerConfig
) -> tuple[tuple[Straggler, ...], str | None]:
    """The stragglers the set can name, or none and why (too few ranks or steps, too small an effect)."""
    seen, steps = len(anatomy.ranks), len(anatomy.steps)
    if seen < cfg.min_ranks:
        return (), f"{seen} of {anatomy.world_size} ranks seen: too few to name a straggler (at least {cfg.min_ranks})"
    if steps < cfg.min_steps:
        return (
            (),
            f"{steps} step{'s' if steps != 1 else ''} seen: too few to name a straggler (at least {cfg.min_steps})",
        )
    named = tuple(s for s in found if s.impact >= cfg.min_impact)
    if named or not found:
        return named, None
    top = max(found, key=lambda s: s.impact)
    return (), (
        f"rank {top.rank} costs {top.impact:.1%} of the step: under the {cfg.min_impact:.0%} that names a straggler"
    )


class _Gpu(msgspec.Struct, frozen=True):
    """The GPU-side matrices (ranks × steps) and which ranks they flag."""

    compute: np.ndarray
    z: np.ndarray
    outlier: np.ndarray
    late: np.ndarray
    last_fraction: np.ndarray
    late_flag: np.ndarray


def _gpu_evidence(anatomy: Anatomy, cfg: StragglerConfig) -> _Gpu:
    compute = anatomy.matrix("gpu_compute_s")
    step = _nanmedian(anatomy.matrix("step"), axis=0, keepdims=True)
    z = modified_z(compute, mad_floor=cfg.mad_floor, axis=0)
    excess = compute - _nanmedian(compute, axis=0, keepdims=True)
    outlier = (z > cfg.z_threshold) & (excess > cfg.min_gpu_excess * step)
    late = anatomy.matrix("late_s")
    last, total = np.nansum(anatomy.matrix("last_arrivals"), axis=1), np.nansum(anatomy.matrix("collectives"), axis=1)
    last_fraction = np.where(total > 0, last / np.maximum(total, 1), 0.0)
    late_z = _nanmedian(modified_z(late, mad_floor=cfg.mad_floor, axis=0), axis=1)
    late_flag = (
        anatomy.gpu_collectives
        & (last_fraction >= cfg.min_last_fraction)
        & (_nanmedian(late, axis=1) >= cfg.min_gpu_excess * float(_nanmedian(step)))
        & (late_z > cfg.z_threshold)
    )
    return _Gpu(compute=compute, z=z, outlier=outlier, late=late, last_fraction=last_fraction, late_flag=late_flag)


def _evidence(outlier: np.ndarray, gpu: _Gpu | None, cfg: StragglerConfig) -> dict[int, tuple[str, ...]]:
    """Each rank's evidence: its share of outlier steps on the GPU's clock and on the host's, and a late arrival
    (the shares of all ranks at once: a 1,536-rank job's page asked numpy 3,000 times a page, row by row)."""
    host = (outlier.mean(axis=1) >= cfg.min_step_fraction).tolist()
    compute = [False] * len(host) if gpu is None else (gpu.outlier.mean(axis=1) >= cfg.min_step_fraction).tolist()
    late = [False] * len(host) if gpu is None else gpu.late_flag.tolist()
    return {
        i: tuple(
            name
            for name, found in (
                (EVIDENCE_GPU_COMPUTE, compute[i]),
                (EVIDENCE_LATE_ARRIVAL, late[i]),
                (EVIDENCE_HOST, host[i]),
            )
            if found
        )
        for i in range(len(host))
    }


def _slow_steps(anatomy: Anatomy, work: np.ndarray, cfg: StragglerConfig) -> tuple[SlowStep, ...]:
    """Each rank's steps against its own median (robust z over steps)."""
    if work.shape[1] < 3:
        return ()
    z = modified_z(work, mad_floor=cfg.mad_floor, axis=1)
    med = _nanmedian(work, axis=1, keepdims=True)
    slow = (z > cfg.z_threshold) & (work > med * (1 + cfg.min_excess))
    return tuple(
        SlowStep(
            rank=anatomy.ranks[i],
            step=anatomy.steps[j],
            work_s=float(work[i, j]),
            median_work_s=float(med[i, 0]),
            z=float(z[i, j]),
        )
        for i, j in zip(*np.nonzero(slow))
    )


def _nanmedian(values: Any, axis: int | None = None, *, keepdims: bool = False) -> Any:
    """``np.nanmedian``, by ``np.median`` when nothing is NaN (every rank ran every step, the usual case): the
    same middle value or mean of the middle two, without numpy's masked-array path for short rows (a tenth
    of a 1,536-rank job's steps report)."""
    values = np.asarray(values)
    if values.size and not np.isnan(values).any():
        return np.median(values, axis=axis, keepdims=keepdims)
    return np.nanmedian(values, axis=axis, keepdims=keepdims)


def _ratios(best: Any, mine: Any) -> list[float]:
    """``best / mine`` per rank, within [0, 1]; 1.0 where ``mine`` is not a positive number (nothing to compare)."""
    mine = np.asarray(mine, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.clip(np.asarray(best, dtype=float) / mine, 0.0, 1.0)
    ratios: list[float] = np.where(np.isfinite(mine) & (mine > 0), ratio, 1.0).tolist()
    return ratios


def _rank_scores(
    anatomy: Anatomy,
    work: np.ndarray,
    z: np.ndarray,
    outlier: np.ndarray,
    phases: Mapping[str, np.ndarray],
    gpu: _Gpu | None,
) -> list[RankScore]:
    # Every reduction over the ranks or over a rank's steps is made once, by axis, not once a rank: a
    # 1,536-rank job's page spent most of its steps' report here.
    med_work = _nanmedian(work, axis=1)
    best_rank = float(np.nanmin(med_work)) if len(med_work) else 0.0
    best_own = np.nanmin(work, axis=1).tolist() if work.size else [float("nan")] * len(anatomy.ranks)
    step_s = _nanmedian(anatomy.matrix("step"), axis=1).tolist()
    med_phase = {p: _nanmedian(m, axis=1) for p, m in phases.items()}
    best_phase = {p: float(np.nanmin(med_phase[p])) for p in WORK_PHASES}
    phase_rows: dict[str, list[float]] = {p: med_phase[p].tolist() for p in PHASES}
    z_rows, outliers = _nanmedian(z, axis=1).tolist(), outlier.sum(axis=1).tolist()
    gpu_rows = _gpu_rows(gpu) if gpu is not None else None
    scores, individual = _ratios(best_rank, med_work), _ratios(best_own, med_work)
    phase_scores = {p: _ratios(best_phase[p], med_phase[p]) for p in WORK_PHASES}
    out = []
    for i, rank in enumerate(anatomy.ranks):
        node, gpu_index = anatomy.placement.get(rank, (None, None))
        work_s = float(med_work[i])
        out.append(
            RankScore(
                rank=rank,
                node=node,
                gpu=gpu_index,
                phases={p: phase_rows[p][i] for p in PHASES},
                work_s=work_s,
                step_s=step_s[i],
                score=scores[i],
                individual_score=individual[i],
                phase_scores={p: phase_scores[p][i] for p in WORK_PHASES},
                z=z_rows[i],
                outlier_steps=int(outliers[i]),
                **({} if gpu_rows is None else {key: column[i] for key, column in gpu_rows.items()}),
            )
        )
    return out


def _gpu_rows(gpu: _Gpu) -> dict[str, list[float]]:
    """Each rank's GPU-clock figures of ``RankScore``, a list per field (rank order)."""
    med = _nanmedian(gpu.compute, axis=1)
    best = float(np.nanmin(med))
    return {
        "gpu_compute_s": med.tolist(),
        "gpu_score": _ratios(best, med),
        "gpu_individual_score": _ratios(np.nanmin(gpu.compute, axis=1), med),
        "gpu_z": _nanmedian(gpu.z, axis=1).tolist(),
        "late_s": _nanmedian(gpu.late, axis=1).tolist(),
        "last_fraction": [float(x) for x in np.asarray(gpu.last_fraction).tolist()],
    }


def _excess_by_phase(anatomy: Anatomy, i: int, others: list[int], name: str) -> dict[str, float]:
    out = {}
    for p in WORK_PHASES:
        m = anatomy.matrix(name % p)
        out[p] = float(_nanmedian(m[i] - _nanmedian(m[others], axis=0))) if others else 0.0
    return out


def _straggler(
    anatomy: Anatomy,
    i: int,
    score: RankScore,
    work: np.ndarray,
    phases: Mapping[str, np.ndarray],
    outlier: np.ndarray,
    gpu: _Gpu | None,
    evidence: tuple[str, ...],
) -> Straggler:
    others = [j for j in range(len(anatomy.ranks)) if j != i]
    on_gpu = EVIDENCE_GPU_COMPUTE in evidence or EVIDENCE_LATE_ARRIVAL in evidence
    excess = _excess_by_phase(anatomy, i, others, "gpu:%s" if on_gpu else "%s")
    wait = phases["barrier_wait"]
    my_wait = float(_nanmedian(wait[i]))
    others_wait = float(_nanmedian(wait[others])) if others else 0.0
    signature = bool(
        others
        and score.work_s >= np.nanmax(_nanmedian(work, axis=1))
        and my_wait <= np.nanmin(_nanmedian(wait, axis=1))
        and others_wait > my_wait
    )
    gpu_excess = float(_nanmedian(gpu.compute[i] - _nanmedian(gpu.compute, axis=0))) if gpu is not None else None
    # GPU-compute evidence is only found with GPU data, so gpu_score is set whenever it is the verdict's
    if on_gpu and EVIDENCE_GPU_COMPUTE in evidence and score.gpu_score is not None:
        verdict_score = score.gpu_score
    else:
        verdict_score = score.score
    excess_s = float(_nanmedian(work[i] - _nanmedian(work, axis=0)))
    extra = {
        EVIDENCE_HOST: excess_s,
        EVIDENCE_GPU_COMPUTE: gpu_excess or 0.0,
        EVIDENCE_LATE_ARRIVAL: score.late_s or 0.0,
    }
    step_s = float(np.median(step_times_s(anatomy)))
    impact = max(extra[e] for e in evidence) / step_s if step_s > 0 else 0.0
    return Straggler(
        rank=score.rank,
        node=score.node,
        gpu=score.gpu,
        phase=max(excess, key=excess.__getitem__),
        score=verdict_score,
        individual_score=score.individual_score,
        z=score.z,
        excess_s=excess_s,
        steps_flagged=float(outlier[i].mean()),
        signature=signature,
        others_wait_s=others_wait,
        evidence=evidence,
        host_only=gpu is not None and not on_gpu,
        others_lost_s=float(_nanmedian(np.nansum(wait[others], axis=0))) if others else 0.0,
        gpu_excess_s=gpu_excess,
        late_s=score.late_s,
        last_fraction=score.last_fraction,
        impact=impact,
    )
