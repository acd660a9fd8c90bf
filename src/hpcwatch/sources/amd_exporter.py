"""AMD's device-metrics-exporter: Prometheus text whose GPU readings become DCGM fields.

The text is Prometheus exposition format 0.0.4, read by ``prometheus_text`` (same grammar, same errors,
same bounded chunked read); each sample is then renamed by ``amd_gpu.EXPORTER_TO_DCGM`` where the reading
has a DCGM twin (``gpu_gfx_activity`` -> ``DCGM_FI_DEV_GPU_UTIL``, ``gpu_energy_consumed`` uJ ->
``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` mJ ...) and keeps its own name otherwise (``gpu_xgmi_link_rx``,
``gpu_ecc_uncorrect_umc``, ``gpu_violation_*``, ``gpu_edge_temperature``). Every label is kept; ``gpu``
(from ``gpu_id``), ``modelName`` (from ``card_series``, else ``card_model``) and ``vendor`` are added, so
``schemas.sample_keys`` finds host (``hostname``), GPU and job (the exporter's Slurm ``job_id`` label). A
``MetricsFieldPrefix`` the exporter was configured with (``amd_gpu_gfx_activity``, ROCm/device-metrics-exporter
issue #135) is dropped from the families renamed; other families keep their name as exposed.

Why a format of its own rather than the plain ``prometheus`` one: a scrape saved from the exporter would
otherwise enter the store under AMD names no analysis reads; the sniff (a ``gpu_*``/``pcie_*`` family with
a ``gpu_id`` label) puts it ahead of ``prometheus``. Series read back from a Prometheus server through
``promql.py`` are not renamed (that backend queries DCGM names).

Not checked: what ``prometheus_text`` does not check; that ``gpu_clock`` carries ``clock_type`` (a clock
without one keeps its name).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator

from hpcwatch.records import Sample
from hpcwatch.sources.amd_gpu import EXPORTER_CLOCK, EXPORTER_CLOCKS, EXPORTER_TO_DCGM, gpu_labels
from hpcwatch.sources.prometheus_text import is_prometheus_text, parse_prometheus_text, read_prometheus_text

__all__ = ["parse_amd_exporter_text", "read_amd_exporter_text", "is_amd_exporter_text", "translate"]

_FAMILY_RE = re.compile(
    r"^(?:# (?:HELP|TYPE) )?(?:[a-zA-Z_:][a-zA-Z0-9_:]*_)?(?:gpu|pcie)_[a-z0-9_]+[{ ]", re.MULTILINE
)
#: The families the reader renames; a ``MetricsFieldPrefix`` before them (``amd_gpu_gfx_activity``) is dropped.
_KNOWN = frozenset({*EXPORTER_TO_DCGM, EXPORTER_CLOCK})
_FAMILY_START_RE = re.compile(r"_(?=gpu_|pcie_)")


def _unprefixed(name: str) -> str:
    """``name`` without the exporter's configurable prefix (its ``MetricsFieldPrefix``) when what follows it is a
    family the reader renames; else ``name`` as exposed."""
    if name in _KNOWN:
        return name
    for m in _FAMILY_START_RE.finditer(name):
        if name[m.end() :] in _KNOWN:
            return name[m.end() :]
    return name


def _labels(labels: dict[str, str], host: str | None) -> dict[str, str]:
    hostname = None if labels.get("hostname") or labels.get("Hostname") else host
    model = next((labels[k] for k in ("card_series", "card_model") if labels.get(k) not in (None, "", "N/A")), None)
    extra = gpu_labels(labels.get("gpu_id", ""), model=model, hostname=hostname, UUID=labels.get("gpu_uuid"))
    return {**labels, **extra}


def translate(samples: Iterable[Sample], *, host: str | None = None) -> Iterator[Sample]:
    """The exporter's samples with the DCGM names and the labels of the module docstring. ``host`` names
    the node of a scrape without a ``hostname`` label."""
    cache: dict[int, dict[str, str]] = {}  # the parser hands one labels dict to every sample of a series
    names: dict[str, str] = {}
    for s in samples:
        labels = cache.get(id(s.labels))
        if labels is None:
            labels = cache[id(s.labels)] = _labels(dict(s.labels), host)
            if len(cache) > 100_000:
                cache.clear()
        metric, value = names.get(s.metric) or names.setdefault(s.metric, _unprefixed(s.metric)), s.value
        if metric == EXPORTER_CLOCK:
            metric = EXPORTER_CLOCKS.get(labels.get("clock_type", ""), metric)
        elif metric in EXPORTER_TO_DCGM:
            metric, factor = EXPORTER_TO_DCGM[metric]
            value *= factor
        yield Sample(metric=metric, labels=labels, t=s.t, value=value)


def parse_amd_exporter_text(
    text: str, *, path: str | os.PathLike[str] = "<input>", t: float | None = None, host: str | None = None
) -> Iterator[Sample]:
    """Samples of one scrape's text; lines without a timestamp get ``t`` (else the time of the parse)."""
    yield from translate(parse_prometheus_text(text, path=path, t=t), host=host)


def read_amd_exporter_text(
    path: str | os.PathLike[str], *, t: float | None = None, host: str | None = None
) -> Iterator[Sample]:
    """A saved scrape (or scrapes appended one after the other); untimed lines get ``t``, else the file's
    write time. Read a chunk of lines at a time, as ``prometheus_text.read_prometheus_text``."""
    yield from translate(read_prometheus_text(path, t=t), host=host)


def is_amd_exporter_text(head: str) -> bool:
    """Sniff: Prometheus text with a ``gpu_*``/``pcie_*`` family and the exporter's ``gpu_id`` label."""
    return 'gpu_id="' in head and _FAMILY_RE.search(head) is not None and is_prometheus_text(head)
