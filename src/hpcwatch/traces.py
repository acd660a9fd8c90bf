"""Columnar batches of traces, shared by the readers (``sources``) and the analyses.

A trace of millions of events travels as numpy columns, never as one Python object per
event (a Python object costs ~100 bytes, millions of them gigabytes); this module says once what the columns are, so a reader fills them and
an analysis reads them without importing each other. Like ``records.py`` it imports
nothing of ours but ``records`` and ``errors``.

``KinetoTrace`` is one rank's PyTorch profiler (Kineto) trace, as
``sources.kineto.read_kineto`` builds it.

The columns of ``KinetoTrace.events`` (``EVENT_COLUMNS``, complete events ``ph == "X"``
only, in file order):

===============  =======  ============================================================
column           dtype    meaning
===============  =======  ============================================================
``ts_us``        float64  start, µs on the trace's clock (Kineto: µs since boot-ish
                          origin; ``KinetoTrace.base_time_ns`` anchors it to UTC)
``dur_us``       float64  duration, µs (0 when missing)
``cat``          int8     category code, index into ``CATEGORIES`` (``OTHER`` = unknown)
``name_id``      int32    index into ``KinetoTrace.names``
``stream``       int32    GPU stream for GPU activities, ``-1`` for host events
``pid``          int64    process (host) or device (GPU) id
``tid``          int64    thread (host) or stream id (GPU)
``correlation``  int64    CUDA correlation id linking a launch to its kernel; -1 when none
``comm``         bool     a collective: NCCL kernel (``ncclKernel_*``, ``ncclDevKernel_*``),
                          ``nccl:*`` / ``gloo:*`` annotation or ``c10d::`` op
``coll_id``      int32    ``Collective name`` arg (index into ``names``); -1 when none
``msg_bytes``    float64  ``In msg nelems`` × element size (NaN when unknown)
``group_size``   int32    ``Group size`` arg: ranks in the collective; -1 when none
``wait_stream``  int32    ``wait_on_stream`` arg of a ``cuda_sync`` event (Event Sync, Stream Wait
                          Event): the stream the awaited CUDA event was recorded on; -1 when none
``wait_corr``    int64    ``wait_on_cuda_event_record_corr_id``: correlation of that
                          ``cudaEventRecord``; -1 when none
===============  =======  ============================================================

Flow events (``ph`` ``s``/``f``: ``ac2g`` launch→kernel, ``fwdbwd`` forward→backward) are
not kept: a launch finds its kernel through ``correlation``, which Kineto writes on both (the
``ac2g`` flow's id is that same number), and no analysis reads ``fwdbwd``. On a kernel-level
trace they are half the events, and their columns cost the reader ~15 % of its time.

"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["KinetoTrace", "CATEGORIES", "CAT", "EVENT_COLUMNS", "GPU_CATEGORIES", "IS_GPU_CATEGORY", "gc_paused"]

#: Event categories we tell apart; the code of a category is its index here.
#: https://github.com/pytorch/kineto/blob/main/libkineto/include/ActivityType.h
CATEGORIES: tuple[str, ...] = (
    "other",
    "cpu_op",
    "user_annotation",
    "gpu_user_annotation",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "cuda_runtime",
    "cuda_driver",
    "python_function",
    "overhead",
    "Trace",
    "cuda_sync",
    "cuda_profiler_range",
)
CAT: Mapping[str, int] = {name: code for code, name in enumerate(CATEGORIES)}
#: Codes of activities that run on the GPU (they have a stream).
GPU_CATEGORIES: tuple[int, ...] = (CAT["kernel"], CAT["gpu_memcpy"], CAT["gpu_memset"])
#: Whether each category code is in ``GPU_CATEGORIES``: ``IS_GPU_CATEGORY[events["cat"]]`` is a table lookup,
#: ~10× cheaper than ``np.isin`` on the column (which sorts or builds a table each call).
IS_GPU_CATEGORY: np.ndarray = np.isin(np.arange(len(CATEGORIES)), GPU_CATEGORIES)

EVENT_COLUMNS: tuple[str, ...] = (
    "ts_us",
    "dur_us",
    "cat",
    "name_id",
    "stream",
    "pid",
    "tid",
    "correlation",
    "comm",
    "coll_id",
    "msg_bytes",
    "group_size",
    "wait_stream",
    "wait_corr",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class KinetoTrace:
    """One rank's trace as columns (see the module docstring for each column)."""

    path: str
    rank: int
    world_size: int | None
    rank_from: str
    """Where ``rank`` came from: ``distributedInfo`` or ``filename``."""
    names: tuple[str, ...]
    events: Mapping[str, np.ndarray]
    base_time_ns: int | None = None
    """UTC ns of the trace clock's origin (``baseTimeNanoseconds``), when written."""
    backend: str | None = None
    """``distributedInfo.backend`` (``nccl``, ``gloo``)."""
    devices: tuple[str, ...] = ()
    """GPU names of ``deviceProperties`` (device index order)."""
    hostname: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """The other top-level keys (without ``traceEvents``)."""
    counters: Mapping[int, Mapping[str, float]] = field(default_factory=dict)
    """CUPTI counters by row: the numeric args of each ``cuda_profiler_range`` event (Kineto's range-profiler
    mode writes one such event per kernel instead of the kernel's own event)."""

    def __len__(self) -> int:
        return len(self.events["ts_us"])

    def name_ids(self, predicate) -> np.ndarray:
        """Sorted ids of the names for which ``predicate(name)`` is true."""
        return np.array([i for i, n in enumerate(self.names) if predicate(n)], dtype=np.int32)

    def name_mask(self, predicate) -> np.ndarray:
        """Whether ``predicate(name)`` holds, by name id: ``name_mask(p)[events["name_id"]]`` is the events'
        mask (a lookup, where ``np.isin(name_id, name_ids(p))`` sorts)."""
        return np.array([bool(predicate(n)) for n in self.names], dtype=bool)

    def to_utc_s(self, ts_us: np.ndarray | float) -> np.ndarray | float:
        """Trace µs to UTC seconds (trace seconds when the origin is unknown)."""
        origin_s = (self.base_time_ns or 0) / 1e9
        return origin_s + np.asarray(ts_us) / 1e6


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a trace is read or walked, then as it was.

    Reading allocates ~3 containers an event and the critical path's graph ~4 a node, none of them in a
    cycle; each collection would walk every object made so far, and the imports' (a fifth of the critical
    path's time on a 0.75 MB trace, and ~6 % of the reader's instructions on a 10 MB one).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
