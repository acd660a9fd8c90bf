"""A real 4-process torch.distributed job (gloo, CPU) with one planted straggler.

Rank 2 sleeps in its backward; the others then wait for it in the all-reduce. The
hook's spans and the profiler's Kineto traces of the same run must both name rank 2
and its slow phase. Run this file as a script to regenerate tests/data/kineto/gloo_straggler/:

    .venv/bin/python tests/unit/test_hook_gloo.py tests/data/kineto/gloo_straggler
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.unit.forkranks import beside

# Only the job's processes need torch; finding it is enough here (importing it costs seconds).
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (hpcwatch[torch])")

WORLD = 4
STRAGGLER = 2
# Strong enough to stay the slowest rank when the machine is loaded (stress-ng on every core delays any rank by
# tens of ms at random); 40 ms was lost in that noise.
DELAY_S = 0.25
STEPS = 6

# The training script each rank runs: a small MLP, data parallel by hand (one all_reduce per
# gradient, as DDP does per bucket), the hook around every phase, the profiler on steps 2-4.
# The training script: a small MLP, data parallel by hand (one all_reduce per gradient, as DDP does
# per bucket), the hook around every phase, the profiler on steps 2-4. One launcher process imports
# torch once and forks the ranks before any torch op runs (importing torch 4 times on a small shared
# machine took most of the test's time).
WORKER = textwrap.dedent("""
    import os, sys, time, traceback
    import torch, torch.distributed as dist, torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile, record_function, schedule
    from hpcwatch.instrument.torch import StepRecorder

    world, out = int(sys.argv[1]), sys.argv[2]
    straggler, delay_s, steps = int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])

    def run(rank):
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

    from forkranks import fork_ranks
    sys.exit(1 if fork_ranks(world, run) else 0)
""")


def run_job(
    out: Path,
    *,
    world: int = WORLD,
    straggler: int = STRAGGLER,
    delay_s: float = DELAY_S,
    steps: int = STEPS,
    timeout_s: float = 90,
) -> Path:
    """Run the job; ``out`` gets rank-N.json traces and hook/rank-N.jsonl."""
    out.mkdir(parents=True, exist_ok=True)
    script = out / "_worker.py"
    script.write_text(WORKER)
    beside(script)
    env = dict(
        os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo"
    )
    proc = subprocess.run(
        [sys.executable, str(script), str(world), str(out), str(straggler), str(delay_s), str(steps)],
        env=env,
        stderr=subprocess.PIPE,
        timeout=timeout_s,
    )
    script.unlink()
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    return out


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory) -> Path:
    return run_job(tmp_path_factory.mktemp("gloo"))


@pytest.mark.slow
@needs_torch
def test_hook_spans_name_the_planted_straggler(gloo_run):
    from hpcwatch.analysis.steps import anatomy_from_spans
    from hpcwatch.analysis.stragglers import find_stragglers
    from hpcwatch.records import Sample, Span
    from hpcwatch.sources.hook import read_hook_jsonl

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


@pytest.mark.slow
@needs_torch
def test_kineto_traces_name_the_planted_straggler_through_the_cli(gloo_run):
    import orjson
    from click.testing import CliRunner

    from hpcwatch.cli import app

    result = CliRunner().invoke(app, ["steps", str(gloo_run), "--json"])
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.stdout)
    assert doc["world_size"] == WORLD
    assert [s["rank"] for s in doc["stragglers"]] == [STRAGGLER]
    assert doc["stragglers"][0]["phase"] == "backward"


# --- the hook's output without a job: fast, no torch needed ---------------------------------------


def test_stored_hook_spans_feed_steps_from_the_store(data_dir, tmp_path):
    import orjson
    from click.testing import CliRunner

    from hpcwatch.cli import app
    from hpcwatch.sources.hook import read_hook_jsonl
    from hpcwatch.store import Store

    db = tmp_path / "hpcwatch.duckdb"
    with Store(db) as store:
        for f in sorted((data_dir / "kineto" / "gloo_straggler" / "hook").glob("rank-*.jsonl")):
            store.add(read_hook_jsonl(f))
    result = CliRunner().invoke(app, ["steps", "--db", str(db), "--job", "gloo-test", "--json"])
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.stdout)
    assert doc["source"] == "spans" and doc["world_size"] == 4 and len(doc["steps"]) == 6
    assert [(s["rank"], s["node"], s["gpu"], s["phase"]) for s in doc["stragglers"]] == [(2, "node2", 0, "backward")]
    assert set(doc["ranks"][0]["phases"]) == {"load", "forward", "backward", "allreduce", "optimizer", "barrier_wait"}


def test_steps_reads_the_hook_files_directly(data_dir):
    import orjson
    from click.testing import CliRunner

    from hpcwatch.cli import app

    result = CliRunner().invoke(app, ["steps", str(data_dir / "kineto" / "gloo_straggler" / "hook"), "--json"])
    assert result.exit_code == 0, result.output
    assert [s["rank"] for s in orjson.loads(result.stdout)["stragglers"]] == [2]


def test_steps_needs_traces_or_a_job():
    from click.testing import CliRunner

    from hpcwatch.cli import app

    result = CliRunner().invoke(app, ["steps"])
    assert result.exit_code != 0


BAD_LINES = [
    (b"not json\n", "bad hook record"),
    # a span without its duration
    (b'{"kind": "span", "job": "1", "rank": 0, "step": 0, "phase": "forward", "start": 1.0}\n', "KeyError"),
    (b'{"kind": "metric", "job": "1"}\n', "unknown record kind"),
]


@pytest.mark.parametrize("line, message", BAD_LINES)
def test_bad_hook_lines_raise_parse_error_with_the_line(line, message, tmp_path):
    from hpcwatch.errors import ParseError
    from hpcwatch.sources.hook import read_hook_jsonl

    path = tmp_path / "rank-0.jsonl"
    path.write_bytes(b"\n" + line)
    with pytest.raises(ParseError, match=message) as err:
        list(read_hook_jsonl(path))
    assert f"{path}:2:" in str(err.value)


def test_hook_lines_are_sniffed_as_their_own_format(data_dir):
    from hpcwatch.sources.registry import detect

    assert detect(data_dir / "kineto" / "gloo_straggler" / "hook" / "rank-1.jsonl").name == "hook-jsonl"


@pytest.mark.parametrize("fields", [{"rank": -1}, {"device": "tpu"}, {"prometheus_port": 70000}, {"grad_every": 0}])
def test_hook_config_rejects_bad_values(fields):
    from hpcwatch.errors import ConfigError
    from hpcwatch.instrument.torch import HookConfig

    with pytest.raises(ConfigError):
        HookConfig(job="1", **{"rank": 0, **fields})


@needs_torch
def test_recorder_counts_nonfinite_gradients_and_serves_prometheus(tmp_path):
    import httpx
    import torch

    from hpcwatch.instrument.torch import StepRecorder
    from hpcwatch.records import Sample, Span
    from hpcwatch.sources.hook import read_hook_jsonl

    model = torch.nn.Linear(4, 2)
    port = free_port()
    with StepRecorder(job="7", rank=1, node="n1", gpu=3, out_dir=tmp_path, prometheus_port=port) as rec:
        for step in range(2):
            with rec.step(step):
                with rec.phase("forward"):
                    loss = model(torch.ones(3, 4)).sum()
                with rec.phase("backward"):
                    loss.backward()
                if step == 1:
                    model.weight.grad[0, :2] = float("nan")
                rec.gradients(model.parameters())
                rec.loss(loss)
            model.zero_grad()
        scrape = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    assert 'train_grad_nonfinite{gpu="3",job="7",node="n1",rank="1"} 1.0' in scrape  # one parameter
    records = list(read_hook_jsonl(tmp_path / "rank-1.jsonl"))
    by_step = {(r.metric, r.labels["step"]): r.value for r in records if isinstance(r, Sample)}
    assert by_step[("train_grad_nonfinite", "0")] == 0 and by_step[("train_grad_nonfinite", "1")] == 1
    norm_1 = by_step[("train_grad_norm", "1")]
    assert by_step[("train_grad_norm", "0")] > 0 and norm_1 != norm_1  # NaN
    assert {(r.step, r.phase) for r in records if isinstance(r, Span)} == {
        (s, p) for s in (0, 1) for p in ("forward", "backward")
    }


if __name__ == "__main__":
    run_job(Path(sys.argv[1]))
