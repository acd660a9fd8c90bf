"""The assessment of a store: ClusterMAX-style criteria, evidence and tier (``hpcwatch assess``, the web)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcwatch.assess import AssessConfig, Assessment, assess_evidence, gather_evidence
from hpcwatch.assess.model import TIERS
from hpcwatch.records import Event
from hpcwatch.security.scan import ScanConfig, ScanExtras, scan_store
from hpcwatch.store import Store
from hpcwatch.vocab import EventKind

__all__ = [
    "assessment_report",
    "assessment_document",
    "assessment_event",
    "latest_assessment",
    "StoredAssessment",
    "TIER_NUMBERS",
    "OVERALL",
]

#: A tier as a number, for /metrics (``hpcwatch_assessment_tier``) and alert rules: higher is better, so
#: ``< 2`` reads "worse than Silver". Ours: ClusterMAX names its tiers, not numbers (https://www.clustermax.ai/).
TIER_NUMBERS: dict[str, int] = {tier: len(TIERS) - 1 - i for i, tier in enumerate(TIERS)}
#: The ``category`` of the overall tier in ``hpcwatch_assessment_tier`` and ``StoredAssessment.categories``.
OVERALL = "overall"


def assessment_report(store: Store, config: AssessConfig, *, run_detectors: bool = True) -> Assessment:
    """Gather the evidence (and, unless told not to, run the six detectors read-only), judge every criterion."""
    findings = (
        scan_store(store, config=ScanConfig.for_cluster(config.cluster), extras=ScanExtras()) if run_detectors else None
    )
    return assess_evidence(gather_evidence(store, config, findings=findings))


def assessment_document(a: Assessment) -> dict[str, Any]:
    """The JSON contract: ``{"tier", "categories": [{"name", "tier", "criteria": [{"id", "status", "evidence",
    "source", ...}]}], "not_assessable": [...], "window": {...}}``."""
    return {
        "tier": a.tier,
        "window": {"t0": a.t0, "t1": a.t1},
        "categories": [
            {
                "name": c.name,
                "tier": c.tier,
                "criteria": [
                    {
                        "id": r.id,
                        "title": r.title,
                        "status": r.status,
                        "evidence": r.evidence,
                        "source": r.source,
                        "command": r.command,
                        "records": list(r.records),
                        "figures": dict(r.figures),
                    }
                    for r in c.criteria
                ],
            }
            for c in a.categories
        ],
        "not_assessable": [
            {"category": n.category, "title": n.title, "why": n.why, "source": n.source} for n in a.not_assessable
        ],
    }


def assessment_event(a: Assessment, *, t: float, source: str = "hpcwatch collect") -> Event:
    """The verdict of a scheduled assessment, as stored (``assessment``): what ``serve`` and ``/metrics``
    show without assessing again. Attrs: ``tier``, ``categories`` {name: tier}, ``t0``/``t1`` (the window
    the evidence covered), ``statuses`` {pass/warn/fail/unknown: criteria}."""
    statuses: dict[str, int] = {}
    for c in a.categories:
        for r in c.criteria:
            statuses[r.status] = statuses.get(r.status, 0) + 1
    return Event(
        kind=EventKind.ASSESSMENT,
        t=t,
        source=source,
        attrs={
            "tier": a.tier,
            "categories": {c.name: c.tier for c in a.categories},
            "t0": a.t0,
            "t1": a.t1,
            "statuses": statuses,
        },
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredAssessment:
    """The newest stored assessment verdict."""

    t: float
    """When it was made (UTC s)."""
    tier: str
    categories: dict[str, str]
    statuses: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"t": self.t, "tier": self.tier, "categories": dict(self.categories), "statuses": dict(self.statuses)}

    def tier_numbers(self) -> dict[str, int]:
        """category (``overall`` too) -> TIER_NUMBERS of its tier; a tier we do not know is left out."""
        tiers = {OVERALL: self.tier, **self.categories}
        return {name: TIER_NUMBERS[tier] for name, tier in tiers.items() if tier in TIER_NUMBERS}


def latest_assessment(store: Store) -> StoredAssessment | None:
    """The newest ``assessment`` event (``hpcwatch collect``'s ``task = "assess"``), None when there is none."""
    events = store.events(EventKind.ASSESSMENT)
    if not events:
        return None
    e = max(events, key=lambda e: e.t)
    return StoredAssessment(
        t=e.t,
        tier=str(e.attrs.get("tier")),
        categories=dict(e.attrs.get("categories") or {}),
        statuses=dict(e.attrs.get("statuses") or {}),
    )
