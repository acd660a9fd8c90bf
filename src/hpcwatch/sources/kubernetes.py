"""``kubectl get pods -o json``: each pod as a workload (``records.Job``) with its GPUs, node and owner.

The id is ``namespace/pod``, the workload dcgm-exporter ``--kubernetes`` names in its ``namespace`` and
``pod`` labels, so the attribution analysis joins the two. A pod maps onto ``Job`` as:

    id         metadata.namespace "/" metadata.name
    account    metadata.namespace            (who pays, as a Slurm account does)
    name       the controlling owner, "Kind/name" (ownerReferences with controller: true), else None
    nodes      (spec.nodeName,) once scheduled
    gpus       sum over containers of the GPU resources (limits, else requests): ``nvidia.com/gpu`` and
               the MIG resources ``nvidia.com/mig-<profile>`` of the device plugin's mixed strategy
    start      status.startTime; end: the last container's terminated.finishedAt once the phase is
               Succeeded or Failed
    state      status.phase

Kubernetes says how many GPUs a pod holds, never which: ``gpus_by_node`` stays empty (dcgm-exporter's
pod labels say which). Accepts a ``List`` (``kubectl get pods``) or one ``Pod`` (``kubectl get pod X``).
Not checked: that init containers' GPUs overlap the others' (Kubernetes counts the larger; we count
containers only). GPU resources: https://github.com/NVIDIA/k8s-device-plugin#shared-access-to-gpus and
its MIG strategies (docs/mig-strategies); pod fields: https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

import orjson

from hpcwatch.errors import ParseError
from hpcwatch.records import Job
from hpcwatch.sources.lines import read_text

__all__ = ["parse_kubectl_pods", "read_kubectl_pods", "is_kubectl_pods", "pod_gpus", "GPU_RESOURCE"]

GPU_RESOURCE = "nvidia.com/gpu"
_MIG_RESOURCE_RE = re.compile(r"nvidia\.com/mig-\d+g\.\d+gb\Z")


def is_kubectl_pods(text: str) -> bool:
    """A JSON object of ``kind`` List or Pod with Kubernetes' ``apiVersion``."""
    head = text.lstrip()
    return (
        head.startswith("{") and '"apiVersion"' in head and bool(re.search(r'"kind"\s*:\s*"(List|PodList|Pod)"', head))
    )


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """GPUs a pod's containers hold (limits, else requests; whole GPUs and MIG instances)."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        wanted = resources.get("limits") or resources.get("requests") or {}
        total += sum(_count(v) for k, v in wanted.items() if k == GPU_RESOURCE or _MIG_RESOURCE_RE.match(k))
    return total


def _count(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        raise _Shape(f"GPU quantity is not a whole number: {value!r}") from None


class _Shape(ValueError):
    """The document is JSON but not the pods shape (turned into a ParseError with the path)."""


def _time(text: Any) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise _Shape(f"not an RFC 3339 time: {text!r}") from None


def _owner(meta: Mapping[str, Any]) -> str | None:
    owners = meta.get("ownerReferences") or []
    chosen = next((o for o in owners if o.get("controller")), owners[0] if owners else None)
    return f"{chosen.get('kind')}/{chosen.get('name')}" if chosen else None


def _end(status: Mapping[str, Any]) -> float | None:
    if status.get("phase") not in ("Succeeded", "Failed"):
        return None
    ends = [
        _time(((s.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for s in status.get("containerStatuses") or []
    ]
    return max((e for e in ends if e is not None), default=None)


def _pod_job(pod: Mapping[str, Any]) -> Job:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    name, namespace = meta.get("name"), meta.get("namespace") or "default"
    if not name:
        raise _Shape("a pod without metadata.name")
    node = spec.get("nodeName")
    return Job(
        id=f"{namespace}/{name}",
        account=namespace,
        name=_owner(meta),
        nodes=(node,) if node else (),
        gpus=pod_gpus(pod),
        start=_time(status.get("startTime")),
        end=_end(status),
        state=status.get("phase"),
    )


def parse_kubectl_pods(text: str, *, path: str | os.PathLike[str] = "<input>") -> Iterator[Job]:
    """One ``Job`` per pod of a ``kubectl get pods -o json`` document (module docstring)."""
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as err:
        raise ParseError(f"not JSON: {err}", path=path) from err
    try:
        if not isinstance(doc, dict) or doc.get("kind") not in ("List", "PodList", "Pod"):
            raise _Shape("not a kubectl List or Pod (kind)")
        pods = [doc] if doc.get("kind") == "Pod" else doc.get("items")
        if not isinstance(pods, list):
            raise _Shape("items is not a list")
        jobs = [_pod_job(p) for p in pods if isinstance(p, dict) and p.get("kind", "Pod") == "Pod"]
    except (_Shape, AttributeError, TypeError) as err:
        raise ParseError(f"not a kubectl pods document: {err}", path=path) from err
    yield from jobs


def read_kubectl_pods(path: str | os.PathLike[str]) -> Iterator[Job]:
    return parse_kubectl_pods(read_text(path), path=path)
