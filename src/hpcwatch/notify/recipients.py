"""Who a notice concerns, as mail addresses: the job's user, its account's coordinators, operators, security.

A user's address, first match wins: the ``[notify.users]`` map; Slurm's mail-user when it is an address
(``--mail-user`` of ``hpcwatch notify --job``, which the EpilogSlurmctld script reads from ``scontrol show
job``, else the job's ``mail_user`` as the store keeps it from ``squeue --json`` / slurmrestd; Slurm
sets it to the user's name when the job gave none, which is no address and falls through); the
``user_template`` (``{user}@example.org``). Every address is checked
(``check_address``): one holding CR, LF, another control or a bidi character, or that is not one
``local@domain``, is refused — a user name from Slurm cannot add a ``Bcc:`` to a mail.

An account's coordinators: the users Slurm names as its coordinators (``coordinators_file``, sacctmgr's
listing), each addressed as a job's user is — the users map, then the template with ``{account}`` the
account (no Slurm mail-user: that is a job's, and a coordinator's notice is no job's) — in their own
language; then the ``[notify.coordinators]`` addresses written by hand for that account, in the
config's language. The hand table adds to Slurm's list, never removes from it: a coordinator added
in sacctmgr is reached without editing the config, and a PI who is no Slurm coordinator can still be
written in. Each address once (Slurm's first).
"""

from __future__ import annotations

from hpcwatch.notify.address import check_address
from hpcwatch.notify.config import NotifyConfig
from hpcwatch.notify.coordinators import coordinator_users

__all__ = ["check_address", "user_address", "user_language", "audience_addresses", "audience_recipients"]


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
    return tuple(address for address, _ in audience_recipients(config, audience, account=account))


def audience_recipients(
    config: NotifyConfig, audience: str, *, account: str | None = None
) -> tuple[tuple[str, str], ...]:
    """(checked address, language) of ``coordinators`` (of ``account``), ``operators`` or ``security``."""
    if audience == "coordinators":
        found = _coordinators(config, account or "")
    elif audience == "operators":
        found = [(a, config.language) for a in config.operators]
    elif audience == "security":
        found = [(a, config.language) for a in config.security]
    else:
        raise ValueError(f"not a role audience: {audience!r}")
    out: dict[str, str] = {}
    for address, lang in found:
        checked = check_address(address)
        if checked and checked not in out:
            out[checked] = lang
    return tuple(out.items())


def _coordinators(config: NotifyConfig, account: str) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    if config.coordinators_file and account:
        for user in sorted(coordinator_users(config.coordinators_file, account)):
            address = user_address(config, user, account)
            if address:
                found.append((address, user_language(config, user)))
    found += [(a, config.language) for a in config.coordinators.get(account, ())]
    return found
