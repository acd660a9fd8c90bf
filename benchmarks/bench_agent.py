"""The node agent's overhead: CPU time and resident memory of ``hpcwatch collect --agent`` as a node runs
it (a fresh process, the default cadence of ``[[agent.check]]``: every 60 s), for a few minutes of wall
time, pushing to a central receiver on this machine.

    flock /tmp/hpcwatch-bench.lock .venv/bin/python benchmarks/bench_agent.py [--duration 180] [--mode push|spool]

The checks are stand-ins writing the real outputs of tests/data (nvidia-smi -q -x of an H200, perfquery -x,
ibstat, dcgmi diag -j) with ``cat``: the figures are the agent's own cost (scheduling, capture, queue,
shipping), not nvidia-smi's or dcgmi's, which the node pays whoever runs them. Reported, from /proc:

    agent CPU     user + system seconds of the agent process itself (utime + stime, CLK_TCK ticks)
    checks CPU    of the commands it ran and waited for (cutime + cstime)
    RSS           VmRSS sampled every 0.5 s: the start-up peak, and the median over the last half of the run
                  (the steady state between checks)

CPU is also given per hour of wall time at that cadence (the run's CPU after start-up / its wall time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
CHECKS = [
    ("nvidia-smi", DATA / "nvidia_smi" / "nvidia_smi_q.xml", "nvidia-smi-xml"),
    ("perfquery", DATA / "health" / "perfquery_hca_0x7cfe9003003b4b96.out", "perfquery"),
    ("ibstat", DATA / "infiniband" / "ibstat_two_cas.txt", "ibstat"),
    ("dcgmi-diag", DATA / "health" / "dcgmi_diag_r1_dcgm3_pass.json", "dcgmi-diag"),
]
TICK = os.sysconf("SC_CLK_TCK")


def cpu(pid: int) -> tuple[float, float]:
    """(own, children's) CPU seconds of ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
    return (utime + stime) / TICK, (cutime + cstime) / TICK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=180.0, help="wall seconds of the agent's run")
    parser.add_argument("--mode", choices=("push", "spool"), default="push")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from hpcwatch.collect.config import ReceiveSection
    from hpcwatch.collect.receive import Receiver

    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp_s:
        tmp = Path(tmp_s)
        token = "bench-token-0123456789abcdef"
        (tmp / "tokens").write_text(f"bench-node {token}\n")
        (tmp / "token").write_text(token + "\n")
        (tmp / "in").mkdir()
        receiver = Receiver(
            ReceiveSection(listen="127.0.0.1:0", spool=str(tmp / "in"), tokens_file=str(tmp / "tokens"))
        )
        receiver.start()
        ship = (
            f'push_url = "http://127.0.0.1:{receiver.port}"\ntoken_file = "{tmp / "token"}"\n'
            if args.mode == "push"
            else f'spool = "{tmp / "in"}"\n'
        )
        text = f'[agent]\nnode = "bench-node"\nqueue_dir = "{tmp / "queue"}"\n{ship}'
        for name, path, fmt in CHECKS:  # interval_s: the default (60 s)
            text += f'\n[[agent.check]]\nname = "{name}"\ncommand = ["cat", "{path}"]\nformat = "{fmt}"\n'
        (tmp / "agent.toml").write_text(text)
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        started = time.monotonic()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hpcwatch",
                "collect",
                "--agent",
                "--config",
                str(tmp / "agent.toml"),
                "--duration",
                str(args.duration),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
        )
        samples: list[tuple[float, float, float, float]] = []  # t, own cpu, children cpu, rss
        try:
            while proc.poll() is None:
                try:
                    own, kids = cpu(proc.pid)
                    samples.append((time.monotonic() - started, own, kids, rss_mib(proc.pid)))
                except (OSError, ValueError):
                    break
                time.sleep(0.5)
            proc.wait()
        finally:
            receiver.stop()
        wall = time.monotonic() - started
        shipped = receiver.accepted if args.mode == "push" else len(list((tmp / "in").iterdir()))
    t, own, kids, rss = zip(*samples, strict=True)
    after_start = next(i for i, x in enumerate(t) if x >= 5.0)
    steady_cpu = own[-1] - own[after_start]
    steady_wall = t[-1] - t[after_start]
    half = [r for x, r in zip(t, rss, strict=True) if x >= t[-1] / 2]
    result = {
        "mode": args.mode,
        "wall_s": round(wall, 1),
        "checks": len(CHECKS),
        "interval_s": 60,
        "shipped": shipped,
        "agent_cpu_s": round(own[-1], 3),
        "agent_cpu_s_first_5s": round(own[after_start], 3),
        "agent_cpu_s_per_hour_after_start": round(steady_cpu / steady_wall * 3600, 2),
        "checks_cpu_s": round(kids[-1], 3),
        "rss_mib_peak": round(max(rss), 1),
        "rss_mib_steady_median": round(statistics.median(half), 1),
        "load_avg_1m": os.getloadavg()[0],
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
