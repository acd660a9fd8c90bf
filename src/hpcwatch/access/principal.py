"""The one answer every route asks of a request: who is this, and with which roles.

Identity (``access/identity``: LDAP bind, a trusted proxy's header, API tokens, session cookies) sets
``request.state.principal``; the policy (``access/policy``) reads it. With no authentication configured
(loopback, or ``--insecure-no-auth``) every request is ``LOCAL``: one person on their own machine,
who may see everything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Principal", "Role", "ROLES", "LOCAL", "principal_of"]

Role = Literal["user", "operator", "security", "decider"]
ROLES: tuple[Role, ...] = ("user", "operator", "security", "decider")


@dataclass(frozen=True, slots=True)
class Principal:
    """A person or a script, as identity established it."""

    name: str
    """The Slurm user name (LDAP uid, the proxy's header, a token's owner)."""
    roles: frozenset[Role] = field(default_factory=frozenset)
    via: str = "local"
    """How it was established: ``local``, ``ldap``, ``proxy``, ``token``, ``session``."""
    scopes: frozenset[str] = field(default_factory=frozenset)
    """A token's scopes (e.g. ``metrics``); empty for people."""
    authenticated: bool = True


LOCAL = Principal(name="local", roles=frozenset(ROLES), via="local")


def principal_of(request: Any) -> Principal:
    """The principal identity attached to ``request`` (a Starlette request or connection); ``LOCAL`` when
    no authentication is configured for this app."""
    return getattr(request.state, "principal", None) or LOCAL
