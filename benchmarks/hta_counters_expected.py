"""Pin HTA 0.5's CUPTI counter analysis on HTA's example trace (run by hand, HTA in its own venv).

    /work/hta-venv/bin/python benchmarks/hta_counters_expected.py > tests/data/kineto/hta_counters_expected.json

(the venv as benchmarks/hta_critical_path_expected.py says): ``get_cupti_counter_data_with_operators``'s row
per profiled kernel, in start order: its name, the top and bottom ``cpu_op`` of its launch's stack, and its
counters. HTA is never a dependency of hpcwatch.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "kineto"
TRACE = "hta_cupti_counters.json.gz"


def main() -> None:
    logging.disable(logging.WARNING)
    from hta.analyzers.cupti_counter_analysis import CUDA_SASS_INSTRUCTION_COUNTER_FLOPS
    from hta.trace_analysis import TraceAnalysis  # the HTA venv only

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(DATA / TRACE, Path(tmp) / TRACE)
        df = TraceAnalysis(trace_dir=tmp).get_cupti_counter_data_with_operators()[0]
    counters = sorted(CUDA_SASS_INSTRUCTION_COUNTER_FLOPS)
    rows = [
        {
            "name": r["name"],
            "top_level_op": r["top_level_op"],
            "bottom_level_op": r["bottom_level_op"],
            "op_stack": list(r["op_stack"]),
            "counters": {c: float(r[c]) for c in counters},
        }
        for _, r in df.sort_values("ts", kind="stable").iterrows()
    ]
    json.dump({"hta": "0.5.0", "trace": TRACE, "rows": rows}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
