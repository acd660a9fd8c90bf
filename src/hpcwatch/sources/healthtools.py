"""Readers of the active health tools' outputs: ``dcgmi diag -j``, nccl-tests, ``ib_write_bw``.

Each run becomes one ``Event`` (``dcgm_diag``, ``nccl_test``, ``ib_write_bw``) whose
attrs hold the run's results; ``analysis.health.active_checks`` judges them.
None of these outputs names the host it ran on (nccl-tests names the ranks'
hosts), so the readers take ``node=``.

- ``dcgmi diag -r 1|2|3 -j``: DCGM 3.x nests results under ``"DCGM GPU Diagnostic"``
  with ``gpu_ids`` and statuses ``Pass/Fail/Warn/Skip``; DCGM 4.x under
  ``"DCGM Diagnostic"`` with ``entity_group``/``entity_id``, warnings as objects
  (``{"warning": ..., "error_id": ...}``) and the version in ``metadata``. Both are
  read. Shapes: NVIDIA/DCGM ``nvvs/include/NvvsCommon.h`` (3.x comment),
  https://github.com/NVIDIA/DCGM/issues/215 (4.x output), and DCGM's note that the
  JSON has no stable schema: https://docs.nvidia.com/datacenter/dcgm/latest/reference/diagnostics/errors.html
  Text dcgmi prints before the document (``Successfully ran diagnostic ...``) is skipped.
- nccl-tests (``all_reduce_perf`` ...): the results table, columns taken from its
  header line (2.13+ has ``root`` and ``#wrong``; older versions ``error``), rows
  possibly prefixed by mpirun's ``[1,0]<stdout>:``. For each row we recompute
  algbw = size / time and busbw = algbw × factor (AllReduce 2(n−1)/n; ReduceScatter,
  AllGather, AlltoAll (n−1)/n; Broadcast, Reduce, SendRecv 1) and flag rows where
  the printed busbw disagrees:
  https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md
- ``ib_write_bw`` (perftest): the ``#bytes #iterations BW peak BW average MsgRate``
  table; ``MB/sec`` is 2^20 bytes/s and ``Gb/sec`` 10^9 bit/s (perftest's
  ``format_factor = MBS ? 0x100000 : 125000000``, perftest_parameters/report code).

Lenient: unknown keys and extra lines (NCCL INFO logs, CPU-frequency warnings)
are skipped; a row that does not fit its table is a ``ParseError``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from hpcwatch.errors import ParseError
from hpcwatch.records import Event
from hpcwatch.sources.lines import file_time, read_text, to_float, to_int
from hpcwatch.vocab import EventKind

__all__ = [
    "parse_dcgmi_diag",
    "read_dcgmi_diag",
    "parse_nccl_tests",
    "read_nccl_tests",
    "parse_ib_write_bw",
    "read_ib_write_bw",
    "busbw_factor",
    "BUSBW_FACTORS",
]

SOURCE = "healthtools"


# -- dcgmi diag -j ---------------------------------------------------------------------------------


def _status(raw: Any) -> str:
    """``pass``/``fail``/``warn``/``skip``/``not run``; an unknown word stays as written (never a pass)."""
    word = str(raw or "").strip().lower()
    return {"skipped": "skip", "notrun": "not run", "not_run": "not run"}.get(word, word)


def _warnings(raw: Any) -> list[str]:
    if raw is None:
        return []
    items = raw if isinstance(raw, list) else [raw]
    return [str(w.get("warning", w)) if isinstance(w, dict) else str(w) for w in items]


def parse_dcgmi_diag(
    text: str,
    *,
    path: str | os.PathLike[str] = "<dcgmi diag>",
    node: str | None = None,
    t: float | None = None,
    level: int | None = None,
) -> Iterator[Event]:
    """One ``dcgm_diag`` event: attrs ``results`` = [{category, test, gpu, status, warnings, info}]."""
    start = text.find("{")
    if start < 0:
        raise ParseError("no JSON document in dcgmi diag output", path=path, line=1, text=text[:80])
    try:
        doc = orjson.loads(text[start : text.rfind("}") + 1])
    except orjson.JSONDecodeError as err:
        line = text.count("\n", 0, start) + (getattr(err, "lineno", 1) or 1)
        raise ParseError(f"not JSON: {err}", path=path, line=line) from err
    body = doc.get("DCGM GPU Diagnostic") or doc.get("DCGM Diagnostic") if isinstance(doc, dict) else None
    if not isinstance(body, dict) or not isinstance(body.get("test_categories"), list):
        raise ParseError(
            "no 'DCGM GPU Diagnostic' / 'DCGM Diagnostic' test_categories",
            path=path,
            line=text.count("\n", 0, start) + 1,
        )
    results = []
    for category in body["test_categories"]:
        for test in category.get("tests", []):
            for r in test.get("results", []):
                gpu = r.get("gpu_ids", r.get("gpu_id", r.get("entity_id")))
                results.append(
                    {
                        "category": category.get("category"),
                        "test": test.get("name"),
                        "gpu": None if gpu is None else str(gpu),
                        "status": _status(r.get("status")),
                        "warnings": _warnings(r.get("warnings")),
                        "info": _warnings(r.get("info")),
                    }
                )
    meta = doc.get("metadata") or {}
    version = body.get("version") or meta.get("version")
    driver = body.get("driver_version_detected") or meta.get("Driver Version Detected")
    yield Event(
        kind=EventKind.DCGM_DIAG,
        t=t if t is not None else _mtime(path),
        source=SOURCE,
        attrs={"node": node, "level": level, "version": version, "driver": driver, "results": results},
    )


def read_dcgmi_diag(
    path: str | os.PathLike[str], *, node: str | None = None, level: int | None = None
) -> Iterator[Event]:
    yield from parse_dcgmi_diag(read_text(path), path=path, node=node, t=file_time(path), level=level)


def _mtime(path: str | os.PathLike[str]) -> float:
    try:
        return Path(path).stat().st_mtime
    except OSError:
        return 0.0  # text given without a file: time unknown, and said so by 0


# -- nccl-tests ------------------------------------------------------------------------------------

#: busbw / algbw for n ranks (nccl-tests doc/PERFORMANCE.md).
BUSBW_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}

_MPI_PREFIX = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_RANK_RE = re.compile(
    r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)\s+\[[^\]]*\]\s+(.+?)\s*$"
)
_COLLECTIVE_RE = re.compile(r"(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|reduce|sendrecv)_perf")
_AVG_RE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")


def busbw_factor(collective: str, nranks: int) -> float | None:
    f = BUSBW_FACTORS.get(collective)
    return f(nranks) if f is not None and nranks > 0 else None


def _header(line: str) -> list[str] | None:
    """Column names of the table header ``#  size  count  type  redop  root  time  algbw  busbw  #wrong ...``."""
    body = line.lstrip("#").split()
    if len(body) < 6 or body[0] != "size" or body[1] != "count":
        return None
    names, seen_time = [], 0
    for token in body:
        token = token.lstrip("#")
        if token == "time":
            seen_time += 1
        prefix = "" if token in ("size", "count", "type", "redop", "root") else ("oop_" if seen_time <= 1 else "ip_")
        names.append(prefix + {"error": "wrong"}.get(token, token))
    return names


def _cell(name: str, token: str, *, path: str | os.PathLike[str], line: int) -> Any:
    if name in ("type", "redop"):
        return token
    if token == "N/A":
        return None
    if name in ("size", "count", "root"):
        return to_int(token, name, path=path, line=line)
    return to_float(token, name, path=path, line=line)


def _check_row(row: dict[str, Any], collective: str, nranks: int) -> None:
    """Recompute algbw and busbw; set ``busbw_mismatch`` when the printed numbers disagree."""
    row["size_bytes"] = row.pop("size")
    factor = busbw_factor(collective, nranks)
    mismatch = False
    for side in ("oop", "ip"):
        time_us, algbw, busbw = row.get(f"{side}_time"), row.get(f"{side}_algbw"), row.get(f"{side}_busbw")
        if time_us is None or algbw is None or busbw is None:
            continue
        row[f"{side}_time_us"] = row.pop(f"{side}_time")
        row[f"{side}_algbw_gbs"] = row.pop(f"{side}_algbw")
        row[f"{side}_busbw_gbs"] = row.pop(f"{side}_busbw")
        if factor is not None:
            # Printed with 2 decimals: allow the rounding of both numbers, plus 1 %.
            mismatch |= abs(busbw - algbw * factor) > 0.011 * (1 + factor) + 0.01 * busbw
        if time_us > 0:
            mismatch |= abs(algbw - row["size_bytes"] / (time_us * 1e3)) > 0.011 + 0.01 * algbw
    row["busbw_mismatch"] = mismatch


def parse_nccl_tests(
    text: str,
    *,
    path: str | os.PathLike[str] = "<nccl-tests>",
    node: str | None = None,
    t: float | None = None,
    collective: str | None = None,
) -> Iterator[Event]:
    """One ``nccl_test`` event: attrs collective, nranks, hosts, gpu_model, rows (one per message size), avg_busbw_gbs."""
    if collective is None:
        found = _COLLECTIVE_RE.search(text) or _COLLECTIVE_RE.search(Path(str(path)).name)
        collective = found.group(1) if found else "unknown"
    ranks: dict[int, tuple[str, str]] = {}
    columns: list[str] | None = None
    rows: list[dict[str, Any]] = []
    avg = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _MPI_PREFIX.sub("", raw).strip()
        if not line:
            continue
        if line.startswith("#"):
            if m := _RANK_RE.match(line):
                ranks[int(m.group(1))] = (m.group(2), m.group(4))
            elif m := _AVG_RE.match(line):
                avg = to_float(m.group(1), "average bus bandwidth", path=path, line=number)
            elif (names := _header(line)) is not None:
                columns = names
            continue
        tokens = line.split()
        if columns is None or not tokens[0].isdigit():
            continue  # NCCL INFO lines, banners
        if len(tokens) != len(columns):
            raise ParseError(
                f"row has {len(tokens)} fields, the header {len(columns)}", path=path, line=number, text=raw
            )
        rows.append({name: _cell(name, tok, path=path, line=number) for name, tok in zip(columns, tokens)})
    if columns is None:
        raise ParseError("no nccl-tests results header ('#  size  count  type ...')", path=path, line=1)
    nranks = len(ranks)
    for row in rows:
        _check_row(row, collective, nranks)
    hosts = sorted({h for h, _ in ranks.values()})
    models = sorted({m for _, m in ranks.values()})
    yield Event(
        kind=EventKind.NCCL_TEST,
        t=t if t is not None else _mtime(path),
        source=SOURCE,
        attrs={
            "node": node or (hosts[0] if hosts else None),
            "collective": collective,
            "nranks": nranks,
            "hosts": hosts,
            "gpu_model": models[0] if len(models) == 1 else None,
            "rows": rows,
            "avg_busbw_gbs": avg,
        },
    )


def read_nccl_tests(
    path: str | os.PathLike[str], *, node: str | None = None, collective: str | None = None
) -> Iterator[Event]:
    yield from parse_nccl_tests(read_text(path), path=path, node=node, t=file_time(path), collective=collective)


# -- ib_write_bw -----------------------------------------------------------------------------------

_IB_HEADER_RE = re.compile(r"^#bytes\s+#iterations\s+BW peak\[(MB|Gb)/sec\]\s+BW average\[(MB|Gb)/sec\]")
_IB_DEVICE_RE = re.compile(r"\bDevice\s*:\s*(\S+)")
_IB_TEST_RE = re.compile(r"^\s*(\S.*\bBW Test)\s*$")
_MIB = 1 << 20


def parse_ib_write_bw(
    text: str, *, path: str | os.PathLike[str] = "<ib_write_bw>", node: str | None = None, t: float | None = None
) -> Iterator[Event]:
    """One ``ib_write_bw`` event: attrs test, device, rows [{size_bytes, iterations, bw_peak_gbps, bw_avg_gbps, msg_rate_mpps}]."""
    device = test = unit = None
    rows = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if m := _IB_HEADER_RE.match(line):
            unit = m.group(2)
            continue
        if device is None and (m := _IB_DEVICE_RE.search(line)):
            device = m.group(1)
        if test is None and (m := _IB_TEST_RE.match(raw)):
            test = m.group(1)
        tokens = line.split()
        if unit is None or not tokens or not tokens[0].isdigit():
            continue
        if len(tokens) != 5:
            raise ParseError(
                "bandwidth row needs 5 fields (#bytes #iterations peak average msgrate)",
                path=path,
                line=number,
                text=raw,
            )
        size, iterations = (
            to_int(tok, name, path=path, line=number) for tok, name in zip(tokens, ("#bytes", "#iterations"))
        )
        values = [
            to_float(tok, name, path=path, line=number)
            for tok, name in zip(tokens, ("#bytes", "#iterations", "BW peak", "BW average", "MsgRate"))
        ]
        to_gbps: Callable[[float], float] = (lambda v: v * _MIB * 8 / 1e9) if unit == "MB" else (lambda v: v)
        rows.append(
            {
                "size_bytes": size,
                "iterations": iterations,
                "bw_peak_gbps": to_gbps(values[2]),
                "bw_avg_gbps": to_gbps(values[3]),
                "msg_rate_mpps": values[4],
            }
        )
    if unit is None:
        raise ParseError("no perftest results header ('#bytes #iterations BW peak[...]')", path=path, line=1)
    yield Event(
        kind=EventKind.IB_WRITE_BW,
        t=t if t is not None else _mtime(path),
        source=SOURCE,
        attrs={"node": node, "test": test, "device": device, "rows": rows},
    )


def read_ib_write_bw(path: str | os.PathLike[str], *, node: str | None = None) -> Iterator[Event]:
    yield from parse_ib_write_bw(read_text(path), path=path, node=node, t=file_time(path))
