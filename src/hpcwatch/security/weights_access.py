"""Who read the weights: every read of the checkpoint folder, by binary, user and job.

Model weights are the asset of a training cluster; reading them needs no exploit,
only a path and a file permission. Tetragon's TracingPolicy
``deploy/tetragon/weights-read.yaml`` hooks ``security_file_permission`` and
``security_mmap_file`` with a ``Prefix`` match on the checkpoint folder (the
cluster model's ``weights.path``), so every open-for-read, read, write and mmap
of a checkpoint becomes a ``process_kprobe`` event (sources/tetragon.py).

``weights_report`` lists the reads (who, what, when, which job). The owner of the
weights is the job (and its user) that wrote them (a ``MAY_WRITE`` access), or the
users named in ``owner_users``.

    rule                          fires on
    weights.foreign_reader        a read by a user who is not an owner
    weights.reader_outside_job    a read by an owner's account from a node where none of the owner's jobs runs
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hpcwatch.records import Event, Finding, Job, Severity
from hpcwatch.security.context import JobIndex, host_of
from hpcwatch.sources.tetragon import MAY_READ, MAY_WRITE
from hpcwatch.vocab import EventKind

__all__ = ["WeightsConfig", "WeightsAccess", "weights_report", "detect_weights_access", "WEIGHT_HOOKS", "RULES"]

#: Rule ids this detector emits (the web catalogues have a title per rule: web/en.yaml ``finding``).
RULES: tuple[str, ...] = ("weights.foreign_reader", "weights.reader_outside_job")

WEIGHT_HOOKS = frozenset({"security_file_permission", "security_mmap_file", "security_file_open"})


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightsConfig:
    weights_path: str = "/lustre/checkpoints"
    """The checkpoint folder (model: ``weights.path``)."""
    owner_users: frozenset[str] = frozenset()
    """Users allowed to read; the writers of the weights are added."""
    uid_names: Mapping[int, str] = field(default_factory=dict)
    """uid -> user name, when Tetragon does not resolve names."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightsAccess:
    t: float
    host: str | None
    path: str
    access: str
    """read | write | mmap"""
    binary: str | None
    user: str | None
    uid: int | None
    job: str | None
    """The job of that user running on that node at that time, if any."""


def weights_report(
    events: Iterable[Event], jobs: Iterable[Job] = (), config: WeightsConfig = WeightsConfig()
) -> list[WeightsAccess]:
    index = JobIndex.of(jobs)
    prefix = config.weights_path.rstrip("/") + "/"
    out = []
    for e in events:
        a = e.attrs
        path = a.get("path") or ""
        if (
            e.kind != EventKind.TETRAGON
            or a.get("function_name") not in WEIGHT_HOOKS
            or not (path + "/").startswith(prefix)
        ):
            continue
        mask = a.get("mask")
        if a["function_name"] == "security_mmap_file":
            access = "mmap"
        elif isinstance(mask, int) and mask & MAY_WRITE:
            access = "write"
        elif mask is None or mask & MAY_READ:
            access = "read"
        else:
            continue  # MAY_EXEC / MAY_APPEND alone: not a read of the content
        host = host_of(a)
        user = a.get("user") or (config.uid_names.get(a["uid"]) if a.get("uid") is not None else None)
        job = next((j.id for j in index.on(host, e.t) if user is None or j.user == user), None) if host else None
        out.append(
            WeightsAccess(
                t=e.t, host=host, path=path, access=access, binary=a.get("binary"), user=user, uid=a.get("uid"), job=job
            )
        )
    return out


def detect_weights_access(
    events: Iterable[Event], jobs: Iterable[Job] = (), config: WeightsConfig = WeightsConfig()
) -> list[Finding]:
    jobs = list(jobs)
    report = weights_report(events, jobs, config)
    owners = set(config.owner_users) | {r.user for r in report if r.access == "write" and r.user}
    if not owners:
        return []  # nobody wrote them and nobody was named: no owner to compare with
    findings, seen = [], set()
    for r in report:
        if r.access == "write":
            continue
        sev: Severity
        if r.user not in owners:
            rule, sev, why = "weights.foreign_reader", "high", f"{r.user or f'uid {r.uid}'} is not an owner"
        elif r.job is None:
            rule, sev, why = "weights.reader_outside_job", "medium", "no job of the owner runs on that node"
        else:
            continue
        key = (rule, r.host, r.binary, r.user, r.path)
        if key in seen:
            continue
        seen.add(key)
        findings.append(
            Finding(
                vector="weights_access",
                severity=sev,
                target=r.path,
                title=f"{(r.binary or '?').rsplit('/', 1)[-1]} on {r.host} read {r.path.rsplit('/', 1)[-1]}: {why}",
                evidence={
                    "host": r.host,
                    "binary": r.binary,
                    "user": r.user,
                    "uid": r.uid,
                    "job": r.job,
                    "access": r.access,
                    "path": r.path,
                    "owners": sorted(owners),
                },
                t=r.t,
                rule=rule,
            )
        )
    return findings
