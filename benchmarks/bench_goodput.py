"""How long the failure twin and the goodput accounting take at Llama 3 scale (run by hand, prints numbers).

.venv/bin/python benchmarks/bench_goodput.py
"""

from __future__ import annotations

import time

from hpcwatch.analysis.goodput import account_goodput
from hpcwatch.analysis.goodputsim import GoodputSimConfig, goodput_sweep, simulate_goodput


def _best_of(n: int, fn):
    best, out = float("inf"), None
    for _ in range(n):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    config = GoodputSimConfig(gpus=16_384, days=54)
    sim_s, run = _best_of(5, lambda: simulate_goodput(config))
    print(
        f"simulate 16,384 GPUs x 54 days: {sim_s * 1e3:.1f} ms  ({run.interruptions} interruptions, "
        f"goodput {run.goodput:.4f}, effective {run.effective_time:.4f})"
    )
    table_s, steps = _best_of(3, run.step_table)
    events = list(run.events())
    print(f"step table: {len(steps):,} executed steps in {table_s * 1e3:.1f} ms; {len(events):,} events")
    acct_s, report = _best_of(3, lambda: account_goodput(run.job(), steps, events))
    print(
        f"accounting from records: {acct_s * 1e3:.1f} ms  (goodput {report.goodput:.4f}, "
        f"|diff| {abs(report.goodput - run.goodput):.2e})"
    )
    sweep_s, runs = _best_of(3, goodput_sweep)
    print(f"sweep 1k..100k GPUs ({len(runs)} runs): {sweep_s * 1e3:.1f} ms")
    for r in runs:
        print(
            f"  {r.config.gpus:>7,} GPUs  MTBF {r.mtbf_s / 3600:6.2f} h  {r.interruptions:5d} interruptions  "
            f"T={r.checkpoint_interval_s:5.0f} s  goodput {r.goodput:.3f}"
        )


if __name__ == "__main__":
    main()
