"""Overhead of the training-loop hook (instrument/torch.py) on a CPU training step.

Runs the same loop (an MLP of ~4.2M parameters, batch 256, SGD) without the recorder,
with it, and with it writing the gradient sketch too (``sketch_dims=32``), steps
interleaved so machine noise hits all alike, and reports the median step time of each,
plus the hook's own cost measured directly (the time spent inside its calls): phases
only, with the gradient norm/NaN count, and with the sketch as well. Times are the thread's CPU time
(``time.thread_time``; torch runs on this one thread), which a busy shared machine
disturbs far less than wall time.

The live stream (``instrument/live.py``, ``live_dir``) is measured the same way, plus its writer
thread: the process's CPU time over the live steps less the training thread's is what the thread
spent writing the stream and polling the control file. The step here has no all-reduce (one
process): a gloo or NCCL step only adds to the step, so the percentages are upper bounds.

    .venv/bin/python benchmarks/bench_hook_overhead.py [--steps 40] [--device cuda]

``--device cuda``: the same loop on the GPU, the recorders timing phases with CUDA events
(``HookConfig.device="cuda"``); a step is then timed in wall time up to a ``torch.cuda.synchronize()`` at its
end (the step's real length: the host only queues work), the hook's own calls in thread CPU time as on CPU.
Ran on one NVIDIA H200 on 2026-12-04 (RESULTS.md).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

from hpcwatch.instrument.torch import StepRecorder


def _model(width: int = 512) -> torch.nn.Module:
    layers = []
    for _ in range(16):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


def _plain_step(model, opt, x, y) -> None:
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()


def _hooked_step(rec: StepRecorder, step: int, model, opt, x, y, *, grads: bool) -> None:
    with rec.step(step):
        with rec.phase("forward"):
            loss = F.cross_entropy(model(x), y)
        with rec.phase("backward"):
            loss.backward()
        if grads:
            rec.gradients(model.parameters())
        with rec.phase("optimizer"):
            opt.step()
            opt.zero_grad()
        rec.loss(loss)


def _hook_cost_s(rec: StepRecorder, model, step: int, *, grads: bool) -> float:
    """Time inside the hook's own calls for one step whose work is already done (grads present)."""
    t0 = time.thread_time()
    with rec.step(step):
        for phase in ("forward", "backward", "allreduce", "optimizer"):
            with rec.phase(phase, "all_reduce" if phase == "allreduce" else None):
                pass
        if grads:
            rec.gradients(model.parameters())
        rec.loss(torch.tensor(1.0))
    return time.thread_time() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--width", type=int, default=512, help="of the MLP's 16 layers (512: 4.2M parameters)")
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    gpu = args.device == "cuda"
    model = _model(args.width).to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.width, device=args.device)
    y = torch.randint(0, 10, (args.batch,), device=args.device)
    params = sum(p.numel() for p in model.parameters())

    def clock() -> float:  # a GPU step lasts until its queued work is done
        if gpu:
            torch.cuda.synchronize()
            return time.perf_counter()
        return time.thread_time()

    with tempfile.TemporaryDirectory() as tmp:
        on = {"device": args.device, "gpu": 0 if gpu else None, "keep": False}
        rec = StepRecorder(job="bench", rank=0, out_dir=tmp, **on)
        rec_sketch = StepRecorder(job="bench", rank=1, out_dir=tmp, sketch_dims=32, **on)
        rec_live = StepRecorder(job="bench", rank=2, live_dir=f"{tmp}/live", **on)
        plain, hooked, sketched, live = [], [], [], []
        live_thread = live_process = plain_others = 0.0
        for step in range(args.steps):
            t0 = clock()
            p0, c0 = time.process_time(), time.thread_time()
            _plain_step(model, opt, x, y)
            t1 = clock()
            p1, c1 = time.process_time(), time.thread_time()
            _hooked_step(rec, step, model, opt, x, y, grads=True)
            t2 = clock()
            _hooked_step(rec_sketch, step, model, opt, x, y, grads=True)
            t3 = clock()
            p3, c3 = time.process_time(), time.thread_time()
            _hooked_step(rec_live, step, model, opt, x, y, grads=True)
            t4, p4, c4 = clock(), time.process_time(), time.thread_time()
            if step >= 3:  # warm-up
                plain.append(t1 - t0)
                hooked.append(t2 - t1)
                sketched.append(t3 - t2)
                live.append(t4 - t3)
                live_thread += c4 - c3
                live_process += p4 - p3
                plain_others += (p1 - p0) - (c1 - c0)  # the process's other threads without the stream (CUDA's)
        loss = F.cross_entropy(model(x), y)
        loss.backward()  # gradients present for the direct cost
        cost_grads = statistics.median(_hook_cost_s(rec, model, 10_000 + i, grads=True) for i in range(30))
        cost_phases = statistics.median(_hook_cost_s(rec, model, 20_000 + i, grads=False) for i in range(30))
        cost_sketch = statistics.median(_hook_cost_s(rec_sketch, model, 30_000 + i, grads=True) for i in range(30))
        cost_live = statistics.median(_hook_cost_s(rec_live, model, 40_000 + i, grads=False) for i in range(30))
        written = rec_live._live.written if rec_live._live is not None else 0
        rec.close()
        rec_sketch.close()
        rec_live.close()
    step_s = statistics.median(plain)
    where = f"GPU ({torch.cuda.get_device_name(0)})" if gpu else "CPU, 1 thread"
    timed = "wall time to the step's synchronize" if gpu else "CPU time"
    print(f"model {params / 1e6:.1f}M parameters, batch {args.batch}, {where}, {len(plain)} steps each")
    for name, times in (("with hook", hooked), ("with hook + sketch", sketched), ("with hook + live stream", live)):
        print(
            f"median step: plain {step_s * 1e3:.2f} ms, {name} {statistics.median(times) * 1e3:.2f} ms "
            f"({100 * (statistics.median(times) / step_s - 1):+.2f} %, {timed}, includes noise)"
        )
    print(
        f"hook's own cost per step: phases + loss + write {cost_phases * 1e6:.0f} µs "
        f"({100 * cost_phases / step_s:.2f} % of the step); with gradient norm/NaN count {cost_grads * 1e6:.0f} µs "
        f"({100 * cost_grads / step_s:.2f} %); with the 32-bucket gradient sketch too {cost_sketch * 1e6:.0f} µs "
        f"({100 * cost_sketch / step_s:.2f} %)"
    )
    # The writer thread: the process's other threads during a live step, less theirs during a plain step.
    writer = max(live_process - live_thread - plain_others, 0.0) / max(len(live), 1)
    print(
        f"live stream: the training thread's cost {cost_live * 1e6:.0f} µs a step "
        f"({100 * cost_live / step_s:.2f} % of the step: phases, enter marks, loss), the writer thread's "
        f"{writer * 1e6:.0f} µs a step ({100 * writer / step_s:.2f} %); {written} stream lines written; "
        f"total {100 * (cost_live + writer) / step_s:.2f} % of the step"
    )


if __name__ == "__main__":
    main()
