"""Mail through an SMTP server (smtplib): STARTTLS or implicit TLS, verified certificates, optional AUTH.

Each message is an ``email.message.EmailMessage`` built under ``email.policy.SMTP``: a header value
holding CR or LF is refused by the policy itself, on top of the subject having been made visible
(``reports.text.visible``) and the address checked (``recipients.check_address``) before. The
password is read from ``password_file`` at each connection (so it can be rotated) and never logged.
"""

from __future__ import annotations

import smtplib
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime
from email.errors import HeaderParseError
from email.headerregistry import Address
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import format_datetime, make_msgid
from pathlib import Path
from typing import Literal

from hpcwatch.errors import BackendError, ConfigError, one_line
from hpcwatch.notify.message import Payload
from hpcwatch.reports.text import visible

__all__ = ["SmtpConfig", "SmtpChannel", "build_email"]

DEFAULT_SMTP_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SmtpConfig:
    host: str = "localhost"
    port: int = 587
    """587 (submission, STARTTLS), 465 (implicit TLS), 25 (a local relay)."""
    security: Literal["starttls", "tls", "none"] = "starttls"
    """``starttls``: upgrade after EHLO (refused if the server does not offer it); ``tls``: TLS from the
    first byte; ``none``: plain text, for a relay on the same host only."""
    ca_file: str = ""
    """CA bundle the server's certificate must chain to (empty: the system's). Certificates are always verified."""
    username: str = ""
    """AUTH user (empty: no AUTH)."""
    password_file: str = ""
    """A file holding the AUTH password (its first line), read at each connection."""
    sender: str = "hpcwatch@localhost"
    """The From address."""
    timeout_s: float = DEFAULT_SMTP_TIMEOUT_S

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be 1-65535, got {self.port}")
        if self.security not in ("starttls", "tls", "none"):
            raise ValueError(f"security must be starttls, tls or none, got {self.security!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if bool(self.username) != bool(self.password_file):
            raise ValueError("username and password_file go together (AUTH), or neither")
        if self.username and self.security == "none":
            raise ValueError(
                "username: AUTH over a plain connection would send the password in clear; use starttls or tls"
            )
        try:
            Address(addr_spec=self.sender)
        except (ValueError, IndexError) as err:
            raise ValueError(f"sender {self.sender!r} is not a mail address: {err}") from err


def build_email(payload: Payload, *, sender: str) -> EmailMessage:
    """The message for ``payload.to``: text, and HTML as its alternative when the payload has one."""
    msg = EmailMessage(policy=SMTP)
    msg["From"] = Address(addr_spec=sender)
    msg["To"] = Address(addr_spec=payload.to)
    msg["Subject"] = payload.subject
    msg["Date"] = format_datetime(datetime.now(UTC))
    msg["Message-ID"] = make_msgid(domain=sender.rpartition("@")[2] or None)
    msg["Auto-Submitted"] = "auto-generated"  # RFC 3834: no vacation replies, no loops
    msg.set_content(payload.text)
    if payload.html:
        msg.add_alternative(payload.html, subtype="html")
    msg["Content-Language"] = payload.lang  # after the content: set_content drops Content-* headers
    return msg


class SmtpChannel:
    def __init__(self, name: str, config: SmtpConfig) -> None:
        self.name, self.config = name, config
        self._smtp: smtplib.SMTP | None = None

    def __repr__(self) -> str:
        c = self.config
        return f"SmtpChannel({self.name!r}, {c.host}:{c.port}, {c.security}, user={c.username or None!r})"

    def _context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.config.ca_file or None)

    def _connect(self) -> smtplib.SMTP:
        c = self.config
        smtp: smtplib.SMTP
        if c.security == "tls":
            smtp = smtplib.SMTP_SSL(c.host, c.port, timeout=c.timeout_s, context=self._context())
        else:
            smtp = smtplib.SMTP(c.host, c.port, timeout=c.timeout_s)
        try:
            smtp.ehlo()
            if c.security == "starttls":
                smtp.starttls(context=self._context())  # SMTPNotSupportedError if not offered: never fall back
                smtp.ehlo()
            if c.username:
                smtp.login(c.username, self._password())
        except BaseException:
            smtp.close()
            raise
        return smtp

    def _password(self) -> str:
        try:
            return Path(self.config.password_file).read_text(encoding="utf-8").splitlines()[0]
        except (OSError, IndexError, UnicodeDecodeError) as err:
            raise smtplib.SMTPException(f"cannot read password_file {self.config.password_file}: {err}") from err

    def _what(self, err: BaseException) -> str:
        return one_line(f"{type(err).__name__}: {err}")

    def check(self) -> None:
        try:
            self._connect().quit()
        except (smtplib.SMTPException, OSError) as err:
            c = self.config
            raise ConfigError(f"smtp channel {self.name}: {c.host}:{c.port}: {self._what(err)}") from err

    def send(self, payload: Payload, *, delivery: str) -> None:
        try:
            msg = build_email(payload, sender=self.config.sender)
            msg["X-Hpcwatch-Notice"] = visible(payload.notice)  # a node or user name is part of the key
        except (ValueError, IndexError, HeaderParseError) as err:  # the policy refused a header: never sent raw
            raise BackendError(f"smtp channel {self.name}: message refused: {self._what(err)}") from err
        try:
            if self._smtp is None:
                self._smtp = self._connect()
            self._smtp.send_message(msg)
        except (smtplib.SMTPException, OSError) as err:
            self.close()
            c = self.config
            raise BackendError(f"smtp channel {self.name}: {c.host}:{c.port}: {self._what(err)}") from err

    def close(self) -> None:
        if self._smtp is not None:
            try:
                self._smtp.quit()
            except (smtplib.SMTPException, OSError):
                self._smtp.close()
            self._smtp = None
