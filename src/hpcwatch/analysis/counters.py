"""CUPTI counters of each kernel, tied to the PyTorch ops that launched it: HTA's counter analysis.

HTA 0.5's ``get_cupti_counter_data_with_operators`` (``hta/analyzers/cupti_counter_analysis.py``): a
trace taken in Kineto's CUPTI range-profiler mode has one ``cuda_profiler_range`` event per kernel (named
after the kernel, its ``args`` the counters measured on it, e.g.
``smsp__sass_thread_inst_executed_op_ffma_pred_on.sum``) and no kernel events. HTA pairs the n-th range
(start order) with the n-th ``cudaLaunchKernel*`` call (start order) and names the ``cpu_op`` stack above
that launch: its outermost (top) and innermost (bottom) op. Tests pin HTA 0.5.0's rows on HTA's own
example trace (``tests/data/kineto/hta_counters_expected.json``): same kernels, ops, stacks and counters.

What we add: FLOPs where the SASS instruction counters are there (HTA's own weights,
``CUDA_SASS_INSTRUCTION_COUNTER_FLOPS``: an FMA counts 2), and the counters summed by top-level op. Where
launches and ranges do not pair up (HTA gives up with an error) we keep the counters and leave the ops
out, saying so (``paired`` False). Pure function: a ``traces.KinetoTrace`` in, frozen structs out.
"""

from __future__ import annotations

from collections import defaultdict

import msgspec
import numpy as np

from hpcwatch.analysis.critical_path import _call_stack, hta_columns
from hpcwatch.traces import CAT, KinetoTrace

__all__ = ["SASS_FLOP_WEIGHTS", "KernelCounters", "OpCounters", "CounterReport", "kernel_counters"]

#: HTA's ``CUDA_SASS_INSTRUCTION_COUNTER_FLOPS``: FLOPs per executed SASS instruction, by counter.
SASS_FLOP_WEIGHTS: dict[str, float] = {
    f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum": 2.0 if "fma" in op else 1.0
    for op in ("ffma", "fmul", "fadd", "hfma", "hmul", "hadd", "dfma", "dmul", "dadd")
}


class KernelCounters(msgspec.Struct, frozen=True, kw_only=True):
    row: int
    """Row of its ``cuda_profiler_range`` event."""
    name: str
    ts_us: float
    dur_us: float
    """The range's duration (µs, trace clock): a profiled replay, not the kernel's time in a normal run."""
    counters: dict[str, float]
    flops: float | None
    """Σ SASS counter × HTA's weight, when every SASS FLOP counter is measured; None otherwise."""
    op_stack: tuple[str, ...]
    """``cpu_op`` names above its launch, outermost first (empty when unpaired)."""
    top_level_op: str
    bottom_level_op: str


class OpCounters(msgspec.Struct, frozen=True, kw_only=True):
    op: str
    kernels: int
    counters: dict[str, float]
    flops: float | None


class CounterReport(msgspec.Struct, frozen=True, kw_only=True):
    kernels: tuple[KernelCounters, ...]
    """In start order."""
    by_top_level_op: tuple[OpCounters, ...]
    """Most FLOPs (else most kernels) first."""
    counter_names: tuple[str, ...]
    paired: bool
    """Every range was paired with a launch (HTA's requirement); False: ops are left out."""
    launches: int


def _flops(counters: dict[str, float]) -> float | None:
    if not all(k in counters for k in SASS_FLOP_WEIGHTS):
        return None
    return sum(counters[k] * w for k, w in SASS_FLOP_WEIGHTS.items())


def kernel_counters(trace: KinetoTrace) -> CounterReport | None:
    """The counters of each profiled kernel with its ops; None when the trace has no ``cuda_profiler_range``."""
    if not trace.counters:
        return None
    c = hta_columns(trace)
    names = trace.names
    ranges = sorted(trace.counters)
    ranges = [ranges[k] for k in np.argsort(np.array([c.ts[r] for r in ranges]), kind="quicksort").tolist()]
    launch_names = {i for i, n in enumerate(names) if n.startswith("cudaLaunchKernel")}  # HTA: str.match
    runtime = CAT["cuda_runtime"]
    launches = [r for r in range(len(c.ts)) if c.cat[r] == runtime and c.name[r] in launch_names]
    launches = [launches[k] for k in np.argsort(np.array([c.ts[r] for r in launches]), kind="quicksort").tolist()]
    paired = len(launches) == len(ranges)
    stacks = _op_stacks(trace, launches) if paired else {}
    kernels = []
    for i, r in enumerate(ranges):
        counters = dict(trace.counters[r])
        stack = stacks.get(launches[i], ()) if paired else ()
        kernels.append(
            KernelCounters(
                row=r,
                name=names[c.name[r]],
                ts_us=float(trace.events["ts_us"][r]),
                dur_us=float(trace.events["dur_us"][r]),
                counters=counters,
                flops=_flops(counters),
                op_stack=stack,
                top_level_op=stack[0] if stack else "",
                bottom_level_op=stack[-1] if stack else "",
            )
        )
    counter_names = sorted({k for kc in kernels for k in kc.counters})
    grouped: dict[str, list[KernelCounters]] = defaultdict(list)
    for kc in kernels:
        if kc.top_level_op:
            grouped[kc.top_level_op].append(kc)
    by_op = []
    for op, ks in grouped.items():
        total: dict[str, float] = defaultdict(float)
        for kc in ks:
            for k, v in kc.counters.items():
                total[k] += v
        flops = [kc.flops for kc in ks]
        by_op.append(
            OpCounters(
                op=op,
                kernels=len(ks),
                counters=dict(total),
                flops=None if any(f is None for f in flops) else sum(f for f in flops if f is not None),
            )
        )
    by_op.sort(key=lambda o: (-(o.flops or 0.0), -o.kernels, o.op))
    return CounterReport(
        kernels=tuple(kernels),
        by_top_level_op=tuple(by_op),
        counter_names=tuple(counter_names),
        paired=paired,
        launches=len(launches),
    )


def _op_stacks(trace: KinetoTrace, launches: list[int]) -> dict[int, tuple[str, ...]]:
    """The ``cpu_op`` names above each launch on its thread (outermost first)."""
    c = hta_columns(trace)
    names = trace.names
    cpu_op = CAT["cpu_op"]
    by_thread: dict[tuple[int, int], list[int]] = defaultdict(list)
    for r in range(len(c.ts)):
        if c.stream[r] < 0:
            by_thread[(c.pid[r], c.tid[r])].append(r)
    wanted = set(launches)
    stacks: dict[int, tuple[str, ...]] = {}
    for rows in by_thread.values():
        if not wanted.intersection(rows):
            continue
        _, parent = _call_stack(rows, c)
        for r in wanted.intersection(rows):
            chain: list[int] = []
            p = parent.get(r, -1)
            seen = 0
            while p >= 0 and seen < len(rows):  # a parent chain is at most the thread's events long
                chain.append(p)
                p = parent.get(p, -1)
                seen += 1
            stacks[r] = tuple(names[c.name[x]] for x in reversed(chain) if c.cat[x] == cpu_op)
    return stacks
