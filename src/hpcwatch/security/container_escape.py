"""Container escape: Falco and Tetragon saw a training container reach for the host.

A GPU container is privileged more often than it should be (device files, IPC,
``--privileged`` for RDMA), which makes the classic escapes one command away:
``release_agent`` of cgroup v1 (CVE-2022-0492), mounting the host disk, debugfs,
loading a kernel module. Findings are tied to the node (Falco ``hostname``,
Tetragon ``node_name``), and through Slurm to the job(s) running there and their GPUs.

Falco rules mapped (names as in https://github.com/falcosecurity/rules/blob/main/rules/falco_rules.yaml
and falco-incubating_rules.yaml):

    rule id                                   Falco rule
    container_escape.release_agent            Detect release_agent File Container Escapes
    container_escape.privileged_mount         Mount Launched in Privileged Container
    container_escape.privileged_debugfs       Debugfs Launched in Privileged Container
    container_escape.kernel_module            Linux Kernel Module Injection Detected
    container_escape.dropped_binary           Drop and execute new binary in container
    container_escape.fileless_exec            Fileless execution via memfd_create
    container_escape.shell                    Terminal shell in container, Run shell untrusted
    container_escape.falco_other              any other alert of priority Warning or above

Tetragon: ``container_escape.release_agent`` (a kprobe write to a ``release_agent`` file),
``container_escape.escape_tool`` (exec of nsenter, unshare, mount, debugfs, insmod,
modprobe as root), ``container_escape.shell`` (a shell whose parent is the training
interpreter: code execution inside the job).

An expected debug shell does not fire: one opened by the user who owns the job on
that node (``srun --jobid ... --pty bash``), or one matching ``allowed_shells``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hpcwatch.records import Event, Finding, Job, Severity
from hpcwatch.security.context import JobIndex, host_of
from hpcwatch.sources.tetragon import MAY_WRITE
from hpcwatch.vocab import EventKind

__all__ = ["ContainerEscapeConfig", "AllowedShell", "detect_container_escape", "FALCO_RULES", "RULES"]

#: Falco rule name -> (our rule id, severity).
FALCO_RULES: dict[str, tuple[str, Severity]] = {
    "Detect release_agent File Container Escapes": ("container_escape.release_agent", "critical"),
    "Mount Launched in Privileged Container": ("container_escape.privileged_mount", "high"),
    "Debugfs Launched in Privileged Container": ("container_escape.privileged_debugfs", "high"),
    "Linux Kernel Module Injection Detected": ("container_escape.kernel_module", "critical"),
    "Drop and execute new binary in container": ("container_escape.dropped_binary", "high"),
    "Fileless execution via memfd_create": ("container_escape.fileless_exec", "high"),
    "Terminal shell in container": ("container_escape.shell", "medium"),
    "Run shell untrusted": ("container_escape.shell", "medium"),
}
_SHELL_RULE = "container_escape.shell"
#: Rule ids this detector emits (the web catalogues have a title per rule: web/en.yaml ``finding``).
RULES: tuple[str, ...] = tuple(
    dict.fromkeys(
        [r for r, _ in FALCO_RULES.values()] + ["container_escape.falco_other", "container_escape.escape_tool"]
    )
)
#: Falco's shell_binaries list.
SHELLS = frozenset({"ash", "bash", "csh", "ksh", "sh", "tcsh", "zsh", "dash"})
ESCAPE_TOOLS = frozenset({"nsenter", "unshare", "mount", "debugfs", "insmod", "modprobe"})
_INTERPRETERS = ("python", "python3", "torchrun")
_PRIORITY_SEVERITY: dict[str, Severity] = {
    "emergency": "critical",
    "alert": "critical",
    "critical": "high",
    "error": "high",
    "warning": "medium",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class AllowedShell:
    """A debug shell someone expects: every field given must match."""

    user: str | None = None
    image_prefix: str | None = None
    host: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerEscapeConfig:
    allowed_shells: tuple[AllowedShell, ...] = ()
    owner_shells_allowed: bool = True
    """A shell by the user who owns the job on that node is their own debugging."""


def detect_container_escape(
    events: Iterable[Event], jobs: Iterable[Job] = (), config: ContainerEscapeConfig = ContainerEscapeConfig()
) -> list[Finding]:
    index = JobIndex.of(jobs)
    findings = []
    for e in events:
        hit = _falco(e) if e.kind == EventKind.FALCO else _tetragon(e) if e.kind == EventKind.TETRAGON else None
        if hit is None:
            continue
        rule, severity, title, who = hit
        host = host_of(e.attrs)
        running = index.on(host, e.t) if host else []
        if rule == _SHELL_RULE and _expected_shell(who, host, running, config):
            continue
        evidence = {
            "host": host,
            **who,
            "jobs": _jobs_evidence(running, host) if host else [],
            "source": e.kind,
            "source_rule": e.attrs.get("rule") or e.attrs.get("function_name"),
        }
        if e.kind == EventKind.FALCO:
            evidence["output"] = e.attrs.get("output")
        target = f"{host} job {running[0].id}" if running else (host or "?")
        findings.append(
            Finding(
                vector="container_escape",
                severity=severity,
                target=target,
                title=title,
                evidence=evidence,
                t=e.t,
                rule=rule,
            )
        )
    return findings


def _jobs_evidence(running: list[Job], host: str) -> list[dict]:
    return [{"id": j.id, "user": j.user, "gpus": list(j.gpus_by_node.get(host, ()))} for j in running]


def _falco(e: Event) -> tuple[str, Severity, str, dict] | None:
    a = e.attrs
    f = a.get("output_fields") or {}
    who = {
        "user": f.get("user.name"),
        "image": f.get("container.image.repository"),
        "container": f.get("container.name") or f.get("container.id"),
        "cmdline": f.get("proc.cmdline"),
    }
    mapped = FALCO_RULES.get(a["rule"])
    if mapped is None:
        severity = _PRIORITY_SEVERITY.get(str(a.get("priority", "")).lower())
        if severity is None:
            return None
        mapped = ("container_escape.falco_other", severity)
    return mapped[0], mapped[1], f"Falco: {a['rule']} on {a.get('host') or '?'}", who


def _tetragon(e: Event) -> tuple[str, Severity, str, dict] | None:
    a = e.attrs
    binary = a.get("binary") or ""
    name = binary.rsplit("/", 1)[-1]
    pod = a.get("pod") or {}
    who = {
        "user": a.get("user"),
        "uid": a.get("uid"),
        "binary": binary,
        "arguments": a.get("arguments"),
        "image": ((pod.get("container") or {}).get("image") or {}).get("name"),
    }
    path = a.get("path") or ""
    if (
        a.get("type") == "process_kprobe"
        and path.endswith("release_agent")
        and (a.get("mask") or MAY_WRITE) & MAY_WRITE
    ):
        return "container_escape.release_agent", "critical", f"{name} wrote {path}", {**who, "path": path}
    if a.get("type") != "process_exec":
        return None
    if name in ESCAPE_TOOLS and a.get("uid") == 0:
        return "container_escape.escape_tool", "high", f"root ran {name} {a.get('arguments') or ''}".strip(), who
    parent = (a.get("parent_binary") or "").rsplit("/", 1)[-1]
    if name in SHELLS and parent.startswith(_INTERPRETERS):
        return _SHELL_RULE, "high", f"the training process ({parent}) started {name}", who
    return None


def _expected_shell(who: dict, host: str | None, running: list[Job], config: ContainerEscapeConfig) -> bool:
    user, image = who.get("user"), who.get("image") or ""
    if config.owner_shells_allowed and user and any(j.user == user for j in running):
        return True
    return any(
        (a.user is None or a.user == user)
        and (a.image_prefix is None or image.startswith(a.image_prefix))
        and (a.host is None or a.host == host)
        for a in config.allowed_shells
    )
