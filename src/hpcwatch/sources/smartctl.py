"""Reader of ``smartctl --json`` (smartmontools 7.x): one drive's health as samples.

``smartctl -j -a /dev/nvme0`` (or ``-x``, ``-H -A``) prints one JSON document per
device. We keep what says whether the drive is dying, under the metric names of
prometheus-community/smartctl_exporter (``metrics.go``), so its scrapes and these
captures are judged by the same rules (``analysis.health_rules``, family ``storage``):

- ``smartctl_device_smart_status``: 1 when ``smart_status.passed``, else 0 (every device type);
- from ``nvme_smart_health_information_log`` (NVMe only): ``smartctl_device_critical_warning`` (the
  SMART / Health log's Critical Warning byte, a bit mask), ``smartctl_device_media_errors``
  (unrecovered data-integrity errors, lifetime count), ``smartctl_device_available_spare`` and
  ``smartctl_device_available_spare_threshold`` (percent), ``smartctl_device_percentage_used``
  (percent of rated endurance, may pass 100);
- ``smartctl_device_temperature{temperature_type="current"}`` (°C, ``temperature.current``).

Labels: ``node`` (the file does not name its host: ``--host``), ``device`` (``/dev/nvme0`` →
``nvme0``, as the exporter names it), ``model_name``, ``serial_number``, ``device_type``.
Time: ``local_time.time_t`` (when smartctl ran, UTC seconds), else the file's write time.
Shape: smartmontools' JSON output (``smartctl --json``, json_format_version 1.0).

Lenient: keys we do not read (ATA attribute tables, SCSI logs, self-test logs) are skipped, and a
document with no device (smartctl could not open it: ``smartctl.messages`` say why) yields nothing.
Strict: a document that is not one JSON object, a number that is not one, is a ``ParseError``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import orjson

from hpcwatch import vocab
from hpcwatch.errors import ParseError
from hpcwatch.records import Sample
from hpcwatch.sources.lines import file_time, read_text, to_int

__all__ = ["parse_smartctl_json", "read_smartctl_json", "is_smartctl_json", "NVME_LOG_FIELDS"]

#: ``nvme_smart_health_information_log`` key -> our metric.
NVME_LOG_FIELDS: dict[str, str] = {
    "critical_warning": vocab.SMARTCTL_DEVICE_CRITICAL_WARNING,
    "media_errors": vocab.SMARTCTL_DEVICE_MEDIA_ERRORS,
    "available_spare": vocab.SMARTCTL_DEVICE_AVAILABLE_SPARE,
    "available_spare_threshold": vocab.SMARTCTL_DEVICE_AVAILABLE_SPARE_THRESHOLD,
    "percentage_used": vocab.SMARTCTL_DEVICE_PERCENTAGE_USED,
}


def is_smartctl_json(head: str) -> bool:
    """A JSON object with smartctl's ``json_format_version`` and its ``smartctl`` block."""
    text = head.lstrip()
    return text.startswith("{") and '"json_format_version"' in text and '"smartctl"' in text


def _line_of(text: str, key: str) -> int:
    at = text.find(f'"{key}"')
    return 1 if at < 0 else text.count("\n", 0, at) + 1


def _number(raw: Any, what: str, *, text: str, path: str | os.PathLike[str]) -> float:
    """A whole JSON number within 64 bits (every field we read is a count, a percent, °C or seconds), else a
    ParseError at its key's line."""
    line = _line_of(text, what.rsplit(".", 1)[-1])
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ParseError(f"{what} is not a number", path=path, line=line, text=str(raw))
    return float(to_int(str(raw), what, path=path, line=line))


def parse_smartctl_json(
    text: str, *, path: str | os.PathLike[str] = "<smartctl --json>", node: str | None = None, t: float | None = None
) -> Iterator[Sample]:
    """The drive's samples (see the module docstring); ``t``: when smartctl ran, if the document does not say."""
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as err:
        raise ParseError(f"not JSON: {err}", path=path, line=getattr(err, "lineno", 1) or 1) from err
    if not isinstance(doc, dict) or not isinstance(doc.get("smartctl"), dict):
        raise ParseError("not smartctl --json output (no 'smartctl' object)", path=path, line=1)
    device = doc.get("device")
    if not isinstance(device, dict):
        return  # smartctl could not open the device: nothing about the drive to judge
    local = doc.get("local_time")
    if isinstance(local, dict) and "time_t" in local:
        when = _number(local["time_t"], "local_time.time_t", text=text, path=path)
    else:
        when = t if t is not None else 0.0
    name = str(device.get("name") or device.get("info_name") or "")
    labels = {
        **({"node": node} if node else {}),
        "device": name.removeprefix("/dev/"),
        "device_type": str(device.get("type") or ""),
        "model_name": str(doc.get("model_name") or doc.get("scsi_model_name") or ""),
        "serial_number": str(doc.get("serial_number") or ""),
    }
    status = doc.get("smart_status")
    if isinstance(status, dict) and isinstance(status.get("passed"), bool):
        yield Sample(metric=vocab.SMARTCTL_DEVICE_SMART_STATUS, labels=labels, t=when, value=float(status["passed"]))
    log = doc.get("nvme_smart_health_information_log")
    if isinstance(log, dict):
        for key, metric in NVME_LOG_FIELDS.items():
            if key in log:
                value = _number(log[key], f"nvme_smart_health_information_log.{key}", text=text, path=path)
                yield Sample(metric=metric, labels=labels, t=when, value=value)
    temperature = doc.get("temperature")
    if isinstance(temperature, dict) and "current" in temperature:
        yield Sample(
            metric=vocab.SMARTCTL_DEVICE_TEMPERATURE,
            labels={**labels, "temperature_type": "current"},
            t=when,
            value=_number(temperature["current"], "temperature.current", text=text, path=path),
        )


def read_smartctl_json(
    path: str | os.PathLike[str], *, node: str | None = None, t: float | None = None
) -> Iterator[Sample]:
    text = read_text(path)
    yield from parse_smartctl_json(text, path=path, node=node, t=file_time(path) if t is None else t)
