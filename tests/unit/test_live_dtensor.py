"""The live stream of a real 4-process DTensor job on a 2×2 ``DeviceMesh`` (gloo, CPU), judged while it runs.

NVRx's straggler ``Detector`` all-reduces and all-gathers its reports on the default process group; under
DTensor's per-mesh sub-groups, called from a subset of the ranks, it blocks (NVIDIA/nvidia-resiliency-ext#277,
as NVIDIA-NeMo/RL#1992 sums it up). The hook calls no collective, so it cannot. This test runs such a job
and checks it end to end:

- each step, a ``Shard(0)`` DTensor is multiplied by a replicated one in ``forward`` (local: no
  collective), ``redistribute``d to ``Replicate()`` over the ``dp`` dimension (an all-gather on that
  sub-group of 2 ranks) and a ``Partial()`` one reduced over the ``tp`` dimension (an all-reduce on the
  other sub-group), each inside a hook phase;
- rank 3 sleeps in its ``forward`` for the first steps: ``collect.live`` names it a straggler while the
  ranks wait, before their last step, for the test's go (a file, so the job's own collectives stay the
  only ones);
- the job ends by itself, each rank bounded by ``faulthandler`` (its stacks go to its own stderr file,
  which a failure shows); every rank's stream holds every step and its close;
- each rank's Flight Recorder, dumped after ``rec.close()``, holds exactly the job's collectives: one
  ``all_gather`` on ``mesh_dp`` and one ``all_reduce`` on ``mesh_tp`` per step, in sequence, all from the
  training thread. A collective from the hook, on any group or thread, would add an entry.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from tests.unit.forkranks import beside
from tests.unit.test_hook_gloo import needs_torch
from tests.unit.test_live_gloo import _end, _errors, _gloo_env, _start, _wait

WORLD = 4
STEPS = 8
STRAGGLER = 3  # on node2; its dp peer is rank 1, its tp peer rank 2
SLOW_STEPS = 6
DELAY_S = 0.25  # as test_hook_gloo: it stays the slowest rank on a loaded machine
# A rank still running then dumps its stacks to its stderr and exits: a deadlock fails the test with each
# rank's stacks (the test takes 6 s on 2 idle cores, 12 s with stress-ng on both)
RANK_LIMIT_S = 45
JOB = "dtensor-test"

WORKER = textwrap.dedent("""
    import faulthandler, json, os, sys, threading, time, traceback
    import torch, torch.distributed as dist
    import torch._C._distributed_c10d as c10d
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    from hpcwatch.instrument.torch import StepRecorder

    world, ctl, steps = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    straggler, slow_steps, delay_s, limit_s = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7])

    def run(rank):
        torch.set_num_threads(1)
        # made before the process group: the recorder then gives Flight Recorder its buffer
        rec = StepRecorder(job="dtensor-test", rank=rank, node=f"node{1 + rank // 2}", gpu=rank % 2, keep=False)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        torch.manual_seed(mesh.get_coordinate()[0])  # one batch per dp shard, the same across tp
        w = DTensor.from_local(torch.randn(8, 8), mesh, [Replicate(), Replicate()])
        for step in range(steps):
            if step == steps - 1:  # the last step waits for the test's go, polled: no collective
                while not os.path.exists(os.path.join(ctl, "go")):
                    time.sleep(0.02)
            with rec.step(step):
                with rec.phase("load"):
                    x = DTensor.from_local(torch.randn(4, 8), mesh, [Shard(0), Replicate()])
                with rec.phase("forward"):
                    y = torch.tanh(x @ w)  # Shard(0) @ Replicate(): each rank its own rows
                    if rank == straggler and step < slow_steps:
                        time.sleep(delay_s)
                with rec.phase("allreduce", collective="all_gather[dp]"):
                    full = y.redistribute(mesh, [Replicate(), Replicate()]).to_local()
                with rec.phase("allreduce", collective="all_reduce[tp]"):
                    part = DTensor.from_local(full.sum(0), mesh, [Replicate(), Partial()])
                    total = part.redistribute(mesh, [Replicate(), Replicate()]).to_local()
                with rec.phase("optimizer"):
                    w = w * (1 - 1e-3 * total.mean().item())  # a replicated update: local
        rec.close()
        dump = json.loads(c10d._dump_fr_trace_json(True, False))
        with open(os.path.join(ctl, f"fr-{rank}.json"), "w") as out:
            json.dump({"thread": str(threading.get_ident()), "entries": dump.get("entries", [])}, out)
        dist.destroy_process_group()

    def own_stderr_and_time_limit(rank):
        err = os.open(os.path.join(ctl, f"rank-{rank}.err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(err, 2)  # each rank's stderr its own: a failure shows which rank said what
        faulthandler.dump_traceback_later(limit_s, exit=True)

    from forkranks import fork_ranks
    failed = fork_ranks(world, run, setup=own_stderr_and_time_limit)
    for rank in range(world) if failed else ():
        with open(os.path.join(ctl, f"rank-{rank}.err")) as err:
            sys.stderr.write(f"--- rank {rank}:\\n{err.read()[-900:]}\\n")
    sys.exit(1 if failed else 0)
""")


def _ranks_stderr(ctl: Path) -> str:
    """Each rank's stderr, its end: where a rank stuck past its limit was (``faulthandler``'s stacks)."""
    return "\n".join(
        f"--- rank {r}:\n{p.read_bytes().decode(errors='replace')[-900:] if p.exists() else '(none)'}"
        for r, p in ((r, ctl / f"rank-{r}.err") for r in range(WORLD))
    )


def _stream(spool: Path, rank: int) -> tuple[dict[int, list[str]], bool]:
    """One rank's stream as written: its spans' phases by step, and whether it says the recorder closed."""
    from hpcwatch.records import Event, Span
    from hpcwatch.sources.livehook import CLOSED, parse_live_line, stream_name

    path = spool / JOB / stream_name(rank)
    phases: dict[int, list[str]] = {}
    closed = False
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        record = parse_live_line(line, path=path, number=number)
        if isinstance(record, Span):
            phases.setdefault(record.step, []).append(record.phase)
        elif isinstance(record, Event) and record.attrs.get("phase") == CLOSED:
            closed = True
    return phases, closed


def _collectives(ctl: Path, rank: int) -> tuple[list[tuple[str, str, int]], set[str]]:
    """One rank's Flight Recorder after its last step: (group, op, sequence) per entry, and the threads that
    issued them, with the training thread's id removed (so a set left non-empty names another thread)."""
    doc = orjson.loads((ctl / f"fr-{rank}.json").read_bytes())
    entries = [(e["process_group"][1], e["profiling_name"], e["collective_seq_id"]) for e in doc["entries"]]
    return entries, {str(e["thread_id"]) for e in doc["entries"]} - {doc["thread"]}


@pytest.mark.slow
@needs_torch
def test_a_dtensor_job_on_a_2x2_mesh_streams_its_straggler_and_ends_with_only_its_own_collectives(
    tmp_path: Path,
) -> None:
    from hpcwatch.collect.config import LiveSection
    from hpcwatch.collect.live import LiveCollector
    from hpcwatch.store import Store, queries
    from hpcwatch.vocab import EventKind

    spool, ctl = tmp_path / "spool", tmp_path / "ctl"
    ctl.mkdir()
    script = tmp_path / "_worker.py"
    script.write_text(WORKER)
    beside(script)
    argv = [sys.executable, str(script), str(WORLD), str(ctl), str(STEPS)]
    argv += [str(STRAGGLER), str(SLOW_STEPS), str(DELAY_S), str(RANK_LIMIT_S)]
    job = _start(argv, _gloo_env(HPCWATCH_LIVE_DIR=str(spool)), tmp_path)
    try:
        with Store(tmp_path / "db") as store:
            # a hang needs 30 s of no progress: the ranks held before their last step are not one
            collector = LiveCollector(store, LiveSection(path=str(spool), hang_after_s=30.0, interval_s=0.2))
            wait = {"store": store, "job_proc": job}
            straggler = _wait(
                collector, kind=EventKind.LIVE_STRAGGLER, ok=lambda e: True, deadline_s=RANK_LIMIT_S + 15, **wait
            )
            assert (straggler.attrs["rank"], straggler.attrs["phase"]) == (STRAGGLER, "forward")
            assert (straggler.attrs["node"], straggler.attrs["gpu"]) == ("node2", 1)
            assert max(straggler.attrs["steps"]) < STEPS - 1  # named while the job runs: its last step is held

            (ctl / "go").touch()
            try:
                code = job.wait(timeout=RANK_LIMIT_S + 30)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the job outlived its ranks' limit:\n{_ranks_stderr(ctl)}")
            assert code == 0, _errors(job)
            collector.run()
            assert all(r.closed for r in collector.jobs[JOB].ranks.values())
            _, hangs = queries.events_of_kinds(store, [EventKind.LIVE_HANG])
            assert hangs == []
    finally:
        _end(job)

    _assert_every_step_streamed(spool)
    _assert_only_the_jobs_collectives(ctl)


def _assert_every_step_streamed(spool: Path) -> None:
    one_step = ["load", "forward", "allreduce", "allreduce", "optimizer"]
    for rank in range(WORLD):
        phases, closed = _stream(spool, rank)
        assert phases == {step: one_step for step in range(STEPS)} and closed, f"rank {rank}'s stream"


def _assert_only_the_jobs_collectives(ctl: Path) -> None:
    """Per step, the dp all-gather then the tp all-reduce, numbered 1.. on each group: nothing else."""
    expected = [
        (group, op, step + 1)
        for step in range(STEPS)
        for group, op in (("mesh_dp", "gloo:all_gather"), ("mesh_tp", "gloo:all_reduce"))
    ]
    for rank in range(WORLD):
        entries, other_threads = _collectives(ctl, rank)
        assert entries == expected, f"rank {rank}: collectives other than the job's"
        assert other_threads == set(), f"rank {rank}: a collective from a thread other than training"
