"""GPU readings of ``amd-smi metric --json`` and ``amd-smi static --json``, as DCGM-named samples.

One document per run of the tool: ``{"gpu_data": [{"gpu": 0, ...}, ...]}`` (amd-smi 25 and later) or the
bare list ``[{"gpu": 0, ...}]`` (amd-smi 24, ROCm 6.x). Each GPU object holds blocks of readings, each
``{"value": V, "unit": U}`` (units since ROCm 6.1), a bare number (older releases: the unit amd-smi writes
today is assumed: %, W, C, MHz, MB, J) or ``"N/A"`` (no sample). ``metric`` gives usage, power, clocks,
temperatures, PCIe, ECC, energy and memory use; ``static`` gives the product (``asic.market_name``, the
``modelName`` label of every sample of that GPU in the same document), the bus id and the VRAM size.
Renamed to DCGM fields by the table of ``amd_gpu`` (which says why and in which units); the edge
temperature keeps the exporter's name ``gpu_edge_temperature``.

Times: amd-smi prints none; samples take ``t``, else the file's write time (``read_amd_smi_json``).

Not checked: blocks and fields not listed in ``_FIELDS`` (skipped: per-XCP busy lists, throttle and
violation counters, per-block ECC, XGMI error status, processes); that two GPU objects have different
``gpu`` numbers.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any, Final

import orjson

from hpcwatch import vocab
from hpcwatch.errors import ParseError
from hpcwatch.records import Sample
from hpcwatch.sources.amd_gpu import gpu_labels, to_unit
from hpcwatch.sources.lines import file_time, read_text

__all__ = ["parse_amd_smi_json", "read_amd_smi_json", "is_amd_smi_json"]

#: (block, field[, sub-field]) of a GPU object -> (metric, the unit a bare number is taken to be in).
_FIELDS: Final[tuple[tuple[tuple[str, ...], str, str | None], ...]] = (
    (("usage", "gfx_activity"), vocab.DCGM_FI_DEV_GPU_UTIL, "%"),
    (("usage", "umc_activity"), vocab.DCGM_FI_DEV_MEM_COPY_UTIL, "%"),
    (("power", "socket_power"), vocab.DCGM_FI_DEV_POWER_USAGE, "W"),
    (("temperature", "hotspot"), vocab.DCGM_FI_DEV_GPU_TEMP, "C"),
    (("temperature", "mem"), vocab.DCGM_FI_DEV_MEMORY_TEMP, "C"),
    (("temperature", "edge"), vocab.GPU_EDGE_TEMPERATURE, "C"),
    (("mem_usage", "used_vram"), vocab.DCGM_FI_DEV_FB_USED, "MB"),
    (("mem_usage", "free_vram"), vocab.DCGM_FI_DEV_FB_FREE, "MB"),
    (("mem_usage", "total_vram"), vocab.DCGM_FI_DEV_FB_TOTAL, "MB"),
    (("vram", "size"), vocab.DCGM_FI_DEV_FB_TOTAL, "MB"),
    (("vram", "vram_size"), vocab.DCGM_FI_DEV_FB_TOTAL, "MB"),
    (("energy", "total_energy_consumption"), vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, "J"),
    (("clock", "gfx_0", "clk"), vocab.DCGM_FI_DEV_SM_CLOCK, "MHz"),
    (("clock", "mem_0", "clk"), vocab.DCGM_FI_DEV_MEM_CLOCK, "MHz"),
    (("ecc", "total_uncorrectable_count"), vocab.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, None),
    (("ecc", "total_correctable_count"), vocab.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, None),
    (("pcie", "replay_count"), vocab.DCGM_FI_DEV_PCIE_REPLAY_COUNTER, None),
)
_MISSING: Final = ("N/A", "", "NA")


def _gpus(doc: Any, *, path: str | os.PathLike[str]) -> list[Mapping[str, Any]]:
    items = doc.get("gpu_data") if isinstance(doc, dict) else doc
    if not isinstance(items, list) or not all(isinstance(g, dict) and "gpu" in g for g in items):
        raise ParseError(
            'not amd-smi JSON (want {"gpu_data": [{"gpu": N, ...}]} or [{"gpu": N, ...}])', path=path, line=1
        )
    return items


def _at(gpu: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    node: Any = gpu
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _reading(raw: Any, default_unit: str | None, what: str, *, path: str | os.PathLike[str]) -> float | None:
    """A reading in hpcwatch's unit, or None for N/A."""
    unit = default_unit
    if isinstance(raw, dict):
        unit = raw.get("unit", default_unit)
        raw = raw.get("value")
        if unit is not None and not isinstance(unit, str):
            raise ParseError(f"{what}: the unit is not a string", path=path, line=None, text=repr(unit)[:80])
    if raw is None or (isinstance(raw, str) and raw.strip() in _MISSING):
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ParseError(f"{what} is not a reading", path=path, line=None, text=repr(raw)[:80])
    value = to_unit(float(raw), unit, what, path=path)
    if not math.isfinite(value):
        raise ParseError(f"{what} is not a finite number", path=path, line=None, text=repr(raw)[:80])
    return value


def _index(gpu: Mapping[str, Any], *, path: str | os.PathLike[str]) -> str:
    index = gpu.get("gpu")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ParseError("a GPU object whose 'gpu' is not an index", path=path, line=None, text=repr(index)[:80])
    return str(index)


def parse_amd_smi_json(
    text: str, *, path: str | os.PathLike[str] = "<input>", hostname: str | None = None, t: float | None = None
) -> Iterator[Sample]:
    """DCGM-named samples of one ``amd-smi metric --json`` or ``amd-smi static --json`` document at ``t`` (default: the time of the parse)."""
    t = time.time() if t is None else t
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as err:
        raise ParseError(f"not JSON: {err}", path=path, line=getattr(err, "lineno", 1) or 1) from err
    for gpu in _gpus(doc, path=path):
        index = _index(gpu, path=path)
        market = _at(gpu, ("asic", "market_name"))
        bdf = _at(gpu, ("bus", "bdf"))
        labels = gpu_labels(
            index,
            model=market if isinstance(market, str) and market not in _MISSING else None,
            hostname=hostname,
            pci_bus_id=bdf if isinstance(bdf, str) and bdf not in _MISSING else None,
        )
        seen: set[str] = set()
        for keys, metric, unit in _FIELDS:
            if metric in seen:
                continue
            value = _reading(_at(gpu, keys), unit, f"GPU {index} {'.'.join(keys)}", path=path)
            if value is not None:
                seen.add(metric)
                yield Sample(metric=metric, labels=labels, t=t, value=value)


def read_amd_smi_json(
    path: str | os.PathLike[str], *, hostname: str | None = None, t: float | None = None
) -> Iterator[Sample]:
    """``parse_amd_smi_json`` of a saved output; ``t`` defaults to the file's write time."""
    when = file_time(path) if t is None else t
    yield from parse_amd_smi_json(read_text(path), path=path, hostname=hostname, t=when)


def is_amd_smi_json(head: str) -> bool:
    """Sniff: a JSON document whose first GPU object has ``"gpu": N`` and an amd-smi block."""
    text = head.lstrip()
    if not text.startswith(("{", "[")) or '"gpu"' not in text[:4096]:
        return False
    if text.startswith("{") and not text[1:].lstrip().startswith('"gpu_data"'):
        return False
    return any(f'"{block}"' in text for block in ("usage", "asic", "mem_usage", "power", "vram", "temperature"))
