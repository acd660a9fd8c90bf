"""GPU readings of ``rocm-smi --json`` (e.g. ``rocm-smi -a --json``, ``rocm-smi --showuse --showpower
--showtemp --showmemuse --json``), as DCGM-named samples.

One JSON object: ``{"card0": {"GPU use (%)": "0", ...}, "card1": {...}, "system": {"Driver version": ...}}``;
every reading is a string, its unit in its key. The keys differ between ROCm 5 and 6 (``Card series`` /
``Card Series``, ``GPU memory use (%)`` / ``GPU Memory Read/Write Activity (%)``; MI300 parts report
``Current Socket Graphics Package Power (W)``, MI200 parts ``Average Graphics Package Power (W)``): both are
read, the first of ``_FIELDS`` present wins. Renamed to DCGM fields by the table of ``amd_gpu`` (bytes to
MiB, uJ to mJ); the edge temperature keeps the exporter's name ``gpu_edge_temperature``.

Labels: ``gpu`` from ``cardN``, ``modelName`` from ``Card Series``/``Card series``/``Device Name``,
``pci_bus_id`` from ``PCI Bus``, ``UUID`` from ``Unique ID``, ``driver_version`` from the ``system`` object.

Times: rocm-smi prints none; samples take ``t``, else the file's write time (``read_rocm_smi_json``).

Not checked: keys not in ``_FIELDS`` (firmware versions, clock levels, ``GFX Activity`` and ``Memory
Activity``, which are accumulators, not percentages); a reading of ``N/A`` gives no sample.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Iterator
from typing import Any, Final

import orjson

from hpcwatch import vocab
from hpcwatch.errors import ParseError
from hpcwatch.records import Sample
from hpcwatch.sources.amd_gpu import MIB, gpu_labels
from hpcwatch.sources.lines import file_time, read_text

__all__ = ["parse_rocm_smi_json", "read_rocm_smi_json", "is_rocm_smi_json"]

#: metric -> (rocm-smi keys, first present wins; factor to hpcwatch's unit).
_FIELDS: Final[tuple[tuple[str, tuple[str, ...], float], ...]] = (
    (vocab.DCGM_FI_DEV_GPU_UTIL, ("GPU use (%)",), 1.0),
    (vocab.DCGM_FI_DEV_MEM_COPY_UTIL, ("GPU Memory Read/Write Activity (%)", "GPU memory use (%)"), 1.0),
    (
        vocab.DCGM_FI_DEV_POWER_USAGE,
        ("Current Socket Graphics Package Power (W)", "Average Graphics Package Power (W)"),
        1.0,
    ),
    (vocab.DCGM_FI_DEV_GPU_TEMP, ("Temperature (Sensor junction) (C)",), 1.0),
    (vocab.DCGM_FI_DEV_MEMORY_TEMP, ("Temperature (Sensor memory) (C)",), 1.0),
    (vocab.GPU_EDGE_TEMPERATURE, ("Temperature (Sensor edge) (C)",), 1.0),
    (vocab.DCGM_FI_DEV_FB_USED, ("VRAM Total Used Memory (B)",), 1.0 / MIB),
    (vocab.DCGM_FI_DEV_FB_TOTAL, ("VRAM Total Memory (B)",), 1.0 / MIB),
    (vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, ("Accumulated Energy (uJ)",), 1e-3),
    (vocab.DCGM_FI_DEV_SM_CLOCK, ("sclk clock speed:",), 1.0),
    (vocab.DCGM_FI_DEV_MEM_CLOCK, ("mclk clock speed:",), 1.0),
    (vocab.DCGM_FI_DEV_PCIE_REPLAY_COUNTER, ("PCIe Replay Count",), 1.0),
)
_CARD_RE = re.compile(r"card(\d{1,6})\Z")
#: "45.0", "(800Mhz)": the number rocm-smi prints, its unit in parentheses for clocks.
_NUMBER_RE = re.compile(r"\s*\(?\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(?:Mhz|MHz)?\s*\)?\s*\Z")
_MISSING: Final = ("N/A", "", "NA", "None")


def _value(raw: Any, what: str, factor: float, *, path: str | os.PathLike[str]) -> float | None:
    if raw is None or (isinstance(raw, str) and raw.strip() in _MISSING):
        return None
    if isinstance(raw, bool):
        raise ParseError(f"{what} is not a reading", path=path, line=None, text=repr(raw))
    m = _NUMBER_RE.match(raw) if isinstance(raw, str) else None
    number = float(raw) if isinstance(raw, (int, float)) else float(m.group(1)) if m else None
    if number is None:
        raise ParseError(f"{what} is not a reading", path=path, line=None, text=repr(raw)[:80])
    value = number * factor
    if not math.isfinite(value):
        raise ParseError(f"{what} is not a finite number", path=path, line=None, text=repr(raw)[:80])
    return value


def _text(card: dict[str, Any], *keys: str) -> str | None:
    for key in keys:
        value = card.get(key)
        if isinstance(value, str) and value.strip() not in _MISSING:
            return value.strip()
    return None


def parse_rocm_smi_json(
    text: str, *, path: str | os.PathLike[str] = "<input>", hostname: str | None = None, t: float | None = None
) -> Iterator[Sample]:
    """DCGM-named samples of one ``rocm-smi ... --json`` document at ``t`` (default: the time of the parse)."""
    t = time.time() if t is None else t
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as err:
        raise ParseError(f"not JSON: {err}", path=path, line=getattr(err, "lineno", 1) or 1) from err
    if not isinstance(doc, dict) or not any(_CARD_RE.match(k) for k in doc):
        raise ParseError('not rocm-smi JSON (want {"card0": {...}, ...})', path=path, line=1)
    system = doc.get("system")
    driver = _text(system, "Driver version") if isinstance(system, dict) else None
    for key, card in doc.items():
        m = _CARD_RE.match(key)
        if m is None:
            continue
        if not isinstance(card, dict):
            raise ParseError(f"{key} is not an object", path=path, line=None, text=repr(card)[:80])
        labels = gpu_labels(
            str(int(m.group(1))),
            model=_text(card, "Card Series", "Card series", "Device Name"),
            hostname=hostname,
            pci_bus_id=_text(card, "PCI Bus"),
            UUID=_text(card, "Unique ID"),
            driver_version=driver,
        )
        for metric, keys, factor in _FIELDS:
            name = next((k for k in keys if _value(card.get(k), k, 1.0, path=path) is not None), None)
            value = None if name is None else _value(card[name], f"{key} {name!r}", factor, path=path)
            if value is not None:
                yield Sample(metric=metric, labels=labels, t=t, value=value)


def read_rocm_smi_json(
    path: str | os.PathLike[str], *, hostname: str | None = None, t: float | None = None
) -> Iterator[Sample]:
    """``parse_rocm_smi_json`` of a saved output; ``t`` defaults to the file's write time."""
    when = file_time(path) if t is None else t
    yield from parse_rocm_smi_json(read_text(path), path=path, hostname=hostname, t=when)


def is_rocm_smi_json(head: str) -> bool:
    """Sniff: a JSON object whose first key is ``cardN``."""
    return re.match(r'\s*\{\s*"card\d+"\s*:\s*\{', head) is not None
