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
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from collections.abc import Mapping

import numpy as np

from hpcwatch.analysis.steps import WORK_PHASES, Anatomy
from hpcwatch.errors import ConfigError
from hpcwatch.records import PHASES

__all__ = ["StragglerConfig", "RankScore", "Straggler", "SlowStep", "StragglerReport", "find_stragglers", "modified_z",
           "DEFAULT_Z_THRESHOLD"]

#: Iglewicz & Hoaglin's cut-off for the modified z-score (NIST handbook, section 1.3.5.17).
DEFAULT_Z_THRESHOLD = 3.5
#: 0.6745 = Φ⁻¹(0.75): makes the MAD estimate σ for normal data (same source).
_MAD_TO_SIGMA = 0.6745


@dataclass(frozen=True, slots=True, kw_only=True)
class StragglerConfig:
    """How sure detection must be before it names a rank."""

    z_threshold: float = DEFAULT_Z_THRESHOLD
    """Modified z-score above which a rank's step is an outlier."""
    min_excess: float = 0.10
    """...and its work must exceed the step's median by at least this fraction (noise on tiny steps)."""
    min_step_fraction: float = 0.5
    """Fraction of the steps a rank must be an outlier in to be called a straggler."""
    mad_floor: float = 0.01
    """MAD never taken below this fraction of the median (identical ranks give MAD 0)."""

    def __post_init__(self) -> None:
        if self.z_threshold <= 0:
            raise ConfigError(f"StragglerConfig.z_threshold must be > 0, got {self.z_threshold}")
        if not 0 < self.min_step_fraction <= 1:
            raise ConfigError(f"StragglerConfig.min_step_fraction must be in (0, 1], got {self.min_step_fraction}")
        if self.min_excess < 0 or self.mad_floor <= 0:
            raise ConfigError("StragglerConfig.min_excess must be >= 0 and mad_floor > 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class RankScore:
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


@dataclass(frozen=True, slots=True, kw_only=True)
class Straggler:
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


@dataclass(frozen=True, slots=True, kw_only=True)
class SlowStep:
    """A step in which one rank was far slower than in its other steps (a pause, a hiccup)."""

    rank: int
    step: int
    work_s: float
    median_work_s: float
    """The rank's median work over the steps."""
    z: float
    """Modified z-score over the rank's own steps."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StragglerReport:
    world_size: int
    steps: tuple[int, ...]
    ranks: tuple[RankScore, ...]
    stragglers: tuple[Straggler, ...]
    """Most severe first."""
    slow_steps: tuple[SlowStep, ...] = ()
    """Outliers over time, each rank against its own steps (needs at least 3 steps)."""


def modified_z(values: np.ndarray, *, mad_floor: float = 0.01, axis: int = 0) -> np.ndarray:
    """0.6745·(x − median)/MAD along ``axis``; MAD floored at ``mad_floor`` × |median|."""
    med = np.nanmedian(values, axis=axis, keepdims=True)
    mad = np.nanmedian(np.abs(values - med), axis=axis, keepdims=True)
    mad = np.maximum(mad, np.maximum(mad_floor * np.abs(med), 1e-12))
    return _MAD_TO_SIGMA * (values - med) / mad


def find_stragglers(anatomy: Anatomy, config: StragglerConfig | None = None, *,
                    placement: Mapping[int, tuple[str | None, int | None]] | None = None) -> StragglerReport:
    """Score every rank and name the stragglers of a job's step anatomy.

    ``placement`` (rank → (node, GPU index), e.g. from the scheduler's job record) overrides
    what the traces or spans said.
    """
    cfg = config or StragglerConfig()
    if placement:
        anatomy = dataclasses.replace(anatomy, placement={**anatomy.placement, **placement})
    work = anatomy.matrix("work")                                  # ranks × steps
    z = modified_z(work, mad_floor=cfg.mad_floor, axis=0)
    med_step = np.nanmedian(work, axis=0, keepdims=True)
    outlier = (z > cfg.z_threshold) & (work > med_step * (1 + cfg.min_excess))
    phases = {p: anatomy.matrix(p) for p in PHASES}
    scores = _rank_scores(anatomy, work, z, outlier, phases)
    flagged = [i for i in range(len(anatomy.ranks))
               if len(anatomy.steps) > 0 and outlier[i].mean() >= cfg.min_step_fraction]
    found = [_straggler(anatomy, i, scores[i], work, phases, outlier) for i in flagged]
    found.sort(key=lambda s: s.score)
    return StragglerReport(world_size=anatomy.world_size, steps=anatomy.steps, ranks=tuple(scores),
                           stragglers=tuple(found), slow_steps=_slow_steps(anatomy, work, cfg))


def _slow_steps(anatomy: Anatomy, work: np.ndarray, cfg: StragglerConfig) -> tuple[SlowStep, ...]:
    """Each rank's steps against its own median (robust z over steps)."""
    if work.shape[1] < 3:
        return ()
    z = modified_z(work, mad_floor=cfg.mad_floor, axis=1)
    med = np.nanmedian(work, axis=1, keepdims=True)
    slow = (z > cfg.z_threshold) & (work > med * (1 + cfg.min_excess))
    return tuple(SlowStep(rank=anatomy.ranks[i], step=anatomy.steps[j], work_s=float(work[i, j]),
                          median_work_s=float(med[i, 0]), z=float(z[i, j]))
                 for i, j in zip(*np.nonzero(slow)))


def _ratio(best: float, mine: float) -> float:
    if not np.isfinite(mine) or mine <= 0:
        return 1.0
    return float(min(max(best / mine, 0.0), 1.0))


def _rank_scores(anatomy: Anatomy, work: np.ndarray, z: np.ndarray, outlier: np.ndarray,
                 phases: Mapping[str, np.ndarray]) -> list[RankScore]:
    med_work = np.nanmedian(work, axis=1)
    best_rank = float(np.nanmin(med_work)) if len(med_work) else 0.0
    step_s = np.nanmedian(anatomy.matrix("step"), axis=1)
    med_phase = {p: np.nanmedian(m, axis=1) for p, m in phases.items()}
    out = []
    for i, rank in enumerate(anatomy.ranks):
        node, gpu = anatomy.placement.get(rank, (None, None))
        out.append(RankScore(
            rank=rank, node=node, gpu=gpu, phases={p: float(med_phase[p][i]) for p in PHASES},
            work_s=float(med_work[i]), step_s=float(step_s[i]), score=_ratio(best_rank, float(med_work[i])),
            individual_score=_ratio(float(np.nanmin(work[i])), float(med_work[i])),
            phase_scores={p: _ratio(float(np.nanmin(med_phase[p])), float(med_phase[p][i])) for p in WORK_PHASES},
            z=float(np.nanmedian(z[i])), outlier_steps=int(outlier[i].sum())))
    return out


def _straggler(anatomy: Anatomy, i: int, score: RankScore, work: np.ndarray, phases: Mapping[str, np.ndarray],
               outlier: np.ndarray) -> Straggler:
    others = [j for j in range(len(anatomy.ranks)) if j != i]
    excess = {p: float(np.nanmedian(phases[p][i] - np.nanmedian(phases[p][others], axis=0)))
              if others else 0.0 for p in WORK_PHASES}
    wait = phases["barrier_wait"]
    my_wait = float(np.nanmedian(wait[i]))
    others_wait = float(np.nanmedian(wait[others])) if others else 0.0
    signature = bool(others and score.work_s >= np.nanmax(np.nanmedian(work, axis=1))
                     and my_wait <= np.nanmin(np.nanmedian(wait, axis=1)) and others_wait > my_wait)
    return Straggler(rank=score.rank, node=score.node, gpu=score.gpu, phase=max(excess, key=excess.get),
                     score=score.score, individual_score=score.individual_score, z=score.z,
                     excess_s=float(np.nanmedian(work[i] - np.nanmedian(work, axis=0))),
                     steps_flagged=float(outlier[i].mean()), signature=signature, others_wait_s=others_wait)
