"""Straggler simulator: what synchronous training loses to the slowest GPU, from 8 to 100,000 GPUs.

A synchronous step ends when the slowest of N GPUs ends, so

    efficiency(N) = E[X] / E[max(X_1 … X_N)]

for a per-GPU step time X. X is either normal (mean 1, coefficient of variation
``cv``) or an empirical sample (step times measured on real GPUs), and each GPU is,
independently with probability ``p_slow``, a slow one whose time is multiplied by
``slow_factor`` (a throttled or degraded GPU):

    G(x) = (1 − p)·H(x) + p·H(x / F)        P(max ≤ x) = G(x)^N

Exact: E[max] = a + ∫_a^∞ (1 − G(x)^N) dx on a fine grid (normal), or the sum over
the sorted support points (empirical), both vectorised over N. Monte-Carlo draws the
max directly instead of N GPUs: the max of n iid draws is H⁻¹(U^(1/n)); with the
mixture, the number of slow GPUs K ~ Binomial(N, p) and the max is
max(H⁻¹(U₁^(1/(N−K))), F·H⁻¹(U₂^(1/K))), exact in distribution.

Check (docs/reference.md, "Stragglers"; Harter 1961 tables): E[max of N standard normals] is 1.424 (N=8),
3.248 (1,024), 3.971 (16,384).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

import numpy as np

from hpcwatch.errors import ConfigError
from hpcwatch.records import Span

__all__ = [
    "StragglerPoint",
    "StragglerCurve",
    "efficiency_curve",
    "expected_max_normal",
    "sample_step_max",
    "busy_times_from_spans",
    "DEFAULT_STEPS",
    "MAX_GPUS",
]


def _scipy_special() -> ModuleType:
    """scipy.special, imported when first needed: it is slow to import (benchmarks/RESULTS.md, "CLI start-up"),
    and every CLI call imports this module."""
    from scipy import special

    module: ModuleType = special  # scipy has no stubs (pyproject.toml): its names are Any to mypy
    return module


#: Monte-Carlo steps when none are asked for (standard error ≈ 0.1 % of the step).
DEFAULT_STEPS = 10_000
#: Largest job we simulate (the grid's tails are sized for it).
MAX_GPUS = 1_000_000
# The normal grid reaches ±Z_TAIL standard deviations: 1 − Φ(9) ≈ 1e-19, so N·(1 − G) stays
# negligible up to MAX_GPUS; GRID_POINTS per span keeps the trapezoid error below 1e-7.
_Z_TAIL = 9.0
_GRID_POINTS = 8001
# Phases that are waiting or collective, not the GPU's own work (records.PHASES).
_WAIT_PHASES = frozenset({"barrier_wait", "allreduce"})
_TINY = 1e-300


@dataclass(frozen=True, slots=True, kw_only=True)
class StragglerPoint:
    """Efficiency of one job size."""

    gpus: int
    efficiency: float
    """E[X] / E[max over the GPUs], exact."""
    efficiency_mc: float | None
    """The same by Monte-Carlo; ``None`` when not asked for."""
    expected_step: float
    """E[max over the GPUs], in the distribution's unit (healthy mean = 1 for the normal)."""
    p_any_slow: float
    """Probability that at least one GPU of the job is a slow one in a step."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StragglerCurve:
    """Efficiency against job size for one per-GPU step-time distribution."""

    points: list[StragglerPoint]
    distribution: Literal["normal", "empirical"]
    cv: float
    """Coefficient of variation of a healthy GPU's step (the sample's, when empirical)."""
    p_slow: float
    slow_factor: float
    mean_step: float
    """E[X], a single GPU's mean step including the slow ones."""
    steps: int
    """Monte-Carlo steps (0 when Monte-Carlo was not run)."""
    seed: int


def efficiency_curve(
    gpus: Sequence[int],
    *,
    cv: float | None = None,
    p_slow: float = 0.0,
    slow_factor: float = 1.0,
    sample: Sequence[float] | np.ndarray | None = None,
    steps: int = DEFAULT_STEPS,
    seed: int = 0,
    monte_carlo: bool = True,
) -> StragglerCurve:
    """Synchronous efficiency for each job size in ``gpus``.

    Give ``cv`` for a normal step time (mean 1), or ``sample`` (measured per-GPU step
    times, any unit) for an empirical one. ``steps`` Monte-Carlo steps per size.
    """
    ns = _check_gpus(gpus)
    _check(p_slow=p_slow, slow_factor=slow_factor, steps=steps, monte_carlo=monte_carlo)
    dist = _Dist.make(cv=cv, sample=sample, p_slow=p_slow, slow_factor=slow_factor)
    emax = dist.expected_max(ns)
    rng = np.random.default_rng(seed)
    mc = [float(dist.mean / dist.draw_max(int(n), steps, rng).mean()) for n in ns] if monte_carlo else [None] * len(ns)
    p_any = -np.expm1(ns * np.log1p(-p_slow)) if p_slow < 1 else np.ones(len(ns))
    points = [
        StragglerPoint(
            gpus=int(n), efficiency=float(dist.mean / e), efficiency_mc=m, expected_step=float(e), p_any_slow=float(p)
        )
        for n, e, m, p in zip(ns, emax, mc, p_any)
    ]
    return StragglerCurve(
        points=points,
        distribution=dist.kind,
        cv=dist.cv,
        p_slow=p_slow,
        slow_factor=slow_factor,
        mean_step=dist.mean,
        steps=steps if monte_carlo else 0,
        seed=seed,
    )


def expected_max_normal(gpus: Sequence[int]) -> np.ndarray:
    """E[max of N standard normals] for each N (the e_N of docs/reference.md, "Stragglers"), by the exact integral."""
    ns = _check_gpus(gpus)
    return _Dist.make(cv=1.0, sample=None, p_slow=0.0, slow_factor=1.0).expected_max(ns) - 1.0


def sample_step_max(
    gpus: int,
    *,
    cv: float | None = None,
    p_slow: float = 0.0,
    slow_factor: float = 1.0,
    sample: Sequence[float] | np.ndarray | None = None,
    steps: int = DEFAULT_STEPS,
    seed: int = 0,
    method: Literal["order", "naive"] = "order",
) -> np.ndarray:
    """Simulated step times (the max over ``gpus`` GPUs) of ``steps`` steps.

    ``order`` draws each step's max directly (order statistics); ``naive`` draws every
    GPU's time (float32) and takes the max — slower, kept to check the other.
    """
    n = int(_check_gpus([gpus])[0])
    _check(p_slow=p_slow, slow_factor=slow_factor, steps=steps, monte_carlo=True)
    dist = _Dist.make(cv=cv, sample=sample, p_slow=p_slow, slow_factor=slow_factor)
    rng = np.random.default_rng(seed)
    if method == "order":
        return dist.draw_max(n, steps, rng)
    if method == "naive":
        maxima: np.ndarray = dist.draw_all(n, steps, rng).max(axis=1)
        return maxima
    raise ConfigError(f"method: expected 'order' or 'naive', got {method!r}")


def busy_times_from_spans(spans: Iterable[Span]) -> np.ndarray:
    """Each (rank, step)'s own work in seconds: its spans less waiting and collectives.

    An empirical sample for ``efficiency_curve``: what a GPU would take if it never waited.
    """
    busy: dict[tuple[int, int], float] = {}
    for span in spans:
        if span.phase not in _WAIT_PHASES:
            busy[(span.rank, span.step)] = busy.get((span.rank, span.step), 0.0) + span.dur
    return np.fromiter(busy.values(), float, len(busy))


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Dist:
    """The per-GPU step time: healthy normal(1, cv) or empirical, mixed with slow GPUs."""

    kind: Literal["normal", "empirical"]
    cv: float
    p: float
    factor: float
    sorted_sample: np.ndarray | None
    mean: float

    @staticmethod
    def make(
        *, cv: float | None, sample: Sequence[float] | np.ndarray | None, p_slow: float, slow_factor: float
    ) -> _Dist:
        mix = (1.0 - p_slow) + p_slow * slow_factor
        if sample is not None:
            if cv is not None:
                raise ConfigError("cv: give either cv or sample, not both")
            x = np.sort(np.asarray(sample, dtype=float).ravel())
            if x.size == 0 or not np.isfinite(x).all() or x[0] <= 0:
                raise ConfigError("sample: needs at least one finite step time > 0")
            return _Dist("empirical", float(x.std() / x.mean()), p_slow, slow_factor, x, float(x.mean() * mix))
        if cv is None or not (cv > 0 and np.isfinite(cv)):
            raise ConfigError(f"cv: must be a number > 0, got {cv!r}")
        return _Dist("normal", float(cv), p_slow, slow_factor, None, mix)

    # -- exact ----------------------------------------------------------------------------------

    def expected_max(self, ns: np.ndarray) -> np.ndarray:
        return self._emax_empirical(ns) if self.kind == "empirical" else self._emax_normal(ns)

    def _emax_normal(self, ns: np.ndarray) -> np.ndarray:
        spans = [(1.0 - _Z_TAIL * self.cv, 1.0 + _Z_TAIL * self.cv)]
        if self.p > 0:
            spans.append((self.factor * spans[0][0], self.factor * spans[0][1]))
        lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
        x = np.unique(np.concatenate([np.linspace(a, b, _GRID_POINTS) for a, b in [*spans, (lo, hi)]]))
        special = _scipy_special()
        sf = (1.0 - self.p) * special.ndtr((1.0 - x) / self.cv)
        if self.p > 0:
            sf = sf + self.p * special.ndtr((1.0 - x / self.factor) / self.cv)
        with np.errstate(divide="ignore"):  # G = 0 far below: log 0 = −inf, G^N = 0
            log_cdf = np.log1p(-np.minimum(sf, 1.0))
        tail = -np.expm1(ns[:, None] * log_cdf[None, :])  # 1 − G(x)^N
        emax: np.ndarray = lo + np.trapezoid(tail, x, axis=1)
        return emax

    def _sample(self) -> np.ndarray:
        """The sorted sample of an empirical distribution (``make`` sets one with that kind)."""
        assert self.sorted_sample is not None, "an empirical _Dist holds its sample"
        return self.sorted_sample

    def _emax_empirical(self, ns: np.ndarray) -> np.ndarray:
        x = self._sample()
        n = x.size
        values = np.concatenate([x, self.factor * x]) if self.p > 0 else x
        weights = (
            np.concatenate([np.full(n, (1 - self.p) / n), np.full(n, self.p / n)]) if self.p > 0 else np.full(n, 1 / n)
        )
        order = np.argsort(values, kind="stable")
        values, weights = values[order], weights[order]
        above = np.concatenate([np.cumsum(weights[::-1])[::-1][1:], [0.0]])  # P(X > v_k), no cancellation
        with np.errstate(divide="ignore"):  # G = 0 below the smallest point
            cdf_n = np.exp(ns[:, None] * np.log1p(-np.minimum(above, 1.0))[None, :])  # G(v_k)^N
        jumps = np.diff(cdf_n, axis=1, prepend=0.0)
        emax: np.ndarray = jumps @ values
        return emax

    # -- Monte-Carlo ----------------------------------------------------------------------------

    def draw_max(self, n: int, steps: int, rng: np.random.Generator) -> np.ndarray:
        slow = rng.binomial(n, self.p, size=steps) if self.p > 0 else np.zeros(steps, dtype=np.int64)
        healthy = self._max_of(n - slow, rng)
        if self.p == 0:
            return healthy
        both: np.ndarray = np.maximum(healthy, self.factor * self._max_of(slow, rng))
        return both

    def _max_of(self, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Max of ``counts[i]`` healthy draws for each i (−inf where the count is 0)."""
        u = rng.random(counts.size)
        safe = np.maximum(counts, 1)
        above = -np.expm1(np.log1p(-u) / safe)  # P(X > max) = 1 − V, V = (1 − u)^(1/n) ~ U^(1/n)
        above = np.clip(above, _TINY, 1.0)  # u = 0 would give an infinite max
        if self.kind == "normal":
            out = 1.0 - self.cv * _scipy_special().ndtri(above)  # Φ⁻¹(1 − q) = −Φ⁻¹(q), exact in the tail
        else:
            x = self._sample()
            out = x[np.clip(x.size - 1 - np.floor(x.size * above).astype(np.int64), 0, x.size - 1)]
        return np.where(counts > 0, out, -np.inf)

    def draw_all(self, n: int, steps: int, rng: np.random.Generator) -> np.ndarray:
        if self.kind == "normal":
            t = rng.standard_normal((steps, n), dtype=np.float32)
            t = 1.0 + self.cv * t
        else:
            t = rng.choice(self._sample().astype(np.float32), size=(steps, n))
        if self.p > 0:
            t = np.where(rng.random((steps, n), dtype=np.float32) < self.p, t * np.float32(self.factor), t)
        return t


def _check_gpus(gpus: Sequence[int]) -> np.ndarray:
    ns = np.asarray(list(gpus))
    if ns.size == 0:
        raise ConfigError("gpus: give at least one job size")
    if ns.dtype.kind not in "iu" or (ns < 1).any() or (ns > MAX_GPUS).any():
        raise ConfigError(f"gpus: whole numbers from 1 to {MAX_GPUS:,}, got {list(gpus)!r}")
    return ns.astype(np.int64)


def _check(*, p_slow: float, slow_factor: float, steps: int, monte_carlo: bool) -> None:
    if not 0.0 <= p_slow <= 1.0:
        raise ConfigError(f"p_slow: a probability in [0, 1], got {p_slow!r}")
    if not (slow_factor > 0 and np.isfinite(slow_factor)):
        raise ConfigError(f"slow_factor: must be a number > 0, got {slow_factor!r}")
    if monte_carlo and not (isinstance(steps, (int, np.integer)) and steps >= 1):
        raise ConfigError(f"steps: a whole number >= 1, got {steps!r}")
