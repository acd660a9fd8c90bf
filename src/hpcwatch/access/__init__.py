"""Who a request comes from and what they may see: identity (LDAP, a trusted proxy header, API tokens,
sessions) and the roles policy that filters every route, stream and export."""

__all__: list[str] = []
