"""Which reader a file needs, from its first bytes and its name.

``FORMATS`` is the table: each ``Format`` has a name (what ``--format`` takes), a
``sniff(head, name)`` that looks at the first 64 KiB of text and the file name,
and the ``reader(path)`` to call. The first format whose sniff says yes wins, so
put specific formats before lenient ones. To add a format, append one line:

    FORMATS.append(Format("falco-json", _sniff_falco, read_falco))

Not checked by sniffing: the whole file (the reader does that and raises a
``ParseError`` on the line that is wrong). An empty file is no format and gives
no records; a file no sniff recognises is a ``ParseError`` naming it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from hpcwatch.errors import ParseError
from hpcwatch.records import Event, Finding, Job, Sample, Span
from hpcwatch.sources import infiniband, lustre, nvidia_smi, prometheus_text, slurm
from hpcwatch.sources.lines import read_bytes

__all__ = ["Format", "FORMATS", "SNIFF_BYTES", "detect_format", "format_named", "read_any", "read_paths",
           "iter_files"]

Record = Sample | Event | Span | Job | Finding

#: How much of a file the sniffers see.
SNIFF_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Format:
    name: str
    """What ``hpcwatch ingest --format`` takes."""
    sniff: Callable[[str, str], bool]
    """(first 64 KiB as text, file name) -> is it this format?"""
    reader: Callable[[Path], Iterator[Any]]
    """path -> records."""
    table_reader: Callable[[Path], pa.Table] | None = None
    """path -> samples as a ``store.SAMPLE_SCHEMA`` table, when the format has a fast columnar path."""


def _json_jobs(head: str) -> bool:
    return head.lstrip().startswith("{") and '"jobs"' in head


def _sniff_squeue(head: str, name: str) -> bool:
    return _json_jobs(head) and ('"job_state"' in head or "squeue" in name)


def _sniff_sacct(head: str, name: str) -> bool:
    return _json_jobs(head) and ('"steps"' in head or '"current"' in head or "sacct" in name)


FORMATS: list[Format] = [
    Format("nvidia-smi-xml", lambda h, n: nvidia_smi.is_nvidia_smi_xml(h), nvidia_smi.read_nvidia_smi_xml),
    Format("squeue-json", _sniff_squeue, slurm.read_squeue_json),
    Format("sacct-json", _sniff_sacct, slurm.read_sacct_json),
    Format("scontrol-job", lambda h, n: h.lstrip().startswith("JobId="), slurm.read_scontrol_show_job),
    Format("perfquery", lambda h, n: infiniband.is_perfquery(h), infiniband.read_perfquery),
    Format("ibstat", lambda h, n: infiniband.is_ibstat(h), infiniband.read_ibstat),
    Format("lustre-job-stats", lambda h, n: lustre.is_job_stats(h), lustre.read_job_stats),
    Format("nvidia-smi-csv", lambda h, n: nvidia_smi.is_nvidia_smi_csv(h), nvidia_smi.read_nvidia_smi_csv),
    Format("prometheus", lambda h, n: prometheus_text.is_prometheus_text(h), prometheus_text.read_prometheus_text,
           prometheus_text.read_prometheus_columns),
]

# Active health tools (specific sniffs, so they go first).
from hpcwatch.sources import healthtools  # noqa: E402

FORMATS[0:0] = [
    Format("dcgmi-diag", lambda h, n: '"DCGM GPU Diagnostic"' in h or '"DCGM Diagnostic"' in h,
           healthtools.read_dcgmi_diag),
    Format("nccl-tests", lambda h, n: "# nThread" in h and "algbw" in h, healthtools.read_nccl_tests),
    Format("ib-write-bw", lambda h, n: "#bytes" in h and "BW peak[" in h, healthtools.read_ib_write_bw),
]

# Security formats (specific sniffs first; pip freeze is lenient, so it goes last).
from hpcwatch.sources import falco, opensm, pip, procparams, tetragon  # noqa: E402

FORMATS[0:0] = [
    Format("falco-json", lambda h, n: falco.is_falco_json(h), falco.read_falco_json),
    Format("tetragon-json", lambda h, n: tetragon.is_tetragon_json(h), tetragon.read_tetragon_json),
    Format("nvidia-params", procparams.is_nvidia_params, procparams.read_nvidia_params),
    Format("opensm-partitions", opensm.is_partitions_conf, opensm.read_partitions_conf),
]
FORMATS.append(Format("pip-list", pip.is_pip_list, pip.read_pip_list))


def format_named(name: str) -> Format:
    for fmt in FORMATS:
        if fmt.name == name:
            return fmt
    known = ", ".join(f.name for f in FORMATS)
    raise ParseError(f"unknown format {name!r} (known: {known})")


def _head(path: Path) -> str:
    if path.name.endswith(".gz"):
        data = read_bytes(path)[:SNIFF_BYTES]
    else:
        try:
            with path.open("rb") as fh:
                data = fh.read(SNIFF_BYTES)
        except OSError as err:
            raise ParseError(f"cannot read the file: {err.strerror or err}", path=path) from err
    # A multi-byte character cut at the end of the head is not an error.
    return data.decode("utf-8", errors="ignore") if data else ""


def detect_format(path: str | os.PathLike[str]) -> Format | None:
    """The format of ``path``; ``None`` for an empty file; ParseError when nothing recognises it."""
    p = Path(path)
    head = _head(p)
    if not head.strip():
        return None
    for fmt in FORMATS:
        try:
            if fmt.sniff(head, p.name):
                return fmt
        except (ValueError, IndexError):
            continue  # a sniffer that trips on odd text has simply not recognised it
    raise ParseError("unknown format (not one of: " + ", ".join(f.name for f in FORMATS) + ")", path=p, line=1)


def read_any(path: str | os.PathLike[str], *, format: str | None = None) -> Iterator[Record]:
    """Records of one file, its format sniffed unless ``format`` names it."""
    fmt = format_named(format) if format else detect_format(path)
    if fmt is not None:
        yield from fmt.reader(Path(path))


def iter_files(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Path]:
    """Files of ``paths``, folders walked in name order; hidden files and folders (``.x``) skipped."""
    for given in paths:
        p = Path(given)
        if p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(files):
                    if not name.startswith("."):
                        yield Path(root) / name
        elif p.exists():
            yield p
        else:
            raise ParseError("no such file or folder", path=p)


def read_paths(paths: Iterable[str | os.PathLike[str]], *, format: str | None = None) -> Iterator[Record]:
    """Records of every file under ``paths`` (see ``iter_files``)."""
    for file in iter_files(paths):
        yield from read_any(file, format=format)

# Training-loop hook output (instrument/torch.py; torch is not imported to read it).
from hpcwatch.instrument.torch import is_hook_jsonl, read_hook_jsonl  # noqa: E402

FORMATS.insert(0, Format("hook-jsonl", lambda h, n: is_hook_jsonl(h), read_hook_jsonl))
