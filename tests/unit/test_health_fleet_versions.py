"""Fleet consistency beyond the GPU driver: kernel, CUDA, NCCL, OFED, GPU VBIOS and HCA firmware that differ
between the nodes of one partition (analysis.health.FLEET_SOURCES).

Real inputs (tests/data/SOURCES.md): the six node_uname_info lines of a real 6-node cluster (atlhyper: three
desktops, one on 6.8.0-88 where two run 6.8.0-85; three Raspberry Pis, one on 6.8.0-1040 where two run -1043);
nvidia-smi -q -x of a V100 node (driver 460.73.01, CUDA 11.2) and of an H200 (580.159.04, CUDA 13.0); NCCL
logs of NCCL issues 983 (2.13.4, CUDA driver 11.7) and nccl-tests 185 (2.19.3, CUDA driver 12.0); ibstat of an
H100 node (8 ConnectX-7 on 28.41.1000); ofed_info -s of a ConnectX-5 host. Where a majority needs a third node,
a real capture is given another host name, or one version, in memory (said in each test)."""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest

from hpcwatch import vocab
from hpcwatch.analysis.health import FLEET_METRICS, PASSIVE_METRICS, health_report, version_checks
from hpcwatch.errors import ParseError
from hpcwatch.records import Sample
from hpcwatch.reports.health import node_health
from hpcwatch.sources.infiniband import parse_ibstat
from hpcwatch.sources.nccl_log import parse_nccl_log
from hpcwatch.sources.nvidia_smi import read_nvidia_smi_xml
from hpcwatch.sources.ofed_info import parse_ofed_info, read_ofed_info
from hpcwatch.sources.prometheus_text import parse_prometheus_columns
from hpcwatch.sources.registry import detect
from hpcwatch.sources.slurmrest import parse_rest_nodes
from hpcwatch.store import Store
from tests.conftest import DATA

UNAME = DATA / "prometheus" / "node_uname_info_6_nodes_otel_atlhyper.prom"
V100 = DATA / "nvidia_smi" / "nvidia_smi_q_v100_busy_gen3_x16_datakit.xml"
H200 = DATA / "nvidia_smi" / "nvidia_smi_q.xml"
OFED = DATA / "ofed_info" / "ofed_info_s_23.07_connectx5_daocloud.txt"
IBSTAT = DATA / "infiniband" / "ibstat_h100_8ndr_ib_plus_ethernet_bond_gpud.txt"
NCCL = DATA / "nccl"
DESKS = {"192.168.0.130": "desk", "192.168.0.7": "desk", "192.168.0.46": "desk"}
PIS = {"192.168.0.182": "raspi", "192.168.0.153": "raspi", "192.168.0.33": "raspi"}


def _table(samples) -> pa.Table:
    with Store(":memory:") as store:
        store.add(samples)
        return store.samples()


def _uname() -> pa.Table:
    """The OpenTelemetry Collector prefixed node-exporter's names with ``otel_``: taken off, as it scraped them."""
    text = UNAME.read_text().replace("otel_node_uname_info", "node_uname_info")
    return parse_prometheus_columns(text, path=str(UNAME), t=100.0)


def _fired(checks, rule: str) -> dict[str, str]:
    return {c.node: c.title for c in checks if c.rule == rule}


def test_the_node_on_another_kernel_than_its_partition_warns_naming_the_majority():
    checks = version_checks(_uname(), {**DESKS, **PIS})
    assert sorted(_fired(checks, "kernel_mismatch")) == ["192.168.0.33", "192.168.0.46"]
    (desk,) = [c for c in checks if c.node == "192.168.0.46"]
    assert desk.verdict == "warn" and desk.evidence["majority"] == "kernel 6.8.0-85-generic"
    assert desk.evidence["odd_nodes"] == ["192.168.0.46"] and desk.evidence["partition"] == "desk"
    assert desk.title == (
        "kernel 6.8.0-88-generic differs from partition desk's kernel 6.8.0-85-generic (2 of 3 nodes); "
        "odd: 192.168.0.46"
    )


def test_without_partitions_the_real_fleet_has_no_majority_and_every_node_is_named():
    """Two kernels on two nodes each, two on one: no version is most nodes', so each node warns."""
    checks = version_checks(_uname())
    fired = _fired(checks, "kernel_mismatch")
    assert len(fired) == 6 and all("the whole fleet's nodes (" in title for title in fired.values())
    assert {len(c.evidence["odd_nodes"]) for c in checks} == {6}


def test_one_node_a_partition_has_nothing_to_compare_with():
    one = {**{ip: f"alone-{ip}" for ip in DESKS}, **PIS}
    assert sorted(_fired(version_checks(_uname(), one), "kernel_mismatch")) == ["192.168.0.33"]


def test_nvidia_smi_gives_driver_cuda_and_vbios_the_odd_node_warns_on_each():
    """The real V100 capture on two hosts, the real H200 on a third: another driver, CUDA and VBIOS."""
    samples = [
        *read_nvidia_smi_xml(V100, hostname="v100-a"),
        *read_nvidia_smi_xml(V100, hostname="v100-b"),
        *read_nvidia_smi_xml(H200, hostname="h200"),
    ]
    checks = version_checks(_table(samples))
    assert {(c.node, c.rule) for c in checks} == {
        ("h200", "driver_mismatch"),
        ("h200", "cuda_mismatch"),
        ("h200", "firmware_mismatch"),
    }
    titles = _fired(checks, "cuda_mismatch") | {"vbios": _fired(checks, "firmware_mismatch")["h200"]}
    assert titles["h200"].startswith("CUDA (driver) 13.0 differs from the whole fleet's CUDA (driver) 11.2")
    assert titles["vbios"].startswith("NVIDIA GPU VBIOS 96.00.A5.00.1A differs")


def _nccl(name: str, rename: tuple[str, str] | None = None):
    text = (NCCL / name).read_text()
    if rename:
        text = text.replace(*rename)
    return [e for e in parse_nccl_log(text.splitlines(), path=name, t=1.0) if e.kind == "nccl_rank"]


def test_nccl_logs_give_each_hosts_nccl_and_cuda_driver():
    """nccl-tests 185's two DGX H100 (2.19.3, CUDA driver 12.0) with its log given again as dgxh100-5, and NCCL
    983's two hosts (2.13.4, CUDA driver 11.7): the 2.13.4 host and both 11.7 hosts are the odd ones."""
    events = [
        *_nccl("nccl_tests_185_roce_2node_v2.19.3.log"),
        *_nccl("nccl_tests_185_roce_2node_v2.19.3.log", ("dgxh100-4", "dgxh100-5")),
        *_nccl("nccl_983_ib_4hca_v2.13.4.log"),
    ]
    partitions = dict.fromkeys(("dgxh100-3", "dgxh100-4", "dgxh100-5", "4c217144f0b1", "e0a95b6643f4"), "gpu")
    checks = version_checks(_table([]), partitions, events)
    assert sorted(_fired(checks, "nccl_fleet_mismatch")) == ["4c217144f0b1"]
    assert sorted(_fired(checks, "cuda_mismatch")) == ["4c217144f0b1", "e0a95b6643f4"]
    # Without partitions NCCL is not compared (a store may hold unrelated clusters' logs); the driver's CUDA is.
    unknown = version_checks(_table([]), events=events)
    assert _fired(unknown, "nccl_fleet_mismatch") == {} and len(_fired(unknown, "cuda_mismatch")) == 2
    (nccl,) = [c for c in checks if c.rule == "nccl_fleet_mismatch"]
    assert nccl.evidence["majority"] == "NCCL 2.19.3" and nccl.evidence["version"] == "NCCL 2.13.4"


def test_the_node_on_another_ofed_warns():
    """The real ofed_info -s line on two hosts; a third host's line edited to an older release."""
    old = OFED.read_text().replace("23.07-0.5.1.2", "5.8-3.0.7.0")
    samples = [
        *read_ofed_info(OFED, node="ib1", t=1.0),
        *read_ofed_info(OFED, node="ib2", t=1.0),
        *parse_ofed_info(old, node="ib3", t=1.0),
    ]
    checks = version_checks(_table(samples))
    assert _fired(checks, "ofed_mismatch") == {
        "ib3": "OFED MLNX_OFED_LINUX-5.8-3.0.7.0 differs from the whole fleet's OFED MLNX_OFED_LINUX-23.07-0.5.1.2 "
        "(2 of 3 nodes); odd: ib3"
    }


def test_ibstat_gives_each_hcas_firmware_and_the_odd_node_warns():
    """The real H100 ibstat (eight MT4129 on 28.41.1000) on two hosts; a third with one HCA's firmware older."""
    text = IBSTAT.read_text()
    older = text.replace("Firmware version: 28.41.1000", "Firmware version: 28.39.2048", 1)
    info = [s for s in parse_ibstat(text, node="h1", t=1.0) if s.metric == vocab.NODE_INFINIBAND_INFO]
    assert {(s.labels["hca_type"], s.labels["firmware_version"]) for s in info} >= {("MT4129", "28.41.1000")}
    samples = [*parse_ibstat(text, node="h1", t=1.0), *parse_ibstat(text, node="h2", t=1.0)]
    samples += parse_ibstat(older, node="h3", t=1.0)
    checks = version_checks(_table(samples))
    (odd,) = [c for c in checks if c.rule == "hca_firmware_mismatch"]
    assert odd.node == "h3" and "HCA firmware MT4129 28.39.2048" in odd.evidence["version"]


def test_the_health_report_judges_the_kernel_and_slurms_node_list_gives_the_partitions():
    """Through the store: the real uname lines as one scrape, and a slurmrestd node list naming each node's
    partitions (sinfo --json's shape, the real 22.05 answer's keys) -- the report groups by them."""
    nodes = {
        "errors": [],
        "nodes": [{"name": ip, "state": "idle", "partitions": [part]} for ip, part in {**DESKS, **PIS}.items()],
    }
    with Store(":memory:") as store:
        store.add_sample_table(_uname())
        store.add(list(parse_rest_nodes(orjson.dumps(nodes).decode(), t=100.0)))
        report = node_health(store, node="192.168.0.46")
    (one,) = report.nodes
    assert one.verdict == "warn" and "kernel_mismatch: kernel 6.8.0-88-generic differs from partition desk" in (
        one.reason()
    )


def test_a_node_takes_the_partitions_its_newest_node_list_names():
    """Slurm's node list, scraped again and again: each node's partitions are those of its newest listing
    that names some (a listing without partitions changes nothing), read once per label set, not per scrape."""
    from hpcwatch.reports.health import _node_partitions

    def listing(t: float, parts: dict[str, list[str]]) -> list[Sample]:
        doc = {"errors": [], "nodes": [{"name": n, "state": "idle", "partitions": p} for n, p in parts.items()]}
        return list(parse_rest_nodes(orjson.dumps(doc).decode(), t=t))

    with Store(":memory:") as store:
        for t in range(10, 100, 10):  # the same listing nine times
            store.add(listing(float(t), {"n1": ["gpu"], "n2": ["gpu"]}))
        store.add(listing(100.0, {"n1": ["debug"], "n2": []}))  # n1 moved; n2 lists none: still gpu
        assert _node_partitions(store) == {"n1": "debug", "n2": "gpu"}
        store.add(listing(110.0, {"n1": ["gpu"]}))  # back to a label set seen before, now the newest
        assert _node_partitions(store)["n1"] == "gpu"


def test_health_report_reads_the_fleet_versions_from_the_samples_it_is_given():
    report = health_report(_uname(), partitions={**DESKS, **PIS})
    assert {n.node for n in report.nodes if n.verdict == "warn"} == {"192.168.0.33", "192.168.0.46"}


def test_every_fleet_metric_is_fetched_for_health():
    assert set(FLEET_METRICS) <= set(PASSIVE_METRICS)


def test_ofed_info_is_recognised_and_a_bad_line_is_one_line_naming_file_and_line(tmp_path):
    assert detect(OFED).name == "ofed-info"
    with pytest.raises(ParseError) as err:
        list(parse_ofed_info("MLNX_OFED_LINUX-23.07-0.5.1.2:\ncompiled against 5.15\n", path="ofed.txt"))
    assert str(err.value).startswith("ofed.txt:2: ") and "\n" not in str(err.value)
    assert [s.labels for s in parse_ofed_info("$ ofed_info -s\nMLNX_OFED_LINUX-24.10-1.1.4.0\n", node="n")] == [
        {"node": "n", "version": "MLNX_OFED_LINUX-24.10-1.1.4.0"}
    ]


def test_a_sample_without_a_host_is_not_compared():
    lonely = Sample(metric=vocab.OFED_INFO, labels={"version": "MLNX_OFED_LINUX-23.07-0.5.1.2"}, t=1.0, value=1.0)
    assert version_checks(_table([lonely])) == []
