"""Training-data poisoning: shards that are not what the manifest pinned, and writes to the data mid-job.

Two signals:

    rule                                  fires on
    data_poisoning.shard_mismatch         a ``shard_check`` event that failed (size, sha256, not listed,
                                          unreadable), from the loader's verifier (instrument/dataset.py)
                                          or from ``verify_manifest`` at scan time
    data_poisoning.bad_signature          a manifest whose HMAC-SHA256 does not verify with the key
    data_poisoning.write_during_job       a Tetragon ``security_file_permission`` with MAY_WRITE (or a
                                          truncate / unlink / rename probe) on a dataset path while a job runs

Writing the dataset before any job reads it (the preparation step) is normal and
does not fire; the data path comes from ``DataPoisoningConfig.dataset_prefixes``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hpcwatch.instrument.dataset import ShardVerifier
from hpcwatch.records import Event, Finding, Job
from hpcwatch.security.context import JobIndex
from hpcwatch.sources.manifest import ShardManifest
from hpcwatch.sources.tetragon import MAY_WRITE
from hpcwatch.vocab import EventKind

__all__ = ["DataPoisoningConfig", "detect_data_poisoning", "verify_manifest", "DEFAULT_DATASET_PREFIXES", "RULES"]

#: Rule ids this detector emits (the web catalogues have a title per rule: web/en.yaml ``finding``).
RULES: tuple[str, ...] = (
    "data_poisoning.shard_mismatch",
    "data_poisoning.bad_signature",
    "data_poisoning.write_during_job",
)

DEFAULT_DATASET_PREFIXES = ("/lustre/datasets",)

#: LSM hooks that change a file without a MAY_WRITE permission check (tetragon.io file-monitoring examples).
_MUTATING_HOOKS = frozenset(
    {
        "security_path_truncate",
        "security_path_unlink",
        "security_path_rename",
        "security_inode_unlink",
        "security_inode_rename",
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class DataPoisoningConfig:
    dataset_prefixes: tuple[str, ...] = DEFAULT_DATASET_PREFIXES
    """Folders holding training data; a write under one during a job fires."""


def verify_manifest(manifest: ShardManifest, *, key: bytes | None = None, t: float = 0.0) -> list[Event]:
    """Check every shard of a manifest on disk now; the same events the loader's verifier emits."""
    verifier = ShardVerifier(manifest, key=key, host="scan", clock=lambda: t)
    for shard in manifest.shards:
        verifier.check(manifest.resolve(shard))
    return verifier.events


def detect_data_poisoning(
    events: Iterable[Event], jobs: Iterable[Job] = (), config: DataPoisoningConfig = DataPoisoningConfig()
) -> list[Finding]:
    index = JobIndex.of(jobs)
    findings: list[Finding] = []
    for event in events:
        if event.kind == EventKind.SHARD_CHECK and not event.attrs.get("ok", True):
            findings.append(_shard_finding(event))
        elif event.kind == EventKind.TETRAGON and _is_dataset_write(event, config):
            running = index.on(None, event.t)
            if running:
                findings.append(_write_finding(event, running))
    return findings


def _shard_finding(event: Event) -> Finding:
    a = event.attrs
    reason = a.get("reason")
    if reason == "bad_signature":
        return Finding(
            vector="data_poisoning",
            severity="high",
            target=a.get("manifest") or a["path"],
            title=f"manifest of {a.get('dataset') or 'the dataset'} fails its HMAC-SHA256 signature",
            evidence=dict(a),
            t=event.t,
            rule="data_poisoning.bad_signature",
        )
    what = {
        "sha256": "hash differs from the manifest",
        "size": "size differs from the manifest",
        "not_in_manifest": "is not in the manifest",
        "missing": "cannot be read",
    }.get(str(reason), reason)
    return Finding(
        vector="data_poisoning",
        severity="critical" if reason in ("sha256", "size") else "high",
        target=a["path"],
        title=f"shard {a['path'].rsplit('/', 1)[-1]} {what}",
        evidence=dict(a),
        t=event.t,
        rule="data_poisoning.shard_mismatch",
    )


def _is_dataset_write(event: Event, config: DataPoisoningConfig) -> bool:
    a = event.attrs
    path = a.get("path") or ""
    if a.get("type") != "process_kprobe" or not any(
        path.startswith(p.rstrip("/") + "/") for p in config.dataset_prefixes
    ):
        return False
    fn = a.get("function_name")
    if fn in _MUTATING_HOOKS:
        return True
    return fn == "security_file_permission" and isinstance(a.get("mask"), int) and bool(a["mask"] & MAY_WRITE)


def _write_finding(event: Event, running: list[Job]) -> Finding:
    a = event.attrs
    return Finding(
        vector="data_poisoning",
        severity="high",
        target=a["path"],
        title=f"{a.get('binary')} wrote training data while {len(running)} job(s) ran",
        evidence={
            "path": a["path"],
            "host": a.get("host"),
            "binary": a.get("binary"),
            "user": a.get("user"),
            "uid": a.get("uid"),
            "function": a.get("function_name"),
            "jobs_running": [j.id for j in running],
        },
        t=event.t,
        rule="data_poisoning.write_during_job",
    )
