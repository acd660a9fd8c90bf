"""The findings summary: per threat vector and severity, and the newest finding of each vector."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from hpcwatch.records import SEVERITIES, VECTORS, Finding
from hpcwatch.security.scan import ScanConfig, ScanExtras, scan_store, weights_reads
from hpcwatch.store import Store, queries

__all__ = [
    "ScanReport",
    "scan_report",
    "VectorSummary",
    "findings_summary",
    "finding_counts",
    "finding_rule_counts",
    "recent_findings",
    "scan_inputs",
    "RECENT_FINDINGS",
]

#: Findings a list returns at most (the newest).
RECENT_FINDINGS = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class VectorSummary:
    """One threat vector: how many findings, and its newest one (fields ``None`` when it has none)."""

    vector: str
    findings: int = 0
    last_t: float | None = None
    title: str | None = None
    severity: str | None = None
    target: str | None = None
    rule: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


def _evidence(text: str | None) -> dict[str, Any]:
    try:
        value = orjson.loads(text) if text else {}
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def findings_summary(store: Store) -> dict[str, VectorSummary]:
    """Every vector of ``records.VECTORS``, in that order, with its count and newest finding."""
    found = {
        v: VectorSummary(
            vector=v,
            findings=n,
            last_t=t,
            title=title,
            severity=sev,
            target=target,
            rule=rule,
            evidence=_evidence(evidence),
        )
        for v, n, t, title, sev, target, rule, evidence in queries.latest_finding_by_vector(store)
    }
    return {v: found.get(v, VectorSummary(vector=v)) for v in VECTORS}


def finding_counts(store: Store) -> dict[tuple[str, str], int]:
    """``{(vector, severity): count}`` for every pair of ``VECTORS`` × ``SEVERITIES``, 0 included."""
    counts: dict[tuple[str, str], int] = {(v, s): 0 for v in VECTORS for s in SEVERITIES}
    counts.update(queries.finding_counts(store))
    return counts


def finding_rule_counts(store: Store) -> dict[tuple[str, str, str], int]:
    """``{(vector, rule, severity): count}`` of the stored findings (only the triples that have some): which
    detector rules the counts of ``finding_counts`` come from, for an alert to name them."""
    return queries.finding_rule_counts(store)


def recent_findings(store: Store, vector: str | None = None, *, limit: int = RECENT_FINDINGS) -> list[Finding]:
    """The newest ``limit`` findings (of ``vector``, or all), oldest first."""
    return store.findings(vector)[-limit:]


def scan_inputs(store: Store) -> dict[str, int]:
    """What a scan had to look at: 'no findings' over nothing is not a clean bill of health."""
    return queries.table_counts(store)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScanReport:
    """One scan: its findings (which replace the store's), who read the weights, and what it looked at."""

    findings: tuple[Finding, ...]
    weights_reads: tuple[Any, ...]
    """``security.scan.weights_reads`` rows (time, host, access, binary, user, job, path)."""
    inputs: dict[str, int]


def scan_report(store: Store, *, config: ScanConfig, extras: ScanExtras) -> ScanReport:
    """Run every detector over the store, store the findings in place of the previous scan's, report."""
    findings = scan_store(store, config=config, extras=extras)
    reads = weights_reads(store, config=config)
    inputs = scan_inputs(store)
    store.clear_findings()
    store.add(findings)
    return ScanReport(findings=tuple(findings), weights_reads=tuple(reads), inputs=inputs)
