"""What an XID means and what to do about it: the table the health checks judge by.

The NVIDIA driver logs an XID (``NVRM: Xid (PCI:0000:18:00): 79, ...``) when a
GPU, its memory, its links or the driver itself report an error; dcgm-exporter
carries the last one as ``DCGM_FI_DEV_XID_ERRORS``. An XID alone does not say
whether the node must leave service: XID 13 or 31 is usually the application's
own fault, while XID 79 means the GPU is gone from the PCIe bus. This table
turns a code into a meaning and an action.

Source of the meanings and actions: NVIDIA's XID catalogue for Ampere and newer
GPUs, "Resolution Bucket (Immediate Action)" column,
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html
(and https://docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html for 48/63/64).
We map NVIDIA's immediate actions onto our verdicts:
RESTART_APP / IGNORE -> ``warn`` (the job failed, the node may be fine),
RESET_GPU / RESTART_BM / WORKFLOW_* / CONTACT_SUPPORT for hardware -> ``drain``.
An unknown code gets ``warn`` with the meaning "unknown XID", never another code's advice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["XidInfo", "XIDS", "xid_info", "XID_CATALOG_URL", "Verdict"]

XID_CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"

Verdict = Literal["ok", "warn", "drain"]


@dataclass(frozen=True, slots=True, kw_only=True)
class XidInfo:
    code: int
    mnemonic: str
    meaning: str
    action: str
    """NVIDIA's immediate action (resolution bucket)."""
    verdict: Verdict
    """What a health check says about the node."""


def _x(code: int, mnemonic: str, meaning: str, action: str, verdict: Verdict) -> XidInfo:
    return XidInfo(code=code, mnemonic=mnemonic, meaning=meaning, action=action, verdict=verdict)


XIDS: dict[int, XidInfo] = {
    x.code: x
    for x in (
        _x(8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", "RESTART_APP", "warn"),
        _x(
            13,
            "ROBUST_CHANNEL_GR_EXCEPTION",
            "Graphics engine exception (often an illegal access in the application)",
            "RESTART_APP",
            "warn",
        ),
        _x(
            31,
            "ROBUST_CHANNEL_FAULT",
            "GPU memory page fault (MMU fault; usually the application)",
            "RESTART_APP",
            "warn",
        ),
        _x(
            43,
            "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR",
            "GPU stopped processing (application fault)",
            "RESTART_APP",
            "warn",
        ),
        _x(
            45,
            "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
            "Preemptive clean-up after a previous error (process killed)",
            "RESTART_APP",
            "warn",
        ),
        _x(48, "DBE", "Double-bit (uncorrectable) ECC error in GPU memory", "RESET_GPU", "drain"),
        _x(61, "PMU_BREAKPOINT", "Internal micro-controller breakpoint/warning", "RESET_GPU", "drain"),
        _x(62, "PMU_HALT_ERROR", "Internal micro-controller halt", "RESET_GPU", "drain"),
        _x(
            63,
            "ROW_REMAP_EVENT",
            "ECC page retirement or row remapping recorded; reset to activate",
            "RESTART_APP",
            "warn",
        ),
        _x(64, "ROW_REMAP_FAILURE", "ECC page retirement or row remapping failed", "RESET_GPU", "drain"),
        _x(74, "NVLINK_ERROR", "NVLink error (link, CRC or replay failure)", "RESET_GPU", "drain"),
        _x(
            79,
            "GPU_FALLEN_OFF_BUS",
            "GPU has fallen off the bus (no longer reachable over PCIe)",
            "RESTART_BM",
            "drain",
        ),
        _x(92, "EXCESSIVE_SBE_RATE", "High single-bit ECC error rate", "RESET_GPU", "drain"),
        _x(
            94,
            "CONTAINED_ECC_ERROR",
            "Contained ECC error (only the affected application is killed)",
            "RESTART_APP",
            "warn",
        ),
        _x(
            95,
            "UNCONTAINED_ECC_ERROR",
            "Uncontained ECC error (all applications on the GPU are affected)",
            "RESET_GPU",
            "drain",
        ),
        _x(109, "CTXSW_TIMEOUT", "Context switch timeout", "RESTART_APP", "warn"),
        _x(119, "GSP_RPC_TIMEOUT", "GSP (GPU System Processor) RPC timeout", "RESET_GPU", "drain"),
        _x(120, "GSP_ERROR", "GSP (GPU System Processor) error", "RESET_GPU", "drain"),
        _x(140, "UNRECOVERED_ECC", "ECC unrecovered error", "RESET_GPU", "drain"),
    )
}


def xid_info(code: int) -> XidInfo:
    """The meaning of an XID; an unknown code is ``warn`` with an honest "unknown" meaning."""
    known = XIDS.get(int(code))
    if known is not None:
        return known
    return XidInfo(
        code=int(code),
        mnemonic="UNKNOWN",
        meaning=f"XID {int(code)} is not in our table; see {XID_CATALOG_URL}",
        action="CONTACT_SUPPORT",
        verdict="warn",
    )
