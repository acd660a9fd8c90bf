"""The one registry of notification channels: a name in ``[[notify.channel]] type = ...`` -> its kind.

A new channel is one module (a frozen config dataclass and a class with ``check``, ``send`` and
``close``: ``message.Channel``) and one ``register(ChannelKind(...))`` line below; docs/extending.md,
"A new notification channel", says which files it touches. ``per_address``: the channel delivers to
mail addresses (one delivery per address); otherwise it posts once per audience.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpcwatch.notify.message import Channel
from hpcwatch.notify.smtp import SmtpChannel, SmtpConfig
from hpcwatch.notify.webhook import SlackChannel, SlackConfig, WebhookChannel, WebhookConfig

__all__ = ["ChannelKind", "CHANNELS", "register"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelKind:
    name: str
    config: type
    """Its options: a frozen, keyword-only dataclass whose fields are the TOML keys."""
    make: Callable[[str, Any], Channel]
    """``make(name, config)``: the channel, not yet connected."""
    per_address: bool
    audiences: tuple[str, ...]
    """Whose notices it carries when its table does not say."""


CHANNELS: dict[str, ChannelKind] = {}


def register(kind: ChannelKind) -> None:
    if kind.name in CHANNELS:
        raise ValueError(f"channel type {kind.name!r} registered twice")
    CHANNELS[kind.name] = kind


register(
    ChannelKind(
        name="smtp",
        config=SmtpConfig,
        make=SmtpChannel,
        per_address=True,
        audiences=("user", "coordinators", "operators", "security"),
    )
)
register(
    ChannelKind(
        name="webhook",
        config=WebhookConfig,
        make=WebhookChannel,
        per_address=False,
        audiences=("operators", "security"),
    )
)
register(
    ChannelKind(
        name="slack", config=SlackConfig, make=SlackChannel, per_address=False, audiences=("operators", "security")
    )
)
