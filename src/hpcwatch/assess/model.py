"""What an assessment is made of: a criterion, its verdict, a category's tier, and the tier rule.

A criterion is data (id, ClusterMAX category, title, what it reads, where its rule comes
from) plus a pure rule: ``Evidence -> Verdict``. ``unknown`` is what a rule answers when
the store does not hold what it needs; it never counts as a pass.

The tier rule (ours: ClusterMAX 2.0 rates clouds by expert review and publishes its
criteria, not a formula from criteria to tier, https://www.clustermax.ai/criteria):

    category tier                                overall tier
    -------------                                ------------
    every criterion pass         -> Platinum     the lowest tier of any category
    passes and warns only        -> Gold         (a cluster is as good as its weakest
    any unknown, no fail         -> Silver        category: one that cannot be shown
    exactly one fail             -> Bronze        to work caps the rating)
    two or more fails            -> Underperform
    no criterion with evidence   -> Silver if any unknown (never better than what was shown)

"Not assessable from cluster data" criteria (prices, contracts, support) are listed
apart and do not enter the rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "Status",
    "STATUSES",
    "Tier",
    "TIERS",
    "Verdict",
    "Criterion",
    "CriterionResult",
    "CategoryResult",
    "category_tier",
    "overall_tier",
    "NotAssessable",
]

Status = Literal["pass", "warn", "fail", "unknown"]
STATUSES: tuple[Status, ...] = ("pass", "warn", "fail", "unknown")
Tier = Literal["Platinum", "Gold", "Silver", "Bronze", "Underperform"]
#: Best first: ClusterMAX 2.0's tiers (https://www.clustermax.ai/).
TIERS: tuple[Tier, ...] = ("Platinum", "Gold", "Silver", "Bronze", "Underperform")


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """A rule's answer: its status, one sentence saying why, the figures it compared, the records it read."""

    status: Status
    evidence: str
    figures: Mapping[str, Any] = field(default_factory=dict)
    records: tuple[str, ...] = ()
    """What in the store the verdict rests on (``samples DCGM_FI_DEV_GPU_UTIL``, ``events slurm_config``...)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Criterion:
    id: str
    category: str
    title: str
    reads: str
    """The evidence it reads, over which window."""
    source: str
    """The ClusterMAX criterion or cmax check it follows (a URL), and where its threshold comes from."""
    command: str
    """The hpcwatch command that shows the records behind it."""
    rule: Callable[[Any], Verdict]


@dataclass(frozen=True, slots=True, kw_only=True)
class CriterionResult:
    id: str
    category: str
    title: str
    status: Status
    evidence: str
    source: str
    command: str
    figures: Mapping[str, Any] = field(default_factory=dict)
    records: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class CategoryResult:
    name: str
    tier: Tier
    criteria: tuple[CriterionResult, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class NotAssessable:
    category: str
    title: str
    why: str
    source: str


def category_tier(statuses: Sequence[Status]) -> Tier:
    """The tier rule of one category (module docstring)."""
    fails = sum(1 for s in statuses if s == "fail")
    if fails >= 2:
        return "Underperform"
    if fails == 1:
        return "Bronze"
    if "unknown" in statuses or not statuses:
        return "Silver"
    if "warn" in statuses:
        return "Gold"
    return "Platinum"


def overall_tier(tiers: Sequence[Tier]) -> Tier:
    """The lowest category tier; Silver when there is no category (nothing was shown)."""
    return max(tiers, key=TIERS.index) if tiers else "Silver"
