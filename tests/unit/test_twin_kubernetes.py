"""The twin's ``kubernetes`` scenario round trip: ``twin run --scenario kubernetes`` -> ``ingest`` -> ``jobs --json``
lists the pods as workloads with their GPU counts and keeps the MIG instances apart.

The twin is not evidence: the label layout it writes is checked here against the real dcgm-exporter
--kubernetes MIG scrape (tests/data/prometheus/dcgm_exporter_h100_mig_kubernetes_issue512.prom)."""

from __future__ import annotations

import json
import re

import pytest

from hpcwatch.sources.kubernetes import read_kubectl_pods
from tests.conftest import DATA

REAL_MIG = DATA / "prometheus/dcgm_exporter_h100_mig_kubernetes_issue512.prom"


@pytest.fixture(scope="module")
def k8s_run(tmp_path_factory):
    """One folder for the module: the first test writes and ingests the run, the next reuses it."""
    return tmp_path_factory.mktemp("k8s")


def _run(run_cli, root):
    out, db = root / "out", str(root / "store")
    if not (root / "store").exists():
        assert run_cli(["twin", "run", "--out", str(out), "--duration", "60", "--scenario", "kubernetes"])[0] == 0
        assert run_cli(["ingest", str(out), "--db", db])[0] == 0
    return out, db


def _label_names(line: str) -> list[str]:
    return re.findall(r'(\w+)="', line.split("{", 1)[1].rsplit("}", 1)[0])


def test_files_are_a_kubernetes_cluster(run_cli, k8s_run) -> None:
    out, _ = _run(run_cli, k8s_run)
    assert not (out / "slurm").exists() and (out / "kubernetes/pods.json").is_file()
    text = (out / "dcgm/node2.prom").read_text()
    assert "hpc_job=" not in text
    ours = next(line for line in text.splitlines() if 'GPU_I_ID="7"' in line and "GR_ENGINE_ACTIVE" in line)
    real = next(line for line in REAL_MIG.read_text().splitlines() if 'GPU_I_ID="7"' in line)
    assert _label_names(ours) == _label_names(real)  # same labels, same order as the real scrape
    # a MIG GPU reports no GPU_UTIL (dcgm-exporter issue 430); a whole GPU held by a pod keeps it, with its pod
    assert not re.search(r'DCGM_FI_DEV_GPU_UTIL\{gpu="7"[^}]*Hostname="node2"', text)
    assert re.search(r'DCGM_FI_DEV_GPU_UTIL\{gpu="0"[^}]*namespace="proj-llm",pod="gpt-pretrain-4101-worker-1"\}', text)
    pods = {j.id: j for j in read_kubectl_pods(out / "kubernetes/pods.json")}
    assert pods["proj-llm/gpt-pretrain-4101-worker-0"].gpus == 6 and pods["serving/tts-node2-gpu7"].gpus == 1
    assert pods["proj-vision/vit-finetune-4105-worker-0"].state == "Pending"  # the twin's pending job


def test_jobs_lists_pods_with_gpu_counts_and_mig_apart(run_cli, k8s_run) -> None:
    _, db = _run(run_cli, k8s_run)
    code, out, err = run_cli(["jobs", "--db", db, "--json"])
    assert code == 0, err
    jobs = {j["id"]: j for j in json.loads(out)["jobs"]}
    # the twin's reference run: job 4101 on GPUs 0-5 of node1 and node2, 4102 node1/6, 4103 node1/7,
    # 4104 node2/6; node2/7 is free, so it is cut into three 1g.10gb instances, two of them with a pod
    assert {k: (v["gpus"], v["gpus_observed"]) for k, v in jobs.items()} == {
        "proj-llm/gpt-pretrain-4101-worker-0": (6, 6),
        "proj-llm/gpt-pretrain-4101-worker-1": (6, 6),
        "proj-vision/jupyter-4102-worker-0": (1, 1),
        "proj-rl/ppo-rollouts-4103-worker-0": (1, 1),
        "proj-vision/vit-finetune-4104-worker-0": (1, 1),
        "serving/embed-node2-gpu7": (1, 1),
        "serving/tts-node2-gpu7": (1, 1),
    }
    assert all(v["attributed_by"] == ["kubernetes"] and v["allocation"] == "kubernetes" for v in jobs.values())
    assert jobs["proj-llm/gpt-pretrain-4101-worker-0"]["name"] == "Job/gpt-pretrain-4101"
    for pod, instance, util in (("serving/embed-node2-gpu7", "7", 62.0), ("serving/tts-node2-gpu7", "9", 31.0)):
        doc = json.loads(run_cli(["job", pod, "--db", db, "--json"])[1])
        (gpu,) = doc["per_gpu"]
        assert (gpu["host"], gpu["device"], gpu["instance"], gpu["profile"]) == (
            "node2",
            f"7.{instance}",
            instance,
            "1g.10gb",
        )
        assert doc["mean_gpu_util"] == pytest.approx(util)  # engine activity x 100
