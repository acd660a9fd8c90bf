"""What a channel is handed: one rendered message (``Payload``), and the shape every channel has (``Channel``).

A payload is rendered once, when its notice is composed, and kept in the store as JSON with its
delivery row: what a restart or a retry sends is what was composed, byte for byte. Every string
from data in it has been made visible (``reports.text.visible``: CR, LF, ESC, bidi controls as
escapes) before it was put in a subject, a text body or a webhook document; the HTML body is
rendered with Jinja2's autoescape on top.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import orjson

__all__ = ["Payload", "Channel"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Payload:
    notice: str
    """The notice's key (``job-end/<id>``...)."""
    kind: str
    """One of ``config.KINDS``."""
    audience: str
    """One of ``config.AUDIENCES``."""
    lang: str
    to: str = ""
    """The mail address (mail channels); empty for a webhook, which posts for the audience."""
    subject: str
    text: str
    html: str = ""
    document: Mapping[str, Any] = field(default_factory=dict)
    """The fields a webhook posts (``kind``, ``notice``, ``audience``, the figures), strings made visible."""

    def to_json(self) -> str:
        return orjson.dumps(asdict(self)).decode()

    @classmethod
    def from_json(cls, text: str) -> Payload:
        return cls(**orjson.loads(text))


class Channel(Protocol):
    """One configured channel. ``check`` raises ``ConfigError`` when its server cannot be reached at start;
    ``send`` raises ``BackendError`` when a delivery fails (the delivery stays pending and is retried)."""

    name: str

    def check(self) -> None: ...
    def send(self, payload: Payload, *, delivery: str) -> None: ...
    def close(self) -> None: ...
