"""How fast one dcgm-exporter scrape of a whole cluster parses, against prometheus_client's parser.

The text is 128 node scrapes of 8 GPUs, concatenated, as dcgm-exporter writes
them: HELP/TYPE per field, then one line per GPU with the exporter's label set
(gpu, UUID, pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION) and
the ``hpc_job`` label of the job mapping directory. Fields are the exporter's
default counters (etc/default-counters.csv,
https://github.com/NVIDIA/dcgm-exporter/blob/main/etc/default-counters.csv).

Run: ``.venv/bin/python benchmarks/bench_prometheus_parse.py [--nodes 128] [--repeat 5]``
Goal: the columnar path (with host/gpu/job columns) under 50 ms on one core.

``--file-mb 100,1000`` also writes files of that many MB under ``/tmp`` (deleted after) and
reads each whole with the streaming ``read_prometheus_columns``, one chunk at a time, in a
fresh process: throughput (MB of text per second, wall) and the process's peak RSS.
Goal: >= 100 MB/s and peak RSS under 500 MB whatever the file size.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from hpcwatch.sources.prometheus_text import parse_prometheus_columns, parse_prometheus_text, read_prometheus_columns

# (field, type, help) -- dcgm-exporter default-counters.csv, plus the profiling fields it enables on H100.
DCGM_FIELDS = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes."),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active."),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus."),
]


def node_scrape(node: int, rng: random.Random, jobs: list[str]) -> str:
    """One node's /metrics as dcgm-exporter 3.x prints it."""
    host = f"gpu-node-{node:03d}"
    gpus = []
    for g in range(8):
        uuid = "GPU-%08x-%04x-%04x-%04x-%012x" % tuple(rng.getrandbits(b) for b in (32, 16, 16, 16, 48))
        label = (
            f'gpu="{g}",UUID="{uuid}",pci_bus_id="00000000:{0x18 + 0x10 * g:02X}:00.0",device="nvidia{g}",'
            f'modelName="NVIDIA H100 80GB HBM3",Hostname="{host}",DCGM_FI_DRIVER_VERSION="580.159.04",'
            f'hpc_job="{jobs[(node * 8 + g) // 16 % len(jobs)]}"'
        )
        gpus.append(label)
    out = []
    for field, kind, doc in DCGM_FIELDS:
        out.append(f"# HELP {field} {doc}\n# TYPE {field} {kind}\n")
        for label in gpus:
            value = rng.randint(0, 100000) if kind == "counter" else round(rng.uniform(0, 1000), 3)
            out.append(f"{field}{{{label}}} {value}\n")
    return "".join(out)


def cluster_scrape(nodes: int = 128, seed: int = 0) -> str:
    rng = random.Random(seed)
    jobs = [str(1000 + j) for j in range(40)]
    return "".join(node_scrape(n, rng, jobs) for n in range(nodes))


def best_ms(fn, repeat: int) -> tuple[float, float]:
    """(best wall-clock ms, best CPU ms of this process): on a shared machine the CPU time is the fairer
    "one core" number, since wall time also counts the time other processes held the core."""
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append((time.perf_counter() - wall) * 1000)
        cpus.append((time.process_time() - cpu) * 1000)
    return min(walls), min(cpus)


def write_file(path: str, megabytes: int) -> int:
    """A file of about ``megabytes`` MB: cluster scrapes of distinct seeds, one after another."""
    written, seed = 0, 0
    with open(path, "w") as out:
        while written < megabytes * 1_000_000:
            written += out.write(cluster_scrape(16, seed=seed))
            seed += 1
    return written


def stream_file(path: str) -> None:
    """(child process) Read ``path`` chunk by chunk; print rows, seconds, peak RSS in MB."""
    pa.set_cpu_count(1)
    started, rows = time.perf_counter(), 0
    for table in read_prometheus_columns(path, t=0.0):
        rows += table.num_rows
    elapsed = time.perf_counter() - started
    print(rows, elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def whole_files(sizes_mb: list[int]) -> None:
    for megabytes in sizes_mb:
        fd, path = tempfile.mkstemp(suffix=".prom", dir="/tmp")
        os.close(fd)
        try:
            size = write_file(path, megabytes)
            out = subprocess.run(
                [sys.executable, __file__, "--stream", path], check=True, capture_output=True, text=True
            ).stdout.split()
            rows, seconds, rss_mb = int(out[0]), float(out[1]), float(out[2])
            print(
                f"read_prometheus_columns, whole file {size / 1e6:7.1f} MB: {rows} samples, {seconds:6.2f} s, "
                f"{size / 1e6 / seconds:6.1f} MB/s, peak RSS {rss_mb:6.1f} MB"
            )
        finally:
            os.unlink(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--file-mb", default="", help="comma-separated sizes of whole files to stream, e.g. 100,1000")
    parser.add_argument("--stream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stream:
        stream_file(args.stream)
        return
    pa.set_cpu_count(1)  # one core: Arrow kernels may not spread over a thread pool
    text = cluster_scrape(args.nodes)
    calibration = best_ms(lambda: sum(range(10**7)), 3)[1]
    lines = text.count("\n")
    table = parse_prometheus_columns(text, t=0.0)
    assert table.num_rows == args.nodes * 8 * len(DCGM_FIELDS)
    assert table.column("host").null_count == 0 and table.column("job").null_count == 0
    ours, ours_cpu = best_ms(lambda: parse_prometheus_columns(text, t=0.0), args.repeat)
    rows, rows_cpu = best_ms(lambda: sum(1 for _ in parse_prometheus_text(text, t=0.0)), args.repeat)
    ref, ref_cpu = best_ms(
        lambda: sum(len(f.samples) for f in text_string_to_metric_families(text)), max(1, args.repeat // 2)
    )
    print(f"text: {args.nodes} nodes x 8 GPUs, {lines} lines, {len(text) / 1e6:.1f} MB, {table.num_rows} samples")
    print("                                                   best wall   best CPU")
    print(f"parse_prometheus_columns (table with host/gpu/job): {ours:7.1f} ms {ours_cpu:7.1f} ms")
    print(f"parse_prometheus_text (one Sample per line):      {rows:7.1f} ms {rows_cpu:7.1f} ms")
    print(f"prometheus_client text_string_to_metric_families: {ref:7.1f} ms {ref_cpu:7.1f} ms")
    print(
        f"prometheus_client / columns: {ref_cpu / ours_cpu:5.1f}x (CPU)   prometheus_client / per-sample: "
        f"{ref_cpu / rows_cpu:5.1f}x (CPU)"
    )
    print(f"calibration: sum(range(10**7)) takes {calibration:.0f} ms of CPU on this machine")
    print(f"goal < 50 ms (CPU, one core) for the columns: {'met' if ours_cpu < 50 else 'NOT met'}")
    if args.file_mb:
        whole_files([int(x) for x in args.file_mb.split(",")])


if __name__ == "__main__":
    main()
