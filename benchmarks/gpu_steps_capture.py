"""GPU check (run by hand on a machine with CUDA GPUs): capture a multi-rank run with a GPU-only
straggler and a lagging host, then check that ``hpcwatch steps`` names the rank from GPU evidence.

    python benchmarks/gpu_steps_capture.py --out /tmp/gpu_capture [--world 4] [--slow-rank 2] \\
        [--slow-ms 20] [--queue-depth 2] [--steps 14]

Run on one H200 on 2026-12-04 (4 gloo ranks on the one GPU, torch 2.11): the defaults give a ~45 ms step
of which the gloo all-reduce is ~35 ms; rank 2 was named from GPU evidence at 20 ms (+19.7 ms measured)
and 5 ms (+4.6 ms); the traces are tests/data/kineto/h200_gloo4_gpu_straggler/. The first defaults (an
8 × 4096 MLP, 2 ms) made a 590 ms step, 97 % of it gloo copying 512 MB through the host, where a 2 ms spin
is 0.3 % of the step: rightly, no straggler was named.

It cannot run without a GPU (CI and the dev machines have none): it exits with status 77 then.
What it does:

- spawns ``--world`` ranks with torch.distributed: NCCL when there is one GPU per rank, else
  gloo over CUDA tensors with ranks sharing the GPUs (the case of issue 11: four gloo ranks
  on one H200);
- trains a small MLP; the slow rank runs ``torch.cuda._sleep`` (one GPU spin kernel, one
  launch: nothing the host can see) inside its backward, ``--slow-ms`` per step;
- the host syncs (``loss.item()``) only every ``--queue-depth`` steps, so it runs ahead of
  the GPU and the GPU's step ends after the host's;
- profiles steps with ``torch.profiler`` (kernels, runtime calls, flows), one trace per rank;
- runs ``python -m hpcwatch steps OUT --json`` and checks: the straggler is ``--slow-rank``,
  named by ``gpu_compute`` (or ``late_arrival``), its GPU excess ≈ ``--slow-ms``; prints
  the GPU clock (GPU step vs host step, queue depth, bound) and the verdict.

``--capture-only`` stops after the traces (a GPU machine without hpcwatch's dependencies: bring the traces
back and check them with ``--check-only --out DIR`` where hpcwatch is installed).

Exit status: 0 when the checks hold (or, with ``--capture-only``, when the traces were written), 1 when not,
77 without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def _spin_cycles_per_ms(torch) -> float:
    """Calibrate ``torch.cuda._sleep``: its argument is GPU clock cycles, whose rate varies by GPU and clock."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    torch.cuda.synchronize()
    return 10_000_000 / start.elapsed_time(end)


def _rank_main(rank: int, args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler

    gpus = torch.cuda.device_count()
    backend = "nccl" if gpus >= args.world else "gloo"
    device = torch.device("cuda", rank % gpus)
    torch.cuda.set_device(device)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group(backend, rank=rank, world_size=args.world)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width, device=device)
    cycles = _spin_cycles_per_ms(torch) * args.slow_ms if rank == args.slow_rank else 0

    def spin(_grad):  # runs in backward, on the GPU only: one kernel launch
        if cycles:
            torch.cuda._sleep(int(cycles))

    model[len(model) // 2].weight.register_hook(spin)
    out = Path(args.out)
    sched = schedule(wait=2, warmup=2, active=args.steps - 4)
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=sched,
        on_trace_ready=tensorboard_trace_handler(str(out), worker_name=f"rank-{rank}", use_gzip=True),
    ) as prof:
        for step in range(args.steps):
            with record_function("forward"):
                loss = model(x).square().mean()
            with record_function("backward"):
                loss.backward()
            with record_function("allreduce"):
                for p in model.parameters():
                    dist.all_reduce(p.grad)
            with record_function("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            if (step + 1) % args.queue_depth == 0:
                loss.item()  # the only sync: the host runs up to queue_depth steps ahead of the GPU
            prof.step()
    torch.cuda.synchronize()
    dist.destroy_process_group()


def _check(args: argparse.Namespace) -> int:
    doc = json.loads(
        subprocess.run(
            [sys.executable, "-m", "hpcwatch", "steps", args.out, "--json"], check=True, capture_output=True, text=True
        ).stdout
    )
    print("GPU clock:", json.dumps(doc.get("gpu_clock")))
    print("stragglers:", json.dumps(doc["stragglers"], indent=1))
    found = [s for s in doc["stragglers"] if s["rank"] == args.slow_rank]
    ok = bool(found) and bool({"gpu_compute", "late_arrival"} & set(found[0]["evidence"]))
    others = [s for s in doc["stragglers"] if s["rank"] != args.slow_rank and not s["host_only"]]
    ok = ok and not others
    if found and found[0]["gpu_excess_s"] is not None:
        print(f"GPU excess {found[0]['gpu_excess_s'] * 1e3:.2f} ms/step (planted {args.slow_ms} ms)")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--slow-rank", type=int, default=2)
    parser.add_argument("--slow-ms", type=float, default=20.0)
    parser.add_argument("--queue-depth", type=int, default=2)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--port", type=int, default=29533)
    parser.add_argument("--capture-only", action="store_true", help="write the traces, do not check them")
    parser.add_argument("--check-only", action="store_true", help="check traces written before in --out")
    args = parser.parse_args()
    if args.check_only:
        return _check(args)
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError:
        print("torch is not installed: nothing to capture", file=sys.stderr)
        return 77
    if not torch.cuda.is_available():
        print("no CUDA GPU here: this check runs on a machine with one", file=sys.stderr)
        return 77
    Path(args.out).mkdir(parents=True, exist_ok=True)
    mp.spawn(_rank_main, args=(args,), nprocs=args.world, join=True)
    return 0 if args.capture_only else _check(args)


if __name__ == "__main__":
    sys.exit(main())
