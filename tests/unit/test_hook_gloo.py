"""A real 4-process torch.distributed job (gloo, CPU) with one planted straggler.

Rank 2 sleeps in its backward; the others then wait for it in the all-reduce. The
hook's spans and the profiler's Kineto traces of the same run must both name rank 2
and its slow phase. Run this file as a script to regenerate tests/data/kineto/gloo_straggler/:

    .venv/bin/python tests/unit/test_hook_gloo.py tests/data/kineto/gloo_straggler
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch") if __name__ != "__main__" else None

WORLD = 4
STRAGGLER = 2
DELAY_S = 0.04
STEPS = 6

# The training script each rank runs: a small MLP, data parallel by hand (one all_reduce per
# gradient, as DDP does per bucket), the hook around every phase, the profiler on steps 2-4.
WORKER = textwrap.dedent('''
    import os, sys, time
    import torch, torch.distributed as dist, torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile, record_function, schedule
    from hpcwatch.instrument.torch import StepRecorder

    rank, world, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    straggler, delay_s, steps = int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = StepRecorder(job="gloo-test", rank=rank, out_dir=os.path.join(out, "hook"),
                       node=f"node{1 + rank // 2}", gpu=rank % 2)

    def one_step(step):
        with rec.step(step):
            with rec.phase("load"), record_function("data_load"):
                x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
            with rec.phase("forward"), record_function("forward"):
                loss = F.cross_entropy(model(x), y)
            with rec.phase("backward"), record_function("backward"):
                loss.backward()
                if rank == straggler:
                    time.sleep(delay_s)
            rec.gradients(model.parameters())
            with rec.phase("allreduce"), record_function("allreduce"):
                for p in model.parameters():
                    dist.all_reduce(p.grad)
                    p.grad /= world
            with rec.phase("optimizer"), record_function("optimizer"):
                opt.step()
                opt.zero_grad()
            rec.loss(loss)

    trace = os.path.join(out, f"rank-{rank}.json")
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3),
                 on_trace_ready=lambda p: p.export_chrome_trace(trace)) as prof:
        for step in range(steps):
            one_step(step)
            prof.step()
    rec.close()
    dist.barrier()
    dist.destroy_process_group()
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(out: Path, *, world: int = WORLD, straggler: int = STRAGGLER, delay_s: float = DELAY_S,
            steps: int = STEPS, timeout_s: float = 90) -> Path:
    """Run the job; ``out`` gets rank-N.json traces and hook/rank-N.jsonl."""
    out.mkdir(parents=True, exist_ok=True)
    script = out / "_worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), OMP_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME="lo")
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(world), str(out), str(straggler),
                               str(delay_s), str(steps)], env=env, stderr=subprocess.PIPE)
             for r in range(world)]
    errors = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        if p.returncode != 0:
            errors.append(err.decode(errors="replace")[-2000:])
    script.unlink()
    assert not errors, errors
    return out


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory) -> Path:
    return run_job(tmp_path_factory.mktemp("gloo"))


def test_hook_spans_name_the_planted_straggler(gloo_run):
    from hpcwatch.analysis.steps import anatomy_from_spans
    from hpcwatch.analysis.stragglers import find_stragglers
    from hpcwatch.instrument.torch import read_hook_jsonl
    from hpcwatch.records import Sample, Span

    records = [r for f in sorted((gloo_run / "hook").glob("rank-*.jsonl")) for r in read_hook_jsonl(f)]
    spans = [r for r in records if isinstance(r, Span)]
    assert {s.rank for s in spans} == set(range(WORLD))
    report = find_stragglers(anatomy_from_spans(spans))
    assert [s.rank for s in report.stragglers] == [STRAGGLER]
    top = report.stragglers[0]
    assert (top.phase, top.node, top.gpu) == ("backward", "node2", 0)
    # The others wait for it in the all-reduce: most of the planted delay shows up as their barrier wait.
    waits = {r.rank: r.phases["barrier_wait"] for r in report.ranks}
    assert min(waits[r] for r in range(WORLD) if r != STRAGGLER) > 0.5 * DELAY_S
    assert waits[STRAGGLER] < 0.3 * DELAY_S
    grad_norms = [r for r in records if isinstance(r, Sample) and r.metric == "train_grad_norm"]
    assert len(grad_norms) == WORLD * STEPS and all(s.value > 0 for s in grad_norms)


def test_kineto_traces_name_the_planted_straggler_through_the_cli(gloo_run):
    import orjson
    from typer.testing import CliRunner

    from hpcwatch.cli import app

    result = CliRunner().invoke(app, ["steps", str(gloo_run), "--json"])
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.stdout)
    assert doc["world_size"] == WORLD
    assert [s["rank"] for s in doc["stragglers"]] == [STRAGGLER]
    assert doc["stragglers"][0]["phase"] == "backward"


if __name__ == "__main__":
    run_job(Path(sys.argv[1]))
