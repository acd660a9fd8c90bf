"""Who a notice concerns, as mail addresses: the job's user, its account's coordinators, operators, security.

A user's address, first match wins: the ``[notify.users]`` map; Slurm's mail-user when it is an address
(``--mail-user`` of ``hpcwatch notify --job``, which the EpilogSlurmctld script reads from ``scontrol show
job``, else the job's ``mail_user`` as the store keeps it from ``squeue --json`` / slurmrestd; Slurm
sets it to the user's name when the job gave none, which is no address and falls through); the
``user_template`` (``{user}@example.org``). Every address is checked
(``check_address``): one holding CR, LF, another control or a bidi character, or that is not one
``local@domain``, is refused — a user name from Slurm cannot add a ``Bcc:`` to a mail.
"""

from __future__ import annotations

from hpcwatch.notify.address import check_address
from hpcwatch.notify.config import NotifyConfig

__all__ = ["check_address", "user_address", "user_language", "audience_addresses"]


def user_address(config: NotifyConfig, user: str | None, account: str | None, *, mail_user: str = "") -> str | None:
    """The user's checked address (see the module docstring for the order), or None."""
    if not user:
        return None
    if user in config.users:
        return check_address(config.users[user])
    if mail_user and (address := check_address(mail_user)):
        return address
    if config.user_template:
        return check_address(config.user_template.format(user=user, account=account or ""))
    return None


def user_language(config: NotifyConfig, user: str | None) -> str:
    return config.languages.get(user or "", config.language)


def audience_addresses(config: NotifyConfig, audience: str, *, account: str | None = None) -> tuple[str, ...]:
    """The checked addresses of ``coordinators`` (of ``account``), ``operators`` or ``security``."""
    if audience == "coordinators":
        found = config.coordinators.get(account or "", ())
    elif audience == "operators":
        found = config.operators
    elif audience == "security":
        found = config.security
    else:
        raise ValueError(f"not a role audience: {audience!r}")
    return tuple(a for a in (check_address(x) for x in found) if a)
