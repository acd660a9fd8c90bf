"""The cluster model: the reference cluster, any size, and one-line errors naming the key."""

import pytest

from hpcwatch.errors import ConfigError
from hpcwatch.model import gpu_spec, load_cluster, parse_cluster, reference_cluster


def test_reference_cluster_is_two_nodes_of_eight_h100_sxm():
    cluster = reference_cluster()
    assert [n.name for n in cluster.nodes] == ["node1", "node2"]
    assert len(cluster.gpus) == 16
    assert {g.spec.key for g in cluster.gpus} == {"h100-sxm"}
    assert cluster.fabric.link.rate_bits_s == 400e9
    assert cluster.storage.kind == "lustre"
    assert cluster.scheduler.kind == "slurm"
    assert cluster.stack.communication == "nccl"
    assert cluster.weights.path.startswith("/")
    assert cluster.node("node2").gpus[2].id == "node2/2"


def test_the_same_model_describes_128_nodes_without_code_changes():
    cluster = parse_cluster("nodes:\n  - prefix: gpu\n    count: 128\n    gpu: h100-sxm\n")
    assert len(cluster.nodes) == 128
    assert len(cluster.gpus) == 1024
    assert cluster.nodes[-1].name == "gpu128"


def test_mixed_node_groups_keep_their_gpu_types():
    text = "nodes:\n  - {prefix: h, count: 2, gpu: h200}\n  - {prefix: b, count: 1, gpu: b200, gpus_per_node: 8}\n"
    cluster = parse_cluster(text)
    assert [n.gpus[0].spec.key for n in cluster.nodes] == ["h200", "h200", "b200"]


@pytest.mark.parametrize(
    "text, expected",
    [
        # an unknown GPU names the key, the line and the known ones
        ("nodes:\n  - count: 2\n    gpu: h1000\n", "x.yaml:3: nodes[0].gpu: unknown GPU 'h1000'"),
        # a misspelt key is refused rather than ignored
        ("nodes:\n  - count: 2\n    gpu: h100\n    gpus_per_nod: 4\n", "x.yaml:4: nodes[0].gpus_per_nod: unknown key"),
        # a count must be a non-negative integer
        ("nodes:\n  - count: two\n    gpu: h100\n", "x.yaml:2: nodes[0].count: expected a non-negative integer"),
        # the fabric rate must be known
        ("nodes:\n  - {count: 1, gpu: h100}\nfabric: {rate: edr2}\n", "x.yaml:3: fabric.rate: unknown rate 'edr2'"),
        # nodes are required
        ("name: x\n", "x.yaml: nodes: missing"),
        # not YAML at all
        ("nodes: [\n", "x.yaml:2: not YAML"),
        # a list at the top
        ("- a\n- b\n", "x.yaml:1: a cluster model is a mapping"),
    ],
)
def test_bad_model_gets_one_line_naming_file_line_and_key(text, expected):
    with pytest.raises(ConfigError) as err:
        parse_cluster(text, path="x.yaml")
    message = str(err.value)
    assert message.startswith(expected)
    assert "\n" not in message


def test_missing_model_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_cluster(tmp_path / "absent.yaml")


def test_catalog_gives_none_for_unknown_devices_never_another_ones_number():
    assert gpu_spec("NVIDIA H100 80GB HBM3").key == "h100-sxm"
    assert gpu_spec("h100").peak_bf16_dense_flops == pytest.approx(989.4e12)
    assert gpu_spec("tesla-k80") is None
    for key in ("h100-sxm", "h200", "a100-sxm", "b200", "mi300x"):
        spec = gpu_spec(key)
        assert spec.idle_power_w < spec.tdp_w
        assert spec.source.startswith("https://")
