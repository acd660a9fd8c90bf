"""Real services for the integration tests: Slurm 22.05 (scripts/slurm-up), Prometheus 2.42,
VictoriaMetrics 1.79 (+ vmalert), the twin's endpoints.

Every service binds 127.0.0.1 on ports of its own (26817..27002 for Slurm, 2909x for Prometheus,
2919x for VictoriaMetrics, 2929x for its vmalert, 2940x for the twin), is started by a fixture and stopped by the PID it wrote, never by name.
Without root or without the Debian packages the tests are skipped with the reason; under CI
(CI=true, as GitHub Actions and GitLab set it) or HPCWATCH_REQUIRE_SERVICES=1 a missing service
fails the run instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from .services import (
    ServiceError,
    stop_process,
    victoriametrics_scrape_config,
)
from .services import (
    start_prometheus as start_prometheus_service,
)
from .services import (
    start_victoriametrics as start_vm_service,
)

__all__ = ["need", "wait_until", "stop_process", "victoriametrics_scrape_config", "PROMQL_BACKENDS"]

ROOT = Path(__file__).resolve().parents[2]
SLURM_BASE = Path(os.environ.get("HPCWATCH_TEST_SLURM_BASE", "/tmp/hpcwatch-slurm-test"))
PROMETHEUS_PORT = 29090
VM_PORT_OFFSET = 100
"""A test's VictoriaMetrics listens on its Prometheus port + 100, its vmalert on + 200."""
TWIN_PORT = 29400
SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel")
DBD_BINARIES = ("slurmdbd", "mariadbd", "mariadb-install-db", "sacct", "sacctmgr")


def need(condition: bool, reason: str) -> None:
    """Skip (or fail under HPCWATCH_REQUIRE_SERVICES=1) when a real service cannot run here."""
    if condition:
        return
    if os.environ.get("HPCWATCH_REQUIRE_SERVICES") == "1" or os.environ.get("CI") == "true":
        pytest.fail(f"CI / HPCWATCH_REQUIRE_SERVICES=1, but {reason}")
    pytest.skip(reason)


def wait_until(check: Callable[[], object], *, timeout_s: float, every_s: float = 0.25, what: str = "") -> object:
    """Poll ``check`` until it returns something truthy; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g}s waiting for {what or check}")
        time.sleep(every_s)


# -- which tests share a pytest-xdist worker ------------------------------------------------------------------

#: Fixtures that stand for one real thing per machine or one costly server: every test using one runs on the
#: same worker (``--dist loadgroup``), so there is one Slurm (one /tmp base, fixed ports) and one 128-node server
#: at a time (each takes half a core or more while it runs) however many workers there are.
SHARED_FIXTURE_GROUPS = {
    "slurm": "slurm",
    "twin_serve": "slurm",
    # the 128-node servers, one after the other: side by side on two cores they starved each other's pages
    "big_server": "demo-128",
    "triage_server": "demo-128",
    "scraped": "demo-128",
    "huge_server": "demo-128",  # the 1,024-node demo, after or before them, never beside
}


#: Seconds a group took on CI's two cores (setup, calls and teardown; 2026-12-07), for the order the groups start
#: in: the longest first, so that no long group starts last (``scripts/test`` asks pytest-xdist to keep this
#: order rather than its own, by test count). A group not listed weighs ``_SECONDS_A_TEST`` a test. On the run
#: these come from, the longest-first order gives 319 s for 355 in test-count order (the groups' seconds laid
#: on four workers). Ours.
GROUP_SECONDS = {
    "demo-128": 256,
    "slurm": 198,
    "test_browser": 193,
    "test_browser_monitor": 80,
    "test_browser_fit": 70,
    "test_browser_job": 60,
    "test_alerting": 57,
    "test_prometheus": 51,
    "test_recording_rules": 50,
    "test_browser_physics": 41,
    "test_browser_states": 36,
}
_SECONDS_A_TEST = 5


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the marks to name the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give each integration test its xdist group: the shared fixture it uses, else its module (a module's
    fixtures, its demo server and Chromium, start once, on one worker); then put the groups in the order they
    start in, the longest first (``GROUP_SECONDS``), each group's tests in their order."""
    here = Path(__file__).parent
    group_of: dict[str, str] = {}
    for item in items:
        if not item.path.is_relative_to(here):
            continue
        mark = item.get_closest_marker("xdist_group")
        if mark is None:
            names = getattr(item, "fixturenames", ())
            shared = next((group for fixture, group in SHARED_FIXTURE_GROUPS.items() if fixture in names), None)
            decorator = pytest.mark.xdist_group(shared or item.module.__name__.rsplit(".", 1)[-1])
            item.add_marker(decorator)
            mark = decorator.mark
        group_of[item.nodeid] = str(mark.kwargs.get("name", mark.args[0] if mark.args else ""))
    tests = Counter(group_of.values())

    def start_order(item: pytest.Item) -> tuple[float, str]:
        group = group_of.get(item.nodeid, "")
        return (-GROUP_SECONDS.get(group, _SECONDS_A_TEST * tests[group]) if group else 0.0, group)

    items.sort(key=start_order)  # stable: a group's tests keep their order


@pytest.hookimpl(tryfirst=True)  # in each worker, before it sends its collection to the controller
def pytest_collection_finish(session: pytest.Session) -> None:
    """pytest-xdist names a test's group in its node id (``...@slurm``); some pytest releases drop that silently
    (pytest 9.2 with xdist 3.8, pytest-xdist#1386) and two workers then start two Slurms on the same ports."""
    if getattr(session.config.option, "loadgroup", False) and not any("@" in item.nodeid for item in session.items):
        raise pytest.UsageError("pytest-xdist did not keep the xdist_group marks (pytest-xdist#1386): pytest < 9.2")


# -- Slurm --------------------------------------------------------------------------------------


@dataclass
class SlurmCluster:
    base: Path
    env: dict[str, str]
    startup_s: float
    accounting: str
    submitted: list[str] = field(default_factory=list)

    @property
    def mapping_dir(self) -> Path:
        return self.base / "hpc-job-mapping"

    def run(self, *argv: str, user: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        cmd = list(argv) if user is None else ["runuser", "-u", user, "--", "sh", "-c", 'cd ~ && exec "$0" "$@"', *argv]
        result = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=30)
        if check and result.returncode != 0:
            pytest.fail(f"{' '.join(argv)} (as {user or 'root'}): {result.stderr.strip()}")
        return result

    def sbatch(self, user: str, *options: str, wrap: str = "sleep 30") -> str:
        out = self.run("sbatch", "--parsable", *options, "--wrap", wrap, user=user).stdout.strip()
        job_id = out.split(";")[0]
        self.submitted.append(job_id)
        return job_id

    def squeue_json(self) -> dict:
        return json.loads(self.run("squeue", "--json").stdout)

    def job_states(self) -> dict[str, str]:
        return {
            str(j["job_id"]): (j["job_state"] if isinstance(j["job_state"], str) else j["job_state"][0])
            for j in self.squeue_json()["jobs"]
        }

    def mapping(self) -> dict[str, list[str]]:
        """ "node/gpu" -> job ids, as the prolog left the files (one the epilog removes while we read is gone)."""
        found = {}
        for p in sorted(self.mapping_dir.glob("*/*")):
            if p.name.startswith("."):
                continue
            try:
                found[f"{p.parent.name}/{p.name}"] = p.read_text().split()
            except FileNotFoundError:
                continue
        return found

    def cancel_all(self) -> None:
        if self.submitted:
            self.run("scancel", *self.submitted, check=False)


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    """A running Slurm: 2 nodes x 8 GRES GPUs, the project's prolog/epilog, alice and bob."""
    need(os.geteuid() == 0, "real Slurm needs root (slurmd, munged, mknod); run as root or in CI")
    missing = [b for b in SLURM_BINARIES if shutil.which(b) is None]
    need(not missing, f"Slurm binaries missing ({', '.join(missing)}): run scripts/install-system")
    accounting = "dbd" if all(shutil.which(b) for b in DBD_BINARIES) else "none"
    env = {
        **os.environ,
        "BASE": str(SLURM_BASE),
        "SLURM_ACCOUNTING": accounting,
        "SLURM_CONF": str(SLURM_BASE / "etc" / "slurm.conf"),
    }
    subprocess.run([str(ROOT / "scripts" / "slurm-down")], env={**env, "PURGE": "1"}, capture_output=True)
    t0 = time.monotonic()
    up = subprocess.run([str(ROOT / "scripts" / "slurm-up")], env=env, capture_output=True, text=True, timeout=120)
    startup_s = time.monotonic() - t0
    if up.returncode != 0:
        subprocess.run([str(ROOT / "scripts" / "slurm-down")], env=env, capture_output=True)
        pytest.fail(f"scripts/slurm-up failed:\n{up.stdout}\n{up.stderr}")
    cluster = SlurmCluster(base=SLURM_BASE, env=env, startup_s=startup_s, accounting=accounting)
    try:
        yield cluster
    finally:
        cluster.cancel_all()
        subprocess.run([str(ROOT / "scripts" / "slurm-down")], env={**env, "PURGE": "1"}, capture_output=True)


# -- Prometheus ---------------------------------------------------------------------------------


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen
    ready_s: float

    def query(self, promql: str) -> list[dict]:
        r = httpx.post(f"{self.url}/api/v1/query", data={"query": promql}, timeout=10)
        r.raise_for_status()
        return r.json()["data"]["result"]


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    need(binary is not None, "prometheus (Debian 2.42) is not installed: run scripts/install-system")
    return binary


@pytest.fixture(scope="module")
def start_prometheus(prometheus_binary, tmp_path_factory) -> Iterator[Callable[..., Prometheus]]:
    """Factory: start a Prometheus with a given config text on its own port; all stopped when the module ends
    (one left running would go on scraping targets that are gone, at 1 s, beside every later module)."""
    started: list[Prometheus] = []

    def start(config_text: str, *, port: int = PROMETHEUS_PORT) -> Prometheus:
        try:
            service = start_prometheus_service(
                prometheus_binary, tmp_path_factory.mktemp("prometheus"), config_text, port=port
            )
        except ServiceError as err:
            pytest.fail(str(err))
        prom = Prometheus(url=service.url, proc=service.proc, ready_s=service.ready_s)
        started.append(prom)
        return prom

    yield start
    for prom in started:
        stop_process(prom.proc)


# -- VictoriaMetrics: the second PromQL backend --------------------------------------------------

PROMQL_BACKENDS = ("prometheus", "victoriametrics")
VM_BINARIES = ("victoria-metrics", "vmalert")


@pytest.fixture(scope="module")
def start_victoriametrics(tmp_path_factory) -> Iterator[Callable[..., Prometheus]]:
    """Factory like ``start_prometheus``: a single-node VictoriaMetrics scraping what the prometheus.yml text
    scrapes, on its own port and data dir, plus a vmalert for its rule_files; all stopped by PID at the end."""
    missing = [b for b in VM_BINARIES if shutil.which(b) is None]
    need(not missing, f"VictoriaMetrics binaries missing ({', '.join(missing)}): run scripts/install-system")
    procs: list[subprocess.Popen] = []

    def start(config_text: str, *, port: int = PROMETHEUS_PORT + VM_PORT_OFFSET) -> Prometheus:
        try:
            service = start_vm_service(
                tmp_path_factory.mktemp("victoriametrics"),
                config_text,
                port=port,
                vmalert_port=port + VM_PORT_OFFSET,
                on_start=procs.append,
            )
        except ServiceError as err:
            pytest.fail(str(err))
        return Prometheus(url=service.url, proc=service.proc, ready_s=service.ready_s)

    yield start
    for proc in reversed(procs):  # vmalert before the database it writes to
        stop_process(proc)


@pytest.fixture(scope="module", params=PROMQL_BACKENDS)
def promql_backend(request) -> str:
    """Which PromQL server a module's tests run against; every such test runs once per backend."""
    return request.param


@pytest.fixture(scope="module")
def start_promql(promql_backend, request) -> Callable[..., Prometheus]:
    """``start(config_text, port=)`` for the backend under test: the port is the Prometheus one, offset for VM."""
    if promql_backend == "prometheus":
        return request.getfixturevalue("start_prometheus")
    start_vm = request.getfixturevalue("start_victoriametrics")
    return lambda config_text, *, port=PROMETHEUS_PORT: start_vm(config_text, port=port + VM_PORT_OFFSET)


# -- the twin's endpoints --------------------------------------------------------------------------


@dataclass
class TwinServer:
    targets: dict[str, str]
    proc: subprocess.Popen


@pytest.fixture(scope="session")
def twin_serve(slurm) -> Iterator[TwinServer]:
    """``hpcwatch twin serve`` for node1/node2, labelling GPUs from the real prolog's mapping dirs."""
    cmd = [
        sys.executable,
        "-m",
        "hpcwatch",
        "twin",
        "serve",
        "--port",
        str(TWIN_PORT),
        "--nodes",
        "2",
        "--mapping-dir",
        str(slurm.mapping_dir),
        "--tick",
        "1",
        "--seed",
        "1",
    ]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    targets = {f"node{i + 1}": f"127.0.0.1:{TWIN_PORT + i}" for i in range(2)}

    def up() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"hpcwatch twin serve exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            return all(httpx.get(f"http://{t}/metrics", timeout=2).status_code == 200 for t in targets.values())
        except httpx.HTTPError:
            return False

    wait_until(up, timeout_s=30, what="hpcwatch twin serve endpoints")
    try:
        yield TwinServer(targets=targets, proc=proc)
    finally:
        stop_process(proc)
