"""Each detector on hand-made records: what fires, what must not, and what the evidence names."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcwatch.instrument.dataset import PoisonedShard, ShardVerifier
from hpcwatch.records import Event, Job, Sample
from hpcwatch.security.container_escape import AllowedShell, ContainerEscapeConfig, detect_container_escape
from hpcwatch.security.data_poisoning import detect_data_poisoning
from hpcwatch.security.gradients import GradientConfig, detect_gradient_anomalies
from hpcwatch.security.rdma import RdmaConfig, column_nanmedians, detect_rdma, ring_allreduce_bytes
from hpcwatch.security.remanence import detect_remanence
from hpcwatch.security.supply_chain import damerau_distance, detect_supply_chain, typosquat_of
from hpcwatch.security.weights_access import WeightsConfig, detect_weights_access, weights_report
from hpcwatch.sources.manifest import parse_manifest, sign_manifest

DATA = Path(__file__).parent.parent / "data" / "security"
T0 = 1_796_000_000.0
TRAIN = Job(
    id="7",
    user="alice",
    nodes=("node1", "node2"),
    gpus=16,
    start=T0 - 100,
    end=None,
    state="RUNNING",
    gpus_by_node={"node1": tuple(range(8)), "node2": tuple(range(8))},
)


def _pkg(name: str, version: str | None = "1.0", **attrs) -> Event:
    return Event(
        kind="pip_package",
        t=T0,
        source="img.json",
        attrs={"name": name, "version": version, "image": "img", "url": None, "editable": False, **attrs},
    )


# -- supply chain ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, imitates",
    [
        ("transfomers", "transformers"),  # one letter dropped
        ("tocrh", None),  # too short to compare (5 letters allowed: torch is 5) -> see below
        ("nmupy", "numpy"),  # adjacent swap
        ("scikitlearn", "scikit-learn"),  # separator removed
        ("pytorch-triton", None),  # the real one
        ("scapy", None),  # a real, unrelated project one edit from scipy
        ("dataset", None),  # idem, from datasets
    ],
)
def test_typosquat_names(name: str, imitates: str | None) -> None:
    expected = "torch" if name == "tocrh" else imitates
    assert typosquat_of(name) == expected


def test_damerau_counts_a_swap_as_one_edit() -> None:
    assert damerau_distance("torch", "tocrh") == 1 and damerau_distance("abc", "abc") == 0


def test_known_incident_fires_for_any_torchtriton_but_only_listed_ultralytics_versions() -> None:
    findings = detect_supply_chain(
        [_pkg("torchtriton", "2.0.0"), _pkg("ultralytics", "8.3.40"), _pkg("ultralytics", "8.3.41")]
    )
    assert sorted((f.rule, f.evidence["version"]) for f in findings) == [
        ("supply_chain.known_incident", "2.0.0"),
        ("supply_chain.known_incident", "8.3.41"),
    ]
    assert findings[0].evidence["url"].startswith("https://")


def test_vcs_install_fires_unless_allowed() -> None:
    from hpcwatch.security.supply_chain import SupplyChainConfig

    pkg = _pkg("ourlib", None, url="git+https://git.example/ourlib@1")
    assert [f.rule for f in detect_supply_chain([pkg])] == ["supply_chain.vcs_install"]
    assert detect_supply_chain([pkg], config=SupplyChainConfig(allow_vcs=frozenset({"ourlib"}))) == []


def test_setuptools_pth_is_known_but_an_impostor_with_its_name_is_not() -> None:
    shim = "import os; var = 'SETUPTOOLS_USE_DISTUTILS'; enabled = os.environ.get(var, 'local') == 'local'"
    ok = Event(
        kind="pth_file",
        t=T0,
        source="x",
        attrs={"path": "/sp/distutils-precedence.pth", "line": 1, "code": shim, "image": "img"},
    )
    bad = Event(
        kind="pth_file",
        t=T0,
        source="x",
        attrs={"path": "/sp/distutils-precedence.pth", "line": 1, "code": "import socket; ...", "image": "img"},
    )
    assert detect_supply_chain([ok]) == []
    assert [f.rule for f in detect_supply_chain([bad])] == ["supply_chain.pth_exec"]


# -- data poisoning --------------------------------------------------------------------------------------------


def _dataset(tmp_path: Path) -> Path:
    shards = {"a.bin": b"a" * 64, "b.bin": b"b" * 64}
    for name, data in shards.items():
        (tmp_path / name).write_bytes(data)
    rows = [
        {"path": n, "sha256": __import__("hashlib").sha256(d).hexdigest(), "bytes": len(d)} for n, d in shards.items()
    ]
    (tmp_path / "manifest.json").write_text(json.dumps(sign_manifest("ds", rows, b"key")))
    return tmp_path / "manifest.json"


def test_loader_hook_names_the_tampered_shard(tmp_path: Path) -> None:
    manifest = parse_manifest(_dataset(tmp_path).read_text(), path=tmp_path / "manifest.json")
    (tmp_path / "b.bin").write_bytes(b"B" + b"b" * 63)
    verifier = ShardVerifier(manifest, key=b"key", job="7", rank=3, host="node2", clock=lambda: T0)
    assert verifier.check(tmp_path / "a.bin") and not verifier.check(tmp_path / "b.bin")
    (finding,) = detect_data_poisoning(verifier.events)
    assert finding.rule == "data_poisoning.shard_mismatch" and finding.target.endswith("b.bin")
    assert finding.evidence["rank"] == 3 and finding.evidence["reason"] == "sha256"


def test_loader_hook_strict_mode_raises_and_wrong_key_is_reported(tmp_path: Path) -> None:
    manifest = parse_manifest(_dataset(tmp_path).read_text(), path=tmp_path / "manifest.json")
    verifier = ShardVerifier(manifest, key=b"wrong", strict=False, clock=lambda: T0)
    assert [f.rule for f in detect_data_poisoning(verifier.events)] == ["data_poisoning.bad_signature"]
    with pytest.raises(PoisonedShard):
        ShardVerifier(manifest, strict=True).check(tmp_path / "unlisted.bin")


def _write(t: float, path: str, mask: int = 2) -> Event:
    return Event(
        kind="tetragon",
        t=t,
        source="t",
        attrs={
            "type": "process_kprobe",
            "host": "node2",
            "binary": "/usr/bin/python3",
            "user": "bob",
            "function_name": "security_file_permission",
            "path": path,
            "mask": mask,
        },
    )


def test_dataset_write_fires_only_while_a_job_runs() -> None:
    events = [
        _write(T0 - 500, "/lustre/datasets/x/0.bin"),
        _write(T0, "/lustre/datasets/x/0.bin"),
        _write(T0, "/lustre/datasets/x/0.bin", mask=4),
        _write(T0, "/lustre/home/bob/out.bin"),
    ]
    (finding,) = detect_data_poisoning(events, [TRAIN])
    assert finding.rule == "data_poisoning.write_during_job" and finding.evidence["jobs_running"] == ["7"]


# -- RDMA ----------------------------------------------------------------------------------------------------


def _ib(host: str, t: float, total: float, metric: str = "node_infiniband_port_data_transmitted_bytes_total") -> Sample:
    return Sample(metric=metric, labels={"device": "mlx5_0", "port": "1", "node": host}, t=t, value=total)


def test_rdma_traffic_without_job_fires_but_storage_servers_do_not() -> None:
    samples = [_ib(h, T0 + i * 30, i * 30 * 1e9) for h in ("node3", "lustre-oss1") for i in range(4)]
    findings = detect_rdma(samples, [TRAIN], config=RdmaConfig(storage_prefixes=("lustre-",)))
    assert [(f.rule, f.target) for f in findings] == [("rdma.traffic_no_job", "node3")]
    assert findings[0].evidence["peak_bytes_per_s"] == pytest.approx(1e9)


def test_rdma_one_node_of_a_job_moving_five_times_its_peer_fires() -> None:
    samples = [_ib("node1", T0 + i * 30, i * 30 * 1e9) for i in range(4)]
    samples += [_ib("node2", T0 + i * 30, i * 30 * 5e9) for i in range(4)]
    (finding,) = detect_rdma(samples, [TRAIN])
    assert finding.rule == "rdma.traffic_disproportion" and finding.target == "node2"
    assert ring_allreduce_bytes(1e9, 4) == pytest.approx(1.5e9)


def test_rdma_peers_scraped_at_other_instants_are_still_peers() -> None:
    """Prometheus spreads its targets over the scrape interval (and a collector scrapes nodes in turn): two nodes'
    samples are never at the same instant. A node is compared with what its peers moved over the interval that
    holds the end of its own."""
    samples = [_ib("node1", T0 + i * 30, i * 30 * 1e9) for i in range(5)]
    samples += [_ib("node2", T0 + 7 + i * 30, i * 30 * 5e9) for i in range(5)]
    samples += [_ib("node3", T0 + 19 + i * 30, i * 30 * 1e9) for i in range(5)]
    (finding,) = detect_rdma(samples, [replace(TRAIN, nodes=("node1", "node2", "node3"))])
    assert finding.rule == "rdma.traffic_disproportion" and finding.target == "node2"
    # node2's first interval (T0+7, T0+37] ends inside node1's (T0+30, T0+60] and node3's (T0+19, T0+49]
    assert finding.evidence["first_t"] == T0 + 37 and finding.evidence["intervals"] == 4
    assert finding.evidence["reference_bytes_per_s"] == pytest.approx(1e9)


def test_rdma_real_node_exporter_scrapes_at_their_own_offsets_fire_on_the_node_moving_five_times_more() -> None:
    """node_exporter's own infiniband output (tests/data/SOURCES.md), its port-1 data counters raised as 1 or 5 GB/s
    would raise them, each node scraped at its own offset and given the ``instance`` label Prometheus adds."""
    from hpcwatch.sources.prometheus_text import read_prometheus_text

    real = [
        s
        for s in read_prometheus_text(DATA.parent / "prometheus" / "node_exporter_e2e_numa_drbd_infiniband.prom", t=T0)
        if s.metric.startswith("node_infiniband_port_data")
    ]
    assert {s.labels["device"] for s in real} == {"mlx4_0"} and len(real) == 4  # 2 ports x rx, tx
    samples = [
        replace(
            s,
            labels={**s.labels, "instance": f"{host}:9100"},
            t=T0 + offset + 30 * i,
            value=s.value + (30 * i * rate if s.labels["port"] == "1" else 0.0),
        )
        for host, offset, rate in (("node1", 0, 1e9), ("node2", 11, 5e9), ("node3", 23, 1e9))
        for i in range(5)
        for s in real
    ]
    (finding,) = detect_rdma(samples, [replace(TRAIN, nodes=("node1", "node2", "node3"))])
    assert (finding.rule, finding.target, finding.evidence["intervals"]) == ("rdma.traffic_disproportion", "node2", 4)
    assert finding.evidence["peak_bytes_per_s"] == pytest.approx(1e10)  # rx + tx of port 1
    assert finding.evidence["reference_bytes_per_s"] == pytest.approx(2e9)


def test_rdma_a_peer_with_no_interval_over_that_moment_is_left_out() -> None:
    """node1 stops reporting at T0+60: node2's intervals that end later have no peer to be compared with."""
    samples = [_ib("node1", T0 + i * 30, i * 30 * 1e9) for i in range(3)]
    samples += [_ib("node2", T0 + 7 + i * 30, i * 30 * 5e9) for i in range(5)]
    (finding,) = detect_rdma(samples, [TRAIN])
    assert finding.evidence["intervals"] == 1 and finding.evidence["first_t"] == T0 + 37  # inside (T0+30, T0+60]


def test_rdma_counter_reset_is_not_traffic_and_pkey_errors_fire() -> None:
    samples = [_ib("node3", T0, 5e12), _ib("node3", T0 + 30, 10.0)]
    samples += [
        Sample(metric="ib_PortRcvConstraintErrors", labels={"node": "node1", "port": "1"}, t=T0 + k, value=v)
        for k, v in ((0, 3), (30, 3), (60, 9))
    ]
    (finding,) = detect_rdma(samples, [TRAIN])
    assert finding.rule == "rdma.pkey_violation" and finding.evidence["increase"] == 6


def test_rdma_open_partition_fires_and_limited_default_does_not() -> None:
    from hpcwatch.sources.opensm import parse_partitions_conf

    open_, closed = (
        list(parse_partitions_conf(t))
        for t in ("Default=0x7fff, ipoib : ALL=full;", "Default=0x7fff, ipoib : ALL=limited, SELF=full;")
    )
    assert [f.rule for f in detect_rdma([], events=open_)] == ["rdma.partitions_open"]
    assert detect_rdma([], events=closed) == []


# -- gradients -----------------------------------------------------------------------------------------------


def _norms(values_by_step: list[list[float]]) -> list[Sample]:
    return [
        Sample(
            metric="train_grad_norm",
            labels={"job": "7", "rank": str(r), "step": str(s), "node": "node1", "gpu": str(r)},
            t=T0 + s,
            value=v,
        )
        for s, row in enumerate(values_by_step)
        for r, v in enumerate(row)
    ]


def test_gradient_outlier_needs_k_consecutive_steps() -> None:
    honest = [1.0, 1.1, 0.9, 1.05]
    once = _norms([honest, [1.0, 1.1, 30.0, 1.05], honest, honest])
    assert detect_gradient_anomalies(once) == []
    thrice = _norms([honest] + [[1.0, 1.1, 30.0, 1.05]] * 3)
    (finding,) = detect_gradient_anomalies(thrice)
    assert finding.evidence["rank"] == 2 and finding.evidence["steps"] == [1, 2, 3]


def test_gradient_finding_is_tied_to_an_xid_of_the_same_gpu() -> None:
    samples = _norms([[1.0, 1.1, 30.0, 1.05]] * 3)
    xid = Event(kind="xid", t=T0, source="dmesg", attrs={"host": "node1", "gpu": 2, "xid": 79})
    other = Event(kind="xid", t=T0, source="dmesg", attrs={"host": "node1", "gpu": 0, "xid": 79})
    (finding,) = detect_gradient_anomalies(samples, [xid, other], GradientConfig(consecutive=3))
    assert [h["xid"] for h in finding.evidence["hardware_events"]] == [79]
    assert "silent data corruption" in finding.title


# -- remanence ------------------------------------------------------------------------------------------------


def _fb(gpu: int, t: float, mib: float, job: str = "") -> Sample:
    return Sample(
        metric="DCGM_FI_DEV_FB_USED", labels={"gpu": str(gpu), "Hostname": "node2", "hpc_job": job}, t=t, value=mib
    )


def test_memory_held_after_the_job_ended_fires_and_a_freed_gpu_does_not() -> None:
    ended = Job(
        id="9",
        user="bob",
        nodes=("node2",),
        gpus=2,
        gpus_by_node={"node2": (0, 1)},
        start=T0 - 600,
        end=T0,
        state="COMPLETED",
    )
    samples = [_fb(g, T0 - 30, 60_000, "9") for g in (0, 1)]
    samples += [_fb(0, T0 + 30, 1.0), _fb(1, T0 + 30, 25_000), _fb(2, T0 + 30, 1.0), _fb(3, T0 + 30, 1.0)]
    (finding,) = detect_remanence(samples, [ended])
    assert finding.rule == "remanence.fb_after_job" and finding.target == "node2/1"
    assert finding.evidence["job"] == "9"


@pytest.mark.parametrize("after_end_s, found", [(10.0, True), (600.0, True), (9.0, False), (601.0, False)])
def test_memory_held_is_watched_from_after_s_to_window_s_after_the_job_ended(after_end_s, found) -> None:
    """``RemanenceConfig``'s defaults: 10 s to 600 s after the end, both ends counted. Older ended jobs on the node
    whose watch is over are skipped before their points are looked at; the answer stays the same."""
    old = [
        Job(id=str(i), user="u", nodes=("node2",), gpus=1, gpus_by_node={"node2": (1,)}, start=i, end=i + 5.0)
        for i in range(50)
    ]
    ended = Job(id="9", user="bob", nodes=("node2",), gpus=1, gpus_by_node={"node2": (1,)}, start=T0 - 600, end=T0)
    samples = [_fb(1, T0 - 30, 60_000, "9"), _fb(0, T0 - 30, 1.0), _fb(0, T0 + 700, 1.0)]
    samples += [_fb(1, T0 + after_end_s, 25_000), _fb(1, T0 + 700, 1.0)]
    findings = [f for f in detect_remanence(samples, [*old, ended]) if f.rule == "remanence.fb_after_job"]
    assert [(f.evidence["job"], f.t) for f in findings] == ([("9", T0 + after_end_s)] if found else [])


def test_surviving_process_and_scrub_switch_fire() -> None:
    ended = Job(id="9", user="bob", nodes=("node2",), gpus=8, start=T0 - 600, end=T0, state="COMPLETED")
    proc = Event(
        kind="gpu_process",
        t=T0 + 60,
        source="nvidia-smi",
        attrs={"host": "node2", "gpu": 3, "pid": 4711, "process_name": "python3"},
    )
    params = Event(
        kind="nvidia_params", t=T0, source="params", attrs={"host": "node2", "params": {"RMDisableScrubOnFree": "1"}}
    )
    rules = sorted(f.rule for f in detect_remanence([], [ended], [proc, params]))
    assert rules == ["remanence.process_after_job", "remanence.scrub_disabled"]


def test_remanence_docstring_cites_the_real_h200_measurement() -> None:
    import hpcwatch.security.remanence as mod

    doc = json.loads((DATA / "results_sweep_remanence.json").read_text())["remanence"]
    assert "'pattern_words_seen': 0" in doc["read_new_process"] and "0 of 268M words" in mod.__doc__


# -- container escape -------------------------------------------------------------------------------------------


def _falco(rule: str, user: str, priority: str = "Notice") -> Event:
    return Event(
        kind="falco",
        t=T0,
        source="f",
        attrs={
            "rule": rule,
            "priority": priority,
            "host": "node1",
            "output": "...",
            "output_fields": {"user.name": user, "container.image.repository": "nvcr.io/x"},
        },
    )


def test_shell_of_the_job_owner_is_expected_and_a_root_shell_is_not() -> None:
    findings = detect_container_escape(
        [_falco("Terminal shell in container", "alice"), _falco("Terminal shell in container", "root")], [TRAIN]
    )
    assert [(f.rule, f.evidence["user"]) for f in findings] == [("container_escape.shell", "root")]
    assert findings[0].evidence["jobs"][0]["id"] == "7" and findings[0].evidence["jobs"][0]["gpus"] == list(range(8))


def test_allow_list_silences_a_shell_but_never_an_escape() -> None:
    config = ContainerEscapeConfig(allowed_shells=(AllowedShell(user="root", image_prefix="nvcr.io/"),))
    events = [
        _falco("Terminal shell in container", "root"),
        _falco("Detect release_agent File Container Escapes", "root", "Critical"),
        _falco("Some Notice Rule", "root"),
    ]
    assert [f.rule for f in detect_container_escape(events, [TRAIN], config)] == ["container_escape.release_agent"]


# -- weights -------------------------------------------------------------------------------------------------


def _read(t: float, host: str, user: str, mask: int, binary: str = "/usr/bin/python3") -> Event:
    return Event(
        kind="tetragon",
        t=t,
        source="t",
        attrs={
            "type": "process_kprobe",
            "host": host,
            "user": user,
            "uid": 1001,
            "binary": binary,
            "function_name": "security_file_permission",
            "path": "/lustre/checkpoints/run/model.pt",
            "mask": mask,
        },
    )


def test_weights_report_names_binary_user_and_job() -> None:
    events = [
        _read(T0, "node1", "alice", 2),
        _read(T0 + 1, "node2", "alice", 4),
        _read(T0 + 2, "node2", "bob", 4, "/usr/bin/cp"),
        _read(T0 + 3, "login1", "alice", 4, "/usr/bin/scp"),
    ]
    report = weights_report(events, [TRAIN])
    assert [(r.access, r.user, r.job) for r in report] == [
        ("write", "alice", "7"),
        ("read", "alice", "7"),
        ("read", "bob", None),
        ("read", "alice", None),
    ]
    findings = detect_weights_access(events, [TRAIN])
    assert sorted((f.rule, f.evidence["user"]) for f in findings) == [
        ("weights.foreign_reader", "bob"),
        ("weights.reader_outside_job", "alice"),
    ]


def test_weights_outside_the_checkpoint_folder_are_ignored() -> None:
    events = [
        Event(
            kind="tetragon",
            t=T0,
            source="t",
            attrs={
                "type": "process_kprobe",
                "host": "node1",
                "function_name": "security_file_permission",
                "path": "/lustre/checkpoints-old/m.pt",
                "mask": 4,
            },
        )
    ]
    assert weights_report(events, config=WeightsConfig(weights_path="/lustre/checkpoints")) == []


def test_rdma_single_node_job_moving_more_than_its_lustre_io_fires() -> None:
    solo = Job(id="8", user="carol", nodes=("node5",), gpus=8, start=T0 - 100, end=None, state="RUNNING")
    samples = [_ib("node5", T0 + i * 30, i * 30 * 2e9) for i in range(4)]
    lustre = [
        Sample(
            metric="lustre_job_read_bytes_total",
            labels={"jobid": "8", "target": "lustre-OST0000"},
            t=T0 + i * 30,
            value=i * 30 * 1e9,
        )
        for i in range(4)
    ]
    assert detect_rdma(samples + lustre, [solo]) == []  # 2 GB/s, of which Lustre explains 1 GB/s
    (finding,) = detect_rdma(samples, [solo])  # no Lustre I/O to explain 2 GB/s
    assert finding.rule == "rdma.traffic_unexplained" and finding.evidence["jobs"] == ["8"]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.lists(st.one_of(st.none(), st.floats(0, 1e12, allow_nan=False)), min_size=1, max_size=6),
        min_size=1,
        max_size=9,
    ).filter(lambda rows: len({len(r) for r in rows}) == 1)
)
def test_the_peers_median_is_numpys_nanmedian(rows) -> None:
    """``column_nanmedians`` (the peer medians of the RDMA disproportion rule) gives ``np.nanmedian(axis=0)``, its
    even counts the mean of the two middle values, on every column with a value."""
    table = np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=np.float64)
    table = table[:, ~np.isnan(table).all(axis=0)]
    assert np.array_equal(column_nanmedians(table), np.nanmedian(table, axis=0))
