"""A real 3-rank torch.distributed job (gloo, CPU) where one rank tampers with its gradients.

Each rank runs the training hook (instrument/torch.py, ``StepRecorder`` with
``sketch_dims``), which writes its local gradient norm and sketch as JSON lines before
the all_reduce; the attacking rank scales (or flips) its gradient first, as a
compromised worker would. The detector, reading only the hook's files, must name the
rank, and stay quiet when nobody tampers. A fast test checks the hook's sketch against
its definition.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hpcwatch.records import Sample
from hpcwatch.security.gradients import SKETCH_DIMS, detect_gradient_anomalies
from hpcwatch.sources.hook import read_hook_jsonl
from tests.conftest import free_port

torch = pytest.importorskip("torch")
slow = pytest.mark.slow  # three torch imports: ~10 s idle, a minute on a loaded 2-core box

WORLD = 3
STEPS = 8
ATTACK_FROM_STEP = 2

WORKER = textwrap.dedent("""
    import sys
    import torch, torch.distributed as dist, torch.nn.functional as F
    from hpcwatch.instrument.torch import StepRecorder
    from hpcwatch.security.gradients import SKETCH_DIMS

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
        with StepRecorder(job=f"gloo-{mode}", rank=rank, out_dir=f"{out}/{mode}", node=f"node{1 + rank // 2}",
                          gpu=rank % 2, keep=False, sketch_dims=SKETCH_DIMS, sketch_seed=7) as rec:
            for step in range(steps):
                with rec.step(step):
                    x = torch.randn(64, 32, generator=data)
                    y = (x @ w_true).argmax(dim=1)
                    with rec.phase("forward"):
                        loss = F.cross_entropy(model(x), y)
                    with rec.phase("backward"):
                        loss.backward()
                    if rank == attacker and step >= start:
                        for p in model.parameters():
                            p.grad.mul_(25.0 if mode == "scale" else -1.0)
                    rec.gradients(model.parameters())          # before the all_reduce, as the hook asks
                    with rec.phase("allreduce"):
                        for p in model.parameters():
                            dist.all_reduce(p.grad)
                            p.grad /= world
                    with rec.phase("optimizer"):
                        opt.step()
                        opt.zero_grad()
                    rec.loss(loss)
    dist.barrier()
    dist.destroy_process_group()
    # Out without the interpreter's teardown: under load, a gloo thread still joinable when torch's
    # statics are destroyed aborts the process ("terminate called without an active exception", -6)
    # after all its work is written. The recorder has closed its files above.
    sys.stdout.flush(); sys.stderr.flush()
    import os; os._exit(0)
""")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    """Samples of the three runs (scale: rank 2, flip: rank 1, none), from one real 3-process job."""
    tmp = tmp_path_factory.mktemp("gloo")
    script = tmp / "worker.py"
    script.write_text(WORKER)
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), str(WORLD), str(tmp), str(STEPS), str(ATTACK_FROM_STEP)],
            env=env,
            stderr=subprocess.PIPE,
        )
        for r in range(WORLD)
    ]
    for p in procs:
        _, err = p.communicate(timeout=110)
        assert p.returncode == 0, err.decode()[-2000:]
    return {
        mode: [
            s for r in range(WORLD) for s in read_hook_jsonl(tmp / mode / f"rank-{r}.jsonl") if isinstance(s, Sample)
        ]
        for mode in ("scale", "flip", "none")
    }


@slow
@pytest.mark.timeout(120)  # < 15 s on an idle machine; 4 torch imports on a loaded one take longer
def test_gloo_rank_that_scales_its_gradients_is_named(runs: dict[str, list]) -> None:
    findings = detect_gradient_anomalies(runs["scale"])
    assert {(f.rule, f.evidence["rank"]) for f in findings} == {("gradient.norm_outlier", 2)}
    assert findings[0].evidence["steps"][0] == ATTACK_FROM_STEP
    assert findings[0].evidence["host"] == "node2"


@slow
def test_gloo_rank_that_flips_its_gradients_is_named_by_its_sketch(runs: dict[str, list]) -> None:
    findings = detect_gradient_anomalies(runs["flip"])
    assert {(f.rule, f.evidence["rank"]) for f in findings} == {("gradient.sketch_direction", 1)}


@slow
def test_gloo_honest_ranks_raise_nothing(runs: dict[str, list]) -> None:
    assert detect_gradient_anomalies(runs["none"]) == []


@slow
def test_gloo_hook_writes_the_sketch_the_detector_reads(runs: dict[str, list]) -> None:
    sketch = [s for s in runs["none"] if s.metric == "train_grad_sketch"]
    assert len(sketch) == WORLD * STEPS * SKETCH_DIMS
    assert {s.labels["dim"] for s in sketch} == {str(i) for i in range(SKETCH_DIMS)}
    assert {s.labels["node"] for s in sketch} == {"node1", "node2"}


def _reference_sketch(flat: np.ndarray, dims: int, seed: int) -> np.ndarray:
    """The sketch by its definition: element i, sign table[i mod period], bucket i mod dims."""
    from hpcwatch.instrument.torch import _SIGN_PERIOD

    signs = (
        torch.randint(0, 2, (_SIGN_PERIOD,), generator=torch.Generator().manual_seed(seed), dtype=torch.int8) * 2 - 1
    ).numpy()
    i = np.arange(flat.size)
    return np.bincount(i % dims, weights=flat * signs[i % _SIGN_PERIOD], minlength=dims)


def _hook_sketch(params: list, *, dims: int = SKETCH_DIMS, seed: int = 0) -> np.ndarray:
    from hpcwatch.instrument.torch import StepRecorder

    rec = StepRecorder(job="j", rank=0, sketch_dims=dims, sketch_seed=seed)
    with rec.step(0):
        rec.gradients(iter(params))  # a generator, as model.parameters() is
    rec.close()
    return np.array([r.value for r in rec.records if r.metric == "train_grad_sketch"])


def test_hook_sketch_is_the_signed_bucket_sum_across_parameters() -> None:
    # Shapes straddle the concatenation batch and the sign table's period; one parameter has no
    # gradient (its elements still count, so ranks that skip it number the rest alike).
    gen = torch.Generator().manual_seed(3)
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (3, 300_000, 17, 5, 1_200_001)]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    params[2].grad = None
    flat = np.concatenate([p.grad.numpy() if p.grad is not None else np.zeros(p.numel()) for p in params])
    got = _hook_sketch(params, dims=24, seed=5)
    np.testing.assert_allclose(got, _reference_sketch(flat, 24, 5), rtol=1e-4, atol=1e-3)


def test_hook_sketch_of_gradients_many_periods_long_is_the_same_signed_bucket_sum(monkeypatch) -> None:
    # A gradient of several sign periods is sketched a block of whole periods at a time (here 3: blocks of 3,
    # 3, then a period and a half one period at a time), after a parameter that leaves it off the period's start.
    from hpcwatch.instrument import torch as hook

    monkeypatch.setattr(hook, "_SKETCH_ROWS", 3)
    gen = torch.Generator().manual_seed(6)
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (70_001, int(7.5 * hook._SIGN_PERIOD))]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    flat = np.concatenate([p.grad.numpy() for p in params])
    got = _hook_sketch(params, dims=32, seed=7)
    np.testing.assert_allclose(got, _reference_sketch(flat, 32, 7), rtol=1e-4, atol=1e-2)


def test_hook_sketch_cosine_tracks_the_gradients_cosine() -> None:
    gen = torch.Generator().manual_seed(4)
    base = torch.randn(50_000, generator=gen)
    noise = torch.randn(50_000, generator=gen)
    sketches = []
    for grad in (base, base + 0.5 * noise, -base):
        p = torch.nn.Parameter(torch.zeros(50_000))
        p.grad = grad.clone()
        sketches.append(_hook_sketch([p]))
    cos = lambda a, b: float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))  # noqa: E731
    true = float(torch.nn.functional.cosine_similarity(base, base + 0.5 * noise, dim=0))  # about 0.89
    assert abs(cos(sketches[0], sketches[1]) - true) < 0.15
    assert cos(sketches[0], sketches[2]) == pytest.approx(-1.0)
