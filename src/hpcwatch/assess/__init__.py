"""ClusterMAX-style assessment: criteria as data, the evidence they read, the tier rule.

``assess(store, config)`` gathers the evidence once, runs every criterion of
``criteria.CRITERIA`` and turns their verdicts into a tier per category and overall
(``model.category_tier`` / ``overall_tier``, the rule written down in ``model``).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcwatch.assess.criteria import CATEGORIES, CRITERIA, NOT_ASSESSABLE
from hpcwatch.assess.evidence import AssessConfig, Evidence, ModelShape, gather_evidence
from hpcwatch.assess.model import (
    STATUSES,
    TIERS,
    CategoryResult,
    Criterion,
    CriterionResult,
    NotAssessable,
    Status,
    Tier,
    Verdict,
    category_tier,
    overall_tier,
)

__all__ = [
    "Assessment",
    "assess_evidence",
    "AssessConfig",
    "ModelShape",
    "Evidence",
    "gather_evidence",
    "CategoryResult",
    "CriterionResult",
    "Criterion",
    "Verdict",
    "NotAssessable",
    "Status",
    "Tier",
    "STATUSES",
    "TIERS",
    "CATEGORIES",
    "CRITERIA",
    "NOT_ASSESSABLE",
    "category_tier",
    "overall_tier",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Assessment:
    tier: Tier
    categories: tuple[CategoryResult, ...]
    not_assessable: tuple[NotAssessable, ...]
    t0: float | None
    t1: float | None

    def criterion(self, criterion_id: str) -> CriterionResult:
        return next(c for cat in self.categories for c in cat.criteria if c.id == criterion_id)

    def statuses(self) -> dict[str, Status]:
        return {c.id: c.status for cat in self.categories for c in cat.criteria}


def _result(c: Criterion, ev: Evidence) -> CriterionResult:
    v = c.rule(ev)
    return CriterionResult(
        id=c.id,
        category=c.category,
        title=c.title,
        status=v.status,
        evidence=v.evidence,
        source=c.source,
        command=c.command,
        figures=dict(v.figures),
        records=v.records,
    )


def assess_evidence(ev: Evidence, criteria: tuple[Criterion, ...] = CRITERIA) -> Assessment:
    """Every criterion over ``ev``, a tier per category (in ``CATEGORIES`` order) and overall."""
    cats = []
    for name in CATEGORIES:
        results = tuple(_result(c, ev) for c in criteria if c.category == name)
        if results:
            cats.append(CategoryResult(name=name, tier=category_tier([r.status for r in results]), criteria=results))
    return Assessment(
        tier=overall_tier([c.tier for c in cats]),
        categories=tuple(cats),
        not_assessable=NOT_ASSESSABLE,
        t0=ev.t0,
        t1=ev.t1,
    )
