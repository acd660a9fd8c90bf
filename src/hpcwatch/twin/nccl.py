"""The twin's NCCL side: the ``NCCL_DEBUG=INFO`` logs its training job would leave, and the Flight Recorder
dumps of a hang; scenarios ``nccl_hang``, ``nccl_socket_fallback`` and ``nccl_conf_stale``.

Written in the real formats (``sources/nccl_log.py`` and ``sources/flight_recorder.py`` cite them): one log
per rank as ``NCCL_DEBUG_FILE=nccl.%h.%p.log`` leaves them (``out/nccl/``), and one dump per rank in
torch's default pickle form, ``TORCH_FR_DUMP_TEMP_FILE=fr_trace_rank_`` (``out/flight_recorder/``).
The lines follow NCCL 2.21's wording (the real logs under tests/data/nccl/).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from hpcwatch import vocab
from hpcwatch.records import Event
from hpcwatch.twin.devices import DRIVER_CUDA, DRIVER_VERSION
from hpcwatch.twin.exposition import hca_device
from hpcwatch.twin.scenarios import Scenario, register
from hpcwatch.vocab import EventKind

__all__ = [
    "write_nccl_logs",
    "nccl_rank_events",
    "socket_nodes_of",
    "log_name",
    "flight_recorder_dumps",
    "write_flight_recorder_dumps",
    "NcclHang",
    "NcclSocketFallback",
    "NcclConfStale",
    "nccl_conf_of",
    "NCCL_VERSION",
    "PID_BASE",
    "ACCEPTANCE_PID_BASE",
    "cuda_driver_of",
    "write_acceptance_logs",
]

NCCL_VERSION = "2.21.5+cuda12.4"
#: Process ids of the ranks (any number; a real log's are the launcher's).
PID_BASE = 4000
#: Entries a rank's Flight Recorder buffer keeps in the twin's dumps (torch's default is 2000).
DUMP_ENTRIES = 20
#: Channels the twin's NCCL builds on an 8-GPU NVLink node over NDR (NCCL's own choice on such nodes is 16-32).
COLL_CHANNELS = 16
#: Gradient bucket elements of the twin's all-reduce (DDP's default bucket is 25 MiB: 6.5M float32).
BUCKET_NUMEL = 6553600


@dataclass(frozen=True, slots=True, kw_only=True)
class _RankFacts:
    """What one rank's NCCL says: its log lines and its ``nccl_rank`` event are both written from these."""

    rank: int
    nranks: int
    node: str
    node_index: int
    gpu: int
    hcas: tuple[int, ...]
    socket: bool
    next_rank: int
    next_gpu: int
    next_off_node: bool
    cuda_driver: int
    """The CUDA version the node's GPU driver supports (``cudaDriverVersion``)."""
    version: str = NCCL_VERSION
    comm_id: str = ""
    pid_base: int = PID_BASE
    env: tuple[tuple[str, str], ...] = ()
    """``NCCL_*`` variables set on the rank's node (its ``/etc/nccl.conf``), in the order NCCL reads them."""

    @property
    def over_net(self) -> bool:
        """Whether it reaches the next rank over the network: another node's, or its own with P2P turned off."""
        return self.next_off_node or ("NCCL_P2P_DISABLE", "1") in self.env

    @property
    def pid(self) -> int:
        return self.pid_base + self.rank

    @property
    def bus_id(self) -> str:
        return f"{0x18 + 0x10 * self.gpu:x}000"

    def via(self, ch: int) -> str:
        if not self.over_net:
            return "P2P/CUMEM/read"
        return "NET/Socket/0" if self.socket else f"NET/IB/{ch % max(1, len(self.hcas))}/GDRDMA"


#: The communicator id of the twin's one job-wide communicator (any 64-bit value).
COMM_ID = "0x7a11ce5e0f0e0001"
#: Rings whose transports a rank's log lists (NCCL prints each channel's connection; the twin, two).
LISTED_CONNECTIONS = 2


def cuda_driver_of(twin: Any, node: str) -> int:
    """``cudaDriverVersion`` on ``node``: the CUDA version of the driver its GPUs' exporter names (a drifted node's
    older driver supports an older CUDA), the twin's own driver's where it names none it knows (AMD GPUs)."""
    labels = twin.gpu_labels[twin.gpus_of_node(node)[0]] if twin.gpus_of_node(node) else {}
    return DRIVER_CUDA.get(labels.get(vocab.DCGM_FI_DRIVER_VERSION, ""), DRIVER_CUDA[DRIVER_VERSION])


def _facts(
    twin: Any,
    rank: int,
    node: str,
    gpu: int,
    nranks: int,
    nodes: list[str],
    *,
    socket: bool,
    comm_id: str = COMM_ID,
    **kw: Any,
) -> _RankFacts:
    """One rank's facts; ``kw``: the other ``_RankFacts`` fields (``version``, ``pid_base``, ``env``)."""
    nxt, per_node = (rank + 1) % nranks, nranks // len(nodes)
    return _RankFacts(
        rank=rank,
        nranks=nranks,
        node=node,
        node_index=twin.node_names.index(node),
        gpu=gpu,
        hcas=tuple(sorted({hca for n, hca in twin.ports if n == node})),
        socket=socket,
        next_rank=nxt,
        next_gpu=nxt % per_node,
        next_off_node=nxt // per_node != rank // per_node,
        cuda_driver=cuda_driver_of(twin, node),
        comm_id=comm_id,
        **kw,
    )


def _rank_lines(f: _RankFacts) -> list[str]:
    p = f"{f.node}:{f.pid}:{f.pid} [{f.gpu}] NCCL INFO "
    ip = f"10.0.0.{f.node_index + 1}"
    lines = [p + f"Bootstrap : Using eth0:{ip}<0>", p + f"cudaDriverVersion {f.cuda_driver}"]
    lines += [p + f"{name} set by environment to {value}." for name, value in f.env]
    if f.rank == 0:
        lines.append(p + f"NCCL version {f.version}")
    if f.socket:
        lines += [
            p + "NET/IB : No device found.",
            p + f"NET/Socket : Using [0]eth0:{ip}<0>",
            p + "Using network Socket",
        ]
    else:
        devs = " ".join(f"[{i}]{hca_device(h)}:1/IB" for i, h in enumerate(f.hcas))
        lines += [
            p + "NET/Plugin: Using internal network plugin.",
            p + f"NET/IB : Using {devs} [RO]; OOB eth0:{ip}<0>",
            p + "Using network IB",
        ]
    comm = (
        f"comm 0x55d0{f.rank:04x} rank {f.rank} nranks {f.nranks} cudaDev {f.gpu} nvmlDev {f.gpu} "
        f"busId {f.bus_id} commId {f.comm_id}"
    )
    lines.append(p + comm + " - Init START")
    for ch in range(COLL_CHANNELS):
        lines.append(p + f"Channel {ch:02d}/{COLL_CHANNELS:02d} :    " + "   ".join(str(r) for r in range(f.nranks)))
    for ch in range(LISTED_CONNECTIONS):
        send = " [send]" if f.over_net else ""
        lines.append(p + f"Channel {ch:02d}/0 : {f.rank}[{f.gpu}] -> {f.next_rank}[{f.next_gpu}]{send} via {f.via(ch)}")
    lines += [
        p + f"{COLL_CHANNELS} coll channels, 0 collnet channels, 0 nvls channels, {COLL_CHANNELS} p2p channels, "
        "2 p2p channels per peer",
        p + "ncclCommInitRank " + comm + " - Init COMPLETE",
    ]
    return lines


def _rank_attrs(f: _RankFacts) -> dict[str, Any]:
    """The attrs of the ``nccl_rank`` event these facts' log makes (``sources/nccl_log.py``'s shape; the twin
    does not import the reader: tests/unit/test_twin_nccl_events.py checks the two agree)."""
    version, _, cuda = f.version.partition("+cuda")
    transport = "P2P" if not f.over_net else ("NET/Socket" if f.socket else "NET/IB")
    return {
        "host": f.node,
        "node": f.node,
        "pid": f.pid,
        "cuda_dev": f.gpu,
        "rank": f.rank,
        "nranks": f.nranks,
        "bus_id": f.bus_id,
        "comm_ids": {f.comm_id: f.rank},
        "version": version if f.rank == 0 else None,
        "cuda_runtime": cuda if f.rank == 0 else None,
        "cuda_driver": f.cuda_driver,
        "network": "Socket" if f.socket else "IB",
        "net_plugin": None if f.socket else "internal",
        "ib_devices": []
        if f.socket
        else [
            {"index": i, "name": hca_device(h), "port": 1, "link": "IB", "sharp": False} for i, h in enumerate(f.hcas)
        ],
        "ib_none": f.socket,
        "socket_ifs": ["eth0"] if f.socket else [],
        "net_speed_gbs": {},
        "transports": {transport: LISTED_CONNECTIONS},
        "gdr": f.over_net and not f.socket,
        "net_peers": [f.next_rank] if f.over_net else [],
        "rings": COLL_CHANNELS,
        "trees": 0,
        "coll_channels": COLL_CHANNELS,
        "nvls_channels": 0,
        "p2p_channels": COLL_CHANNELS,
        "collnet_channels": 0,
        "pattern_channels": None,
        "nnodes": None,
        "local_ranks": None,
        "env": dict(f.env),
        "warns": 0,
    }


def _job_facts(
    twin: Any, socket_nodes: frozenset[str], conf: Mapping[str, Mapping[str, str]] | None = None
) -> list[_RankFacts]:
    ranks = twin.ranks(twin.training_job)
    nodes = sorted({node for _, node, _ in ranks}, key=ranks and [n for _, n, _ in ranks].index)
    return [
        _facts(
            twin,
            rank,
            node,
            gpu,
            len(ranks),
            nodes,
            socket=node in socket_nodes,
            env=tuple((conf or {}).get(node, {}).items()),
        )
        for rank, node, gpu in ranks
    ]


def log_name(f: _RankFacts) -> str:
    """``NCCL_DEBUG_FILE=nccl.%h.%p.log``."""
    return f"nccl.{f.node}.{f.pid}.log"


def nccl_rank_events(
    twin: Any,
    *,
    t: float,
    socket_nodes: frozenset[str] = frozenset(),
    conf: Mapping[str, Mapping[str, str]] | None = None,
) -> list[Event]:
    """The ``nccl_rank`` events of the training job's ranks, as the reader makes them of ``write_nccl_logs``'
    files (the live twin's ML-stack collector: its logs are not written, their events are)."""
    return [
        Event(kind=EventKind.NCCL_RANK, t=t, source=f"nccl/{log_name(f)}", attrs=_rank_attrs(f))
        for f in _job_facts(twin, socket_nodes, conf)
    ]


def socket_nodes_of(scenarios: Any) -> frozenset[str]:
    """The nodes whose ranks fall back to NET/Socket under these scenarios (``nccl_socket_nodes``)."""
    return frozenset().union(*(getattr(s, "nccl_socket_nodes", frozenset()) for s in scenarios))


def nccl_conf_of(scenarios: Any) -> dict[str, dict[str, str]]:
    """node -> the ``NCCL_*`` variables its ``/etc/nccl.conf`` sets under these scenarios (``nccl_conf``)."""
    out: dict[str, dict[str, str]] = {}
    for s in scenarios:
        for node, variables in getattr(s, "nccl_conf", {}).items():
            out.setdefault(node, {}).update(variables)
    return out


def write_nccl_logs(
    twin: Any,
    out: Path,
    *,
    socket_nodes: frozenset[str] = frozenset(),
    conf: Mapping[str, Mapping[str, str]] | None = None,
) -> int:
    """One log per rank of the training job under ``out/nccl``; ``socket_nodes`` fall back to NET/Socket, ``conf``
    gives a node's ``/etc/nccl.conf`` variables."""
    folder = out / "nccl"
    folder.mkdir(parents=True, exist_ok=True)
    facts = _job_facts(twin, socket_nodes, conf)
    for f in facts:
        (folder / log_name(f)).write_text("\n".join(_rank_lines(f)) + "\n")
    return len(facts)


#: Process ids of the ranks of a node's acceptance run (``write_acceptance_logs``), apart from the training job's.
ACCEPTANCE_PID_BASE = 7000


def write_acceptance_logs(twin: Any, out: Path, node: str, *, version: str = NCCL_VERSION) -> int:
    """The ``NCCL_DEBUG=INFO`` logs of an acceptance run on ``node`` alone (nccl-tests' all_reduce_perf under
    mpirun between jobs, one process per GPU, ``NCCL_DEBUG_FILE=nccl.%h.%p.log``), under ``out/nccl``: its rank 0
    prints the NCCL ``version`` the node loads, which the fleet rule ``nccl_fleet_mismatch`` compares."""
    folder = out / "nccl"
    folder.mkdir(parents=True, exist_ok=True)
    gpus = len(twin.gpus_of_node(node))
    comm_id = f"0x7a11ce5e0f0e{0x100 + twin.node_names.index(node):04x}"  # one communicator per node's run
    facts = [
        _facts(
            twin,
            rank,
            node,
            rank,
            gpus,
            [node],
            socket=False,
            version=version,
            comm_id=comm_id,
            pid_base=ACCEPTANCE_PID_BASE,
        )
        for rank in range(gpus)
    ]
    for f in facts:
        (folder / log_name(f)).write_text("\n".join(_rank_lines(f)) + "\n")
    return len(facts)


def _entry(seq: int, state: str, t_ns: int) -> dict[str, Any]:
    return {
        "record_id": seq - 1,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "thread_name": "pt_main_thread",
        "thread_id": "140000000000000",
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": t_ns,
        "input_sizes": [[BUCKET_NUMEL]],
        "input_dtypes": ["Float"],
        "output_sizes": [[BUCKET_NUMEL]],
        "output_dtypes": ["Float"],
        "state": state,
        "time_discovered_started_ns": t_ns + 1000,
        "time_discovered_completed_ns": t_ns + 2000 if state == "completed" else None,
        "retired": state == "completed",
        "timeout_ms": 600000,
        "is_p2p": False,
    }


def flight_recorder_dumps(nranks: int, *, stuck_rank: int, hang_seq: int, t0_ns: int) -> dict[int, dict[str, Any]]:
    """rank -> dump: every rank completed ``hang_seq - 1`` all-reduces; all but ``stuck_rank`` issued
    ``hang_seq`` and wait in it (state ``started``), the stuck one never issued it."""
    dumps = {}
    for rank in range(nranks):
        last = hang_seq - 1 if rank == stuck_rank else hang_seq
        seqs = range(max(1, last - DUMP_ENTRIES + 1), last + 1)
        entries = [_entry(s, "completed" if s < hang_seq else "started", t0_ns + s * 1_000_000) for s in seqs]
        dumps[rank] = {
            "version": "2.10",
            "comm_lib_version": NCCL_VERSION.split("+")[0],
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(nranks)))}},
            "pg_status": {
                "0": {
                    "last_enqueued_collective": last,
                    "last_started_collective": last,
                    "last_completed_collective": hang_seq - 1,
                }
            },
            "entries": entries,
        }
    return dumps


def write_flight_recorder_dumps(out: Path, dumps: dict[int, dict[str, Any]]) -> int:
    folder = out / "flight_recorder"
    folder.mkdir(parents=True, exist_ok=True)
    for rank, dump in dumps.items():
        # Protocol 2, as torch's pickle_str writes it; plain data only, so the restricted loader reads it.
        (folder / f"fr_trace_rank_{rank}").write_bytes(pickle.dumps(dump, protocol=2))
    return len(dumps)


@register
class NcclHang(Scenario):
    """One rank of the training job never reaches an all-reduce: the others wait in it until the watchdog
    fires, and every rank dumps its Flight Recorder (``hpcwatch hang out/flight_recorder`` names it)."""

    name = "nccl_hang"
    description = "rank 5 of the training job never issues all-reduce 120; the others wait (Flight Recorder dumps)"
    stuck_rank = 5
    hang_seq = 120

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        nranks = len(twin.ranks(twin.training_job))
        write_nccl_logs(twin, out)
        dumps = flight_recorder_dumps(
            nranks, stuck_rank=self.stuck_rank % nranks, hang_seq=self.hang_seq, t0_ns=int(t0 * 1e9)
        )
        write_flight_recorder_dumps(out, dumps)


@register
class NcclSocketFallback(Scenario):
    """node2's ranks find no HCA (a missing driver module in the job's container) and NCCL falls back to
    TCP sockets there, while node1 uses NET/IB: ``hpcwatch nccl out/nccl`` fires nccl_socket_fallback."""

    name = "nccl_socket_fallback"
    description = "node2's ranks fall back to NET/Socket while node1 uses NET/IB (NCCL logs)"
    socket_node = "node2"
    nccl_socket_nodes = frozenset({socket_node})
    """Read by the twin core for the live ``nccl_rank`` events (twin/nccl.socket_nodes_of)."""

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        write_nccl_logs(twin, out, socket_nodes=frozenset({self.socket_node}))


@register
class NcclConfStale(Scenario):
    """node2 kept the ``/etc/nccl.conf`` of a debugging session (NCCL reads it into its environment at init):
    P2P and shared memory off, the ring algorithm forced. Its ranks reach their node's other GPUs over NET/IB
    instead of NVLink (``nccl_intranode_net``) and print the forcing variable (``nccl_forced_tuning``); node1's
    ranks, without that file, are as usual."""

    name = "nccl_conf_stale"
    description = "node2's stale /etc/nccl.conf turns P2P and SHM off and forces NCCL_ALGO=Ring (NCCL logs)"
    nccl_conf: ClassVar[dict[str, dict[str, str]]] = {
        "node2": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_ALGO": "Ring"}
    }
    """Read by the twin core for the live ``nccl_rank`` events (twin/nccl.nccl_conf_of)."""

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        write_nccl_logs(twin, out, conf=self.nccl_conf)
