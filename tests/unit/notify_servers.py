"""Real servers for the notify tests, in-process on port 0: aiosmtpd (STARTTLS and AUTH required) and an
http.server receiver that checks each delivery's HMAC signature."""

from __future__ import annotations

import hashlib
import hmac
import subprocess
import threading
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import EmailMessage
from email.policy import default
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

SMTP_USER, SMTP_PASSWORD = "hpcwatch", "s3cret-pass"


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, made with the openssl CLI (cryptography is not installed)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
            "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@dataclass
class Received:
    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage
    raw: bytes
    tls: bool
    authenticated: bool


class MailHandler:
    def __init__(self) -> None:
        self.received: list[Received] = []
        self.arrived = threading.Condition()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        raw = envelope.original_content or envelope.content
        with self.arrived:
            self.received.append(
                Received(
                    mail_from=envelope.mail_from,
                    rcpt_tos=list(envelope.rcpt_tos),
                    message=message_from_bytes(raw, policy=default),  # type: ignore[arg-type]
                    raw=raw,
                    tls=session.ssl is not None,
                    authenticated=bool(session.authenticated),
                )
            )
            self.arrived.notify_all()
        return "250 OK"


def _authenticate(server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any) -> AuthResult:
    ok = isinstance(auth_data, LoginPassword) and (auth_data.login, auth_data.password) == (
        SMTP_USER.encode(),
        SMTP_PASSWORD.encode(),
    )
    return AuthResult(success=ok, handled=False)  # handled=True (the default) would leave a failure unanswered


class PortZeroController(Controller):
    """aiosmtpd's Controller connects to ``self.port`` to see the server up: learn the bound port first."""

    def _trigger_server(self) -> None:
        self.port = self.server.sockets[0].getsockname()[1]
        super()._trigger_server()


class SmtpServer:
    """aiosmtpd on 127.0.0.1, STARTTLS and AUTH required; ``restart()`` comes back on the same port."""

    def __init__(self, cert: Path, key: Path, port: int = 0) -> None:
        import ssl

        self.cert, self.key = cert, key
        self.handler = MailHandler()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        self._context = context
        self.port = port
        self.controller: PortZeroController | None = None

    def start(self) -> SmtpServer:
        self.controller = PortZeroController(
            self.handler,
            hostname="127.0.0.1",
            port=self.port,
            tls_context=self._context,
            require_starttls=True,
            authenticator=_authenticate,
            auth_require_tls=True,
        )
        self.controller.start()
        self.port = self.controller.port
        return self

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None

    @property
    def received(self) -> list[Received]:
        return self.handler.received


@dataclass
class Delivery:
    headers: dict[str, str]
    body: bytes
    signature_ok: bool

    @property
    def document(self) -> dict[str, Any]:
        return orjson.loads(self.body)


@dataclass
class HttpReceiver:
    """An http.server thread on port 0: records each POST and whether its HMAC signature checks out."""

    secret: bytes
    status: int = 200
    deliveries: list[Delivery] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    def start(self, port: int = 0) -> HttpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                stamp = self.headers.get("X-Hpcwatch-Timestamp", "")
                expected = (
                    "sha256=" + hmac.new(receiver.secret, f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
                )
                ok = hmac.compare_digest(expected, self.headers.get("X-Hpcwatch-Signature", ""))
                receiver.deliveries.append(Delivery(headers=dict(self.headers), body=body, signature_ok=ok))
                self.send_response(receiver.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.server_address[1])

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
