"""Capture a real NCCL INFO log and real Flight Recorder dumps of a deliberate hang, bounded by a timeout.

Run by hand on a machine with torch (and, for NCCL, >= 2 GPUs):

    python benchmarks/gpu_nccl_capture.py --out /tmp/capture --backend nccl --world-size 2
    python benchmarks/gpu_nccl_capture.py --out /tmp/capture --backend gloo --world-size 4   # CPU only

What it does: ``--world-size`` processes on this host (torch.multiprocessing, one GPU each for NCCL)
run ``--hang-at - 1`` all-reduces together, then every rank but ``--stuck-rank`` issues all-reduce
number ``--hang-at`` while the stuck rank sleeps: a real hang. Each rank waits ``--wait-s``, then
dumps its Flight Recorder buffer both ways torch writes it (the pickle, ``fr_trace_rank_<r>``, and
``fr_trace_rank_<r>.json``) and leaves with ``os._exit`` (a hung communicator cannot be destroyed).
``--mismatch-rank`` makes that rank's last all-reduce another dtype (int32, same bytes) instead (the other mistake
the analysis names). The parent kills every child after ``--deadline-s`` whatever happens.

NCCL only: ``NCCL_DEBUG=INFO`` with ``NCCL_DEBUG_FILE=<out>/nccl.%h.%p.log`` (one log per process,
the real format ``hpcwatch nccl`` reads), and ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` with a process-group
timeout of ``--timeout-s`` so the watchdog's own dump (``TORCH_FR_DUMP_TEMP_FILE`` prefix, same
folder) may appear beside ours.

Facts used (torch 2.13 sources): the dump functions ``torch._C._distributed_c10d._dump_nccl_trace``
/ ``_dump_nccl_trace_json`` (NCCL) and ``_dump_fr_trace`` / ``_dump_fr_trace_json`` (any backend
that records, gloo included since the recorder was made backend-generic); buffer size env
``TORCH_FR_BUFFER_SIZE`` (``TORCH_NCCL_TRACE_BUFFER_SIZE`` is its deprecated name).

Afterwards: ``hpcwatch hang <out>`` names the wavefront; ``hpcwatch nccl <out>`` reads the logs.
This script was run here with ``--backend gloo`` (tests/data/flight_recorder/); the NCCL run needs
a machine with GPUs and has not been run by this project yet.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

__all__ = ["main"]

DEFAULT_PORT = 29561


def _dump(backend: str, out: Path, rank: int) -> None:
    import torch._C._distributed_c10d as c10d

    if backend == "nccl":
        raw, text = c10d._dump_nccl_trace(), c10d._dump_nccl_trace_json()
    else:
        raw, text = c10d._dump_fr_trace(), c10d._dump_fr_trace_json()
    (out / f"fr_trace_rank_{rank}").write_bytes(raw)
    (out / f"fr_trace_rank_{rank}.json").write_bytes(text if isinstance(text, bytes) else text.encode())


def _rank_main(rank: int, args: argparse.Namespace) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    device = torch.device("cuda", rank) if args.backend == "nccl" else torch.device("cpu")
    if args.backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(
        args.backend, rank=rank, world_size=args.world_size, timeout=datetime.timedelta(seconds=args.timeout_s)
    )
    grads = torch.ones(args.numel, device=device)
    for _ in range(args.hang_at - 1):
        dist.all_reduce(grads)
    if args.backend == "nccl":
        torch.cuda.synchronize()
    if rank == args.mismatch_rank:
        # int32 where the others send float32: the same bytes, so the transport cannot notice; the recorder does
        dist.all_reduce(torch.ones(args.numel, dtype=torch.int32, device=device), async_op=True)
    elif rank != args.stuck_rank:
        dist.all_reduce(grads, async_op=True)  # the others wait here for the stuck rank
    time.sleep(args.wait_s)
    _dump(args.backend, args.out, rank)
    sys.stdout.flush()
    os._exit(0)


def _child(rank: int, args: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port), TORCH_FR_BUFFER_SIZE="2000")
    if args.backend == "nccl":
        os.environ.update(
            NCCL_DEBUG="INFO",
            NCCL_DEBUG_FILE=str(args.out / "nccl.%h.%p.log"),
            TORCH_NCCL_DUMP_ON_TIMEOUT="1",
            TORCH_FR_DUMP_TEMP_FILE=str(args.out / "watchdog_rank_"),
        )
    _rank_main(rank, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--stuck-rank", type=int, default=1)
    parser.add_argument("--mismatch-rank", type=int, default=-1)
    parser.add_argument("--hang-at", type=int, default=5, help="the all-reduce (1-based) the stuck rank never calls")
    parser.add_argument("--numel", type=int, default=1024)
    parser.add_argument("--timeout-s", type=float, default=20.0)
    parser.add_argument("--wait-s", type=float, default=3.0)
    parser.add_argument("--deadline-s", type=float, default=120.0)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_child, args=(r, args)) for r in range(args.world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + args.deadline_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    stuck = [p for p in procs if p.is_alive()]
    for p in stuck:
        p.kill()
        p.join()
    print(f"wrote {sorted(f.name for f in args.out.iterdir())} into {args.out}; killed {len(stuck)} at the deadline")
    return 1 if stuck else 0


if __name__ == "__main__":
    sys.exit(main())
