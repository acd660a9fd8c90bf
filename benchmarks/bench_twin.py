"""How fast the twin writes: one hour of a 128-node (1,024 H100) cluster at 10 s resolution.

Target (brief): under 10 s. Run by hand: ``.venv/bin/python benchmarks/bench_twin.py [nodes] [hours]``.
Prints the time to simulate only, and to simulate and write every file.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from importlib import resources

from hpcwatch.model import parse_cluster
from hpcwatch.twin import Twin
from hpcwatch.twin.run import write_run


def cluster_of(nodes: int):
    text = resources.files("hpcwatch.model").joinpath("reference.yaml").read_text()
    return parse_cluster(text.replace("count: 2", f"count: {nodes}"), path=f"reference x{nodes}")


def main() -> None:
    nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    hours = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    cluster = cluster_of(nodes)
    ticks = int(hours * 3600 / 10)
    twin = Twin(cluster, seed=0)
    t = time.perf_counter()
    for _ in range(ticks):
        twin.advance(10.0)
    sim_s = time.perf_counter() - t
    out = tempfile.mkdtemp(prefix="bench_twin_")
    try:
        twin = Twin(cluster, seed=0)
        t = time.perf_counter()
        summary = write_run(twin, out, duration_s=hours * 3600, step_s=10.0)
        write_s = time.perf_counter() - t
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print(f"nodes={nodes} gpus={twin.n_gpus} ticks={ticks}")
    print(f"simulate only:        {sim_s:6.2f} s")
    print(f"simulate + write all: {write_s:6.2f} s  ({summary.files} files, {summary.spans} spans)")


if __name__ == "__main__":
    main()
