"""API tokens for scripts and for Prometheus: ``hpcw_<id>_<secret>``, shown once, stored as a hash.

**What is stored**: the SHA-256 of the secret, not a slow hash (scrypt, argon2). A slow hash is there to make
guessing a *password* expensive, because people choose passwords from a small space; the secret here is 256
random bits (``secrets.token_bytes(32)``), which no amount of guessing reaches, so a fast hash loses nothing
and keeps each scrape a microsecond, not the 50 ms scrypt would cost on every request. The id (public, 64
random bits) finds the entry; the hashes compare with ``hmac.compare_digest`` (constant time).

**Where**: a JSON file named by the auth config's ``[tokens] file``, not a table of the store: the exporter,
the web server and ``hpcwatch token`` may run on different hosts with different stores, a token must be
revocable (the store's Parquet parts are immutable: a revocation would be a tombstone every reader must
honour), and one 0600 file is what an operator can back up, inspect and lock down. It is rewritten whole
(temp file, ``os.replace``) and re-read when its mtime changes, so a revocation is seen at the next request.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

from hpcwatch.errors import ConfigError, InputError

__all__ = ["Scope", "SCOPES", "TokenEntry", "TokenStore", "parse_duration"]

Scope = Literal["metrics", "api"]
SCOPES: tuple[Scope, ...] = ("metrics", "api")
PREFIX = "hpcw_"
_TOKEN_RE = re.compile(r"hpcw_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")
_DURATION_RE = re.compile(r"(\d+)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_USER_RE = re.compile(r"[A-Za-z0-9._@-]{1,64}")


@dataclass(frozen=True, slots=True)
class TokenEntry:
    id: str
    user: str
    scope: Scope
    created: float
    expires: float
    sha256: str
    revoked: float | None = None

    def valid_at(self, now: float) -> bool:
        return self.revoked is None and now < self.expires


def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``2w`` → seconds."""
    match = _DURATION_RE.fullmatch(text.strip())
    if not match or int(match.group(1)) == 0:
        raise InputError(f"--expires {text!r}: give a number and a unit (s, m, h, d, w), e.g. 30d")
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class TokenStore:
    """The tokens file: create, list, revoke, and check a presented token."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._mtime: int | None = None
        self._entries: dict[str, TokenEntry] = {}

    def entries(self) -> list[TokenEntry]:
        with self._lock:
            self._reload()
            return sorted(self._entries.values(), key=lambda e: e.created)

    def create(
        self, user: str, scope: Scope, expires_in_s: float, *, now: float | None = None
    ) -> tuple[str, TokenEntry]:
        """A new token for ``user``: the token text (shown once, never stored) and its entry."""
        if not _USER_RE.fullmatch(user):
            raise InputError(f"--user {user!r}: letters, digits and . _ @ - only, at most 64")
        if scope not in SCOPES:
            raise InputError(f"--scope {scope!r}: one of {', '.join(SCOPES)}")
        now = time.time() if now is None else now
        token_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
        entry = TokenEntry(token_id, user, scope, now, now + expires_in_s, _digest(secret))
        with self._lock:
            self._reload()
            self._entries[token_id] = entry
            self._write()
        return f"{PREFIX}{token_id}_{secret}", entry

    def revoke(self, token_id: str, *, now: float | None = None) -> TokenEntry:
        with self._lock:
            self._reload()
            entry = self._entries.get(token_id)
            if entry is None:
                raise InputError(f"{self.path}: no token {token_id!r} (see hpcwatch token list)")
            entry = self._entries[token_id] = replace(entry, revoked=time.time() if now is None else now)
            self._write()
        return entry

    def verify(self, token: str, *, now: float | None = None) -> TokenEntry | None:
        """The entry ``token`` is the secret of, if it is valid now (not expired, not revoked); else None."""
        match = _TOKEN_RE.fullmatch(token)
        if match is None:
            return None
        with self._lock:
            self._reload()
            entry = self._entries.get(match.group(1))
        if entry is None or not hmac.compare_digest(entry.sha256, _digest(match.group(2))):
            return None
        return entry if entry.valid_at(time.time() if now is None else now) else None

    def _reload(self) -> None:
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            self._entries, self._mtime = {}, None
            return
        if mtime == self._mtime:
            return
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
            self._entries = {e["id"]: TokenEntry(**e) for e in doc["tokens"]}
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"{self.path}: not a tokens file hpcwatch wrote ({type(err).__name__}: {err})") from err
        self._mtime = mtime

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # hashes only, still nobody else's
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"tokens": [asdict(e) for e in self._entries.values()]}, out, indent=1)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, self.path)
        self._mtime = self.path.stat().st_mtime_ns
