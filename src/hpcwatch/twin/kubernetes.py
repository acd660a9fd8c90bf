"""The ``kubernetes`` scenario: the twin's cluster run by Kubernetes instead of Slurm.

The same simulation, written as a Kubernetes GPU cluster's collectors leave it:

- dcgm-exporter runs with ``--kubernetes``: a GPU held by a workload carries ``container``, ``namespace``
  and ``pod`` labels (after ``DCGM_FI_DRIVER_VERSION``, in that order, as the real scrape
  tests/data/prometheus/dcgm_exporter_h100_mig_kubernetes_issue512.prom writes them) and no ``hpc_job``;
  a free GPU carries none.
- Every GPU no job holds during the run is cut into MIG instances ``MIG_INSTANCES`` (``1g.10gb``, GPU
  instance ids 7, 8, 9 as on that real H100): per-instance lines carry ``GPU_I_PROFILE`` and ``GPU_I_ID``
  after ``modelName``; instances report ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (ratio) and no
  ``DCGM_FI_DEV_GPU_UTIL`` (https://github.com/NVIDIA/dcgm-exporter/issues/430); power, energy,
  temperature, clocks and XIDs stay whole-GPU lines. Instances 7 and 9 hold an inference pod each
  (namespace ``serving``), 8 is free.
- ``kubernetes/pods.json``: ``kubectl get pods -o json`` (a ``List``): per twin job and node one worker pod
  (namespace = the job's account, owner a batch/v1 ``Job``; ``nvidia.com/gpu`` = the GPUs it holds there;
  pending jobs are Pending pods without a node), and the MIG pods (``nvidia.com/mig-1g.10gb: 1``, owner a
  ReplicaSet), the shape sources/kubernetes.py reads.
- No ``slurm/`` folder: there is no Slurm. The mapping dir's ``gpu.instance`` names (``2.0``) are what
  ``analysis.attribution`` calls a MIG instance; the pods say who holds them.

The rewrite happens in ``extra_files``, after the twin has written its scrapes, so the simulation and every
other scenario are unchanged.
"""

from __future__ import annotations

import re
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from hpcwatch import vocab
from hpcwatch.records import Job
from hpcwatch.twin.scenarios import Scenario, register

__all__ = ["Kubernetes", "MIG_INSTANCES", "MIG_PROFILE", "SERVING_NAMESPACE", "worker_pod", "mig_pod"]

MIG_PROFILE = "1g.10gb"
#: GPU instance id -> (pod stem or None for a free instance, engine activity ratio, tensor activity, FB used MiB).
MIG_INSTANCES: dict[str, tuple[str | None, float, float, int]] = {
    "7": ("embed", 0.62, 0.40, 7800),
    "8": (None, 0.0, 0.0, 0),
    "9": ("tts", 0.31, 0.20, 5200),
}
#: A 1g.10gb instance's framebuffer as nvidia-smi shows it on an H100 80GB (MiB; ours, rounded).
MIG_FB_MIB = 9856
SERVING_NAMESPACE = "serving"
_PER_INSTANCE = {vocab.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, vocab.DCGM_FI_DEV_FB_USED, vocab.DCGM_FI_DEV_FB_FREE}
_LINE_RE = re.compile(r"(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\{(?P<labels>.*)\} (?P<value>\S+)(?P<ts> \d+)?\Z")
_HPC_JOB_RE = re.compile(r',hpc_job="([^"]*)"')
_LABEL_RE = re.compile(r'(\w+)="([^"]*)"')


def worker_pod(job: Job, k: int) -> str:
    """The pod of ``job`` on its ``k``-th node: ``<name>-<id>-worker-<k>`` (a PyTorch-style worker)."""
    return f"{_dns(job.name or 'job')}-{_dns(job.id)}-worker-{k}"


def mig_pod(stem: str, node: str, gpu: str) -> str:
    return f"{stem}-{_dns(node)}-gpu{gpu}"


def _dns(text: str) -> str:
    """A DNS-1123 label part (pod names): lower case, [a-z0-9-]."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "x"


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@register
class Kubernetes(Scenario):
    name = "kubernetes"
    description = (
        "Kubernetes instead of Slurm: dcgm-exporter --kubernetes pod labels, MIG 1g.10gb instances on "
        "the free GPUs, kubernetes/pods.json (kubectl get pods -o json); no slurm/ files."
    )

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        jobs = twin.jobs
        pods = {(job.id, node): (job, worker_pod(job, k)) for job in jobs for k, node in enumerate(job.nodes)}
        held = {(node, str(g)) for job in jobs for node, gpus in job.gpus_by_node.items() for g in gpus}
        mig = _free_gpus(twin, held)
        for path in sorted((out / "dcgm").glob("*.prom")):
            path.write_text(_rewrite(path.read_text(), pods, mig))
        folder = out / "kubernetes"
        folder.mkdir(parents=True, exist_ok=True)
        items = [*_worker_pods(jobs), *_mig_pods(sorted(mig), t0)]
        (folder / "pods.json").write_bytes(
            orjson.dumps(
                {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}},
                option=orjson.OPT_INDENT_2,
            )
        )
        shutil.rmtree(out / "slurm", ignore_errors=True)


def _free_gpus(twin: Any, held: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """(node, gpu) of every GPU no job holds during the run."""
    return {
        (node.name, str(g.index))
        for node in twin.cluster.nodes
        for g in node.gpus
        if (node.name, str(g.index)) not in held
    }


def _worker_pods(jobs: list[Job]) -> list[dict]:
    out = []
    for job in jobs:
        for k, node in enumerate(job.nodes or (None,)):
            gpus = len(job.gpus_by_node.get(node, ())) if node else job.gpus
            out.append(
                _pod(
                    name=worker_pod(job, k),
                    namespace=_dns(job.account or "default"),
                    owner=("batch/v1", "Job", f"{_dns(job.name or 'job')}-{_dns(job.id)}"),
                    container=_dns(job.name or "job"),
                    resources={"nvidia.com/gpu": str(gpus)},
                    node=node,
                    start=job.start,
                    end=job.end,
                    state=job.state,
                )
            )
    return out


def _mig_pods(mig: list[tuple[str, str]], t0: float) -> list[dict]:
    return [
        _pod(
            name=mig_pod(stem, node, gpu),
            namespace=SERVING_NAMESPACE,
            owner=("apps/v1", "ReplicaSet", f"{stem}-{_dns(node)}-gpu{gpu}-5f7d9c"),
            container=stem,
            resources={f"nvidia.com/mig-{MIG_PROFILE}": "1"},
            node=node,
            start=t0,
            end=None,
            state="RUNNING",
        )
        for node, gpu in mig
        for stem, *_ in MIG_INSTANCES.values()
        if stem
    ]


def _pod(
    *,
    name: str,
    namespace: str,
    owner: tuple[str, str, str],
    container: str,
    resources: dict[str, str],
    node: str | None,
    start: float | None,
    end: float | None,
    state: str | None,
) -> dict:
    api, kind, owner_name = owner
    phase = "Pending" if start is None else ("Succeeded" if end is not None else "Running")
    status: dict[str, Any] = {"phase": phase}
    if start is not None:
        status["startTime"] = _rfc3339(start)
        run = (
            {"terminated": {"exitCode": 0, "finishedAt": _rfc3339(end), "startedAt": _rfc3339(start)}}
            if end is not None
            else {"running": {"startedAt": _rfc3339(start)}}
        )
        status["containerStatuses"] = [{"name": container, "ready": end is None, "restartCount": 0, "state": run}]
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": container,
                "image": f"registry.example/{container}:1",
                "resources": {"limits": dict(resources), "requests": dict(resources)},
            }
        ]
    }
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "ownerReferences": [
                {
                    "apiVersion": api,
                    "kind": kind,
                    "name": owner_name,
                    "controller": True,
                    "blockOwnerDeletion": True,
                    "uid": f"uid-{owner_name}",
                }
            ],
        },
        "spec": spec,
        "status": status,
    }


# -- dcgm-exporter --kubernetes text -------------------------------------------------------------------


def _rewrite(text: str, pods: dict[tuple[str, str], tuple[Job, str]], mig: set[tuple[str, str]]) -> str:
    """hpc_job labels -> pod labels; lines of MIG GPUs -> one per instance (engine activity for utilisation).
    Engine-activity lines gather at the end of their block, under their own TYPE line."""
    out: list[str] = []
    engine: list[str] = []
    for line in text.split("\n"):
        if line.startswith("#") or not line:
            if engine:
                out += [f"# TYPE {vocab.DCGM_FI_PROF_GR_ENGINE_ACTIVE} gauge", *engine]
                engine = []
            out.append(line)
            continue
        m = _LINE_RE.match(line)
        if m is None:
            out.append(line)
            continue
        labels = dict(_LABEL_RE.findall(m["labels"]))
        node, gpu = labels.get("Hostname", ""), labels.get("gpu", "")
        if (node, gpu) in mig:
            out += _instance_lines(m, engine)
            continue
        job = _HPC_JOB_RE.search(m["labels"])
        body = _HPC_JOB_RE.sub("", m["labels"])
        if job and (found := pods.get((job.group(1).split(",")[0], node))):
            owner, pod = found
            body += (
                f',container="{_dns(owner.name or "job")}",namespace="{_dns(owner.account or "default")}",pod="{pod}"'
            )
        out.append(f"{m['name']}{{{body}}} {m['value']}{m['ts'] or ''}")
    if engine:
        out += [f"# TYPE {vocab.DCGM_FI_PROF_GR_ENGINE_ACTIVE} gauge", *engine]
    return "\n".join(out)


def _instance_lines(m: re.Match, engine: list[str]) -> list[str]:
    """A MIG GPU's line: whole-GPU fields stay; per-instance fields become one line per instance."""
    name, ts = m["name"], m["ts"] or ""
    body = _HPC_JOB_RE.sub("", m["labels"])
    if name not in _PER_INSTANCE and name != vocab.DCGM_FI_DEV_GPU_UTIL:
        return [f"{name}{{{body}}} {m['value']}{ts}"]
    node = dict(_LABEL_RE.findall(body)).get("Hostname", "")
    gpu = dict(_LABEL_RE.findall(body)).get("gpu", "")
    lines = []
    for gid, (stem, active, tensor, fb_used) in MIG_INSTANCES.items():
        lab = body.replace(',Hostname="', f',GPU_I_PROFILE="{MIG_PROFILE}",GPU_I_ID="{gid}",Hostname="', 1)
        if stem:
            lab += f',container="{stem}",namespace="{SERVING_NAMESPACE}",pod="{mig_pod(stem, node, gpu)}"'
        if name == vocab.DCGM_FI_DEV_GPU_UTIL:
            engine.append(f"{vocab.DCGM_FI_PROF_GR_ENGINE_ACTIVE}{{{lab}}} {active:.6f}{ts}")
            continue
        value = {
            vocab.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE: f"{tensor:.6f}",
            vocab.DCGM_FI_DEV_FB_USED: str(fb_used),
            vocab.DCGM_FI_DEV_FB_FREE: str(MIG_FB_MIB - fb_used),
        }[name]
        lines.append(f"{name}{{{lab}}} {value}{ts}")
    return lines
