"""``kubectl get pods -o json`` as workloads: GPUs (whole and MIG), node, owner, times; bad documents."""

from __future__ import annotations

import pytest

from hpcwatch.errors import ParseError
from hpcwatch.sources.kubernetes import parse_kubectl_pods, read_kubectl_pods
from hpcwatch.sources.registry import detect
from tests.conftest import DATA

KUARD = DATA / "kubernetes/kubectl_get_pods_minikube_kuard.json"
GPU_PODS = DATA / "kubernetes/kubectl_get_pods_gpu_mig_made_by_us.json"


def test_real_minikube_pod_list_gives_a_workload_without_gpus() -> None:
    (pod,) = list(read_kubectl_pods(KUARD))
    assert pod.id == "default/queue-l4dv8" and pod.account == "default" and pod.name == "ReplicaSet/queue"
    assert pod.nodes == ("minikube",) and pod.gpus == 0 and pod.state == "Running" and pod.end is None
    assert pod.start == 1671788205.0  # 2022-12-23T09:36:45Z


def test_gpu_and_mig_requests_counted_and_finished_pod_ended() -> None:
    pods = {p.id: p for p in read_kubectl_pods(GPU_PODS)}
    embed = pods["model-playground-stg/text-embedding-predictor-00008-deployment-57946f6c67-vdtjl"]
    assert embed.gpus == 1 and embed.nodes == ("gsrh100-074",) and embed.end is None
    train = pods["research/train-0"]
    assert train.gpus == 8 and train.name == "Job/train" and train.state == "Succeeded"
    assert train.end - train.start == 7200.0


def test_the_registry_recognises_both_files() -> None:
    assert detect(KUARD).name == detect(GPU_PODS).name == "kubectl-pods"


@pytest.mark.parametrize(
    "text",
    [
        '{"kind": "List", "apiVersion": "v1"',  # truncated JSON
        '{"kind": "Service", "apiVersion": "v1"}',  # not pods
        '{"kind": "List", "apiVersion": "v1", "items": {}}',  # items not a list
        '{"kind": "Pod", "apiVersion": "v1", "metadata": {}}',  # a pod without a name
        '{"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "p"}, "status": {"startTime": "yesterday"}}',  # bad time
        '{"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "p"}, '
        '"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "500m"}}}]}}',  # fractional GPUs
    ],
)
def test_bad_documents_are_one_line_parse_errors(text) -> None:
    with pytest.raises(ParseError) as err:
        list(parse_kubectl_pods(text, path="pods.json"))
    assert "pods.json" in str(err.value) and "\n" not in str(err.value)
