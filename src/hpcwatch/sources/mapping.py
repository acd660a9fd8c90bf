"""dcgm-exporter's HPC job mapping directory: which Slurm job holds which GPU, right now.

dcgm-exporter ``--hpc-job-mapping-dir DIR`` reads one file per GPU, named by the
GPU index (``0`` … ``7``) or, for a MIG instance, ``<gpu>.<gpu instance>``
(``2.0``); each file holds the ids of the jobs on that GPU, one per line. A
Slurm prolog writes them and the epilog removes them, so this is the only
place where "GPU 3 of node1 belongs to job 42" is written down on the node.
(https://github.com/NVIDIA/dcgm-exporter#enabling-hpc-job-mapping-on-dcgm-exporter)

Not checked: that the jobs exist, that a job is on one GPU only, that the
index exists on the node. An empty file maps its GPU to no job (``[]``). Files
that are not named like a GPU are skipped and reported in ``MappingDir.ignored``
with the reason; a job id that is not one word is a ``ParseError``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from hpcwatch.errors import ParseError
from hpcwatch.sources.lines import read_text

__all__ = [
    "MappingDir",
    "scan_job_mapping_dir",
    "read_job_mapping_dir",
    "read_job_mapping_tree",
    "parse_job_mapping_file",
    "is_mapping_name",
]

_GPU_NAME_RE = re.compile(r"(?:0|[1-9][0-9]{0,3})(?:\.(?:0|[1-9][0-9]{0,3}))?\Z")
# Slurm job ids: 42, array tasks 42_7, heterogeneous components 42+1.
_JOB_ID_RE = re.compile(r"[0-9]+(?:[_+][0-9]+)?\Z")


@dataclass(frozen=True, slots=True, kw_only=True)
class MappingDir:
    """What one node's mapping directory says."""

    jobs: dict[str, list[str]] = field(default_factory=dict)
    """GPU index (``"3"``) or MIG ``"gpu.instance"`` (``"2.0"``) -> job ids (maybe empty)."""
    ignored: tuple[tuple[str, str], ...] = ()
    """(file name, why it was skipped)."""


def is_mapping_name(name: str) -> bool:
    """A GPU index or a MIG ``gpu.instance`` name."""
    return _GPU_NAME_RE.match(name) is not None


def parse_job_mapping_file(text: str, *, path: str | os.PathLike[str] = "<input>") -> list[str]:
    """The job ids in one mapping file (blank lines skipped)."""
    jobs = []
    for number, raw in enumerate(text.split("\n"), start=1):
        job = raw.strip()
        if not job:
            continue
        if not _JOB_ID_RE.match(job):
            raise ParseError("not a Slurm job id", path=path, line=number, text=raw)
        jobs.append(job)
    return jobs


def scan_job_mapping_dir(directory: str | os.PathLike[str]) -> MappingDir:
    """Every GPU file of ``directory``, and what was skipped."""
    root = Path(directory)
    try:
        entries = sorted(root.iterdir(), key=lambda p: p.name)
    except OSError as err:
        raise ParseError(f"cannot list the mapping directory: {err.strerror or err}", path=root) from err
    jobs: dict[str, list[str]] = {}
    ignored: list[tuple[str, str]] = []
    for entry in entries:
        if not is_mapping_name(entry.name):
            ignored.append((entry.name, "not a GPU index or MIG gpu.instance name"))
        elif not entry.is_file():
            ignored.append((entry.name, "not a regular file"))
        else:
            jobs[entry.name] = parse_job_mapping_file(read_text(entry), path=entry)
    return MappingDir(jobs=dict(sorted(jobs.items(), key=lambda kv: _gpu_order(kv[0]))), ignored=tuple(ignored))


def read_job_mapping_dir(directory: str | os.PathLike[str]) -> dict[str, list[str]]:
    """GPU index or MIG ``"gpu.instance"`` -> job ids, for one node's mapping directory."""
    return scan_job_mapping_dir(directory).jobs


def read_job_mapping_tree(root: str | os.PathLike[str]) -> dict[str, dict[str, list[str]]]:
    """Node -> GPU -> job ids, for a tree of per-node directories (``root/node1/0``, as in our Slurm prolog)."""
    base = Path(root)
    try:
        nodes = sorted(p for p in base.iterdir() if p.is_dir())
    except OSError as err:
        raise ParseError(f"cannot list the mapping tree: {err.strerror or err}", path=base) from err
    return {node.name: read_job_mapping_dir(node) for node in nodes}


def _gpu_order(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split("."))
