"""Who a login name and password are, by binding to the directory as that user (ldap3, no protocol of ours).

The password is checked by the directory itself (a simple bind as the user's DN), never compared here. The
DN is the ``user_dn`` template with the name escaped as an RDN value (RFC 4514), or found by ``search_filter``
with the name escaped as a filter value (RFC 4515), so ``*)(uid=*`` or ``a,ou=x`` match nobody. Groups are
searched as the user just bound (what it may read), their ``cn`` and DN given back for ``[roles]``.
"""

from __future__ import annotations

import logging
import math
import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcwatch.access.authconfig import LdapConfig
from hpcwatch.errors import BackendError

__all__ = ["LdapUser", "LdapAuthenticator", "valid_login_name"]

log = logging.getLogger(__name__)

_NAME_RE = re.compile(r"[A-Za-z0-9._@-]{1,64}")
_MAX_PASSWORD = 1024


@dataclass(frozen=True, slots=True)
class LdapUser:
    name: str
    dn: str
    groups: frozenset[str]
    """Each group's cn and DN."""


def valid_login_name(name: str) -> bool:
    """A Slurm-like user name; anything else is refused before the directory is asked."""
    return bool(_NAME_RE.fullmatch(name))


def _seconds(timeout_s: float) -> int:
    """ldap3 packs its socket timeouts as whole seconds (``struct.pack`` of an int: a float fails)."""
    return max(1, math.ceil(timeout_s))


class LdapAuthenticator:
    def __init__(self, config: LdapConfig) -> None:
        self.config = config

    def authenticate(self, name: str, password: str) -> LdapUser | None:
        """The user, if the directory accepts ``password`` for ``name``; None if it does not. A directory that
        does not answer (down, TLS refused, timeout) is a ``BackendError``: not the user's fault, not a failure
        to count against them."""
        from ldap3.core.exceptions import LDAPException

        # An empty password is an unauthenticated bind (RFC 4513 §5.1.2), which succeeds: refuse it here.
        if not valid_login_name(name) or not password or len(password) > _MAX_PASSWORD:
            return None
        try:
            dn = self._user_dn(name)
            if dn is None:
                return None
            connection = self._connection(dn, password)
            try:
                if not connection.bind():
                    return None
                return LdapUser(name=name, dn=dn, groups=self._groups(connection, name, dn))
            finally:
                connection.unbind()
        except (LDAPException, OSError) as err:
            raise BackendError(f"LDAP {self.config.url}: {type(err).__name__}: {err}") from err

    def _server(self) -> Any:
        from ldap3 import Server, Tls

        c = self.config
        tls = None
        if c.url.startswith("ldaps://") or c.start_tls:
            tls = Tls(validate=ssl.CERT_REQUIRED, ca_certs_file=c.ca_file or None)
        return Server(c.url, use_ssl=c.url.startswith("ldaps://"), tls=tls, connect_timeout=_seconds(c.timeout_s))

    def _connection(self, dn: str | None, password: str | None) -> Any:
        from ldap3 import Connection

        c = self.config
        connection = Connection(
            self._server(), user=dn, password=password, receive_timeout=_seconds(c.timeout_s), raise_exceptions=False
        )
        if c.start_tls:
            connection.open()
            if not connection.start_tls():
                raise BackendError(f"LDAP {c.url}: StartTLS refused: {connection.result}")
        return connection

    def _user_dn(self, name: str) -> str | None:
        from ldap3.utils.conv import escape_filter_chars
        from ldap3.utils.dn import escape_rdn

        c = self.config
        if c.user_dn:
            return c.user_dn.replace("{user}", escape_rdn(name))
        password = Path(c.bind_password_file).read_text().strip() if c.bind_password_file else None
        finder = self._connection(c.bind_dn or None, password)
        try:
            if not finder.bind():
                raise BackendError(f"LDAP {c.url}: the search account {c.bind_dn or '(anonymous)'} cannot bind")
            finder.search(c.search_base, c.search_filter.replace("{user}", escape_filter_chars(name)), size_limit=2)
            found = [e.entry_dn for e in finder.entries]
        finally:
            finder.unbind()
        return found[0] if len(found) == 1 else None  # two entries for one name: refuse, do not guess

    def _groups(self, connection: Any, name: str, dn: str) -> frozenset[str]:
        from ldap3.utils.conv import escape_filter_chars

        c = self.config
        if not c.group_base:
            return frozenset()
        query = c.group_filter.replace("{user}", escape_filter_chars(name)).replace("{dn}", escape_filter_chars(dn))
        connection.search(c.group_base, query, attributes=["cn"], size_limit=1000)
        groups: set[str] = set()
        for entry in connection.entries:
            groups.add(entry.entry_dn)
            groups.update(str(v) for v in entry.cn.values)
        return frozenset(groups)
