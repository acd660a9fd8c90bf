"""Lustre per-job I/O: ``lctl get_param obdfilter.*.job_stats`` (OSTs) and ``mdt.*.job_stats`` (MDTs).

The text is YAML-like (https://doc.lustre.org/lustre_manual.xhtml#jobstats):

    obdfilter.lustre-OST0000.job_stats=
    job_stats:
    - job_id:          24
      snapshot_time:   1510782606
      read_bytes:      { samples: 125, unit: bytes, min: 4096, max: 4096, sum: 512000 }
      getattr:         { samples: 7, unit: reqs }

Each job gives, at its ``snapshot_time``:
``lustre_job_<op>_bytes_total`` (the ``sum``) for byte counters
(``read_bytes`` -> ``lustre_job_read_bytes_total``), and ``lustre_job_<op>_total``
(the ``samples``: how many requests) for every counter
(``read_bytes`` -> ``lustre_job_read_total``, ``getattr`` -> ``lustre_job_getattr_total``).
Labels: ``jobid`` (as Lustre wrote it: a Slurm id, or ``procname.uid``; may be
empty) and ``target`` (``lustre-OST0000``, from the ``param=`` header line or the
``target=`` argument).

Ops timed in ``usecs`` (newer Lustre) also give ``lustre_job_<op>_seconds_total``.

Not checked: units other than bytes/reqs/usecs (their ``samples`` are still
read), ``start_time``/``elapsed_time`` of newer Lustre (skipped), that job ids
are unique per target.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from hpcwatch.errors import ParseError
from hpcwatch.records import Sample
from hpcwatch.sources.lines import read_text, shown, to_float

__all__ = ["parse_job_stats", "read_job_stats", "is_job_stats"]

_PARAM_RE = re.compile(r"(?:obdfilter|mdt)\.([^.\s=]+)\.job_stats=\s*\Z")
_JOB_RE = re.compile(r"-\s+job_id:\s*(.*?)\s*\Z")
_SCALAR_RE = re.compile(r"([a-z_]+):\s*([^{\s][^{]*?)?\s*\Z")
_STAT_RE = re.compile(r"([a-z_]+):\s*\{(.*)\}\s*\Z")
_SKIPPED = frozenset({"start_time", "elapsed_time"})


def _stat_fields(body: str, *, path: str | os.PathLike[str], line: int, raw: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for item in body.split(","):
        key, sep, value = item.partition(":")
        if not sep or not key.strip():
            raise ParseError("bad counter (want { samples: N, unit: U, ... })", path=path, line=line, text=raw)
        fields[key.strip()] = value.strip()
    if "samples" not in fields:
        raise ParseError("counter without samples", path=path, line=line, text=raw)
    return fields


def _stat_samples(
    op: str,
    fields: dict[str, str],
    labels: dict[str, str],
    t: float,
    *,
    path: str | os.PathLike[str],
    line: int,
    raw: str,
) -> Iterator[Sample]:
    count = to_float(fields["samples"], f"{op} samples", path=path, line=line, text=raw)
    name = op[: -len("_bytes")] if op.endswith("_bytes") else op
    unit = fields.get("unit")
    total = to_float(fields.get("sum", "0"), f"{op} sum", path=path, line=line, text=raw)
    if unit == "usecs":
        # Newer Lustre also times each op ("read: {.., unit: usecs}"); its count repeats read_bytes'.
        yield Sample(metric=f"lustre_job_{name}_seconds_total", labels=labels, t=t, value=total / 1e6)
        if name in ("read", "write"):
            return
    yield Sample(metric=f"lustre_job_{name}_total", labels=labels, t=t, value=count)
    if unit == "bytes":
        yield Sample(metric=f"lustre_job_{name}_bytes_total", labels=labels, t=t, value=total)


def parse_job_stats(
    text: str, *, path: str | os.PathLike[str] = "<input>", target: str | None = None, t: float | None = None
) -> Iterator[Sample]:
    """Samples of one or more ``job_stats`` blocks; ``t`` only where a job has no ``snapshot_time``."""
    labels: dict[str, str] | None = None
    when: float | None = None
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or line == "job_stats:":
            continue
        if (m := _PARAM_RE.match(line)) is not None:
            target, labels = m.group(1), None
            continue
        if (m := _JOB_RE.match(line)) is not None:
            labels = {"jobid": m.group(1), **({"target": target} if target else {})}
            when = t
            continue
        if labels is None:
            raise ParseError("not a job_stats line (want '- job_id:' first)", path=path, line=number, text=raw)
        if (m := _STAT_RE.match(line)) is not None:
            if when is None:
                raise ParseError("counter before snapshot_time and no time given", path=path, line=number, text=raw)
            fields = _stat_fields(m.group(2), path=path, line=number, raw=raw)
            yield from _stat_samples(m.group(1), fields, labels, when, path=path, line=number, raw=raw)
        elif (m := _SCALAR_RE.match(line)) is not None:
            if m.group(1) == "snapshot_time":
                when = to_float(m.group(2) or "", "snapshot_time", path=path, line=number, text=raw)
            elif m.group(1) not in _SKIPPED:
                raise ParseError(f"unknown job_stats field {shown(m.group(1))}", path=path, line=number, text=raw)
        else:
            raise ParseError("not a job_stats line", path=path, line=number, text=raw)


def _target_from_name(path: Path) -> str | None:
    """``obdfilter_OST0000_job_stats.txt`` -> ``OST0000`` (how the exporter fixtures are named)."""
    m = re.search(r"((?:OST|MDT)[0-9a-fA-F]{4})", path.name)
    return m.group(1) if m else None


def read_job_stats(
    path: str | os.PathLike[str], *, target: str | None = None, t: float | None = None
) -> Iterator[Sample]:
    """``parse_job_stats`` of a saved ``lctl get_param`` output; the target defaults to the one in the file name."""
    text = read_text(path)
    yield from parse_job_stats(text, path=path, target=target or _target_from_name(Path(path)), t=t)


def is_job_stats(head: str) -> bool:
    first = head.lstrip().split("\n", 1)[0].strip()
    return first == "job_stats:" or _PARAM_RE.match(first) is not None
