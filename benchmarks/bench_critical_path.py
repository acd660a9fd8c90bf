"""Whole-process time of ``hpcwatch steps TRACE --critical-path --json`` vs a script calling HTA 0.5 on it.

Both as a user types them, start-up included (median of ``--repeat`` runs, wall clock; each command runs once
untimed first and both keep their bytecode caches, as installed packages do, under a temporary
``PYTHONPYCACHEPREFIX`` so the worktree stays clean):

    .venv/bin/python benchmarks/bench_critical_path.py --hta-python /work/hta-venv/bin/python

``--before SRC`` also times another checkout's ``src`` (an older hpcwatch) in the same run, so a change is
measured against what it replaces at the same load; the load average is printed at the start and the end.

Then, in the same run, each side **in process** (the median of ``--repeat`` runs in one process, after one run
that loads what the command loads on first use: the work without the interpreter's start-up and the imports)
and the **start-up floors** of both interpreters: ``python -c pass``, ``import numpy``, ``hpcwatch --help``,
HTA's ``from hta.trace_analysis import TraceAnalysis``. On HTA's 0.02 MB traces HTA's whole process is ~0.9 s,
nearly all its imports, and ten times less is below our interpreter with numpy imported: there the whole-process
ratio is the ratio of the two start-ups, the in-process one the ratio of the two analyses.

HTA runs in its own venv (``HolisticTraceAnalysis==0.5.0 pandas==2.2.3``); it is never a dependency of hpcwatch.
The HTA script is the few lines of HTA's documentation: TraceAnalysis(trace_dir=...), critical_path_analysis,
get_critical_path_breakdown (HTA reads every trace of a folder, so each trace is copied alone into one).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "kineto"
CASES = (
    ("hta_cp_simple_add.json.gz", "[param|pytorch.model.alex_net|0|0|0|measure|forward]", 1),
    ("hta_alexnet_stream_sync.json.gz", "[param|pytorch.model.alex_net|0|0|0|measure|forward]", 1),
    ("hta_gpu_lags_host_rank0.json.gz", "ProfilerStep", 1),
    ("hta_a100_nccl_rank0.json.gz", "ProfilerStep", 0),
    ("h200_annotated_steps.json.gz", "ProfilerStep", 0),
)
#: The median CPU seconds of each ``_time`` call, in call order: on a shared machine the wall clock also counts
#: the time the process waited for a core, the CPU time does not.
CPU_TIMES: list[float] = []
HTA_SCRIPT = """
import logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
t = TraceAnalysis(trace_dir=sys.argv[1])
g, ok = t.critical_path_analysis(rank=0, annotation=sys.argv[2], instance_id=int(sys.argv[3]))
df = g.get_critical_path_breakdown()
print(int(df.duration.sum()))
"""
#: Both in-process scripts print the median seconds of ``repeat`` runs after an untimed one.
OURS_IN_PROCESS = """
import statistics, sys, time
from click.testing import CliRunner
from hpcwatch.cli import app
repeat, args = int(sys.argv[1]), sys.argv[2:]
runner, times = CliRunner(), []
for _ in range(repeat + 1):
    t = time.perf_counter()
    done = runner.invoke(app, args)
    times.append(time.perf_counter() - t)
    assert done.exit_code == 0, done.output
print(statistics.median(times[1:]))
"""
HTA_IN_PROCESS = """
import logging, statistics, sys, time
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
repeat, folder, annotation, instance = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
times = []
for _ in range(repeat + 1):
    t = time.perf_counter()
    g, ok = TraceAnalysis(trace_dir=folder).critical_path_analysis(rank=0, annotation=annotation, instance_id=instance)
    g.get_critical_path_breakdown()
    times.append(time.perf_counter() - t)
print(statistics.median(times[1:]))
"""


def _env(pycache: str, src: Path = ROOT / "src") -> dict[str, str]:
    """The environment every timed command runs in: ``src`` first on the path, bytecode cached under ``pycache``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return env | {"PYTHONPATH": str(src), "PYTHONPYCACHEPREFIX": pycache}


def _time(cmd: list[str], repeat: int, pycache: str, src: Path = ROOT / "src") -> tuple[float, str]:
    """Median wall time of ``repeat`` runs after one untimed run (which writes the bytecode caches); the median
    CPU time (user + system, of the process and its children) of the same runs goes to ``CPU_TIMES``."""
    times, cpu, out = [], [], ""
    env = _env(pycache, src)
    subprocess.run(cmd, capture_output=True, check=False, env=env)
    for _ in range(repeat):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        times.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        if done.returncode != 0:
            raise SystemExit(f"{cmd[0]} failed: {done.stderr.strip().splitlines()[-1:]}")
        out = done.stdout
    CPU_TIMES.append(statistics.median(cpu))
    return statistics.median(times), out


def _in_process(cmd: list[str], pycache: str) -> float:
    """What one of the ``*_IN_PROCESS`` scripts printed: the median seconds of its runs in one process."""
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=_env(pycache))
    if done.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed: {done.stderr.strip().splitlines()[-1:]}")
    return float(done.stdout.split()[-1])


def _floors(hta_python: str, repeat: int, pycache: str) -> None:
    """The start-up of each interpreter and of what each side imports first, whole process (median)."""
    print("start-up floors, whole process (median s):")
    for label, cmd in (
        ("python -c pass", [sys.executable, "-c", "pass"]),
        ("python -c 'import numpy'", [sys.executable, "-c", "import numpy"]),
        ("hpcwatch steps --help", [sys.executable, "-m", "hpcwatch", "steps", "--help"]),
        ("HTA's python -c pass", [hta_python, "-c", "pass"]),
        ("HTA: import TraceAnalysis", [hta_python, "-c", "from hta.trace_analysis import TraceAnalysis"]),
    ):
        print(f"  {label:36} {_time(cmd, repeat, pycache)[0]:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hta-python", required=True)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--before", type=Path, help="another checkout's src/ to time too (e.g. main's)")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} at the start")
    # ``python -m hpcwatch`` with this checkout's src first: what the ``hpcwatch`` entry point runs, from this tree
    hpcwatch = [sys.executable, "-m", "hpcwatch"]
    pycache = tempfile.mkdtemp(prefix="bench-cp-pyc-")
    before_col = f" {'before s':>8} {'×':>5}" if args.before else ""
    print(f"{'trace':36} {'MB':>5} {'hpcwatch s':>10} {'HTA s':>7} {'×':>5}{before_col}  path µs (ours / HTA)")
    for name, annotation, instance in CASES:
        trace = DATA / name
        cmd = [
            *hpcwatch,
            "steps",
            str(trace),
            "--critical-path",
            "--annotation",
            annotation,
            "--instance",
            str(instance),
            "--json",
        ]
        ours, ours_out = _time(cmd, args.repeat, pycache)
        before = _time(cmd, args.repeat, pycache, args.before)[0] if args.before else None
        length = json.loads(ours_out)["length_us"]
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(trace, Path(tmp) / name)
            script = Path(tmp) / "hta_cp.py"
            script.write_text(HTA_SCRIPT)
            theirs, hta_out = _time(
                [args.hta_python, str(script), tmp, annotation, str(instance)], args.repeat, pycache
            )
        mb = trace.stat().st_size / 1e6
        was = f" {before:8.3f} {theirs / before:5.1f}" if before is not None else ""
        print(f"{name:36} {mb:5.2f} {ours:10.3f} {theirs:7.3f} {theirs / ours:5.1f}{was}  {length} / {hta_out.strip()}")
        cpu = CPU_TIMES[-3:] if before is not None else [CPU_TIMES[-2], CPU_TIMES[-1]]
        cpu_was = f" {cpu[1]:8.3f} {cpu[-1] / cpu[1]:5.1f}" if before is not None else ""
        print(f"{'  CPU s (user + system)':42} {cpu[0]:10.3f} {cpu[-1]:7.3f} {cpu[-1] / cpu[0]:5.1f}{cpu_was}")
        ours_in = _in_process([sys.executable, "-c", OURS_IN_PROCESS, str(args.repeat), *cmd[3:]], pycache)
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(trace, Path(tmp) / name)
            hta_cmd = [args.hta_python, "-c", HTA_IN_PROCESS, str(args.repeat), tmp, annotation, str(instance)]
            theirs_in = _in_process(hta_cmd, pycache)
        print(f"{'  in process s':42} {ours_in:10.3f} {theirs_in:7.3f} {theirs_in / ours_in:5.1f}")
    _floors(args.hta_python, args.repeat, pycache)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
