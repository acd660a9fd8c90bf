"""What Alertmanager fires, as ``hpcwatch serve --alertmanager URL`` shows it: the v2 API read, and what it saw.

``AlertmanagerClient.alerts()`` asks ``GET /api/v2/alerts`` (a timeout, at most
``sources.alertmanager.MAX_ANSWER_BYTES`` read, the answer parsed by ``sources.alertmanager``) and raises a
one-line ``BackendError`` for anything else. ``AlertWatch`` asks it every ``every_s`` seconds on its own
thread and keeps what it saw since the server started:

    firing     the alerts of the newest answer
    resolved   alerts that were firing and left the list (when this process noticed), newest first, at
               most ``MAX_RESOLVED``
    down_since when the answers stopped (None while Alertmanager answers): the page says it

Alertmanager being down never stops the page: the watch keeps its last list and says since when it could
not ask. API: https://github.com/prometheus/alertmanager/blob/main/api/v2/openapi.yaml
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from hpcwatch.errors import BackendError, HpcwatchError, one_line
from hpcwatch.promql import safe_url
from hpcwatch.sources.alertmanager import MAX_ANSWER_BYTES, AmAlert, parse_alertmanager_alerts

__all__ = ["AlertmanagerClient", "AlertWatch", "WatchedAlert", "DEFAULT_TIMEOUT_S", "DEFAULT_EVERY_S", "MAX_RESOLVED"]

#: Seconds one ask may take (ours: an Alertmanager on the site network answers in milliseconds).
DEFAULT_TIMEOUT_S = 5.0
#: Seconds between asks (ours: Prometheus' default evaluation interval is 1 min; 15 s shows a change soon).
DEFAULT_EVERY_S = 15.0
#: Resolved alerts kept (ours: a page's list).
MAX_RESOLVED = 200


class AlertmanagerClient:
    """``GET /api/v2/alerts`` of one Alertmanager; ``client`` lets tests pass an ``httpx.MockTransport``."""

    def __init__(self, url: str, *, client: httpx.Client | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if timeout_s <= 0:
            raise BackendError(f"timeout_s must be > 0, got {timeout_s}")
        if not url.startswith(("http://", "https://")):
            raise BackendError(f"--alertmanager {safe_url(url)!r}: not an http:// or https:// URL")
        self.url, self.timeout_s = url.rstrip("/"), timeout_s
        self._client = client or httpx.Client(timeout=timeout_s, trust_env=False)

    def __repr__(self) -> str:
        return f"AlertmanagerClient(url={safe_url(self.url)!r})"

    @property
    def label(self) -> str:
        return f"Alertmanager {safe_url(self.url)}"

    def alerts(self) -> list[AmAlert]:
        where = f"{safe_url(self.url)}/api/v2/alerts"
        try:
            with self._client.stream("GET", f"{self.url}/api/v2/alerts", timeout=self.timeout_s) as response:
                if response.status_code != 200:
                    raise BackendError(f"{where}: HTTP {response.status_code}")
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > MAX_ANSWER_BYTES:
                        raise BackendError(f"{where}: answer larger than {MAX_ANSWER_BYTES} bytes")
        except httpx.HTTPError as err:
            raise BackendError(one_line(f"{where}: {type(err).__name__}: {err}")) from err
        try:
            return parse_alertmanager_alerts(bytes(body), path=where)
        except HpcwatchError as err:
            raise BackendError(str(err)) from err

    def close(self) -> None:
        self._client.close()


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchedAlert:
    fingerprint: str
    name: str
    labels: dict[str, str]
    summary: str
    severity: str
    starts_at: float | None
    state: str
    """``active``, ``suppressed`` (silenced or inhibited), ``unprocessed``."""
    first_seen: float
    """When this process first saw it (UTC s)."""
    resolved_at: float | None = None
    """When it left Alertmanager's list (this process' clock); None while it fires."""


def _watched(a: AmAlert, now: float) -> WatchedAlert:
    return WatchedAlert(
        fingerprint=a.fingerprint,
        name=a.name,
        labels=dict(a.labels),
        summary=a.summary,
        severity=a.labels.get("severity", ""),
        starts_at=a.starts_at,
        state=a.state,
        first_seen=now,
    )


@dataclass(slots=True)
class AlertWatch:
    """What one Alertmanager fired since this process started (see the module docstring)."""

    client: AlertmanagerClient | Any
    every_s: float = DEFAULT_EVERY_S
    clock: Callable[[], float] = time.time
    _firing: dict[str, WatchedAlert] = field(default_factory=dict)
    _resolved: deque[WatchedAlert] = field(default_factory=lambda: deque(maxlen=MAX_RESOLVED))
    _down_since: float | None = None
    _error: str | None = None
    _asked: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def poll(self) -> None:
        """Ask once; a failure is kept (``down_since``, ``error``), never raised."""
        now = self.clock()
        try:
            found = self.client.alerts()
        except BackendError as err:
            with self._lock:
                self._down_since = self._down_since if self._down_since is not None else now
                self._error = str(err)
            return
        with self._lock:
            current = {a.fingerprint: a for a in found}
            for fp, old in list(self._firing.items()):
                if fp not in current:
                    self._resolved.appendleft(
                        WatchedAlert(**{**asdict(old), "resolved_at": now})  # the same alert, now resolved
                    )
                    del self._firing[fp]
            for fp, a in current.items():
                first = self._firing[fp].first_seen if fp in self._firing else now
                self._firing[fp] = WatchedAlert(**{**asdict(_watched(a, now)), "first_seen": first})
            self._down_since, self._error, self._asked = None, None, now

    def snapshot(self) -> dict[str, Any]:
        """``source`` (the Alertmanager's URL, without credentials), ``asked`` (last answer, UTC s),
        ``down_since``, ``error`` (one line), ``firing`` and ``resolved`` (``WatchedAlert`` dicts)."""
        with self._lock:
            return {
                "source": getattr(self.client, "label", "Alertmanager"),
                "asked": self._asked,
                "down_since": self._down_since,
                "error": self._error,
                "firing": [asdict(a) for a in sorted(self._firing.values(), key=lambda a: -(a.starts_at or 0.0))],
                "resolved": [asdict(a) for a in self._resolved],
            }

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hpcwatch-alertmanager", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.client.timeout_s + 1.0 if hasattr(self.client, "timeout_s") else 1.0)
