"""The access side of one running app: its policy, its pseudonym key and its coordinators, turning a
``Principal`` into the ``Scope`` every report is filtered by."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hpcwatch.access.coordinators import Coordinators
from hpcwatch.access.policy import DEFAULT_POLICY, Policy
from hpcwatch.access.principal import Principal
from hpcwatch.access.scope import FULL, Scope, pseudonym_key, scope_for

__all__ = ["Access"]


@dataclass(slots=True)
class Access:
    policy: Policy = DEFAULT_POLICY
    key: bytes = field(default=b"", repr=False)
    coordinators: Coordinators = field(default_factory=lambda: Coordinators(None))

    @classmethod
    def of(cls, policy: Policy | None, *, store_path: str | Path | None) -> Access:
        """The policy (the built-in one when None) with its key and its coordinators file read now."""
        policy = policy or DEFAULT_POLICY
        return cls(
            policy=policy,
            key=pseudonym_key(policy, store_path),
            coordinators=Coordinators(policy.coordinators_file),
        )

    def scope(self, principal: Principal) -> Scope:
        """``FULL`` for the local principal (no authentication configured: behaviour unchanged)."""
        if principal.via == "local":
            return FULL
        return scope_for(principal, self.policy, coordinators=self.coordinators.table(), key=self.key)
