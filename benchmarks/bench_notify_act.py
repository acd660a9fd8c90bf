"""What ``hpcwatch notify`` and ``hpcwatch act`` cost as an operator runs them: wall and CPU time of the whole
process (a fresh interpreter, as cron, ``collect`` or a shell starts them), on a store built here.

    flock /tmp/hpcwatch-bench.lock .venv/bin/python benchmarks/bench_notify_act.py [--jobs 1000] [--verdicts 100]
        [--nodes 128 1024] [--repeat 3]

Cases, each a fresh process (``python -c`` running the console script's lines, bytecode cached in a folder of
its own, filled by one untimed run, as bench_cli_startup.py does):

    notify --help                 the start-up floor: interpreter, click, the command's imports
    notify --once                 a store holding ``--jobs`` job ends of the last day (50 users, 10 accounts) and
                                  ``--verdicts`` nodes' health verdicts turning drain: every job-end report,
                                  health notice and digest composed, written to the store's notices table and
                                  mailed to an aiosmtpd server on 127.0.0.1 run by this script (plain SMTP, no
                                  TLS), the accounts' coordinators taken from a sacctmgr listing
                                  (``coordinators_file``); one run on a fresh copy of the store each time
    act --once --dry-run          ``[act.idle]`` on a store where every GPU of N nodes (8 each, one job a node)
                                  has been idle for 35 minutes: every job found and judged, nothing run

Figures: wall seconds of the process, and its CPU (user + system, from ``os.wait4``, the process and any
child it waited for). The SMTP server runs in this script's process, so its CPU is in none of them. The
only in-process figure is ``compose only``: the same store's candidates built by ``notify.compose`` in this
process (no delivery, no SMTP), to tell composing from sending.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from hpcwatch import vocab
from hpcwatch.records import Event, Job, Sample
from hpcwatch.store import Store
from hpcwatch.vocab import EventKind

_ENTRY = "import sys; sys.argv[0] = 'hpcwatch'; from hpcwatch.cli import main; sys.exit(main())"
USERS, ACCOUNTS, GPUS_PER_NODE = 50, 10, 8


def notify_store(path: Path, *, jobs: int, verdicts: int, now: float) -> None:
    """``jobs`` ended jobs spread over the last 23 hours, and ``verdicts`` nodes turning drain in the last hour."""
    ended = [
        Job(
            id=str(10_000 + i),
            name=f"train-{i}",
            user=f"user{i % USERS:02d}",
            account=f"proj-{i % ACCOUNTS}",
            partition="gpu",
            nodes=(f"gpu{i % 512:04d}",),
            gpus=8,
            start=now - 23 * 3600 + i * 60 - 7200,
            end=now - 23 * 3600 + i * (22 * 3600 / max(jobs, 1)),
            state="COMPLETED" if i % 7 else "FAILED",
        )
        for i in range(jobs)
    ]
    events = [
        Event(
            kind=EventKind.HEALTH_VERDICT,
            t=now - 3600 + i,
            source="health",
            attrs={"node": f"gpu{i:04d}", "verdict": "drain", "reason": "xid_errors: XID 79 (fallen off the bus)"},
        )
        for i in range(verdicts)
    ]
    with Store(path) as store:
        store.add(ended)
        store.add(events)


def coordinators_listing(path: Path) -> None:
    """sacctmgr's ``show user withcoordinator --parsable2``: one coordinator a project, user00 of all."""
    rows = ["User|Def Acct|Admin|Coord Accounts"]
    for u in range(USERS):
        coord = [f"proj-{a}" for a in range(ACCOUNTS) if u == a or u == 0]
        rows.append(f"user{u:02d}|proj-{u % ACCOUNTS}|None|{','.join(coord)}")
    path.write_text("\n".join(rows) + "\n")


def act_store(path: Path, *, nodes: int, now: float) -> None:
    """One running job a node, each GPU at 0 % utilisation every 30 s for the last 35 minutes."""
    with Store(path) as store:
        store.add(
            [
                Job(
                    id=str(20_000 + n),
                    user=f"user{n % USERS:02d}",
                    account=f"proj-{n % ACCOUNTS}",
                    partition="gpu",
                    nodes=(f"gpu{n:04d}",),
                    gpus=GPUS_PER_NODE,
                    start=now - 3600,
                    state="RUNNING",
                )
                for n in range(nodes)
            ]
        )
        t = now - 35 * 60
        while t <= now:
            store.add(
                [
                    Sample(
                        metric=vocab.DCGM_FI_DEV_GPU_UTIL,
                        labels={
                            "Hostname": f"gpu{n:04d}",
                            "gpu": str(g),
                            "hpc_job": str(20_000 + n),
                            "modelName": "NVIDIA H100 80GB HBM3",
                        },
                        t=t,
                        value=0.0,
                    )
                    for n in range(nodes)
                    for g in range(GPUS_PER_NODE)
                ]
            )
            t += 30.0


def config(folder: Path, *, smtp_port: int, coordinators: Path) -> Path:
    path = folder / "hpcwatch.toml"
    path.write_text(
        f"""
[notify]
user_template = "{{user}}@example.org"
operators = ["ops@example.org"]
rate_per_hour = 1000000
coordinators_file = "{coordinators}"

[[notify.channel]]
type = "smtp"
host = "127.0.0.1"
port = {smtp_port}
security = "none"

[act]
who = "bench"

[act.idle]
enabled = true
idle_minutes = 30
grace_minutes = 10
"""
    )
    return path


def run(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall s, CPU s, the last line of its output) of ``hpcwatch ARGV`` as a fresh process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", _ENTRY, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert proc.stdout is not None
    out = proc.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"hpcwatch {' '.join(argv)} exited {proc.returncode}:\n{out[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, _said(out)


def _said(out: str) -> str:
    """What the run said, in short: notify's counts, act's steps counted, else the output's last line."""
    try:
        doc = json.loads(out)
    except ValueError:
        return out.strip().splitlines()[-1] if out.strip() else ""
    if "said" in doc:
        return f"{len(doc['said'])} said: " + ", ".join(
            f"{n} {s}" for s, n in Counter(x["step"] for x in doc["said"]).items()
        )
    return " ".join(f"{k} {v}" for k, v in doc.items())


def compose_only(store_path: Path, config_path: Path) -> tuple[float, int, int]:
    """In process: every candidate of the store built (rendered), nothing delivered: (s, candidates, messages)."""
    from hpcwatch.notify.compose import candidates
    from hpcwatch.notify.config import parse_notify_text
    from hpcwatch.notify.render import Renderer

    cfg = parse_notify_text(config_path.read_text(), path=str(config_path))
    t0 = time.perf_counter()
    with Store(store_path) as store:
        found = list(candidates(store, cfg, Renderer(cfg.templates), now=time.time()))
        messages = sum(len(c.build()) for c in found)
    return time.perf_counter() - t0, len(found), messages


def _line(name: str, runs: list[tuple[float, float, str]]) -> None:
    walls, cpus = [r[0] for r in runs], [r[1] for r in runs]
    print(
        f"{name:34s} wall best {min(walls):7.2f} s  median {statistics.median(walls):7.2f} s   "
        f"CPU best {min(cpus):7.2f} s  median {statistics.median(cpus):7.2f} s   | {runs[-1][2][:120]}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000, help="job ends in the notify store")
    parser.add_argument("--verdicts", type=int, default=100, help="nodes turning drain in the notify store")
    parser.add_argument("--nodes", type=int, nargs="+", default=[128, 1024], help="idle nodes of the act stores")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per case")
    args = parser.parse_args()
    from aiosmtpd.controller import Controller

    class Sink:
        count = 0

        async def handle_DATA(self, server, session, envelope):
            Sink.count += len(envelope.rcpt_tos)
            return "250 OK"

    class PortZero(Controller):
        def _trigger_server(self) -> None:  # learn the bound port before aiosmtpd connects to it
            self.port = self.server.sockets[0].getsockname()[1]
            super()._trigger_server()

    smtp = PortZero(Sink(), hostname="127.0.0.1", port=0)
    smtp.start()
    try:
        with tempfile.TemporaryDirectory(prefix="hpcwatch-bench-notify-") as tmp:
            _bench(Path(tmp), args, smtp.port)
    finally:
        smtp.stop()
    print(f"SMTP server received {Sink.count} recipients in all")


def _bench(tmp: Path, args: argparse.Namespace, smtp_port: int) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(ROOT / "src"), PYTHONPYCACHEPREFIX=str(tmp / "pycache"))
    now = time.time()
    coordinators_listing(tmp / "coordinators.txt")
    cfg = config(tmp, smtp_port=smtp_port, coordinators=tmp / "coordinators.txt")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs")

    t0 = time.perf_counter()
    notify_store(tmp / "notify-store", jobs=args.jobs, verdicts=args.verdicts, now=now)
    print(f"notify store: {args.jobs} job ends, {args.verdicts} verdicts, built in {time.perf_counter() - t0:.1f} s")

    run(["notify", "--help"], env)  # fills the bytecode cache
    _line("notify --help", [run(["notify", "--help"], env) for _ in range(args.repeat)])

    shutil.copytree(tmp / "notify-store", tmp / "compose-store")
    took, found, messages = compose_only(tmp / "compose-store", cfg)
    print(f"{'compose only (in process)':34s} {took:7.2f} s   {found} candidates, {messages} messages")

    runs = []
    for i in range(args.repeat):
        fresh = tmp / f"notify-run-{i}"
        shutil.copytree(tmp / "notify-store", fresh)
        runs.append(run(["notify", "--config", str(cfg), "--db", str(fresh), "--once", "--json"], env))
    _line("notify --once", runs)

    for nodes in args.nodes:
        store = tmp / f"act-{nodes}"
        t0 = time.perf_counter()
        act_store(store, nodes=nodes, now=time.time())
        print(f"act store: {nodes} idle nodes, {nodes * GPUS_PER_NODE} GPUs, built in {time.perf_counter() - t0:.1f} s")
        argv = ["act", "--config", str(cfg), "--db", str(store), "--once", "--dry-run", "--json"]
        _line(f"act --once --dry-run, {nodes} nodes", [run(argv, env) for _ in range(args.repeat)])


if __name__ == "__main__":
    main()
