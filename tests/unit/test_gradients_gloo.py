"""A real 3-rank torch.distributed job (gloo, CPU) where one rank tampers with its gradients.

Each rank computes its local gradient, its norm and a random-projection sketch, and
writes them as hook samples (JSON lines) before the all_reduce; the attacking rank
scales (or flips) its gradient first, as a compromised worker would. The detector,
reading only those files, must name the rank, and stay quiet when nobody tampers.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest

from hpcwatch.instrument.torch import read_hook_jsonl
from hpcwatch.security.gradients import detect_gradient_anomalies

pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # three torch imports: ~10 s idle, a minute on a loaded 2-core box

WORLD = 3
STEPS = 8
ATTACK_FROM_STEP = 2

WORKER = textwrap.dedent('''
    import json, sys, time
    import torch, torch.distributed as dist, torch.nn.functional as F
    from hpcwatch.security.gradients import grad_sketch, gradient_samples

    rank, world, out, steps, start = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    # One process group, three runs (importing torch is the slow part on a busy machine).
    for mode, attacker in (("scale", 2), ("flip", 1), ("none", -1)):
        torch.manual_seed(0)                       # same initial model on every rank
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        data = torch.Generator().manual_seed(100 + rank)   # each rank its own micro-batches
        w_true = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))
        with open(f"{out}/{mode}-rank-{rank}.jsonl", "w") as f:
            for step in range(steps):
                x = torch.randn(64, 32, generator=data)
                y = (x @ w_true).argmax(dim=1)
                F.cross_entropy(model(x), y).backward()
                if rank == attacker and step >= start:
                    for p in model.parameters():
                        p.grad.mul_(25.0 if mode == "scale" else -1.0)
                flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double().numpy()
                norm = float((flat ** 2).sum() ** 0.5)
                for s in gradient_samples(job=f"gloo-{mode}", rank=rank, step=step, t=time.time(), norm=norm,
                                          sketch=grad_sketch(flat, seed=0), node=f"node{1 + rank // 2}", gpu=rank % 2):
                    f.write(json.dumps({"kind": "sample", "metric": s.metric, "labels": dict(s.labels),
                                        "t": s.t, "value": s.value}) + "\\n")
                for p in model.parameters():
                    dist.all_reduce(p.grad)
                    p.grad /= world
                opt.step()
                opt.zero_grad()
    dist.barrier()
    dist.destroy_process_group()
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    """Samples of the three runs (scale: rank 2, flip: rank 1, none), from one real 3-process job."""
    tmp = tmp_path_factory.mktemp("gloo")
    script = tmp / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1",
           "GLOO_SOCKET_IFNAME": "lo"}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(WORLD), str(tmp), str(STEPS),
                               str(ATTACK_FROM_STEP)], env=env, stderr=subprocess.PIPE) for r in range(WORLD)]
    for p in procs:
        _, err = p.communicate(timeout=110)
        assert p.returncode == 0, err.decode()[-2000:]
    return {mode: [s for r in range(WORLD) for s in read_hook_jsonl(tmp / f"{mode}-rank-{r}.jsonl")]
            for mode in ("scale", "flip", "none")}


@pytest.mark.timeout(120)  # < 15 s on an idle machine; 4 torch imports on a loaded one take longer
def test_gloo_rank_that_scales_its_gradients_is_named(runs: dict[str, list]) -> None:
    findings = detect_gradient_anomalies(runs["scale"])
    assert {(f.rule, f.evidence["rank"]) for f in findings} == {("gradient.norm_outlier", 2)}
    assert findings[0].evidence["steps"][0] == ATTACK_FROM_STEP
    assert findings[0].evidence["host"] == "node2"


def test_gloo_rank_that_flips_its_gradients_is_named_by_its_sketch(runs: dict[str, list]) -> None:
    findings = detect_gradient_anomalies(runs["flip"])
    assert {(f.rule, f.evidence["rank"]) for f in findings} == {("gradient.sketch_direction", 1)}


def test_gloo_honest_ranks_raise_nothing(runs: dict[str, list]) -> None:
    assert detect_gradient_anomalies(runs["none"]) == []
