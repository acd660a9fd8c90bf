"""The access side of one running app: its policy, its pseudonym key and its coordinators, turning a
``Principal`` into the ``Scope`` every report is filtered by."""

from __future__ import annotations

import threading
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
    coordinators: Coordinators = field(default_factory=lambda: Coordinators(None))
    store_path: str | Path | None = None
    key: bytes | None = field(default=None, repr=False)
    """Made on the first scope that needs it: a local app (no authentication) never writes ``access.key``."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def of(cls, policy: Policy | None, *, store_path: str | Path | None) -> Access:
        """The policy (the built-in one when None) with its coordinators file read now, and its key file
        when it names one (a missing key file is an error at start, not at the first request)."""
        policy = policy or DEFAULT_POLICY
        key = pseudonym_key(policy, store_path) if policy.key_file is not None else None
        return cls(policy=policy, coordinators=Coordinators(policy.coordinators_file), store_path=store_path, key=key)

    def scope(self, principal: Principal) -> Scope:
        """``FULL`` for the local principal (no authentication configured: behaviour unchanged)."""
        if principal.via == "local":
            return FULL
        return scope_for(principal, self.policy, coordinators=self.coordinators.table(), key=self._key())

    def _key(self) -> bytes:
        with self._lock:
            if self.key is None:
                self.key = pseudonym_key(self.policy, self.store_path)
            return self.key
