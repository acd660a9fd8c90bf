"""HTTP channels: a generic JSON webhook (HMAC-SHA256 signed) and a Slack/Mattermost incoming webhook.

The generic webhook POSTs the payload's document as JSON (``application/json``, keys sorted) with::

    X-Hpcwatch-Timestamp: <UTC seconds, integer>
    X-Hpcwatch-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>." + body)>
    X-Hpcwatch-Delivery:  <hex SHA-256 of the delivery key, 32 characters>

A receiver recomputes the HMAC over the raw body with the shared secret (``hmac.compare_digest``),
refuses a timestamp far from its clock (a replay), and may drop a delivery id it has seen: a crash
between a server's answer and the store's commit sends that one delivery again (at least once).
The Slack/Mattermost kind posts ``{"text": ...}`` with ``&``, ``<`` and ``>`` escaped as Slack's
message formatting asks (https://api.slack.com/reference/surfaces/formatting#escaping), so a job
name cannot become a link or a mention. Any 2xx answer is a delivery; anything else is retried.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from hpcwatch.errors import BackendError, ConfigError, one_line
from hpcwatch.notify.message import Payload

__all__ = ["WebhookConfig", "WebhookChannel", "SlackConfig", "SlackChannel", "signature", "SIGNATURE_HEADER"]

SIGNATURE_HEADER = "X-Hpcwatch-Signature"
TIMESTAMP_HEADER = "X-Hpcwatch-Timestamp"
DELIVERY_HEADER = "X-Hpcwatch-Delivery"
DEFAULT_WEBHOOK_TIMEOUT_S = 10.0


def _check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"url must be http(s)://host[:port]/path, got {url!r}")
    if parts.username or parts.password:
        raise ValueError("url: credentials in the URL would be logged; use secret_file")


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookConfig:
    url: str = ""
    secret_file: str = ""
    """A file holding the shared HMAC secret (its first line), read at each delivery."""
    ca_file: str = ""
    """https: the CA bundle the server must chain to (empty: the system's)."""
    timeout_s: float = DEFAULT_WEBHOOK_TIMEOUT_S

    def __post_init__(self) -> None:
        _check_url(self.url)
        if not self.secret_file:
            raise ValueError("secret_file is required: every delivery is signed")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SlackConfig:
    url: str = ""
    """The incoming webhook's URL (Slack, or Mattermost's compatible one). It is a secret: never logged whole."""
    ca_file: str = ""
    timeout_s: float = DEFAULT_WEBHOOK_TIMEOUT_S

    def __post_init__(self) -> None:
        _check_url(self.url)
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    """The ``X-Hpcwatch-Signature`` value of a body sent at ``timestamp``."""
    return "sha256=" + hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class _Http:
    """What both kinds share: a reachability check, a POST, an answer judged."""

    name: str
    url: str
    ca_file: str
    timeout_s: float

    def _where(self) -> str:
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"

    def check(self) -> None:
        parts = urlsplit(self.url)
        try:
            socket.create_connection(
                (parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)), timeout=self.timeout_s
            ).close()
        except OSError as err:
            raise ConfigError(f"{self.kind} channel {self.name}: {self._where()}: {one_line(str(err))}") from err

    kind = "webhook"

    def _post(self, body: bytes, headers: dict[str, str]) -> None:
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        context = ssl.create_default_context(cafile=self.ca_file or None) if self.url.startswith("https") else None
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=context) as answer:
                answer.read(4096)
        except urllib.error.HTTPError as err:
            raise BackendError(f"{self.kind} channel {self.name}: {self._where()}: HTTP {err.code}") from err
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise BackendError(f"{self.kind} channel {self.name}: {self._where()}: {one_line(str(reason))}") from err

    def close(self) -> None:
        pass


class WebhookChannel(_Http):
    kind = "webhook"

    def __init__(self, name: str, config: WebhookConfig) -> None:
        self.name, self.config = name, config
        self.url, self.ca_file, self.timeout_s = config.url, config.ca_file, config.timeout_s

    def __repr__(self) -> str:
        return f"WebhookChannel({self.name!r}, {self._where()})"

    def _secret(self) -> bytes:
        try:
            return Path(self.config.secret_file).read_bytes().splitlines()[0]
        except (OSError, IndexError) as err:
            raise ConfigError(f"webhook channel {self.name}: cannot read secret_file: {err}") from err

    def check(self) -> None:
        self._secret()
        super().check()

    def send(self, payload: Payload, *, delivery: str) -> None:
        document: dict[str, Any] = {
            **payload.document,
            "notice": payload.notice,
            "kind": payload.kind,
            "audience": payload.audience,
            "subject": payload.subject,
            "text": payload.text,
        }
        body = orjson.dumps(document, option=orjson.OPT_SORT_KEYS)
        try:
            secret = self._secret()
        except ConfigError as err:
            raise BackendError(str(err)) from err
        now = int(time.time())
        self._post(
            body,
            {
                "Content-Type": "application/json",
                "User-Agent": "hpcwatch-notify",
                TIMESTAMP_HEADER: str(now),
                SIGNATURE_HEADER: signature(secret, now, body),
                DELIVERY_HEADER: hashlib.sha256(delivery.encode()).hexdigest()[:32],
            },
        )


class SlackChannel(_Http):
    kind = "slack"

    def __init__(self, name: str, config: SlackConfig) -> None:
        self.name, self.config = name, config
        self.url, self.ca_file, self.timeout_s = config.url, config.ca_file, config.timeout_s

    def __repr__(self) -> str:
        return f"SlackChannel({self.name!r}, {self._where()})"

    def send(self, payload: Payload, *, delivery: str) -> None:
        text = slack_escape(f"{payload.subject}\n{payload.text}")
        self._post(orjson.dumps({"text": text}), {"Content-Type": "application/json", "User-Agent": "hpcwatch-notify"})
