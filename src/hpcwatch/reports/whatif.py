"""What-if, MFU and straggler-simulation reports: what ``hpcwatch whatif``, ``hpcwatch mfu`` and
``hpcwatch simulate stragglers`` print, and the ``whatif`` of ``hpcwatch steps --json``.

The analyses (``analysis.whatif``, ``analysis.mfu``, ``analysis.stragglersim``) are imported when a report
is built: ``hpcwatch steps`` on one trace needs only ``whatif_document``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# MFU of a model's measured step is the analysis itself (light: dataclasses and the GPU catalogue); the views
# ask it here, as they ask every report.
from hpcwatch.analysis.mfu import compute_mfu as model_mfu
from hpcwatch.errors import InputError

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from hpcwatch.analysis.mfu import MfuResult
    from hpcwatch.analysis.stragglersim import StragglerCurve
    from hpcwatch.analysis.whatif import WhatIf
    from hpcwatch.store import Store

__all__ = [
    "whatif_of_ops",
    "whatif_of_job",
    "whatif_document",
    "StepTimeMeans",
    "step_time_means",
    "model_mfu",
    "model_mfu_document",
    "job_busy_times",
    "straggler_efficiency",
    "step_over_one_gpu",
]


def whatif_of_ops(table: pa.Table) -> WhatIf:
    """The what-if of a per-operation trace (the ByteDance straggler format's op table)."""
    from hpcwatch.analysis.whatif import whatif_ops

    return whatif_ops(table)


def whatif_of_job(store: Store, job_id: str) -> WhatIf:
    """The what-if of ``job_id``'s stored step spans. ``InputError`` when it has none."""
    from hpcwatch.analysis.whatif import whatif_spans

    spans = store.spans(job_id)
    if not spans:
        raise InputError(f"job {job_id}: no step spans in the store")
    return whatif_spans(spans)


def whatif_document(result: WhatIf) -> dict[str, Any]:
    """The ``--json`` document of a what-if (``hpcwatch whatif`` and the ``whatif`` of ``steps --json``)."""
    import msgspec

    doc: dict[str, Any] = msgspec.to_builtins(result)
    doc["by_dp_rank"] = {str(k): v for k, v in result.by_dp_rank.items()}
    doc["by_stage"] = {str(k): v for k, v in result.by_stage.items()}
    return doc


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTimeMeans:
    """The mean step of a what-if's steps: as measured, as replayed, and replayed without stragglers."""

    actual_s: float
    replay_s: float
    ideal_s: float


def step_time_means(result: WhatIf) -> StepTimeMeans:
    """The means of ``result``'s step times (the text view's one line of them)."""

    def mean(xs: Sequence[float]) -> float:
        return sum(xs) / len(xs)

    return StepTimeMeans(
        actual_s=mean(result.step_time_actual_s),
        replay_s=mean(result.step_time_replay_s),
        ideal_s=mean(result.step_time_ideal_s),
    )


def model_mfu_document(result: MfuResult) -> dict[str, float]:
    """The ``hpcwatch mfu --json`` document: MFU, achieved TFLOP/s per GPU, FLOPs per token (and HFU)."""
    doc = {
        "mfu": result.mfu,
        "achieved_tflops": result.achieved_flops / 1e12,
        "flops_per_token": result.flops_per_token,
    }
    if result.hfu is not None:
        doc["hfu"] = result.hfu
    return doc


def job_busy_times(store: Store, job_id: str) -> np.ndarray:
    """Per-GPU step busy times of ``job_id``'s stored spans. ``InputError`` when it has none."""
    from hpcwatch.analysis.stragglersim import busy_times_from_spans

    values = busy_times_from_spans(store.spans(job_id))
    if values.size == 0:
        raise InputError(f"job {job_id}: no step spans in the store")
    return values


def straggler_efficiency(
    sizes: Sequence[int],
    *,
    cv: float | None,
    sample: np.ndarray | None,
    p_slow: float,
    slow_factor: float,
    steps: int,
    seed: int,
) -> StragglerCurve:
    """Synchronous efficiency against job size (``analysis.stragglersim.efficiency_curve``)."""
    from hpcwatch.analysis.stragglersim import efficiency_curve

    return efficiency_curve(sizes, cv=cv, sample=sample, p_slow=p_slow, slow_factor=slow_factor, steps=steps, seed=seed)


def step_over_one_gpu(curve: StragglerCurve) -> tuple[float, ...]:
    """Per point of ``curve``: its expected synchronous step over one GPU's mean step."""
    return tuple(p.expected_step / curve.mean_step for p in curve.points)
