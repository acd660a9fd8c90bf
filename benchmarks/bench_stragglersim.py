"""How fast the straggler simulator is: Monte-Carlo of 1,024 GPUs × 10,000 steps, the exact curve 8 → 100k.

Targets (issue): Monte-Carlo < 1 s, exact 50-point curve < 100 ms. Run by hand:
``.venv/bin/python benchmarks/bench_stragglersim.py``; prints the best of a few runs.
"""

from __future__ import annotations

import time

import numpy as np

from hpcwatch.analysis.stragglersim import efficiency_curve, sample_step_max

REPEATS = 5
CURVE = np.unique(np.geomspace(8, 100_000, 50).astype(int)).tolist()


def best_s(work) -> float:
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    cases = {
        "MC 1,024 GPUs x 10,000 steps, order statistics": lambda: sample_step_max(1024, cv=0.05, steps=10_000),
        "MC 1,024 x 10,000, order statistics, p_slow 1e-3 x2": lambda: sample_step_max(
            1024, cv=0.05, p_slow=1e-3, slow_factor=2.0, steps=10_000
        ),
        "MC 1,024 x 10,000, naive (10M float32 normals)": lambda: sample_step_max(
            1024, cv=0.05, steps=10_000, method="naive"
        ),
        f"exact curve, {len(CURVE)} sizes 8..100k, normal": lambda: efficiency_curve(CURVE, cv=0.05, monte_carlo=False),
        f"exact curve, {len(CURVE)} sizes, normal + slow GPUs": lambda: efficiency_curve(
            CURVE, cv=0.05, p_slow=1e-3, slow_factor=2.0, monte_carlo=False
        ),
        f"exact curve, {len(CURVE)} sizes, empirical 10k sample + slow": lambda: efficiency_curve(
            CURVE,
            sample=np.random.default_rng(0).gamma(400, 1e-4, 10_000),
            p_slow=1e-3,
            slow_factor=2.0,
            monte_carlo=False,
        ),
        f"exact + MC (10,000 steps each), {len(CURVE)} sizes": lambda: efficiency_curve(
            CURVE, cv=0.05, p_slow=1e-3, slow_factor=2.0
        ),
    }
    for name, work in cases.items():
        print(f"{name:60s} {best_s(work) * 1e3:9.1f} ms")


if __name__ == "__main__":
    main()
