"""Alertmanager's alerts: the answer of its v2 API, ``GET /api/v2/alerts`` (a JSON list of ``gettableAlert``).

One alert per element, as ``AmAlert``::

    {"labels": {"alertname": ..., ...}, "annotations": {...}, "fingerprint": "114212a24ca97549",
     "startsAt": "2021-09-16T13:20:35.966Z", "endsAt": ..., "updatedAt": ...,
     "status": {"state": "active" | "suppressed" | "unprocessed", "silencedBy": [...], "inhibitedBy": [...]},
     "receivers": [{"name": "default"}], "generatorURL": ...}

API: https://github.com/prometheus/alertmanager/blob/main/api/v2/openapi.yaml (``gettableAlert``,
``alertStatus``). The list holds the alerts Alertmanager has not yet resolved (``endsAt`` is when it will,
unless Prometheus sends the alert again): a resolved alert is one that left the list.

Bounded: at most ``MAX_ALERTS`` alerts, ``MAX_LABELS`` labels each, label and annotation values cut to
``MAX_VALUE_CHARS``; text outside those bounds is refused (a ``ParseError``) or cut, never kept whole. Not
checked: the receivers, ``generatorURL``, the members of ``silencedBy``/``inhibitedBy`` (only whether
they are empty).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import orjson

from hpcwatch.errors import ParseError

__all__ = [
    "AmAlert",
    "AmState",
    "parse_alertmanager_alerts",
    "MAX_ALERTS",
    "MAX_LABELS",
    "MAX_VALUE_CHARS",
    "MAX_ANSWER_BYTES",
]

#: The most alerts one answer may hold (ours: a cluster with every node alerting on a dozen rules).
MAX_ALERTS = 20_000
#: The most labels of one alert (ours: Prometheus' default ``label_limit`` is none; 64 is far past real rules).
MAX_LABELS = 64
#: A label or annotation value past this is cut (ours: a page line).
MAX_VALUE_CHARS = 500
#: The largest answer read (ours: MAX_ALERTS alerts of ~1 KB).
MAX_ANSWER_BYTES = 32 << 20

AmState = Literal["active", "suppressed", "unprocessed"]
_STATES = ("active", "suppressed", "unprocessed")


@dataclass(frozen=True, slots=True, kw_only=True)
class AmAlert:
    fingerprint: str
    name: str
    """The ``alertname`` label ("" when absent)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    summary: str = ""
    """The ``summary`` annotation, else ``description``."""
    starts_at: float | None = None
    """UTC seconds."""
    ends_at: float | None = None
    updated_at: float | None = None
    state: AmState = "active"
    silenced: bool = False
    inhibited: bool = False


def _time(value: Any, what: str) -> float | None:
    if value in (None, "") or value == "0001-01-01T00:00:00Z":  # Go's zero time: not set
        return None
    if not isinstance(value, str):
        raise ValueError(f"{what} is not a time: {value!r:.60}")
    text = value.replace("Z", "+00:00")
    # Go writes nanoseconds; Python reads up to microseconds.
    head, dot, rest = text.partition(".")
    if dot:
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[: min(digits, 6)]}{rest[digits:]}"
    try:
        when = datetime.fromisoformat(text)
    except ValueError as err:
        raise ValueError(f"{what} is not a time: {value!r:.60}") from err
    if when.tzinfo is None:
        raise ValueError(f"{what} has no time zone: {value!r:.60}")
    return when.timestamp()


def _strings(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not an object")
    if len(value) > MAX_LABELS:
        raise ValueError(f"{what}: {len(value)} entries, more than {MAX_LABELS}")
    return {str(k)[:MAX_VALUE_CHARS]: str(v)[:MAX_VALUE_CHARS] for k, v in value.items()}


def _alert(raw: Any) -> AmAlert:
    if not isinstance(raw, dict):
        raise ValueError("an alert is not an object")
    labels = _strings(raw.get("labels"), "labels")
    annotations = _strings(raw.get("annotations"), "annotations")
    status = raw["status"] if isinstance(raw.get("status"), dict) else {}
    state = status.get("state", "active")
    if state not in _STATES:
        raise ValueError(f"unknown status.state {state!r:.40} (known: {', '.join(_STATES)})")
    fingerprint = raw.get("fingerprint")
    if not isinstance(fingerprint, str) or not fingerprint or len(fingerprint) > 64:
        raise ValueError(f"bad fingerprint {fingerprint!r:.60}")
    return AmAlert(
        fingerprint=fingerprint,
        name=labels.get("alertname", ""),
        labels=labels,
        summary=annotations.get("summary") or annotations.get("description", ""),
        starts_at=_time(raw.get("startsAt"), "startsAt"),
        ends_at=_time(raw.get("endsAt"), "endsAt"),
        updated_at=_time(raw.get("updatedAt"), "updatedAt"),
        state=state,
        silenced=bool(status.get("silencedBy")),
        inhibited=bool(status.get("inhibitedBy")),
    )


def parse_alertmanager_alerts(text: str | bytes, *, path: str = "<input>") -> list[AmAlert]:
    """The alerts of one ``GET /api/v2/alerts`` answer; a ``ParseError`` naming ``path`` (the URL) and the
    alert's index (as its line) for anything else."""
    if len(text) > MAX_ANSWER_BYTES:
        raise ParseError(f"answer of {len(text)} bytes, more than {MAX_ANSWER_BYTES}", path=path)
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as err:
        raise ParseError(f"not JSON: {err}", path=path, line=1) from err
    if not isinstance(doc, list):
        raise ParseError("not an Alertmanager v2 alert list (expected a JSON list)", path=path, line=1)
    if len(doc) > MAX_ALERTS:
        raise ParseError(f"{len(doc)} alerts, more than {MAX_ALERTS}", path=path)
    out = []
    for i, raw in enumerate(doc):
        try:
            out.append(_alert(raw))
        except ValueError as err:
            raise ParseError(f"alert {i}: {err}", path=path, line=1) from err
    return out
