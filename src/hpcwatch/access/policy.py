"""Roles → permissions: what each role may see, from a TOML file or the built-in default.

TOML, not YAML, because every other config of hpcwatch (``collect``, ``notify``, ``act``) is TOML, read
by the standard library's ``tomllib`` with ``tomlkeys`` naming the line of a wrong key, so a bad policy
reads like a bad collector config: ``FILE:LINE: what``.

```toml
[roles]
user = ["jobs:own", "jobs:account"]
operator = ["jobs:all", "health", "actions", "aggregates"]
security = ["findings", "weights", "audit"]
decider = ["aggregates"]

[pseudonyms]
key_file = "/etc/hpcwatch/pseudonym.key"   # optional: the HMAC key of decider's pseudonyms

[coordinators]
file = "/var/lib/hpcwatch/coordinators.txt"  # optional: sacctmgr show user withcoordinator --parsable2
```

A role the file leaves out keeps no permission (listing it is how a site grants it); a role or a
permission this module does not know is an error, never ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from hpcwatch.access.principal import ROLES, Principal
from hpcwatch.errors import ConfigError
from hpcwatch.tomlkeys import KeyLines, load_toml, read_config

__all__ = ["PERMISSIONS", "DEFAULT_POLICY", "Policy", "load_policy", "parse_policy"]

#: Every permission a role can hold, and what it opens. Routes name them (``web/access.py``).
PERMISSIONS: Final[Mapping[str, str]] = {
    "jobs:own": "one's own jobs: their GPUs, steps, pages, queue entries",
    "jobs:account": "the jobs of the Slurm accounts one coordinates (sacctmgr's coordinators)",
    "jobs:all": "every job, with its user and account",
    "health": "node and GPU health: verdicts, problems, the recent events, collectors, histories",
    "findings": "security findings, per threat vector",
    "weights": "who read the model weights (checkpoint events)",
    "audit": "the audit trail: who opened which job or finding, who acted",
    "aggregates": "cluster-wide aggregates (assessment, utilisation) with user names pseudonymised",
    "actions": "the actions of hpcwatch act and their undo",
}

#: The roles of issue #25: a user sees their jobs, an operator jobs and health, security the findings and
#: the audit, a decider aggregates only.
DEFAULT_ROLES: Final[Mapping[str, frozenset[str]]] = {
    "user": frozenset({"jobs:own", "jobs:account"}),
    "operator": frozenset({"jobs:all", "health", "actions", "aggregates"}),
    "security": frozenset({"findings", "weights", "audit"}),
    "decider": frozenset({"aggregates"}),
}


@dataclass(frozen=True, slots=True)
class Policy:
    """Roles → permissions, and where the key of decider's pseudonyms is kept."""

    roles: Mapping[str, frozenset[str]] = field(default_factory=lambda: dict(DEFAULT_ROLES))
    key_file: Path | None = None
    """The HMAC key of pseudonyms; None: kept beside the store (``access.scope.pseudonym_key``)."""
    coordinators_file: Path | None = None
    """``sacctmgr show user withcoordinator --parsable2`` saved by cron (``access.coordinators``)."""
    source: str = "built-in"

    def permissions(self, principal: Principal) -> frozenset[str]:
        """What ``principal``'s roles grant together."""
        granted: set[str] = set()
        for role in principal.roles:
            granted |= self.roles.get(role, frozenset())
        return frozenset(granted)


DEFAULT_POLICY: Final = Policy()


def load_policy(path: str | Path) -> Policy:
    """The policy file at ``path``; a ConfigError ``FILE:LINE: what`` when it cannot be one."""
    return parse_policy(read_config(path, "policy file"), path=str(path))


def parse_policy(text: str, *, path: str = "<policy>") -> Policy:
    doc = load_toml(text, path)
    lines = KeyLines(text)
    unknown = sorted(set(doc) - {"roles", "pseudonyms", "coordinators"})
    if unknown:
        where = f"{path}:{lines.find(None, None, unknown[0])}"
        raise ConfigError(f"{where}: unknown table {unknown[0]!r} (known: roles, pseudonyms, coordinators)")
    if "roles" not in doc:
        raise ConfigError(f"{path}:1: no [roles] table")
    roles = _roles(doc["roles"], path, lines)
    key_file = _path_in(doc.get("pseudonyms", {}), "pseudonyms", "key_file", path, lines)
    coordinators = _path_in(doc.get("coordinators", {}), "coordinators", "file", path, lines)
    return Policy(roles=roles, key_file=key_file, coordinators_file=coordinators, source=path)


def _roles(raw: Any, path: str, lines: KeyLines) -> dict[str, frozenset[str]]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}:{lines.find(None, None, 'roles')}: roles must be a table of role = [permissions]")
    out: dict[str, frozenset[str]] = {}
    for role, granted in raw.items():
        where = f"{path}:{lines.find('roles', None, role)}"
        if role not in ROLES:
            raise ConfigError(f"{where}: unknown role {role!r} in [roles] (known: {', '.join(ROLES)})")
        if not isinstance(granted, list) or not all(isinstance(p, str) for p in granted):
            raise ConfigError(f"{where}: roles.{role} must be a list of permission names, got {granted!r}")
        bad = [p for p in granted if p not in PERMISSIONS]
        if bad:
            raise ConfigError(
                f"{where}: unknown permission {bad[0]!r} in roles.{role} (known: {', '.join(PERMISSIONS)})"
            )
        out[role] = frozenset(granted)
    return out


def _path_in(raw: Any, table: str, key: str, path: str, lines: KeyLines) -> Path | None:
    """The one key of a table naming a file (``[pseudonyms] key_file``, ``[coordinators] file``)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}:{lines.find(None, None, table)}: {table} must be a table")
    for other in raw:
        if other != key:
            raise ConfigError(f"{path}:{lines.find(table, None, other)}: unknown key {other!r} in [{table}]")
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        where = f"{path}:{lines.find(table, None, key)}"
        raise ConfigError(f"{where}: {table}.{key} must be a path (a string), got {value!r}")
    return Path(value)
