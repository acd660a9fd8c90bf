"""The live stream of a real 4-process torch.distributed job (gloo, CPU), judged while it runs.

One job, three acts, each driven by what the collector has seen (files the test writes, never a sleep):

1. rank 2 sleeps in its backward for the first steps: ``collect.live`` names it a straggler while the
   job runs;
2. the test asks for an on-demand trace of 2 steps (``request_trace``): every rank's trace lands and is
   read;
3. the test plants a hang: rank 1 sleeps inside its all-reduce phase before calling the collective, the
   others wait in ``all_reduce``; the collector names the hang and the collective, asks for the Flight
   Recorder dumps (written by each rank's watcher thread), and reads them: rank 1 never issued it.

Ranks 0 and 1 also all-reduce in a sub-group of their own each step: the hook, which calls no collective,
streams the same from ranks in and out of it. Then the test releases rank 1 and the ranks stop together (an all-reduced flag: the job's own collective).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest

from tests.conftest import free_port
from tests.unit.forkranks import beside
from tests.unit.test_hook_gloo import needs_torch

WORLD = 4
STRAGGLER = 2
HUNG = 1
SLOW_STEPS = 8
DELAY_S = 0.25
JOB = "live-test"

WORKER = textwrap.dedent("""
    import os, sys, time, traceback
    import torch, torch.distributed as dist, torch.nn.functional as F
    from hpcwatch.instrument.torch import StepRecorder

    world, ctl = int(sys.argv[1]), sys.argv[2]
    straggler, hung, slow_steps, delay_s = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])

    def run(rank):
        torch.set_num_threads(1)
        rec = StepRecorder(job="live-test", rank=rank, node=f"node{1 + rank // 2}", gpu=rank % 2, keep=False)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        pair = dist.new_group([0, 1])  # a sub-group: only ranks 0 and 1 call its collective
        stop = torch.zeros(1)
        hung_once = False
        for step in range(100000):
            with rec.step(step):
                with rec.phase("load"):
                    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
                    time.sleep(0.02)
                with rec.phase("forward"):
                    loss = F.cross_entropy(model(x), y)
                with rec.phase("backward"):
                    loss.backward()
                    if rank == straggler and step < slow_steps:
                        time.sleep(delay_s)
                with rec.phase("allreduce", collective="all_reduce"):
                    if rank == hung and not hung_once and os.path.exists(os.path.join(ctl, "hang")):
                        hung_once = True
                        while not os.path.exists(os.path.join(ctl, "release")):
                            time.sleep(0.05)
                    for p in model.parameters():
                        dist.all_reduce(p.grad)
                        p.grad /= world
                    stop[0] = float(rank == 0 and os.path.exists(os.path.join(ctl, "stop")))
                    dist.all_reduce(stop)
                if rank in (0, 1):
                    with rec.phase("pair_sync", collective="all_reduce[0,1]"):
                        dist.all_reduce(torch.ones(1), group=pair)
                with rec.phase("optimizer"):
                    opt.step()
                    opt.zero_grad()
            if stop.item() > 0:
                break
        rec.close()
        dist.destroy_process_group()

    from forkranks import fork_ranks
    sys.exit(1 if fork_ranks(world, run) else 0)
""")


def _gloo_env(**extra: str) -> dict[str, str]:
    """The ranks' environment: one free rendezvous port on loopback, one thread each, and ``extra``."""
    return dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        OMP_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME="lo",
        **extra,
    )


def _start(argv: list[str], env: dict[str, str], tmp_path: Path) -> subprocess.Popen:
    """The job, its stderr in a file: a pipe left full would stop the ranks, and read on a failure would wait
    on ranks still holding it."""
    with open(tmp_path / "job.err", "wb") as err:
        job = subprocess.Popen(argv, env=env, stderr=err, start_new_session=True)  # its ranks: one group
    job.err_path = tmp_path / "job.err"  # type: ignore[attr-defined]
    return job


def _errors(job: subprocess.Popen) -> str:
    return job.err_path.read_bytes().decode(errors="replace")[-4000:]  # type: ignore[attr-defined]


def _end(job: subprocess.Popen) -> None:
    """The job's ranks, ended by their group (the job's own id) when the driver is gone or still there."""
    if job.poll() is None or job.returncode != 0:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def _wait(collector, store, kind, ok, *, deadline_s: float, job_proc) -> object:
    """Run the collector until an event of ``kind`` satisfies ``ok``; the event."""
    from hpcwatch.store import queries

    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        assert job_proc.poll() is None, _errors(job_proc)
        collector.run()
        _, events = queries.events_of_kinds(store, [kind])
        found = [e for e in events if ok(e)]
        if found:
            return found[-1]
        time.sleep(0.1)  # the collector's cadence, not a pass condition
    state = {job: {r: (list(x.steps), x.stop) for r, x in j.ranks.items()} for job, j in collector.jobs.items()}
    raise AssertionError(f"no {kind} event in {deadline_s} s; the collector saw {state}")


@pytest.mark.slow
@needs_torch
def test_live_stream_names_straggler_trace_and_hang_while_the_job_runs(tmp_path: Path) -> None:
    from hpcwatch.collect.config import LiveSection
    from hpcwatch.collect.live import LiveCollector, request_trace
    from hpcwatch.reports.livejob import live_verdicts
    from hpcwatch.store import Store
    from hpcwatch.vocab import EventKind

    spool, ctl = tmp_path / "spool", tmp_path / "ctl"
    ctl.mkdir()
    script = tmp_path / "_worker.py"
    script.write_text(WORKER)
    beside(script)
    env = _gloo_env(HPCWATCH_LIVE_DIR=str(spool))
    argv = [sys.executable, str(script), str(WORLD), str(ctl), str(STRAGGLER), str(HUNG), str(SLOW_STEPS), str(DELAY_S)]
    job = _start(argv, env, tmp_path)
    try:
        with Store(tmp_path / "db") as store:
            collector = LiveCollector(store, LiveSection(path=str(spool), hang_after_s=3.0, interval_s=0.2))
            wait = {"store": store, "job_proc": job}

            straggler = _wait(collector, kind=EventKind.LIVE_STRAGGLER, ok=lambda e: True, deadline_s=60, **wait)
            assert (straggler.attrs["rank"], straggler.attrs["phase"]) == (STRAGGLER, "backward")
            assert straggler.attrs["node"] == "node2"
            assert min(straggler.attrs["steps"]) < SLOW_STEPS  # named from the slow steps, while running

            request = request_trace(spool, JOB, 2)
            seen: set[int] = set()

            def every_rank_traced(e) -> bool:
                if e.attrs["request"] == request and len(e.attrs["steps"]) >= 1:
                    seen.add(e.attrs["rank"])
                return seen == set(range(WORLD))

            _wait(collector, kind=EventKind.LIVE_TRACE, ok=every_rank_traced, deadline_s=30, **wait)

            (ctl / "hang").touch()
            hang = _wait(collector, kind=EventKind.LIVE_HANG, ok=lambda e: True, deadline_s=30, **wait)
            assert hang.attrs["collectives"] == ["all_reduce"]
            assert {s["rank"] for s in hang.attrs["stops"]} == set(range(WORLD))
            dump = _wait(collector, kind=EventKind.LIVE_DUMP, ok=lambda e: True, deadline_s=30, **wait)
            assert dump.attrs["request"] == hang.attrs["dump_request"]
            assert dump.attrs["ranks_dumped"] == list(range(WORLD))
            assert dump.attrs["verdict"] == "hang" and dump.attrs["missing"] == [HUNG]
            assert dump.attrs["wavefront_op"] == "gloo:all_reduce"

            page = live_verdicts(store, JOB)
            assert page.straggler is not None and page.hang is not None and page.dump is not None
            (ctl / "release").touch()
            (ctl / "stop").touch()
            assert job.wait(timeout=60) == 0, _errors(job)
            collector.run()
            # every rank closed its stream: a finished job is not a hang
            assert all(r.closed for r in collector.jobs[JOB].ranks.values())
            later = collector._judge(spool / JOB, collector.jobs[JOB], time.time() + 3600)
            assert EventKind.LIVE_HANG not in [e.kind for e in later]
    finally:
        _end(job)


@pytest.mark.slow
@needs_torch
def test_over_http_a_trace_asked_with_the_cli_and_a_hangs_dump_come_back_through_the_receiver(
    tmp_path: Path, run_cli
) -> None:
    """The same job, 2 ranks, streaming over HTTP only (the node's spool is not the collector's): the
    requests reach the ranks in the receiver's answers, the trace and the dump come back as POSTs."""
    from hpcwatch.collect.config import LiveSection, ReceiveSection
    from hpcwatch.collect.live import LiveCollector
    from hpcwatch.collect.receive import Receiver
    from hpcwatch.sources.kineto import read_kineto
    from hpcwatch.store import Store
    from hpcwatch.vocab import EventKind

    world, token = 2, "node1-token-0123456789"
    node_spool, live_spool, ctl = tmp_path / "node", tmp_path / "live", tmp_path / "ctl"
    ctl.mkdir()
    (tmp_path / "tokens").write_text(f"node1 {token}\n")
    (tmp_path / "token").write_text(token)
    (tmp_path / "in").mkdir()
    script = tmp_path / "_worker.py"
    script.write_text(WORKER)
    beside(script)
    receiver = Receiver(
        ReceiveSection(
            listen="127.0.0.1:0",
            spool=str(tmp_path / "in"),
            tokens_file=str(tmp_path / "tokens"),
            live_spool=str(live_spool),
        )
    )
    receiver.start()
    env = _gloo_env(
        HPCWATCH_LIVE_DIR=str(node_spool),
        HPCWATCH_LIVE_URL=f"http://127.0.0.1:{receiver.port}",
        HPCWATCH_LIVE_TOKEN_FILE=str(tmp_path / "token"),
    )
    argv = [sys.executable, str(script), str(world), str(ctl), "-1", str(HUNG), "0", "0"]
    job = _start(argv, env, tmp_path)
    try:
        with Store(tmp_path / "db") as store:
            # a hang is judged well past the 2 s between two pushes of a rank: at 2 s, a rank's last enters
            # still in its next batch read as where it stopped (rank 0 "in load")
            collector = LiveCollector(store, LiveSection(path=str(live_spool), hang_after_s=6.0, interval_s=0.2))
            wait = {"store": store, "job_proc": job}
            deadline = time.monotonic() + 60
            while not (collector.jobs.get(JOB) and len(collector.jobs[JOB].ranks) == world):
                assert time.monotonic() < deadline, "both ranks' streams pushed"
                assert job.poll() is None, _errors(job)
                collector.run()
                time.sleep(0.1)

            code, out, _ = run_cli(["trace", JOB, "--steps", "2", "--live-dir", str(live_spool), "--json"])
            assert code == 0, out
            request = orjson.loads(out)["request"]
            seen: dict[int, str] = {}

            def every_rank_traced(e) -> bool:
                if e.attrs["request"] == request:
                    seen[e.attrs["rank"]] = e.attrs["path"]
                return set(seen) == set(range(world))

            _wait(collector, kind=EventKind.LIVE_TRACE, ok=every_rank_traced, deadline_s=30, **wait)
            for rank, path in seen.items():  # the collector's copy, read by the Kineto reader
                assert Path(path).parent == live_spool / JOB
                assert read_kineto(path).rank == rank
            assert not list(node_spool.glob(f"{JOB}/trace-*")), "a trace the collector took leaves the node"

            (ctl / "hang").touch()
            hang = _wait(collector, kind=EventKind.LIVE_HANG, ok=lambda e: True, deadline_s=30, **wait)
            assert hang.attrs["collectives"] == ["all_reduce"]
            dump = _wait(collector, kind=EventKind.LIVE_DUMP, ok=lambda e: True, deadline_s=30, **wait)
            assert dump.attrs["request"] == hang.attrs["dump_request"]
            assert dump.attrs["ranks_dumped"] == list(range(world))
            assert dump.attrs["verdict"] == "hang" and dump.attrs["missing"] == [HUNG]
            assert receiver.refused == {}
            (ctl / "release").touch()
            (ctl / "stop").touch()
            assert job.wait(timeout=60) == 0, _errors(job)
    finally:
        receiver.stop()
        (ctl / "release").touch()
        (ctl / "stop").touch()
        _end(job)
