"""Gradient injection and silent data corruption: one rank's gradients do not look like the others'.

In data-parallel training every rank computes a gradient on its own micro-batch
and AllReduce averages them; one rank that scales, flips or corrupts its local
gradient (a compromised worker, or a GPU with silent data corruption) poisons
every replica at the next step, and nothing in the loss says which rank did it.
Before the AllReduce the ranks' local gradients are samples of one distribution,
so a rank is suspicious when, for ``consecutive`` steps in a row:

    rule                          fires on
    gradient.norm_outlier         |robust z| of its local norm > ``z_threshold``
                                  (z = 0.6745 (x - median) / MAD over the step's ranks; Iglewicz & Hoaglin 1993)
    gradient.sketch_direction     cosine of its random-projection sketch with the mean of the others' < ``min_cosine``
    gradient.nonfinite            it reported NaN/Inf gradient elements while most ranks did not (one step suffices)

Inputs are the hook's Samples (instrument/torch.py): ``train_grad_norm``,
``train_grad_nonfinite`` with labels ``job, rank, step`` (``node``, ``gpu`` when known),
and ``train_grad_sketch`` with one more label ``dim`` (see ``grad_sketch``; the hook writes
a signed-bucket sketch instead, and any linear sketch works when all ranks of a job use the
same one: only cosines between ranks are compared). A
finding is marked as likely SDC when the rank's GPU logged an XID event or an ECC
error (``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``/``DCGM_FI_DEV_XID_ERRORS`` > 0) during the job.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcwatch import vocab
from hpcwatch.records import Event, Finding, Sample
from hpcwatch.security.context import host_of
from hpcwatch.vocab import EventKind

__all__ = [
    "GradientConfig",
    "detect_gradient_anomalies",
    "reads_metric",
    "grad_sketch",
    "gradient_samples",
    "SKETCH_DIMS",
    "RULES",
]

#: Rule ids this detector emits (the web catalogues have a title per rule: web/en.yaml ``finding``).
RULES: tuple[str, ...] = ("gradient.norm_outlier", "gradient.sketch_direction", "gradient.nonfinite")

#: 32 random directions: enough to tell "same direction" from "opposite" at cosine +-0.3 with
#: little chance of a false sign (Johnson-Lindenstrauss), 32 floats per rank per step.
SKETCH_DIMS = 32
#: 0.6745 = the 0.75 quantile of N(0,1): makes MAD comparable to a standard deviation.
_MAD_SCALE = 0.6745
_HW_METRICS = (vocab.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, vocab.DCGM_FI_DEV_XID_ERRORS)


@dataclass(frozen=True, slots=True, kw_only=True)
class GradientConfig:
    z_threshold: float = 6.0
    """Robust z beyond which a rank's norm is an outlier (3.5 is Iglewicz & Hoaglin's; 6 tolerates data noise)."""
    consecutive: int = 3
    """Steps in a row a rank must stand out before it fires."""
    min_cosine: float = -0.1
    """A sketch pointing away from the others' mean (cosine below this) stands out."""
    min_ranks: int = 3
    """A median needs at least three voices."""

    def __post_init__(self) -> None:
        if self.consecutive < 1:
            raise ValueError(f"consecutive must be >= 1, got {self.consecutive}")
        if self.min_ranks < 3:
            raise ValueError(f"min_ranks must be >= 3, got {self.min_ranks}")


def grad_sketch(flat: np.ndarray, *, dims: int = SKETCH_DIMS, seed: int = 0, chunk: int = 1 << 20) -> np.ndarray:
    """Project a flat gradient onto ``dims`` Gaussian directions (same seed on every rank = same directions)."""
    flat = np.asarray(flat, dtype=np.float64).ravel()
    rng = np.random.default_rng(seed)
    out = np.zeros(dims)
    for lo in range(0, flat.size, chunk):
        part = flat[lo : lo + chunk]
        out += rng.standard_normal((dims, part.size)) @ part
    return out / math.sqrt(dims)


def gradient_samples(
    *,
    job: str,
    rank: int,
    step: int,
    t: float,
    norm: float,
    nonfinite: int = 0,
    sketch: np.ndarray | None = None,
    node: str | None = None,
    gpu: int | None = None,
) -> list[Sample]:
    """The Samples the hook writes for one rank's step."""
    labels = {"job": job, "rank": str(rank), "step": str(step)}
    if node is not None:
        labels["node"] = node
    if gpu is not None:
        labels["gpu"] = str(gpu)
    out = [
        Sample(metric=vocab.TRAIN_GRAD_NORM, labels=labels, t=t, value=float(norm)),
        Sample(metric=vocab.TRAIN_GRAD_NONFINITE, labels=labels, t=t, value=float(nonfinite)),
    ]
    for i, v in enumerate(sketch if sketch is not None else ()):
        out.append(Sample(metric=vocab.TRAIN_GRAD_SKETCH, labels={**labels, "dim": str(i)}, t=t, value=float(v)))
    return out


@dataclass(slots=True)
class _Steps:
    norms: dict = field(default_factory=lambda: defaultdict(dict))  # step -> rank -> norm
    nonfinite: dict = field(default_factory=lambda: defaultdict(dict))  # step -> rank -> count
    sketch: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(dict)))  # step -> rank -> dim -> v
    where: dict = field(default_factory=dict)  # rank -> (host, gpu, first t)


def reads_metric(metric: str) -> bool:
    """Whether ``detect_gradient_anomalies`` reads samples of ``metric`` (the scan gives it only those, in order)."""
    return metric in _HW_METRICS or metric.startswith("train_grad_")


def detect_gradient_anomalies(
    samples: Iterable[Sample], events: Iterable[Event] = (), config: GradientConfig = GradientConfig()
) -> list[Finding]:
    jobs: dict[str, _Steps] = defaultdict(_Steps)
    hardware: list[Sample] = []
    for s in samples:
        if s.metric in _HW_METRICS:
            hardware.append(s)
            continue
        if not s.metric.startswith("train_grad_") or "job" not in s.labels:
            continue
        try:
            rank, step = int(s.labels["rank"]), int(s.labels["step"])
        except (KeyError, ValueError):
            continue
        steps = jobs[s.labels["job"]]
        steps.where.setdefault(rank, (host_of(s.labels), s.labels.get("gpu"), s.t))
        if s.metric == vocab.TRAIN_GRAD_NORM:
            steps.norms[step][rank] = s.value
        elif s.metric == vocab.TRAIN_GRAD_NONFINITE:
            steps.nonfinite[step][rank] = s.value
        elif s.metric == vocab.TRAIN_GRAD_SKETCH and "dim" in s.labels:
            steps.sketch[step][rank][int(s.labels["dim"])] = s.value
    xids = [e for e in events if e.kind in (EventKind.XID, EventKind.GPU_XID)]
    findings = []
    for job, steps in sorted(jobs.items()):
        flagged = _runs(_norm_flags(steps.norms, config), config.consecutive, "gradient.norm_outlier")
        flagged += _runs(_sketch_flags(steps.sketch, config), config.consecutive, "gradient.sketch_direction")
        flagged += _runs(_nonfinite_flags(steps.nonfinite), 1, "gradient.nonfinite")
        findings += [_finding(job, hit, steps.where, xids, hardware) for hit in flagged]
    return findings


def _norm_flags(norms: dict, config: GradientConfig) -> dict[int, dict[int, float]]:
    flags: dict[int, dict[int, float]] = {}
    for step, by_rank in norms.items():
        if len(by_rank) < config.min_ranks:
            continue
        values = np.array(list(by_rank.values()))
        med = float(np.median(values))
        mad = float(np.median(np.abs(values - med)))
        mad = max(mad, 1e-3 * abs(med), 1e-12)  # identical ranks: any visible departure counts
        flags[step] = {r: z for r, v in by_rank.items() if abs(z := _MAD_SCALE * (v - med) / mad) > config.z_threshold}
    return flags


def _sketch_flags(sketch: dict, config: GradientConfig) -> dict[int, dict[int, float]]:
    flags: dict[int, dict[int, float]] = {}
    for step, by_rank in sketch.items():
        if len(by_rank) < config.min_ranks:
            continue
        dims = sorted(set().union(*(d.keys() for d in by_rank.values())))
        ranks = sorted(by_rank)
        mat = np.array([[by_rank[r].get(d, 0.0) for d in dims] for r in ranks])
        flags[step] = {}
        for i, r in enumerate(ranks):
            others = np.delete(mat, i, axis=0).mean(axis=0)
            denom = np.linalg.norm(mat[i]) * np.linalg.norm(others)
            cos = float(mat[i] @ others / denom) if denom > 0 else 1.0
            if cos < config.min_cosine:
                flags[step][r] = cos
    return flags


def _nonfinite_flags(nonfinite: dict) -> dict[int, dict[int, float]]:
    flags = {}
    for step, by_rank in nonfinite.items():
        bad = {r: v for r, v in by_rank.items() if v > 0 or math.isnan(v)}
        if bad and len(bad) * 2 < len(by_rank):
            flags[step] = bad
    return flags


def _runs(flags: dict[int, dict[int, float]], needed: int, rule: str) -> list[dict]:
    """(rank, first step, steps, worst score) of every rank flagged on ``needed`` consecutive recorded steps."""
    hits: dict[int, dict[str, Any]] = {}
    streak: defaultdict[int, list[tuple[int, float]]] = defaultdict(list)
    for step in sorted(flags):
        for rank in list(streak):
            if rank not in flags[step]:
                streak.pop(rank)
        for rank, score in flags[step].items():
            streak[rank].append((step, score))
            if len(streak[rank]) >= needed and rank not in hits:
                hits[rank] = {
                    "rule": rule,
                    "rank": rank,
                    "steps": [s for s, _ in streak[rank]],
                    "score": max((sc for _, sc in streak[rank]), key=abs),
                }
            elif rank in hits and hits[rank]["steps"][-1] == step - 1:
                hits[rank]["steps"].append(step)
    return list(hits.values())


def _finding(job: str, hit: dict, where: dict, xids: list[Event], hardware: list[Sample]) -> Finding:
    host, gpu, t = where.get(hit["rank"], (None, None, 0.0))
    hw = [
        {"t": e.t, "kind": e.kind, **{k: e.attrs.get(k) for k in ("xid", "gpu", "host")}}
        for e in xids
        if host and host_of(e.attrs) == host and (gpu is None or str(e.attrs.get("gpu")) == str(gpu))
    ]
    hw += [
        {"t": s.t, "metric": s.metric, "value": s.value}
        for s in hardware
        if s.value > 0 and host and host_of(s.labels) == host and (gpu is None or s.labels.get("gpu") == gpu)
    ]
    what = {
        "gradient.norm_outlier": f"gradient norm is a robust outlier (z {hit['score']:+.1f})",
        "gradient.sketch_direction": f"gradient points away from the other ranks' (cosine {hit['score']:+.2f})",
        "gradient.nonfinite": "gradient has non-finite elements the other ranks do not",
    }[hit["rule"]]
    cause = "likely silent data corruption (the GPU logged errors)" if hw else "gradient injection or SDC"
    return Finding(
        vector="gradient_injection",
        severity="critical" if hit["rule"] != "gradient.nonfinite" else "high",
        target=f"job {job} rank {hit['rank']}" + (f" ({host}/{gpu})" if host else ""),
        title=f"rank {hit['rank']} of job {job}: {what}; {cause}",
        evidence={
            "job": job,
            "rank": hit["rank"],
            "host": host,
            "gpu": gpu,
            "steps": hit["steps"],
            "score": hit["score"],
            "hardware_events": hw,
        },
        t=t,
        rule=hit["rule"],
    )
