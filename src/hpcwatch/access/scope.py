"""What one principal may see, as the report layer asks it: ``Scope``, the filter object passed to reports.

A ``Scope`` is the policy applied to a principal: its permissions, the Slurm accounts it coordinates
(``sacctmgr``'s coordinators, ``sources/sacctmgr.py``), and the key its pseudonyms are made with.
``FULL`` (every permission) is what ``LOCAL`` gets: no authentication configured, nothing filtered.

Pseudonyms are a keyed HMAC-SHA256 of the name, so they are stable within a deployment (a decider can
follow "u-3f9a…" across days) and cannot be reversed by hashing a list of user names without the key.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from hpcwatch.access.policy import PERMISSIONS, Policy
from hpcwatch.access.principal import Principal
from hpcwatch.errors import ConfigError

__all__ = ["Scope", "FULL", "scope_for", "pseudonym_key", "KEY_BYTES"]

KEY_BYTES: Final = 32


@dataclass(frozen=True, slots=True)
class Scope:
    """A principal's view: ``can(permission)``, ``sees_job(user, account)``, ``shown(name)``."""

    name: str
    permissions: frozenset[str]
    accounts: frozenset[str] = frozenset()
    """Slurm accounts the principal coordinates (their jobs are visible with ``jobs:account``)."""
    key: bytes = field(default=b"", repr=False)

    def can(self, permission: str) -> bool:
        return permission in self.permissions

    @property
    def everything(self) -> bool:
        """Nothing to filter: every permission (``LOCAL``, or a role holding them all)."""
        return self.permissions >= frozenset(PERMISSIONS)

    @property
    def all_jobs(self) -> bool:
        return "jobs:all" in self.permissions

    @property
    def pseudonymous(self) -> bool:
        """Only aggregates: the names it sees are pseudonyms."""
        return not self.all_jobs and "aggregates" in self.permissions

    def sees_job(self, user: str | None, account: str | None) -> bool:
        """Whether a job of ``user`` under ``account`` is shown with its id and names."""
        if self.all_jobs:
            return True
        if "jobs:own" in self.permissions and user is not None and user == self.name:
            return True
        return "jobs:account" in self.permissions and account is not None and account in self.accounts

    def pseudonym(self, name: str) -> str:
        """``u-`` and 12 hex digits of HMAC-SHA256(key, name): stable within a deployment, not reversible."""
        return _pseudonym(self.key, name)

    def shown(self, name: str | None) -> str | None:
        """``name`` as this scope may read it: itself, or its pseudonym for an aggregates-only scope."""
        if name is None or not self.pseudonymous:
            return name
        return self.pseudonym(name)


@functools.lru_cache(maxsize=65_536)
def _pseudonym(key: bytes, name: str) -> str:
    # Cached: a decider's live frame names the same few hundred users on every GPU, every second.
    return "u-" + hmac.new(key, name.encode(), hashlib.sha256).hexdigest()[:12]


FULL: Final = Scope(name="local", permissions=frozenset(PERMISSIONS))


def scope_for(
    principal: Principal,
    policy: Policy,
    *,
    coordinators: Mapping[str, Iterable[str]] | None = None,
    key: bytes = b"",
) -> Scope:
    """``principal`` under ``policy``; ``coordinators`` maps a user to the accounts they coordinate."""
    accounts = frozenset((coordinators or {}).get(principal.name, ()))
    return Scope(name=principal.name, permissions=policy.permissions(principal), accounts=accounts, key=key)


def pseudonym_key(policy: Policy, store_path: str | Path | None) -> bytes:
    """The deployment's pseudonym key: the policy's ``key_file``; else ``access.key`` beside an on-disk store,
    made once (mode 0600); else (an in-memory store) a key for this process only."""
    path = policy.key_file
    if path is None and store_path not in (None, ":memory:"):
        path = Path(str(store_path)) / "access.key"
    if path is None:
        return secrets.token_bytes(KEY_BYTES)
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        if policy.key_file is not None:
            raise ConfigError(f"{path}: the pseudonym key file does not exist") from None
        key = _new_key(path)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the pseudonym key: {err.strerror}") from err
    if len(key) < 16:
        raise ConfigError(f"{path}: the pseudonym key must be at least 16 bytes, it has {len(key)}")
    return key


def _new_key(path: Path) -> bytes:
    key = secrets.token_bytes(KEY_BYTES)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_bytes()  # another process made it first: use theirs
    except OSError:
        return key  # a read-only store: pseudonyms for this process only
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key
