"""Where one rank's GPU time goes: kernels, idle gaps, overlap, launches and collectives.

The analyses Holistic Trace Analysis users rely on, by HTA's own rules so the numbers
agree (each function names the HTA method it matches, and tests pin HTA 0.5.0's numbers
on real traces), plus the bandwidth of each collective, which HTA does not compute:

- ``kernel_breakdown``: GPU time per kernel kind (compute / communication / memory)
  and the top kernels by GPU time (HTA ``get_gpu_kernel_breakdown``).
- ``idle_breakdown``: the gaps between consecutive kernels of each stream, by cause
  (HTA ``get_idle_time_breakdown``)::

      host wait     CPU   launch0           launch1
                    GPU   |==kernel0==|       ·····|==kernel1==     (launched after kernel0 ended)
      kernel wait   GPU   |==kernel0==|·|==kernel1==                (gap < 30 µs, launched in time)
      other         GPU   |==kernel0==|··········|==kernel1==       (launched in time, waited on something)

- ``comm_compute_overlap``: the share of communication time during which compute
  kernels also run (HTA ``get_comm_comp_overlap``).
- ``launch_stats``: per launched kernel, its runtime call's duration, its GPU
  duration and the launch delay (HTA ``get_cuda_kernel_launch_stats``).
- ``collectives``: each NCCL kernel with its collective, message size, algorithm and
  bus bandwidth (nccl-tests' definitions).

Pure functions: a ``traces.KinetoTrace`` in, frozen structs (msgspec.Struct) out; times in µs as
in the trace (HTA's unit), bandwidths in bytes/s.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import msgspec
import numpy as np

from hpcwatch.analysis.steps import merge_intervals
from hpcwatch.traces import CAT, IS_GPU_CATEGORY, KinetoTrace

__all__ = [
    "KIND_COMPUTE",
    "KIND_COMMUNICATION",
    "KIND_MEMORY",
    "KIND_OTHER",
    "KINDS",
    "kernel_kinds",
    "KernelStat",
    "KernelBreakdown",
    "kernel_breakdown",
    "StreamIdle",
    "idle_breakdown",
    "comm_compute_overlap",
    "LaunchStats",
    "launch_stats",
    "Collective",
    "collectives",
    "bus_factor",
    "DEFAULT_CONSECUTIVE_KERNEL_DELAY_US",
    "DEFAULT_RUNTIME_CUTOFF_US",
    "DEFAULT_LAUNCH_DELAY_CUTOFF_US",
    "DEFAULT_TOP_KERNELS",
    "profiled_rows",
    "has_gpu_activity",
]

KIND_COMPUTE, KIND_COMMUNICATION, KIND_MEMORY, KIND_OTHER = "compute", "communication", "memory", "other"
KINDS: tuple[str, ...] = (KIND_COMPUTE, KIND_COMMUNICATION, KIND_MEMORY, KIND_OTHER)

# HTA's kernel kinds (hta/common/types.py: CommunicateKernelGroupingPattern, MemoryKernelGroupingPattern,
# ComputeKernelGroupingPattern, the last one an inverse match), used with re.match.
_COMM_RE = re.compile(r"(^nccl)")
_MEMORY_RE = re.compile(r"(^(hip)?Memcpy)|(^(hip)?Memset)|(^dma)")
_NOT_COMPUTE_RE = re.compile(r"(^nccl)|(.*Memcpy)|(.*Memset)|(.*dma)|(^.*Sync)|(cuda.*LaunchKernel)|(^runFunction)")

#: HTA's defaults (hta/trace_analysis.py): gaps under 30 µs are launch overhead ("kernel wait");
#: runtime calls over 50 µs and launch delays over 100 µs are outliers.
DEFAULT_CONSECUTIVE_KERNEL_DELAY_US = 30.0
DEFAULT_RUNTIME_CUTOFF_US = 50.0
DEFAULT_LAUNCH_DELAY_CUTOFF_US = 100.0
#: Kernels listed per kind (HTA's ``num_kernels`` default).
DEFAULT_TOP_KERNELS = 10
#: The runtime calls that launch GPU work (HTA's list in cuda_kernel_analysis.py, MTIA's left out).
_LAUNCH_NAMES = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync"})


def _kind_of(name: str) -> str:
    if _COMM_RE.match(name):
        return KIND_COMMUNICATION
    if _MEMORY_RE.match(name):
        return KIND_MEMORY
    return KIND_OTHER if _NOT_COMPUTE_RE.match(name) else KIND_COMPUTE


def kernel_kinds(trace: KinetoTrace) -> np.ndarray:
    """The kind code (index into ``KINDS``) of each name of ``trace.names``."""
    index = {k: i for i, k in enumerate(KINDS)}
    return np.array([index[_kind_of(n)] for n in trace.names] + [index[KIND_OTHER]], dtype=np.int8)


_STEP_RE = re.compile(r"ProfilerStep")


def profiled_rows(trace: KinetoTrace, *, include_last_step: bool = False) -> np.ndarray:
    """Whether each event is in the profiled steps, by HTA's rule (``Trace._filter_irrelevant_gpu_kernels``).

    With at least two ``ProfilerStep`` names, HTA keeps the host events that start before
    the last step starts (the last step is often cut short), or before it ends with
    ``include_last_step``, and the GPU activities launched by one of those (same
    correlation id); otherwise every event.
    """
    ev = trace.events
    steps = trace.name_mask(lambda n: _STEP_RE.search(n) is not None)
    host = ev["stream"] < 0
    marks = steps[ev["name_id"]] & host
    if steps.sum() < 2 or not marks.any():
        return np.ones(len(trace), dtype=bool)
    limit = (ev["ts_us"][marks] + ev["dur_us"][marks]).max() if include_last_step else ev["ts_us"][marks].max()
    kept_host = host & ((ev["ts_us"] <= limit) if include_last_step else (ev["ts_us"] < limit))
    launched = np.unique(ev["correlation"][kept_host & (ev["correlation"] >= 0)])
    kept: np.ndarray = kept_host | (~host & np.isin(ev["correlation"], launched) & (ev["correlation"] >= 0))
    return kept


def _profiled(trace: KinetoTrace, include_last_step: bool, kept: np.ndarray | None) -> np.ndarray:
    """``kept`` when the caller found it already (``profiled_rows``: each analysis below takes it, so a caller
    running several on one trace finds it once), else ``profiled_rows``."""
    return profiled_rows(trace, include_last_step=include_last_step) if kept is None else kept


def _gpu_rows(trace: KinetoTrace, kept: np.ndarray | None = None) -> np.ndarray:
    """GPU activities (kernels, memcpy, memset) with a stream, in file order (of ``kept`` only)."""
    ev = trace.events
    mask = IS_GPU_CATEGORY[ev["cat"]] & (ev["stream"] >= 0)
    return np.flatnonzero(mask if kept is None else mask & kept)


def has_gpu_activity(trace: KinetoTrace) -> bool:
    """Whether the trace has kernels, copies or memsets on a stream (not a CPU-only trace)."""
    return bool(len(_gpu_rows(trace)))


class KernelStat(msgspec.Struct, frozen=True, kw_only=True):
    """One kernel name on one rank."""

    name: str
    kind: str
    count: int
    total_us: float
    mean_us: float
    min_us: float
    max_us: float


class KernelBreakdown(msgspec.Struct, frozen=True, kw_only=True):
    """GPU time of one rank by kernel kind and by kernel."""

    rank: int
    kind_us: Mapping[str, float]
    """µs when exactly these kinds run (``"compute"``, ``"compute+communication"``…), as HTA's kernel-type table."""
    top: tuple[KernelStat, ...]
    """Per kind, the kernels with the most GPU time (``top`` of each), most first."""

    def kind_pct(self) -> dict[str, float]:
        total = sum(self.kind_us.values()) or 1.0
        return {k: 100 * v / total for k, v in self.kind_us.items()}


def kernel_breakdown(
    trace: KinetoTrace,
    *,
    top: int = DEFAULT_TOP_KERNELS,
    include_last_step: bool = False,
    kept: np.ndarray | None = None,
) -> KernelBreakdown:
    """GPU time per kind and the ``top`` kernels of each kind (HTA ``get_gpu_kernel_breakdown``).

    ``kind_us`` is HTA's kernel-type table: the time when exactly a given set of kinds runs,
    keyed ``"compute"``, ``"communication"``, ``"compute+communication"``… (union of each
    kind's kernels, overlaps split out, so the values add up to the GPU's busy time).
    """
    ev = trace.events
    rows = _gpu_rows(trace, _profiled(trace, include_last_step, kept))
    names, dur = ev["name_id"][rows], ev["dur_us"][rows]
    kinds = kernel_kinds(trace)[names]
    kind_us = _exclusive_kind_us(ev["ts_us"][rows], ev["ts_us"][rows] + dur, kinds)
    ids, inverse = np.unique(names, return_inverse=True)
    total = np.bincount(inverse, weights=dur, minlength=len(ids))
    count = np.bincount(inverse, minlength=len(ids))
    lo = np.full(len(ids), np.inf)
    hi = np.full(len(ids), -np.inf)
    np.minimum.at(lo, inverse, dur)
    np.maximum.at(hi, inverse, dur)
    stats = [
        KernelStat(
            name=trace.names[int(i)],
            kind=_kind_of(trace.names[int(i)]),
            count=int(count[j]),
            total_us=float(total[j]),
            mean_us=float(total[j] / count[j]),
            min_us=float(lo[j]),
            max_us=float(hi[j]),
        )
        for j, i in enumerate(ids)
    ]
    chosen = [s for k in KINDS for s in sorted((s for s in stats if s.kind == k), key=lambda s: -s.total_us)[:top]]
    return KernelBreakdown(rank=trace.rank, kind_us=kind_us, top=tuple(sorted(chosen, key=lambda s: -s.total_us)))


def _exclusive_kind_us(starts: np.ndarray, ends: np.ndarray, kinds: np.ndarray) -> dict[str, float]:
    """µs per set of kinds running at once, over the elementary segments between all interval ends."""
    merged = [merge_intervals(starts[kinds == i], ends[kinds == i]) for i in range(len(KINDS) - 1)]
    cuts = np.unique(np.concatenate([np.concatenate(m) for m in merged] or [np.zeros(0)]))
    if len(cuts) < 2:
        return {}
    mid, length = (cuts[1:] + cuts[:-1]) / 2, np.diff(cuts)
    code = np.zeros(len(mid), dtype=np.int64)
    for i, (s, e) in enumerate(merged):
        at = np.searchsorted(s, mid, side="right") - 1
        inside = (at >= 0) & (mid < e[np.clip(at, 0, None)]) if len(s) else np.zeros(len(mid), dtype=bool)
        code |= inside.astype(np.int64) << i
    out = {}
    for value in np.unique(code[code > 0]):
        label = "+".join(KINDS[i] for i in range(len(KINDS) - 1) if value >> i & 1)
        out[label] = float(length[code == value].sum())
    return out


class StreamIdle(msgspec.Struct, frozen=True, kw_only=True):
    """Idle time between consecutive GPU activities of one stream, by cause (µs)."""

    rank: int
    stream: int
    host_wait_us: float
    kernel_wait_us: float
    other_us: float

    @property
    def idle_us(self) -> float:
        return self.host_wait_us + self.kernel_wait_us + self.other_us


def _launch_ts(trace: KinetoTrace, rows: np.ndarray) -> np.ndarray:
    """Start (µs) of the host event with each row's correlation id (NaN when none)."""
    ev = trace.events
    host = np.flatnonzero((ev["stream"] < 0) & (ev["correlation"] >= 0) & (ev["cat"] == CAT["cuda_runtime"]))
    if len(host) == 0:
        return np.full(len(rows), np.nan)
    corr = ev["correlation"][host]
    order = np.argsort(corr, kind="stable")
    corr, ts = corr[order], ev["ts_us"][host][order]
    wanted = ev["correlation"][rows]
    pos = np.clip(np.searchsorted(corr, wanted), 0, len(corr) - 1)
    return np.where(corr[pos] == wanted, ts[pos], np.nan)


def idle_breakdown(
    trace: KinetoTrace,
    *,
    consecutive_kernel_delay_us: float = DEFAULT_CONSECUTIVE_KERNEL_DELAY_US,
    include_last_step: bool = False,
    kept: np.ndarray | None = None,
) -> tuple[StreamIdle, ...]:
    """Each stream's idle time as host wait, kernel wait or other (HTA ``get_idle_time_breakdown``).

    A gap before a kernel is host wait when the kernel's launch (its runtime call) started
    after the previous kernel ended; else kernel wait when shorter than
    ``consecutive_kernel_delay_us``; else other. HTA rounds times to whole µs first (so do
    its numbers); we keep the trace's times.
    """
    ev = trace.events
    rows = _gpu_rows(trace, _profiled(trace, include_last_step, kept))
    launch = _launch_ts(trace, rows)
    out = []
    for stream in np.unique(ev["stream"][rows]):
        mine = rows[ev["stream"][rows] == stream]
        order = np.argsort(ev["ts_us"][mine], kind="stable")
        mine, when = mine[order], launch[ev["stream"][rows] == stream][order]
        starts, ends = ev["ts_us"][mine], ev["ts_us"][mine] + ev["dur_us"][mine]
        gap = starts[1:] - ends[:-1]
        host = when[1:] > ends[:-1]
        kernel = ~host & (gap < consecutive_kernel_delay_us)
        out.append(
            StreamIdle(
                rank=trace.rank,
                stream=int(stream),
                host_wait_us=float(gap[host].sum()),
                kernel_wait_us=float(gap[kernel].sum()),
                other_us=float(gap[~host & ~kernel].sum()),
            )
        )
    return tuple(out)


def comm_compute_overlap(
    trace: KinetoTrace, *, include_last_step: bool = False, kept: np.ndarray | None = None
) -> float | None:
    """Share (0-1) of the communication kernels' time when compute kernels run too (HTA
    ``get_comm_comp_overlap`` ratio); ``None`` without communication kernels."""
    ev = trace.events
    rows = _gpu_rows(trace, _profiled(trace, include_last_step, kept))
    kinds = kernel_kinds(trace)[ev["name_id"][rows]]
    starts, ends = ev["ts_us"][rows], ev["ts_us"][rows] + ev["dur_us"][rows]
    comm = merge_intervals(starts[kinds == 1], ends[kinds == 1])
    comp = merge_intervals(starts[kinds == 0], ends[kinds == 0])
    comm_us = float((comm[1] - comm[0]).sum())
    if comm_us <= 0:
        return None
    return _intersection_us(comm, comp) / comm_us


def _intersection_us(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of the intersection of two sets of disjoint sorted intervals."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return 0.0
    # For each interval of a, the b intervals that may overlap it: from the first ending after its start.
    total = 0.0
    j0 = np.searchsorted(b[1], a[0], side="right")
    j1 = np.searchsorted(b[0], a[1], side="left")
    for s, e, lo, hi in zip(a[0], a[1], j0, j1):
        if hi > lo:
            total += float((np.minimum(b[1][lo:hi], e) - np.maximum(b[0][lo:hi], s)).clip(0).sum())
    return total


class LaunchStats(msgspec.Struct, frozen=True, kw_only=True):
    """Kernel launches of one rank: one entry per launched GPU activity (µs)."""

    rank: int
    cpu_us: np.ndarray
    """Duration of the runtime call (``cudaLaunchKernel``…)."""
    gpu_us: np.ndarray
    """Duration of the GPU activity it launched."""
    launch_delay_us: np.ndarray
    """GPU start − runtime call end, clipped at 0 (HTA's launch delay)."""
    runtime_cutoff_us: float
    launch_delay_cutoff_us: float

    @property
    def launches(self) -> int:
        return len(self.cpu_us)

    @property
    def short_kernels(self) -> int:
        """Kernels shorter on the GPU than their own launch call (HTA's "short kernels")."""
        return int(((self.cpu_us <= self.runtime_cutoff_us) & (self.gpu_us < self.cpu_us)).sum())

    @property
    def runtime_outliers(self) -> int:
        return int((self.cpu_us > self.runtime_cutoff_us).sum())

    @property
    def launch_delay_outliers(self) -> int:
        return int((self.launch_delay_us > self.launch_delay_cutoff_us).sum())

    def launch_delay_quantiles_us(self) -> dict[str, float]:
        if not self.launches:
            return {}
        q = np.quantile(self.launch_delay_us, [0.5, 0.95, 1.0])
        return {"p50": float(q[0]), "p95": float(q[1]), "max": float(q[2])}


def launch_stats(
    trace: KinetoTrace,
    *,
    runtime_cutoff_us: float = DEFAULT_RUNTIME_CUTOFF_US,
    launch_delay_cutoff_us: float = DEFAULT_LAUNCH_DELAY_CUTOFF_US,
    include_last_step: bool = False,
    kept: np.ndarray | None = None,
) -> LaunchStats:
    """Runtime call, GPU time and launch delay of each launch (HTA ``get_cuda_kernel_launch_stats``)."""
    ev = trace.events
    kept = _profiled(trace, include_last_step, kept)
    launches = trace.name_mask(lambda n: n in _LAUNCH_NAMES)
    host = np.flatnonzero(launches[ev["name_id"]] & (ev["stream"] < 0) & (ev["correlation"] >= 0) & kept)
    gpu = np.flatnonzero((ev["stream"] >= 0) & (ev["correlation"] >= 0) & IS_GPU_CATEGORY[ev["cat"]] & kept)
    order = np.argsort(ev["correlation"][host], kind="stable")
    host = host[order]
    corr = ev["correlation"][host]
    pos = np.clip(np.searchsorted(corr, ev["correlation"][gpu]), 0, max(len(corr) - 1, 0))
    matched = (corr[pos] == ev["correlation"][gpu]) if len(corr) else np.zeros(len(gpu), dtype=bool)
    gpu, cpu = gpu[matched], host[pos[matched]]
    delay = ev["ts_us"][gpu] - ev["ts_us"][cpu] - ev["dur_us"][cpu]
    return LaunchStats(
        rank=trace.rank,
        cpu_us=ev["dur_us"][cpu],
        gpu_us=ev["dur_us"][gpu],
        launch_delay_us=np.clip(delay, 0.0, None),
        runtime_cutoff_us=runtime_cutoff_us,
        launch_delay_cutoff_us=launch_delay_cutoff_us,
    )


# nccl-tests' bus bandwidth factors (doc/PERFORMANCE.md, https://github.com/NVIDIA/nccl-tests):
# busbw = algbw × factor(n); all-reduce moves 2(n-1)/n of the data per rank, all-gather and
# reduce-scatter (n-1)/n, broadcast and reduce 1. c10d's "Collective name" spellings.
_BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "_allgather_base": lambda n: (n - 1) / n,
    "allgather_into_tensor_coalesced": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "_reduce_scatter_base": lambda n: (n - 1) / n,
    "reduce_scatter_tensor_coalesced": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "alltoall_base": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def bus_factor(collective: str, group_size: int) -> float | None:
    """nccl-tests' busbw / algbw for ``collective`` over ``group_size`` ranks (``None`` when unknown)."""
    rule = _BUS_FACTORS.get(collective.lower())
    return None if rule is None or group_size < 1 else float(rule(group_size))


class Collective(msgspec.Struct, frozen=True, kw_only=True):
    """One NCCL kernel of one rank."""

    rank: int
    stream: int
    start_us: float
    dur_us: float
    kernel: str
    collective: str | None
    """c10d's ``Collective name`` (``allreduce``, ``broadcast``…), when the trace has it."""
    msg_bytes: float
    """Input message size (``In msg nelems`` × element size); NaN when unknown."""
    group_size: int | None
    algbw_bytes_s: float | None
    """msg_bytes / duration (nccl-tests' algorithm bandwidth)."""
    busbw_bytes_s: float | None
    """algbw × the collective's bus factor (all-reduce: 2(n−1)/n)."""


def collectives(trace: KinetoTrace) -> tuple[Collective, ...]:
    """Every communication kernel with its message size and bandwidths, in start order.

    The kernel's duration includes the time it waited for the last rank to arrive, so a
    rank that arrives early shows a low bandwidth: compare the last arriver's (or the
    median over ranks of the k-th collective) with nccl-tests' numbers.
    """
    ev = trace.events
    rows = _gpu_rows(trace)
    rows = rows[ev["comm"][rows]]
    rows = rows[np.argsort(ev["ts_us"][rows], kind="stable")]
    out = []
    for row in rows:
        coll = trace.names[ev["coll_id"][row]] if ev["coll_id"][row] >= 0 else None
        size, dur = float(ev["msg_bytes"][row]), float(ev["dur_us"][row])
        group = int(ev["group_size"][row]) if ev["group_size"][row] > 0 else trace.world_size
        algbw = size / (dur / 1e6) if np.isfinite(size) and dur > 0 else None
        factor = bus_factor(coll, group) if coll is not None and group else None
        out.append(
            Collective(
                rank=trace.rank,
                stream=int(ev["stream"][row]),
                start_us=float(ev["ts_us"][row]),
                dur_us=dur,
                kernel=trace.names[ev["name_id"][row]],
                collective=coll,
                msg_bytes=size,
                group_size=group,
                algbw_bytes_s=algbw,
                busbw_bytes_s=algbw * factor if algbw is not None and factor is not None else None,
            )
        )
    return tuple(out)
