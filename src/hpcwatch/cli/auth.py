"""``hpcwatch token create|list|revoke``: the API tokens of the auth config's ``[tokens] file``; and
``identity_for``, what ``serve --auth`` and ``exporter --auth`` build from that config."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from hpcwatch.cli.common import PATH, HelpGroup, app, emit_json, json_option, safe_text
from hpcwatch.errors import ConfigError

__all__ = ["token", "identity_for", "check_auth_exposure"]


def _auth_required(function: Any) -> Any:
    return click.option(
        "--auth", "auth", type=PATH, required=True, help="The auth config whose [tokens] file holds the tokens."
    )(function)


def _store_of(auth: Path) -> Any:
    from hpcwatch.access.authconfig import load_auth_config
    from hpcwatch.access.tokens import TokenStore

    config = load_auth_config(auth)
    if config.tokens is None:
        raise ConfigError(f"{auth}:1: no [tokens] table: say where tokens are kept ([tokens] file = ...)")
    return TokenStore(config.tokens.file)


@app.group(cls=HelpGroup)
def token() -> None:
    """API tokens for scripts (scope api) and for Prometheus scraping the exporter (scope metrics)."""


@token.command()
@_auth_required
@click.option("--user", required=True, help="Whose token it is (a Slurm user name; its roles come from [roles]).")
@click.option(
    "--scope", type=click.Choice(["metrics", "api"]), required=True, help="metrics: the exporter; api: the web API."
)
@click.option("--expires", default="90d", show_default=True, help="Lifetime: a number and s, m, h, d or w.")
def create(auth: Path, user: str, scope: str, expires: str) -> None:
    """Make a token: printed once (keep it: only its hash is stored)."""
    from hpcwatch.access.tokens import parse_duration

    text, entry = _store_of(auth).create(user, scope, parse_duration(expires))
    click.echo(text)
    click.echo(f"id {entry.id}, {entry.scope}, for {entry.user}, expires {_utc(entry.expires)}", err=True)


@token.command(name="list")
@_auth_required
@json_option()
def list_tokens(auth: Path, as_json: bool) -> None:
    """The tokens (never their secrets): id, user, scope, created, expires, revoked."""
    from dataclasses import asdict

    entries = _store_of(auth).entries()
    if as_json:
        emit_json([{k: v for k, v in asdict(e).items() if k != "sha256"} for e in entries])
        return
    now = time.time()
    for e in entries:
        state = "revoked" if e.revoked else ("expired" if e.expires <= now else "valid")
        click.echo(
            f"{e.id}  {safe_text(e.user)}  {e.scope}  created {_utc(e.created)}  expires {_utc(e.expires)}  {state}"
        )


@token.command()
@_auth_required
@click.argument("token_id")
def revoke(auth: Path, token_id: str) -> None:
    """Revoke the token of that id (seen by running servers at their next request)."""
    entry = _store_of(auth).revoke(token_id)
    click.echo(f"revoked {entry.id} ({safe_text(entry.user)}, {entry.scope})")


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def identity_for(auth: Path, store: Any | None) -> Any:
    """The ``Identity`` of ``--auth FILE``; its audit events (logins, failures, lock-outs) go to ``store``."""
    from hpcwatch.access.authconfig import load_auth_config
    from hpcwatch.access.identity import Identity

    config = load_auth_config(auth)
    if store is None:
        return Identity(config)
    return Identity(config, audit=lambda event: store.add([event]))


def check_auth_exposure(identity: Any, host: str, *, tls: bool) -> None:
    """Passwords never cross a network in clear: a login form off loopback needs TLS here, or
    ``[session] secure = "always"`` to say a TLS proxy in front terminates it."""
    from hpcwatch.httpguard import is_loopback

    config = identity.config
    if config.ldap is not None and not is_loopback(host) and not tls and config.session.secure != "always":
        raise ConfigError(
            f"{config.path}: [ldap] logins on {host} without TLS would send passwords in clear: give --tls-cert "
            '/--tls-key, or set [session] secure = "always" if a TLS proxy in front terminates HTTPS'
        )
