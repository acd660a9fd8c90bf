"""One rule for a mail address hpcwatch writes in a header: a plain ``local@domain``, nothing else."""

from __future__ import annotations

from email.errors import HeaderParseError
from email.headerregistry import Address

from hpcwatch.reports.text import CONTROL_CHARACTERS

__all__ = ["check_address"]


def check_address(address: str) -> str | None:
    """``address`` when it is one plain ``local@domain`` (no display name, no CR, LF, other control or bidi
    character, no list separator), else None."""
    if not address or CONTROL_CHARACTERS.search(address) or any(c in address for c in ' ,;<>"()'):
        return None
    try:
        parsed = Address(addr_spec=address)
    except (ValueError, IndexError, HeaderParseError):
        return None
    if not parsed.username or not parsed.domain or parsed.addr_spec != address:
        return None
    return address
