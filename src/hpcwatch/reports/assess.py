"""The assessment of a store: ClusterMAX-style criteria, evidence and tier (``hpcwatch assess``, the web)."""

from __future__ import annotations

from typing import Any

from hpcwatch.assess import AssessConfig, Assessment, assess_evidence, gather_evidence
from hpcwatch.security.scan import ScanConfig, ScanExtras, scan_store
from hpcwatch.store import Store

__all__ = ["assessment_report", "assessment_document"]


def assessment_report(store: Store, config: AssessConfig, *, run_detectors: bool = True) -> Assessment:
    """Gather the evidence (and, unless told not to, run the six detectors read-only), judge every criterion."""
    findings = scan_store(store, config=ScanConfig.for_cluster(config.cluster), extras=ScanExtras()) \
        if run_detectors else None
    return assess_evidence(gather_evidence(store, config, findings=findings))


def assessment_document(a: Assessment) -> dict[str, Any]:
    """The JSON contract: ``{"tier", "categories": [{"name", "tier", "criteria": [{"id", "status", "evidence",
    "source", ...}]}], "not_assessable": [...], "window": {...}}``."""
    return {
        "tier": a.tier,
        "window": {"t0": a.t0, "t1": a.t1},
        "categories": [{"name": c.name, "tier": c.tier, "criteria": [
            {"id": r.id, "title": r.title, "status": r.status, "evidence": r.evidence, "source": r.source,
             "command": r.command, "records": list(r.records), "figures": dict(r.figures)} for r in c.criteria]}
            for c in a.categories],
        "not_assessable": [{"category": n.category, "title": n.title, "why": n.why, "source": n.source}
                           for n in a.not_assessable],
    }
