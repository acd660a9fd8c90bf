"""The pinned minimum versions an assessment checks, with their date and source.

Facts copied from SemiAnalysis' ClusterMAX audit CLI, ``cmax/scripts/1-audit/minimum-versions.json``
(https://github.com/SemiAnalysisAI/ClusterMAX, commit 50ecb6fb), itself built from NVIDIA's
security bulletins. Update them from there, never by hand-picking a version.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

__all__ = [
    "MINIMUMS_SOURCE",
    "DRIVER_BRANCH_MINIMUMS",
    "DRIVER_SOURCE",
    "CONTAINER_TOOLKIT_MINIMUM",
    "CONTAINER_TOOLKIT_SOURCE",
    "driver_floor",
    "at_least",
]

MINIMUMS_SOURCE = (
    "https://github.com/SemiAnalysisAI/ClusterMAX/blob/main/cmax/scripts/1-audit/minimum-versions.json "
    "(commit 50ecb6fb)"
)

#: NVIDIA data-centre driver: the first fixed release of each branch (nvidiaDriver.branches).
DRIVER_BRANCH_MINIMUMS: dict[str, str] = {
    "535": "535.309.01",
    "570": "570.211.01",
    "580": "580.159.03",
    "590": "590.48.01",
    "595": "595.71.05",
}
DRIVER_SOURCE = (
    "NVIDIA Security Bulletin: GPU Display Driver - May 2026 (a_id 5821, released 2026-05-19) and "
    "January 2026 (a_id 5747); https://nvidia.custhelp.com/app/answers/detail/a_id/5821/"
)

#: NVIDIA Container Toolkit (nvidiaContainerToolkit.minimum), CVE-2026-24260.
CONTAINER_TOOLKIT_MINIMUM = "1.19.1"
CONTAINER_TOOLKIT_SOURCE = (
    "NVIDIA Security Bulletin: NVIDIA Container Toolkit - June 2026 (a_id 5850, released "
    "2026-06-30); https://nvidia.custhelp.com/app/answers/detail/a_id/5850/"
)


def driver_floor(version: str) -> str | None:
    """The minimum of ``version``'s branch (its first number), or None for a branch the table does not list."""
    return DRIVER_BRANCH_MINIMUMS.get(version.strip().split(".", 1)[0])


def at_least(version: str, minimum: str) -> bool | None:
    """``version >= minimum``; None when either is not a version."""
    try:
        return Version(version.strip()) >= Version(minimum)
    except InvalidVersion:
        return None
