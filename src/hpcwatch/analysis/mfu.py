"""Model FLOPs utilisation: how much of the GPUs' peak the model's own arithmetic uses.

PaLM (Chowdhery et al. 2022, appendix B, https://arxiv.org/abs/2204.02311) counts
the FLOPs a dense decoder needs per token, whatever the implementation does:

    flops_per_token = 6·N + 12·L·d·T

(N non-embedding parameters: 2 FLOPs per weight forward, 4 backward; 12·L·d·T the
attention scores and values over a context T, forward and backward.) Then

    MFU = tokens/s × flops_per_token / (GPUs × peak)

Hardware FLOPs utilisation (HFU) also counts what the hardware recomputes: full
activation recomputation runs the forward (2·N + 4·L·d·T) a second time
(Korthikanti et al. 2022, https://arxiv.org/abs/2205.05198), so HFU = MFU × 4/3.
The peak is the dense BF16 number of ``hpcwatch.model.catalog``; an unknown GPU is
an error, never another device's number.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcwatch.errors import ConfigError
from hpcwatch.model.catalog import gpu_spec

__all__ = ["MfuResult", "compute_mfu", "flops_per_token", "DEFAULT_GPU"]

#: GPU assumed when none is named: the reference cluster's.
DEFAULT_GPU = "h100-sxm"


@dataclass(frozen=True, slots=True, kw_only=True)
class MfuResult:
    """MFU of a training run and the numbers it comes from (FLOPs per GPU)."""

    mfu: float
    """Model FLOPs utilisation, 0..1."""
    hfu: float | None
    """Hardware FLOPs utilisation with recomputation; ``None`` when none was given."""
    achieved_flops: float
    """Model FLOP/s each GPU delivers."""
    flops_per_token: float
    """6·N + 12·L·d·T."""
    tokens_per_s: float
    peak_flops: float
    """Dense BF16 peak of one GPU, FLOP/s."""
    gpu: str
    """Catalog key of the GPU."""


def flops_per_token(*, params: float, layers: int, d_model: int, seq: int) -> float:
    """Model FLOPs per trained token (PaLM appendix B): 6·N + 12·L·d·T."""
    return 6.0 * params + 12.0 * layers * d_model * seq


def compute_mfu(
    *,
    params: float,
    layers: int,
    d_model: int,
    seq: int,
    tokens_per_step: float,
    step_time_s: float,
    gpus: int,
    gpu: str = DEFAULT_GPU,
    recompute: bool = False,
) -> MfuResult:
    """MFU (and HFU with full activation recomputation) of a dense decoder's training step.

    ``params`` is the non-embedding parameter count, ``tokens_per_step`` the global
    batch in tokens, ``step_time_s`` the step time, ``gpus`` how many GPUs share it.
    """
    _positive(
        params=params,
        layers=layers,
        d_model=d_model,
        seq=seq,
        tokens_per_step=tokens_per_step,
        step_time_s=step_time_s,
        gpus=gpus,
    )
    spec = gpu_spec(gpu)
    if spec is None:
        raise ConfigError(f"gpu: unknown GPU {gpu!r}; no peak FLOP/s in the catalog for it")
    per_token = flops_per_token(params=params, layers=layers, d_model=d_model, seq=seq)
    tokens_per_s = tokens_per_step / step_time_s
    achieved = tokens_per_s * per_token / gpus
    mfu = achieved / spec.peak_bf16_dense_flops
    # Recomputing the forward adds (2N + 4LdT) to the 6N + 12LdT: a factor 4/3 on every term.
    hfu = mfu * 4.0 / 3.0 if recompute else None
    return MfuResult(
        mfu=mfu,
        hfu=hfu,
        achieved_flops=achieved,
        flops_per_token=per_token,
        tokens_per_s=tokens_per_s,
        peak_flops=spec.peak_bf16_dense_flops,
        gpu=spec.key,
    )


def _positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ConfigError(f"{name}: must be > 0, got {value!r}")
