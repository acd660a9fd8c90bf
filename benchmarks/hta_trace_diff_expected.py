"""Pin HTA 0.5's TraceDiff.compare_traces on HTA's own example traces (run by hand, HTA in its own venv).

    /work/hta-venv/bin/python benchmarks/hta_trace_diff_expected.py > tests/data/kineto/hta_diff_expected.json

(the venv as benchmarks/hta_critical_path_expected.py says). For each case: HTA's row per name (counts and
total duration, µs, of each side; HTA never rounds them further). HTA is never a dependency of hpcwatch.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "kineto"
#: (name, control file, test file, control iterations, test iterations, device)
CASES = (
    ("base_vs_test_first", "hta_diff_base.json.gz", "hta_diff_test.json.gz", None, None, "ALL"),
    ("base_vs_test_1010", "hta_diff_base.json.gz", "hta_diff_test.json.gz", 1010, 1010, "ALL"),
    ("base_1009_vs_1010_gpu", "hta_diff_base.json.gz", "hta_diff_base.json.gz", 1009, 1010, "GPU"),
    ("rank3_first", "hta_diff_control_rank3.json.gz", "hta_diff_test_rank3.json.gz", None, None, "ALL"),
    (
        "rank3_cpu_1010_1011",
        "hta_diff_control_rank3.json.gz",
        "hta_diff_test_rank3.json.gz",
        [1010, 1011],
        [1010, 1011],
        "CPU",
    ),
)


def main() -> None:
    logging.disable(logging.WARNING)
    from hta.trace_diff import DeviceType, LabeledTrace, TraceDiff  # the HTA venv only

    out = {}
    for case, control, test, ci, ti, device in CASES:
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            shutil.copy(DATA / control, Path(a) / control)
            shutil.copy(DATA / test, Path(b) / test)
            lc, lt = LabeledTrace("c", trace_dir=a), LabeledTrace("t", trace_dir=b)
            df = TraceDiff.compare_traces(
                lc, lt, control_iteration=ci, test_iteration=ti, device_type=DeviceType[device]
            )
        rows = {
            str(name): [
                int(r["c_counts"]),
                int(r["t_counts"]),
                int(r["c_total_duration"]),
                int(r["t_total_duration"]),
                r["counts_change_categories"],
            ]
            for name, r in df.iterrows()
        }
        out[case] = {
            "control": control,
            "test": test,
            "control_iterations": [ci] if isinstance(ci, int) else ci,
            "test_iterations": [ti] if isinstance(ti, int) else ti,
            "device": device.lower(),
            "rows": rows,
        }
    json.dump({"hta": "0.5.0", "cases": out}, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
