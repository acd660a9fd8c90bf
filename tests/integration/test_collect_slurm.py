"""``hpcwatch collect --config deploy/hpcwatch.toml`` against the real parts, as docs/deploy.md installs it.

Real Slurm 22.05 (scripts/slurm-up) with Debian's slurmrestd started the way
deploy/systemd/slurmrestd-hpcwatch.service starts it (its ExecStart line, as user hpcwatch, the
socket moved into the test's folder); a real Prometheus scraping the twin's dcgm-exporter endpoints;
a Falco log this test appends to, rotates and truncates while ``collect`` runs. The config is
deploy/hpcwatch.toml with only its paths, URLs and the Slurm interval changed. Checked: jobs of
alice and bob reach the store through the REST API within one poll; every Falco line is stored once
through rotation, copytruncate and a ``kill -9``; slurmctld stopped mid-run is a collector error and
then a recovery, never a crash; ``hpcwatch serve`` on the store says which collectors answer.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from hpcwatch.reports.collectors import read_status
from hpcwatch.store import Store
from tests.conftest import free_port

from .conftest import ROOT, need, stop_process, wait_until

pytestmark = pytest.mark.integration

SLURM_INTERVAL_S = 2.0
STATUS_EVERY_S = 0.5  # a quarter of a poll: the status file counts Slurm runs to within one
PROMETHEUS_PORT = 29093
FALCO = json.loads((ROOT / "tests" / "data" / "security" / "falco_docs_alert.jsonl").read_text())
T0 = 1507591916


def alert(i: int) -> str:
    when = datetime.fromtimestamp(T0 + i, UTC).strftime("%Y-%m-%dT%H:%M:%S.746609046Z")
    return json.dumps(dict(FALCO, time=when)) + "\n"


def append(path: Path, rng: range) -> None:
    with open(path, "a") as f:
        f.writelines(alert(i) for i in rng)


def _exec_start(unit: str) -> list[str]:
    line = next(
        ln for ln in (ROOT / "deploy" / "systemd" / unit).read_text().splitlines() if ln.startswith("ExecStart=")
    )
    return shlex.split(line[len("ExecStart=") :])


@pytest.fixture(scope="module")
def hpcwatch_user() -> str:
    need(shutil.which("slurmrestd") is not None, "slurmrestd is not installed: run scripts/install-system")
    try:
        pwd.getpwnam("hpcwatch")
    except KeyError:  # what deploy/systemd/hpcwatch.sysusers.conf makes
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "hpcwatch"], check=True
        )
    return "hpcwatch"


@pytest.fixture(scope="module")
def slurmrestd(slurm, hpcwatch_user):
    # Not under pytest's 0700 root folder: the hpcwatch user must reach its socket's folder.
    run = Path(tempfile.mkdtemp(prefix="hpcwatch-run-"))
    run.chmod(0o755)
    shutil.chown(run, hpcwatch_user)
    sock = run / "slurmrestd.socket"
    argv = [a.replace("/run/hpcwatch/slurmrestd.socket", str(sock)) for a in _exec_start("slurmrestd-hpcwatch.service")]
    log = open(run / "slurmrestd.log", "wb")  # noqa: SIM115 -- the child holds it
    proc = subprocess.Popen(
        ["runuser", "-u", hpcwatch_user, "--", "env", f"SLURM_CONF={slurm.env['SLURM_CONF']}", *argv],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_until(lambda: sock.exists() or proc.poll() is not None, timeout_s=20, what="the slurmrestd socket")
    assert proc.poll() is None, (run / "slurmrestd.log").read_text()
    yield sock
    stop_process(proc)
    shutil.rmtree(run, ignore_errors=True)


@pytest.fixture(scope="module")
def prometheus(start_prometheus, twin_serve):
    targets = list(twin_serve.targets.values())
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "dcgm", "static_configs": [{"targets": targets}]}],
    }
    prom = start_prometheus(json.dumps(config), port=PROMETHEUS_PORT)
    wait_until(lambda: prom.query("DCGM_FI_DEV_GPU_UTIL"), timeout_s=30, what="Prometheus scraping the twin")
    return prom


def site_config(tmp: Path, sock: Path, prom_url: str) -> Path:
    """deploy/hpcwatch.toml with this test's paths: nothing else changed but the Slurm and status intervals."""
    text = (ROOT / "deploy" / "hpcwatch.toml").read_text()
    swaps = {
        "/var/lib/hpcwatch/store": str(tmp / "store"),
        "/run/hpcwatch/slurmrestd.socket": str(sock),
        "http://127.0.0.1:9090": prom_url,
        "/var/log/falco/events.json": str(tmp / "falco" / "events.json"),
        "/var/run/cilium/tetragon/tetragon.log": str(tmp / "tetragon.log"),
        "/var/spool/hpcwatch": str(tmp / "spool"),
    }
    for old, new in swaps.items():
        assert old in text, f"deploy/hpcwatch.toml no longer holds {old}"
        text = text.replace(old, new)
    assert "status_every_s = 5.0" in text
    text = text.replace("status_every_s = 5.0", f"status_every_s = {STATUS_EVERY_S}")
    text = re.sub(
        r'(name = "slurm"\n(?:.*\n)*?)interval_s = 30\.0', rf"\1interval_s = {SLURM_INTERVAL_S}", text, count=1
    )
    path = tmp / "hpcwatch.toml"
    path.write_text(text)
    return path


def start_collect(config: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hpcwatch", "collect", "--config", str(config)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def falco_seconds(store_path: Path) -> list[int]:
    with Store(store_path) as store:
        return sorted(int(e.t) - T0 for e in store.events("falco"))


def statuses(store_path: Path) -> dict:
    found = read_status(store_path)
    return {c.name: c for c in found.collectors} if found else {}


def falco_runs_by(pid: int, store_path: Path) -> int:
    """The Falco collector's runs, once the status is the daemon ``pid``'s (the old one's lingers until then)."""
    found = read_status(store_path)
    if not found or [d.get("pid") for d in found.daemons.values()] != [pid]:
        return 0
    return next((c.runs for c in found.collectors if c.name == "falco"), 0)


def slurm_runs(store_path: Path) -> int:
    found = statuses(store_path).get("slurm")
    return found.runs if found else 0


def test_collect_runs_the_sample_config_against_real_slurm_prometheus_and_logs(slurm, slurmrestd, prometheus, tmp_path):
    (tmp_path / "falco").mkdir()
    (tmp_path / "spool").mkdir()
    (tmp_path / "tetragon.log").write_text("")
    falco = tmp_path / "falco" / "events.json"
    append(falco, range(0, 10))
    config = site_config(tmp_path, slurmrestd, prometheus.url)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    store_path = tmp_path / "store"
    collect = start_collect(config, env)
    serve = None
    try:
        # -- Slurm through the REST API, within one poll --------------------------------------------
        # Counted in the collector's own Slurm runs, not in seconds: a loaded machine stretches a poll, never
        # the number of polls. The run under way at submission may have read before it, the status file may not
        # yet count the one just ended (it is rewritten every STATUS_EVERY_S); the next run must see them.
        wait_until(lambda: slurm_runs(store_path) >= 1, timeout_s=60, what="the first Slurm poll")
        runs_before = slurm_runs(store_path)
        alice = slurm.sbatch("alice", "--gres=gpu:2", wrap="sleep 60")
        bob = slurm.sbatch("bob", "-N2", "--gres=gpu:1", wrap="sleep 60")

        def both_jobs():
            with Store(store_path) as store:
                return {j.id: j.user for j in store.jobs() if j.id in (alice, bob)} == {alice: "alice", bob: "bob"}

        wait_until(both_jobs, timeout_s=60, every_s=0.2, what="alice's and bob's jobs")
        runs_taken = slurm_runs(store_path) - runs_before
        assert runs_taken <= 3, f"jobs seen {runs_taken} Slurm polls after they were submitted"
        wait_until(
            lambda: statuses(store_path).get("prometheus") and statuses(store_path)["prometheus"].records,
            timeout_s=60,
            what="the PromQL collector to copy DCGM series",
        )

        # -- Falco: appended, rotated (create), copytruncated, all while running ------------------
        wait_until(lambda: falco_seconds(store_path) == list(range(10)), timeout_s=20, what="the first Falco lines")
        append(falco, range(10, 15))
        os.rename(falco, falco.with_name("events.json.1"))  # logrotate create
        append(falco, range(15, 20))
        wait_until(lambda: falco_seconds(store_path) == list(range(20)), timeout_s=20, what="lines across rotation")
        append(falco, range(20, 25))
        shutil.copy(falco, falco.with_name("events.json.2"))  # logrotate copytruncate
        os.truncate(falco, 0)
        append(falco, range(25, 28))
        wait_until(lambda: falco_seconds(store_path) == list(range(28)), timeout_s=20, what="lines across truncation")

        # -- kill -9, lines written while it is dead, restart: resumes where it stopped -----------
        os.kill(collect.pid, signal.SIGKILL)
        collect.wait(timeout=10)
        append(falco, range(28, 40))
        collect = start_collect(config, env)
        wait_until(lambda: falco_seconds(store_path) == list(range(40)), timeout_s=30, what="lines after kill -9")
        # Two more reads of the same file by the restarted daemon: a line it took again would be stored by now.
        wait_until(lambda: falco_runs_by(collect.pid, store_path) >= 3, timeout_s=30, what="the new daemon's reads")
        assert falco_seconds(store_path) == list(range(40)), "a line was stored twice after the restart"

        # -- serve reads the store while collect writes it, and names the collectors ---------------
        port = free_port()
        serve = subprocess.Popen(
            [sys.executable, "-m", "hpcwatch", "serve", "--db", str(store_path), "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

        def live():
            try:
                doc = httpx.get(f"http://127.0.0.1:{port}/api/live", timeout=5).json()
            except (httpx.HTTPError, ValueError):
                return None
            return {c["name"]: c["answering"] for c in doc.get("collect") or []}

        answering = wait_until(lambda: (s := live()) and s.get("slurm") and s, timeout_s=30, what="serve's /api/live")
        assert answering["slurm"] and answering["falco"] and answering["prometheus"]

        # -- slurmctld stopped mid-run: an error, the others go on, then recovery ------------------
        pid = int((slurm.base / "run" / "slurmctld.pid").read_text())
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: statuses(store_path)["slurm"].last_error, timeout_s=30, what="a Slurm collector error")
        error = statuses(store_path)["slurm"].last_error
        append(falco, range(40, 42))
        wait_until(lambda: falco_seconds(store_path) == list(range(42)), timeout_s=20, what="Falco while Slurm is down")
        subprocess.run(["slurmctld"], env=slurm.env, check=True)
        wait_until(
            lambda: statuses(store_path)["slurm"].last_error is None,
            timeout_s=60,
            what=f"the Slurm collector to recover from: {error}",
        )
        assert collect.poll() is None, "collect exited"
        print(
            f"jobs in the store {runs_taken} Slurm polls after sbatch (poll {SLURM_INTERVAL_S}s); Slurm down: {error}"
        )
    finally:
        for proc in (serve, collect):
            if proc is not None:
                stop_process(proc)
