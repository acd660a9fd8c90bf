"""Load + temporal breakdown: hpcwatch vs Holistic Trace Analysis on the same traces, same run.

HTA (``pip install HolisticTraceAnalysis``) pulls ~70 packages (jupyterlab, pandas, ipykernel…)
into an environment, so it lives in its own venv, not in hpcwatch's test extra:

    python3 -m venv /tmp/hta && /tmp/hta/bin/pip install HolisticTraceAnalysis -e .
    .venv/bin/python benchmarks/bench_steps_vs_hta.py [--hta-python /tmp/hta/bin/python] [--repeat 3]
    .venv/bin/python benchmarks/bench_steps_vs_hta.py --whole [--set DIR ...] [--twin-ranks 8 --twin-steps 60 --twin-steps 360]

``--whole`` times what a user runs, whole process, same run: ``hpcwatch steps DIR --json`` (the
venv's console script) against a Python process doing HTA's ``TraceAnalysis(trace_dir=DIR)`` +
``get_temporal_breakdown``, the two alternating, nothing sampling them. Memory comes from one more run
of each, sampled from /proc every 10 ms: the peak of the process tree's PSS (the process and its
children, ours our forked readers, HTA's its parser pool; a page they share counted once) and of its
RSS summed (a shared page counted once per process). The sets: the test traces, any ``--set`` folder, and the twin's
kernel-level traces of ``--twin-ranks`` ranks × ``--twin-steps`` steps (gzipped JSON).
Both sides run with their modules' bytecode cached, as an installed package runs (pip writes
HTA's .pyc at install): ``PYTHONDONTWRITEBYTECODE`` is dropped for the timed commands, their
.pyc go under a temporary ``PYTHONPYCACHEPREFIX`` (the worktree stays clean), and each command
runs once untimed first. Without that our ~70 modules were compiled from source on every
run (~0.1 s of each figure), HTA's not.

Each measurement runs in a fresh child process, so its peak RSS (``ru_maxrss``) is its own;
we report the peak and the growth over the process's RSS after its imports. HTA rounds event
times to whole µs by default, so our numbers are compared with ``round_us=True`` (equal) and
without (the difference is HTA's rounding). HTA's ``get_temporal_breakdown`` stops on an
assertion on the H200 trace (its rounding makes non-compute time -2 µs); the benchmark then
times its parse and computes the breakdown with HTA's own building blocks. A last HTA run
with ``HTA_DISABLE_NS_ROUNDING=1`` gives its unrounded numbers, which ours equal.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = {
    "hta_a100_nccl_rank0": ROOT / "tests/data/kineto/hta_a100_nccl_rank0.json.gz",
    "h200_annotated_steps": ROOT / "tests/data/kineto/h200_annotated_steps.json.gz",
    "hta_gpu_lags_host_rank0": ROOT / "tests/data/kineto/hta_gpu_lags_host_rank0.json.gz",
    "hta_sampled_2ranks": ROOT / "tests/data/kineto/hta_sampled_2ranks",
}


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _current_rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def child_ours(trace_dir: str) -> dict:
    import warnings

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as hpcwatch.cli sets it, before numpy loads

    from hpcwatch.analysis.steps import anatomy_from_traces, temporal_breakdown
    from hpcwatch.sources.kineto import read_kineto

    warnings.simplefilter("ignore")
    base = _current_rss_mib()
    t0, c0 = time.perf_counter(), time.process_time()
    traces = [read_kineto(p) for p in sorted(Path(trace_dir).iterdir())]
    t1 = time.perf_counter()
    rows = {t.rank: temporal_breakdown(t, round_us=True) for t in traces}
    t2, c2 = time.perf_counter(), time.process_time()
    exact = {t.rank: temporal_breakdown(t) for t in traces}
    t3 = time.perf_counter()
    anatomy_from_traces(traces)
    t4 = time.perf_counter()
    return {
        "load_s": t1 - t0,
        "breakdown_s": t2 - t1,
        "cpu_s": c2 - c0,
        "anatomy_s": t4 - t3,
        "peak_rss_mib": _rss_mib(),
        "base_rss_mib": base,
        "numbers": {r: [b.idle_us, b.compute_us, b.non_compute_us, b.kernel_us] for r, b in rows.items()},
        "exact": {r: [b.idle_us, b.compute_us, b.non_compute_us, b.kernel_us] for r, b in exact.items()},
    }


def child_hta(trace_dir: str) -> dict:
    import logging

    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis

    base = _current_rss_mib()
    t0, c0 = time.perf_counter(), time.process_time()
    analysis = TraceAnalysis(trace_dir=trace_dir)
    t1 = time.perf_counter()
    try:
        df = analysis.get_temporal_breakdown(visualize=False)
        numbers = {
            int(r["rank"]): [
                float(r["idle_time(us)"]),
                float(r["compute_time(us)"]),
                float(r["non_compute_time(us)"]),
                float(r["kernel_time(us)"]),
            ]
            for _, r in df.iterrows()
        }
        note = ""
    except AssertionError:
        numbers, note = _hta_blocks(analysis), "get_temporal_breakdown asserted; HTA building blocks used"
    t2, c2 = time.perf_counter(), time.process_time()
    return {
        "load_s": t1 - t0,
        "breakdown_s": t2 - t1,
        "cpu_s": c2 - c0,
        "peak_rss_mib": _rss_mib(),
        "base_rss_mib": base,
        "numbers": numbers,
        "note": note,
    }


def _hta_blocks(analysis) -> dict:
    from hta.analyzers.breakdown_analysis import BreakdownAnalysis
    from hta.utils.utils import get_kernel_type, merge_kernel_intervals

    sym = analysis.t.symbol_table.get_sym_table()
    out = {}
    for rank, df in analysis.t.traces.items():
        gpu = df[df["stream"].ne(-1)].copy()
        idle, kernel = BreakdownAnalysis._get_idle_time_for_kernels(gpu.copy())
        kinds = gpu["name"].apply(lambda x: get_kernel_type(sym[x]))
        comp = merge_kernel_intervals(gpu[kinds.eq("COMPUTATION")].copy())
        compute = comp.end.sum() - comp.ts.sum()
        out[int(rank)] = [float(idle), float(compute), float(kernel - compute - idle), float(kernel)]
    return out


def _run(python: str, role: str, trace_dir: Path, *, env: dict | None = None) -> dict:
    proc = subprocess.run(
        [python, __file__, "--child", role, str(trace_dir)], capture_output=True, text=True, timeout=600, env=env
    )
    if proc.returncode != 0:
        raise SystemExit(f"{role} child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _best(runs: list[dict]) -> dict:
    best = min(runs, key=lambda r: r["load_s"] + r["breakdown_s"])
    return {**best, "peak_rss_mib": min(r["peak_rss_mib"] for r in runs), "cpu_s": min(r["cpu_s"] for r in runs)}


_HTA_WHOLE = """
import logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
try:
    a.get_temporal_breakdown(visualize=False)
except AssertionError:
    pass
"""


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def _tree_memory_mib(pid: int) -> tuple[float, float]:
    """(PSS, RSS) of ``pid`` and its descendants, summed (MiB). PSS charges a page shared by n processes
    1/n to each (a forked child shares its parent's interpreter and libraries), so its sum counts each page
    once; the RSS sum counts a shared page once per process."""
    pss = rss = 0
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1])
                    elif line.startswith("Rss:"):
                        rss += int(line.split()[1])
        except OSError:
            pass
    return pss / 1024, rss / 1024


def wall_time(cmd: list[str], env: dict[str, str] | None = None) -> float:
    """Wall seconds of one command, nothing sampling it."""
    t0 = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{cmd} failed with status {done.returncode}")
    return wall


def peak_memory(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(peak PSS, peak RSS) MiB of one command's process tree, sampled from /proc every 10 ms (a run apart
    from the timed ones: the sampler takes a share of the CPU)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    peak = (0.0, 0.0)
    while proc.poll() is None:
        pss, rss = _tree_memory_mib(proc.pid)
        peak = (max(peak[0], pss), max(peak[1], rss))
        time.sleep(0.01)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} failed with status {proc.returncode}")
    return peak


def _twin_set(folder: Path, ranks: int, steps: int) -> Path:
    import gzip

    import orjson

    from hpcwatch.twin.exposition import GpuTraceConfig, gpu_kineto_traces

    folder.mkdir(parents=True, exist_ok=True)
    docs = gpu_kineto_traces(
        GpuTraceConfig(slow_rank=2, slow_backward_factor=1.15), steps=list(range(steps)), world_size=ranks
    )
    for r, doc in docs.items():
        (folder / f"rank-{r}.json.gz").write_bytes(gzip.compress(orjson.dumps(doc), 6))
    return folder


def _cached_bytecode_env(folder: Path) -> dict[str, str]:
    """The environment with bytecode written and read under ``folder`` (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": str(folder)}


def main_whole(args) -> None:
    sets = {name: path for name, path in TRACES.items()}
    sets.update({Path(p).name: Path(p) for p in args.set})
    with tempfile.TemporaryDirectory() as tmp:
        env = _cached_bytecode_env(Path(tmp) / "pycache")
        script = Path(args.python).with_name("hpcwatch")  # what a user types: the venv's console script
        ours_cmd = [str(script), "steps"] if script.exists() else [args.python, "-m", "hpcwatch", "steps"]
        hta_cmd = [args.hta_python, "-c", _HTA_WHOLE]
        for cmd in (ours_cmd, hta_cmd):  # untimed: writes each side's bytecode
            wall_time(cmd + [str(TRACES["hta_sampled_2ranks"])], env=env)
        for steps in (args.twin_steps or [60]) if args.twin_ranks else ():
            name = f"twin_{args.twin_ranks}ranks_{steps}steps"
            sets[name] = _twin_set(Path(tmp) / name, args.twin_ranks, steps)
        print(
            f"ours: {' '.join(ours_cmd)} DIR --json; wall: best of {args.repeat}, alternating; memory: one "
            "more run each, sampled"
        )
        print(
            "set | MB gz (MB JSON), files | ours s | HTA s | speed-up | peak PSS MiB ours, HTA (ratio) | "
            "peak RSS summed MiB ours, HTA (ratio)"
        )
        for name, path in sets.items():
            folder = path
            if path.is_file():
                folder = Path(tmp) / name
                folder.mkdir()
                shutil.copy(path, folder / path.name)
            size = sum(f.stat().st_size for f in folder.iterdir())
            inflated = sum(len(__import__("gzip").open(f).read()) for f in folder.iterdir())
            ours_argv, hta_argv = ours_cmd + [str(folder), "--json"], hta_cmd + [str(folder)]
            ours, hta = [], []
            for _ in range(args.repeat):  # alternating, so that a slow spell of the machine hits both
                ours.append(wall_time(ours_argv, env=env))
                hta.append(wall_time(hta_argv, env=env))
            (pss, rss), (hta_pss, hta_rss) = peak_memory(ours_argv, env=env), peak_memory(hta_argv, env=env)
            print(
                f"{name} | {size / 2**20:.2f} ({inflated / 2**20:.1f}), {len(list(folder.iterdir()))} | "
                f"{min(ours):.3f} | {min(hta):.2f} | {min(hta) / min(ours):.1f}x | "
                f"{pss:.0f}, {hta_pss:.0f} ({pss / hta_pss:.2f}) | {rss:.0f}, {hta_rss:.0f} ({rss / hta_rss:.2f})"
            )
        helps = sorted(wall_time([*ours_cmd[:-1], "--help"], env=env) for _ in range(10))
    print(f"hpcwatch --help (10 runs): best {helps[0] * 1e3:.0f} ms, median {helps[5] * 1e3:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--whole", action="store_true", help="whole-process comparison (what a user runs)")
    parser.add_argument("--set", action="append", default=[], help="another trace folder or file (--whole)")
    parser.add_argument("--twin-ranks", type=int, default=8)
    parser.add_argument(
        "--twin-steps",
        type=int,
        action="append",
        default=[],
        help="steps of a twin set (repeatable; default 60; 360 is the 236 MB set)",
    )
    parser.add_argument("--hta-python", default="/tmp/hta/bin/python")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.whole:
        return main_whole(args)
    for name, path in TRACES.items():
        with tempfile.TemporaryDirectory() as tmp:
            if path.is_dir():
                shutil.copytree(path, tmp, dirs_exist_ok=True)
            else:
                shutil.copy(path, Path(tmp) / path.name)
            ours = _best([_run(args.python, "ours", Path(tmp)) for _ in range(args.repeat)])
            hta = _best([_run(args.hta_python, "hta", Path(tmp)) for _ in range(args.repeat)])
            hta_exact = _run(args.hta_python, "hta", Path(tmp), env=dict(os.environ, HTA_DISABLE_NS_ROUNDING="1"))
        _report(name, ours, hta)
        _report_exact(ours, hta_exact)


def _report(name: str, ours: dict, hta: dict) -> None:
    t_ours, t_hta = ours["load_s"] + ours["breakdown_s"], hta["load_s"] + hta["breakdown_s"]
    g_ours = ours["peak_rss_mib"] - ours["base_rss_mib"]
    g_hta = hta["peak_rss_mib"] - hta["base_rss_mib"]
    print(f"\n== {name}")
    print(
        f"time  load+breakdown: ours {t_ours:.3f} s (load {ours['load_s']:.3f}, breakdown {ours['breakdown_s']:.4f}, "
        f"+anatomy {ours['anatomy_s']:.3f}); HTA {t_hta:.3f} s (load {hta['load_s']:.3f}, "
        f"breakdown {hta['breakdown_s']:.3f})  -> {t_hta / t_ours:.1f}x faster"
    )
    print(
        f"CPU time load+breakdown: ours {ours['cpu_s']:.3f} s; HTA {hta['cpu_s']:.3f} s  -> "
        f"{hta['cpu_s'] / ours['cpu_s']:.1f}x less CPU (steadier than wall time on a shared machine)"
    )
    print(
        f"peak RSS: ours {ours['peak_rss_mib']:.0f} MiB (+{g_ours:.0f} over imports); HTA {hta['peak_rss_mib']:.0f} "
        f"MiB (+{g_hta:.0f})  -> {ours['peak_rss_mib'] / hta['peak_rss_mib']:.2f} of HTA's peak, "
        f"{g_ours / max(g_hta, 1e-9):.2f} of its growth"
    )
    if hta.get("note"):
        print(f"HTA: {hta['note']}")
    for rank, theirs in hta["numbers"].items():
        mine, exact = ours["numbers"][str(rank)], ours["exact"][str(rank)]
        labels = ("idle", "compute", "non_compute", "kernel")
        print(f"rank {rank} µs   HTA " + " ".join(f"{k}={v:.0f}" for k, v in zip(labels, theirs)))
        print(f"rank {rank} µs  ours " + " ".join(f"{k}={v:.0f}" for k, v in zip(labels, mine)) + "  (HTA rounding)")
        diff = max(abs(a / exact[3] - b / theirs[3]) for a, b in zip(exact[:3], theirs[:3]))
        print(
            f"rank {rank} µs exact "
            + " ".join(f"{k}={v:.1f}" for k, v in zip(labels, exact))
            + f"  (no rounding: max share difference {100 * diff:.2f} points)"
        )


def _report_exact(ours: dict, hta: dict) -> None:
    for rank, theirs in hta["numbers"].items():
        exact = ours["exact"][str(rank)]
        worst = max(abs(a - b) / max(abs(b), 1.0) for a, b in zip(exact, theirs))
        print(
            f"rank {rank} µs   HTA with HTA_DISABLE_NS_ROUNDING=1: "
            + " ".join(f"{v:.1f}" for v in theirs)
            + f"  -> ours differ by at most {100 * worst:.4f} %"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        role, trace_dir = sys.argv[2], sys.argv[3]
        print(json.dumps(child_ours(trace_dir) if role == "ours" else child_hta(trace_dir)))
    else:
        main()
