"""The twin's NCCL side: the ``NCCL_DEBUG=INFO`` logs its training job would leave, and the Flight Recorder
dumps of a hang; scenarios ``nccl_hang`` and ``nccl_socket_fallback``.

Written in the real formats (``sources/nccl_log.py`` and ``sources/flight_recorder.py`` cite them): one log
per rank as ``NCCL_DEBUG_FILE=nccl.%h.%p.log`` leaves them (``out/nccl/``), and one dump per rank in
torch's default pickle form, ``TORCH_FR_DUMP_TEMP_FILE=fr_trace_rank_`` (``out/flight_recorder/``).
The lines follow NCCL 2.21's wording (the real logs under tests/data/nccl/).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from hpcwatch.twin.exposition import hca_device
from hpcwatch.twin.scenarios import Scenario, register

__all__ = ["write_nccl_logs", "flight_recorder_dumps", "write_flight_recorder_dumps", "NcclHang",
           "NcclSocketFallback", "NCCL_VERSION", "PID_BASE"]

NCCL_VERSION = "2.21.5+cuda12.4"
#: Process ids of the ranks (any number; a real log's are the launcher's).
PID_BASE = 4000
#: Entries a rank's Flight Recorder buffer keeps in the twin's dumps (torch's default is 2000).
DUMP_ENTRIES = 20
#: Channels the twin's NCCL builds on an 8-GPU NVLink node over NDR (NCCL's own choice on such nodes is 16-32).
COLL_CHANNELS = 16
#: Gradient bucket elements of the twin's all-reduce (DDP's default bucket is 25 MiB: 6.5M float32).
BUCKET_NUMEL = 6553600


def _rank_lines(twin: Any, rank: int, node: str, gpu: int, nranks: int, nodes: list[str], *,
                socket: bool) -> list[str]:
    pid = PID_BASE + rank
    p = f"{node}:{pid}:{pid} [{gpu}] NCCL INFO "
    hcas = sorted({hca for n, hca in twin.ports if n == node})
    lines = [p + "Bootstrap : Using eth0:10.0.0.%d<0>" % (nodes.index(node) + 1), p + "cudaDriverVersion 12040"]
    if rank == 0:
        lines.append(p + f"NCCL version {NCCL_VERSION}")
    if socket:
        lines += [p + "NET/IB : No device found.", p + f"NET/Socket : Using [0]eth0:10.0.0.{nodes.index(node) + 1}<0>",
                  p + "Using network Socket"]
    else:
        devs = " ".join(f"[{i}]{hca_device(h)}:1/IB" for i, h in enumerate(hcas))
        lines += [p + "NET/Plugin: Using internal network plugin.",
                  p + f"NET/IB : Using {devs} [RO]; OOB eth0:10.0.0.{nodes.index(node) + 1}<0>", p + "Using network IB"]
    lines.append(p + f"comm 0x55d0{rank:04x} rank {rank} nranks {nranks} cudaDev {gpu} nvmlDev {gpu} "
                     f"busId {0x18 + 0x10 * gpu:x}000 commId 0x7a11ce5e0f0e0001 - Init START")
    nxt, per_node = (rank + 1) % nranks, nranks // len(nodes)
    for ch in range(COLL_CHANNELS):
        lines.append(p + f"Channel {ch:02d}/{COLL_CHANNELS:02d} :    " + "   ".join(str(r) for r in range(nranks)))
    for ch in range(2):
        if nxt // per_node != rank // per_node:
            via = "NET/Socket/0" if socket else f"NET/IB/{ch % max(1, len(hcas))}/GDRDMA"
            lines.append(p + f"Channel {ch:02d}/0 : {rank}[{gpu}] -> {nxt}[{nxt % per_node}] [send] via {via}")
        else:
            lines.append(p + f"Channel {ch:02d}/0 : {rank}[{gpu}] -> {nxt}[{nxt % per_node}] via P2P/CUMEM/read")
    lines += [p + f"{COLL_CHANNELS} coll channels, 0 collnet channels, 0 nvls channels, {COLL_CHANNELS} p2p channels, "
                  "2 p2p channels per peer",
              p + f"ncclCommInitRank comm 0x55d0{rank:04x} rank {rank} nranks {nranks} cudaDev {gpu} nvmlDev {gpu} "
                  f"busId {0x18 + 0x10 * gpu:x}000 commId 0x7a11ce5e0f0e0001 - Init COMPLETE"]
    return lines


def write_nccl_logs(twin: Any, out: Path, *, socket_nodes: frozenset[str] = frozenset()) -> int:
    """One log per rank of the training job under ``out/nccl``; ``socket_nodes`` fall back to NET/Socket."""
    ranks = twin.ranks(twin.training_job)
    nodes = sorted({node for _, node, _ in ranks}, key=ranks and [n for _, n, _ in ranks].index)
    folder = out / "nccl"
    folder.mkdir(parents=True, exist_ok=True)
    for rank, node, gpu in ranks:
        text = "\n".join(_rank_lines(twin, rank, node, gpu, len(ranks), nodes, socket=node in socket_nodes)) + "\n"
        (folder / f"nccl.{node}.{PID_BASE + rank}.log").write_text(text)
    return len(ranks)


def _entry(seq: int, state: str, t_ns: int) -> dict[str, Any]:
    return {"record_id": seq - 1, "pg_id": 0, "process_group": ("0", "default_pg"), "thread_name": "pt_main_thread",
            "thread_id": "140000000000000", "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
            "profiling_name": "nccl:all_reduce", "time_created_ns": t_ns, "input_sizes": [[BUCKET_NUMEL]],
            "input_dtypes": ["Float"], "output_sizes": [[BUCKET_NUMEL]], "output_dtypes": ["Float"], "state": state,
            "time_discovered_started_ns": t_ns + 1000, "time_discovered_completed_ns": t_ns + 2000 if state == "completed"
            else None, "retired": state == "completed", "timeout_ms": 600000, "is_p2p": False}


def flight_recorder_dumps(nranks: int, *, stuck_rank: int, hang_seq: int, t0_ns: int) -> dict[int, dict[str, Any]]:
    """rank -> dump: every rank completed ``hang_seq - 1`` all-reduces; all but ``stuck_rank`` issued
    ``hang_seq`` and wait in it (state ``started``), the stuck one never issued it."""
    dumps = {}
    for rank in range(nranks):
        last = hang_seq - 1 if rank == stuck_rank else hang_seq
        seqs = range(max(1, last - DUMP_ENTRIES + 1), last + 1)
        entries = [_entry(s, "completed" if s < hang_seq else "started", t0_ns + s * 1_000_000) for s in seqs]
        dumps[rank] = {"version": "2.10", "comm_lib_version": NCCL_VERSION.split("+")[0],
                       "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(nranks)))}},
                       "pg_status": {"0": {"last_enqueued_collective": last, "last_started_collective": last,
                                           "last_completed_collective": hang_seq - 1}},
                       "entries": entries}
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
        dumps = flight_recorder_dumps(nranks, stuck_rank=self.stuck_rank % nranks, hang_seq=self.hang_seq,
                                      t0_ns=int(t0 * 1e9))
        write_flight_recorder_dumps(out, dumps)


@register
class NcclSocketFallback(Scenario):
    """node2's ranks find no HCA (a missing driver module in the job's container) and NCCL falls back to
    TCP sockets there, while node1 uses NET/IB: ``hpcwatch nccl out/nccl`` fires nccl_socket_fallback."""

    name = "nccl_socket_fallback"
    description = "node2's ranks fall back to NET/Socket while node1 uses NET/IB (NCCL logs)"
    socket_node = "node2"

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        write_nccl_logs(twin, out, socket_nodes=frozenset({self.socket_node}))
