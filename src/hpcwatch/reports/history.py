"""The last minutes of a GPU or a node, for the page's sparklines and time range.

Takes a *samples source*, not a Store: ``Store.samples`` and ``PrometheusBackend.samples``
(promql.py) return the same table (``SAMPLE_SCHEMA``, same filters, same order), so the
sparklines of ``hpcwatch serve --prometheus`` and of the embedded store are one code path.

Each series is cut into ``points`` equal buckets over ``[t1 - range_s, t1]``; a bucket holds
the mean of its samples (a node: the mean over its GPUs, power summed), ``None`` where none fell::

    samples  ·· · ···  ·  ···· ·· ·        ·· ·
    buckets [ m ][ m ][ m ][ m ][None][ m ]...   mean per bucket, None = no scrape in it
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hpcwatch import vocab
from hpcwatch.errors import InputError
from hpcwatch.reports.live import GPU_FIELDS

__all__ = [
    "SamplesSource",
    "Series",
    "History",
    "HISTORY_METRICS",
    "HISTORY_RANGES_S",
    "DEFAULT_POINTS",
    "element_history",
]

#: What a sparkline shows: dcgm-exporter's utilisation (%), power (W) and temperature (°C)
#: (https://github.com/NVIDIA/dcgm-exporter/blob/main/etc/default-counters.csv).
HISTORY_METRICS = (vocab.DCGM_FI_DEV_GPU_UTIL, vocab.DCGM_FI_DEV_POWER_USAGE, vocab.DCGM_FI_DEV_GPU_TEMP)
#: The page's time ranges: 5 min, 15 min, 1 h (dcgm-exporter scrapes every 30 s by default, so 1 h is
#: still 120 points; longer belongs in Grafana, deploy/grafana/).
HISTORY_RANGES_S = (300.0, 900.0, 3600.0)
#: Buckets per sparkline: one per 5 s over 5 min. Ours: about the pixels of a 240 px line, every 4 px.
DEFAULT_POINTS = 60
#: A node's power is the sum over its GPUs; the other fields are means.
_SUMMED = {vocab.DCGM_FI_DEV_POWER_USAGE}


class SamplesSource(Protocol):
    """Anything with ``samples(metric, host=, t0=, t1=) -> pa.Table`` of ``SAMPLE_SCHEMA``."""

    def samples(
        self,
        metric: str | list[str] | None = None,
        *,
        host: str | None = None,
        job: str | None = None,
        t0: float | None = None,
        t1: float | None = None,
    ) -> pa.Table: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Series:
    field: str
    """The live snapshot's name for it: ``util_pct``, ``power_w``, ``temp_c``."""
    metric: str
    values: tuple[float | None, ...]
    """One per bucket, oldest first; None where no sample fell."""


@dataclass(frozen=True, slots=True, kw_only=True)
class History:
    host: str
    gpu: str | None
    """None: the whole node."""
    t0: float
    t1: float
    step_s: float
    series: tuple[Series, ...]


def element_history(
    source: SamplesSource, *, host: str, gpu: str | None, t1: float, range_s: float, points: int = DEFAULT_POINTS
) -> History:
    """The last ``range_s`` seconds before ``t1`` of one GPU (``gpu`` its index) or of a whole node."""
    if not (range_s > 0 and math.isfinite(range_s)):
        raise InputError(f"range_s must be a positive number of seconds, got {range_s!r}")
    if points < 1:
        raise InputError(f"points must be >= 1, got {points!r}")
    t0 = t1 - range_s
    table = source.samples(list(HISTORY_METRICS), host=host, t0=t0, t1=t1)
    if gpu is not None:
        table = table.filter(pc.equal(table["gpu"], gpu))
    step = range_s / points
    series = tuple(_series(table, metric, t0, step, points, whole_node=gpu is None) for metric in HISTORY_METRICS)
    return History(host=host, gpu=gpu, t0=t0, t1=t1, step_s=step, series=series)


def _series(table: pa.Table, metric: str, t0: float, step: float, points: int, *, whole_node: bool) -> Series:
    rows = table.filter(pc.equal(table["metric"], metric))
    field, scale = GPU_FIELDS[metric]
    t = rows["t"].to_numpy(zero_copy_only=False)
    v = rows["value"].to_numpy(zero_copy_only=False) * scale
    bucket = np.clip(((t - t0) // step).astype(np.int64), 0, points - 1)
    sums = np.bincount(bucket, weights=v, minlength=points)
    counts = np.bincount(bucket, minlength=points)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = sums / counts
    if whole_node and metric in _SUMMED:  # mean per GPU-scrape × GPUs seen = the node's total
        gpus = len(set(rows["gpu"].to_pylist())) or 1
        means = means * gpus
    return Series(
        field=field, metric=metric, values=tuple(None if c == 0 else round(float(m), 3) for m, c in zip(means, counts))
    )
