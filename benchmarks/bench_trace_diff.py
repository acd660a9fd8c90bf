"""Whole-process time of ``hpcwatch steps A --compare B --json`` vs a script calling HTA 0.5's TraceDiff on them.

As ``bench_critical_path.py`` times them (as typed, start-up included, median of ``--repeat`` runs after one
untimed one, bytecode cached under a temporary ``PYTHONPYCACHEPREFIX``), on HTA's own TraceDiff example traces:

    .venv/bin/python benchmarks/bench_trace_diff.py --hta-python /work/hta-venv/bin/python [--before SRC]

The HTA script is its documented use: ``LabeledTrace(trace_dir=...)`` for each side and
``TraceDiff.compare_traces`` (each trace copied alone into a folder, as HTA reads every trace of one).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from bench_critical_path import CPU_TIMES, DATA, _time

#: (control, test, control iterations, test iterations, device)
CASES = (
    ("hta_diff_base.json.gz", "hta_diff_test.json.gz", None, None, "all"),
    ("hta_diff_control_rank3.json.gz", "hta_diff_test_rank3.json.gz", None, None, "all"),
    ("hta_diff_control_rank3.json.gz", "hta_diff_test_rank3.json.gz", "1010-1011", "1010-1011", "cpu"),
)
HTA_SCRIPT = """
import logging, sys
logging.disable(logging.WARNING)
from hta.trace_diff import DeviceType, LabeledTrace, TraceDiff
def its(arg):
    if arg == "-":
        return None
    lo, _, hi = arg.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))
df = TraceDiff.compare_traces(
    LabeledTrace("c", trace_dir=sys.argv[1]), LabeledTrace("t", trace_dir=sys.argv[2]),
    control_iteration=its(sys.argv[3]), test_iteration=its(sys.argv[4]), device_type=DeviceType[sys.argv[5]],
)
print(len(df))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hta-python", required=True)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--before", type=Path, help="another checkout's src/ to time too (e.g. main's)")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} at the start")
    pycache = tempfile.mkdtemp(prefix="bench-diff-pyc-")
    before_col = f" {'before s':>8} {'×':>5}" if args.before else ""
    print(f"{'control → test':62} {'hpcwatch s':>10} {'HTA s':>7} {'×':>5}{before_col}  names (ours / HTA)")
    for control, test, ci, ti, device in CASES:
        cmd = [sys.executable, "-m", "hpcwatch", "steps", str(DATA / control), "--compare", str(DATA / test)]
        cmd += ["--step", ci] if ci else []
        cmd += ["--compare-step", ti] if ti else []
        cmd += ["--device", device, "--json"]
        ours, out = _time(cmd, args.repeat, pycache)
        names = len(json.loads(out)["changes"])
        before = _time(cmd, args.repeat, pycache, args.before)[0] if args.before else None
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            shutil.copy(DATA / control, Path(a) / control)
            shutil.copy(DATA / test, Path(b) / test)
            script = Path(a).parent / f"hta_diff_{os.getpid()}.py"
            script.write_text(HTA_SCRIPT)
            try:
                hta_cmd = [args.hta_python, str(script), a, b, ci or "-", ti or "-", device.upper()]
                theirs, hta_out = _time(hta_cmd, args.repeat, pycache)
            finally:
                script.unlink()
        case = f"{control} → {test}" + (f" {ci}" if ci else "") + f" {device}"
        was = f" {before:8.3f} {theirs / before:5.1f}" if before is not None else ""
        print(f"{case:62} {ours:10.3f} {theirs:7.3f} {theirs / ours:5.1f}{was}  {names} / {hta_out.strip()}")
        cpu = CPU_TIMES[-3:] if before is not None else [CPU_TIMES[-2], CPU_TIMES[-1]]
        cpu_was = f" {cpu[1]:8.3f} {cpu[-1] / cpu[1]:5.1f}" if before is not None else ""
        print(f"{'  CPU s (user + system)':62} {cpu[0]:10.3f} {cpu[-1]:7.3f} {cpu[-1] / cpu[0]:5.1f}{cpu_was}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
