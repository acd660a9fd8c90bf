"""How fast the twin writes: one hour of a 128-node (1,024 H100) cluster at 10 s resolution.

Target (brief): under 10 s. Run by hand: ``.venv/bin/python benchmarks/bench_twin.py [nodes] [hours]``.
Prints the time to simulate only, and to simulate and write every file with one process and with
one writer process per core (at most 4).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

from hpcwatch.twin import Twin
from hpcwatch.twin.run import sized_reference, write_run


def main() -> None:
    nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    hours = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    cluster = sized_reference(nodes)
    ticks = int(hours * 3600 / 10)
    twin = Twin(cluster, seed=0)
    t, c = time.perf_counter(), time.process_time()
    for _ in range(ticks):
        twin.advance(10.0)
    sim_s, sim_cpu = time.perf_counter() - t, time.process_time() - c
    print(f"nodes={nodes} gpus={twin.n_gpus} ticks={ticks} cores={os.cpu_count()}")
    # On a shared machine wall time includes waiting for a core; CPU time is what the twin costs.
    print(f"simulate only:        {sim_s:6.2f} s wall, {sim_cpu:6.2f} s CPU")
    for workers in sorted({1, min(os.cpu_count() or 1, 4)}):
        out = tempfile.mkdtemp(prefix="bench_twin_")
        try:
            twin = Twin(cluster, seed=0)
            t, c = time.perf_counter(), time.process_time()
            summary = write_run(twin, out, duration_s=hours * 3600, step_s=10.0, workers=workers)
            write_s, write_cpu = time.perf_counter() - t, time.process_time() - c
        finally:
            shutil.rmtree(out, ignore_errors=True)
        print(
            f"simulate + write all, {workers} writer process(es): {write_s:6.2f} s wall, "
            f"{write_cpu:6.2f} s CPU in the main process ({summary.files} files)"
        )


if __name__ == "__main__":
    main()
