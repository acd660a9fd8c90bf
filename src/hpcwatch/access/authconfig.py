"""The auth config (``--auth FILE`` of ``serve``, ``exporter`` and ``token``): who may log in and how.

One TOML file, each table optional, at least one way in::

    [ldap]                  # bind as the user (ldap3); groups give roles
    url = "ldaps://ldap.example.org"
    user_dn = "uid={user},ou=people,dc=example,dc=org"
    group_base = "ou=groups,dc=example,dc=org"
    group_filter = "(&(objectClass=posixGroup)(memberUid={user}))"

    [proxy]                 # a reverse proxy that authenticated the user already
    header = "X-Remote-User"
    trusted = ["10.0.0.5", "10.0.1.0/24"]

    [tokens]                # API tokens for scripts and Prometheus (hpcwatch token create)
    file = "/etc/hpcwatch/tokens.json"

    [roles]                 # role -> users and @groups; everyone is also "user"
    operator = ["alice", "@hpc-admins"]

    [session]   idle_minutes, absolute_hours, secure ("auto": with TLS)
    [login]     per_address_per_minute, lockout_failures, lockout_minutes

A wrong key reads ``FILE:LINE: what`` (hpcwatch.tomlkeys), as ``collect``, ``notify`` and ``act`` do.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_type_hints

from hpcwatch.access.principal import ROLES, Role
from hpcwatch.errors import ConfigError
from hpcwatch.tomlkeys import KeyLines, load_toml, read_config, typed

__all__ = [
    "AuthConfig",
    "LdapConfig",
    "ProxyConfig",
    "TokensConfig",
    "SessionConfig",
    "LoginConfig",
    "load_auth_config",
    "parse_auth_text",
    "roles_for",
]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True, kw_only=True)
class LdapConfig:
    url: str
    """``ldap://host:389`` (then say ``start_tls = true`` off loopback) or ``ldaps://host:636``."""
    user_dn: str = ""
    """The DN to bind as, ``{user}`` standing for the escaped login name; else found by ``search_filter``."""
    search_base: str = ""
    search_filter: str = "(uid={user})"
    bind_dn: str = ""
    """The service account that searches for the user's DN (with ``search_base``); empty: anonymous."""
    bind_password_file: str = ""
    group_base: str = ""
    """Where groups are searched (empty: no groups, every LDAP user has the role ``user`` only)."""
    group_filter: str = "(|(memberUid={user})(member={dn}))"
    start_tls: bool = False
    ca_file: str = ""
    timeout_s: float = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyConfig:
    header: str = "X-Remote-User"
    """The header naming the user the proxy authenticated; empty: a proxy that only terminates TLS, whose
    ``X-Forwarded-For`` is believed but which names no user."""
    trusted: tuple[str, ...] = ()
    """Addresses or CIDRs of the proxies; the header from any other peer is ignored (and logged)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TokensConfig:
    file: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionConfig:
    idle_minutes: float = 30.0
    absolute_hours: float = 12.0
    secure: Literal["auto", "always", "never"] = "auto"
    """The cookie's ``Secure`` flag: ``auto`` sets it when the server speaks TLS."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoginConfig:
    per_address_per_minute: int = 10
    lockout_failures: int = 5
    lockout_minutes: float = 15.0


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthConfig:
    path: str = "<auth>"
    ldap: LdapConfig | None = None
    proxy: ProxyConfig | None = None
    tokens: TokensConfig | None = None
    roles: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    session: SessionConfig = field(default_factory=SessionConfig)
    login: LoginConfig = field(default_factory=LoginConfig)

    def trusted_networks(self) -> tuple[Network, ...]:
        return tuple(ipaddress.ip_network(a, strict=False) for a in (self.proxy.trusted if self.proxy else ()))


_TABLES: dict[str, type] = {
    "ldap": LdapConfig,
    "proxy": ProxyConfig,
    "tokens": TokensConfig,
    "session": SessionConfig,
    "login": LoginConfig,
}


def load_auth_config(path: Path | str) -> AuthConfig:
    """The auth config in ``path``; a missing file or a wrong key is one ``ConfigError`` line."""
    return parse_auth_text(read_config(path, "auth config"), path=str(path))


def parse_auth_text(text: str, *, path: str = "<auth>") -> AuthConfig:
    doc = load_toml(text, path)
    lines = KeyLines(text)
    values: dict[str, Any] = {"path": path}
    for name, raw in doc.items():
        where = f"{path}:{lines.find(None, None, name)}"
        if name == "roles":
            values["roles"] = _roles(raw, path, lines)
        elif name in _TABLES:
            values[name] = _table(name, raw, path, lines)
        else:
            raise ConfigError(f"{where}: unknown table [{name}] (known: {', '.join([*_TABLES, 'roles'])})")
    config = AuthConfig(**values)
    if config.ldap is None and config.proxy is None and config.tokens is None:
        raise ConfigError(f"{path}:1: no way in: give at least one of [ldap], [proxy], [tokens]")
    return config


def _table(name: str, raw: Any, path: str, lines: KeyLines) -> Any:
    kind = _TABLES[name]
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}:{lines.find(None, None, name)}: [{name}] must be a table")
    hints = get_type_hints(kind)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"{path}:{lines.find(name, None, key)}"
        if key not in hints:
            raise ConfigError(f"{where}: unknown key {key!r} in [{name}] (known: {', '.join(hints)})")
        values[key] = typed(value, key, hints[key], where, table=name)
        _check(name, key, values[key], where)
    missing = [f.name for f in fields(kind) if f.name not in values and _required(f)]
    if missing:
        raise ConfigError(f"{path}:{lines.find(None, None, name)}: [{name}] needs {', '.join(missing)}")
    if name == "ldap":
        _check_ldap(values, path, lines)
    return kind(**values)


def _required(f: Any) -> bool:
    from dataclasses import MISSING

    return f.default is MISSING and f.default_factory is MISSING


def _check(table: str, key: str, value: Any, where: str) -> None:
    """The values a type cannot say wrong: URLs, addresses, templates, positive numbers."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value <= 0:
        raise ConfigError(f"{where}: {key} must be > 0, got {value!r}")
    if (table, key) == ("ldap", "url") and not value.startswith(("ldap://", "ldaps://")):
        raise ConfigError(f"{where}: url must start with ldap:// or ldaps://, got {value!r}")
    if (table, key) in (("ldap", "user_dn"), ("ldap", "search_filter")) and value and "{user}" not in value:
        raise ConfigError(f"{where}: {key} must contain {{user}}, got {value!r}")
    if (table, key) == ("proxy", "trusted"):
        for address in value:
            try:
                ipaddress.ip_network(address, strict=False)
            except ValueError:
                raise ConfigError(f"{where}: trusted: {address!r} is not an address or CIDR") from None
    if (table, key) == ("proxy", "header") and value and not value.replace("-", "").isalnum():
        raise ConfigError(f"{where}: header must be a header name (letters, digits, -), got {value!r}")


def _check_ldap(values: dict[str, Any], path: str, lines: KeyLines) -> None:
    if not values.get("user_dn") and not values.get("search_base"):
        where = f"{path}:{lines.find(None, None, 'ldap')}"
        raise ConfigError(f"{where}: [ldap] needs user_dn (a template) or search_base (to find the user)")


def _roles(raw: Any, path: str, lines: KeyLines) -> dict[str, tuple[str, ...]]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}:{lines.find(None, None, 'roles')}: [roles] must be a table")
    out: dict[str, tuple[str, ...]] = {}
    for role, members in raw.items():
        where = f"{path}:{lines.find('roles', None, role)}"
        if role not in ROLES:
            raise ConfigError(f"{where}: unknown role {role!r} (known: {', '.join(ROLES)})")
        out[role] = typed(members, role, tuple[str, ...], where, table="roles")
    return out


def roles_for(config: AuthConfig | None, user: str, groups: frozenset[str] = frozenset()) -> frozenset[Role]:
    """``user`` (and the LDAP groups it is in, as ``@cn`` or ``@dn``) → its roles: ``user`` always, the others
    as ``[roles]`` lists them. Groups compare without case, as LDAP compares cn and DN values."""
    found: set[Role] = {"user"}
    lowered = {g.lower() for g in groups}
    for role, members in (config.roles if config else {}).items():
        for member in members:
            if member == user or (member.startswith("@") and member[1:].lower() in lowered):
                found.add(role)  # type: ignore[arg-type]  # checked against ROLES when read
    return frozenset(found)
