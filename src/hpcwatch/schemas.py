"""Columnar batches that travel between layers, and the rule that keys a sample.

Readers with a fast path (Prometheus text), the twin, the PromQL backend and the
store all build or read sample tables with these columns, so they live here, beside
``records.py``, where every layer may import them.

Samples keep three columns pulled out of their labels, because every analysis
filters on them:

    host  <- Hostname | hostname | node, else instance without its port   (dcgm-, node-exporter)
             (not ``node`` on node-exporter's NUMA, zoneinfo, buddyinfo and DRBD series: there it
             names a NUMA node ``0``/``1`` or a DRBD peer ``local``/``remote``, not a host)
    gpu   <- gpu                             (dcgm-exporter GPU index)
    job   <- hpc_job | jobid | job_id        (dcgm-exporter mapping, Lustre job_stats)
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

__all__ = ["SAMPLE_SCHEMA", "sample_keys", "HOST_LABELS", "JOB_LABELS", "NODE_NOT_HOST_PREFIXES", "node_label_is_host"]

HOST_LABELS = ("Hostname", "hostname", "node")
JOB_LABELS = ("hpc_job", "jobid", "job_id")
#: node-exporter families whose own ``node`` label is a NUMA node (memory_numa, zoneinfo, buddyinfo) or a DRBD
#: peer (drbd: ``local``/``remote``), as in node_exporter's collector/fixtures/e2e-output.txt.
NODE_NOT_HOST_PREFIXES = ("node_memory_numa_", "node_zoneinfo_", "node_buddyinfo_", "node_drbd_")

#: Columns of the samples table and of ``Store.samples()``.
SAMPLE_SCHEMA = pa.schema(
    [
        ("metric", pa.string()),
        ("t", pa.float64()),  # UTC seconds
        ("value", pa.float64()),
        ("host", pa.string()),  # see module docstring
        ("gpu", pa.string()),
        ("job", pa.string()),
        ("labels", pa.string()),  # all labels, JSON object
    ]
)


def node_label_is_host(metric: str | None) -> bool:
    """Whether a series' ``node`` label names its host (False for node-exporter's NUMA/zone/DRBD families)."""
    return metric is None or not metric.startswith(NODE_NOT_HOST_PREFIXES)


def sample_keys(labels: Mapping[str, str], metric: str | None = None) -> tuple[str | None, str | None, str | None]:
    """(host, gpu, job) of a sample's labels; see the module docstring. ``metric`` (the series' name) is
    needed only to tell a NUMA or DRBD ``node`` label from a host: without it ``node`` is a host."""
    names = HOST_LABELS if node_label_is_host(metric) else HOST_LABELS[:2]
    host = next((labels[k] for k in names if labels.get(k)), None)
    if host is None and labels.get("instance"):
        host = labels["instance"].rsplit(":", 1)[0]  # Prometheus' target label: "node3:9100"
    job = next((labels[k] for k in JOB_LABELS if labels.get(k)), None)
    return host, labels.get("gpu") or None, job
