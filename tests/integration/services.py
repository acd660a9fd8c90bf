"""Start and stop Prometheus, Alertmanager and VictoriaMetrics by PID: what the test fixtures (conftest.py) and the scale
study (benchmarks/scale_study.py) share. No pytest here: a failure is a ``ServiceError`` with the log's tail.

Every service binds 127.0.0.1 on the port it is given, keeps its data in the folder it is given, and is
stopped by the PID we started, never by name.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

__all__ = [
    "Service",
    "ServiceError",
    "stop_process",
    "spawn",
    "start_prometheus",
    "start_alertmanager",
    "start_victoriametrics",
    "victoriametrics_scrape_config",
    "VM_SCRAPE_KEYS",
    "READY_TIMEOUT_S",
]

READY_TIMEOUT_S = 30.0
"""Prometheus 2.42 and VictoriaMetrics 1.79 answer /-/ready, /health in well under a second here."""
VM_SCRAPE_KEYS = ("global", "scrape_configs")
"""What VictoriaMetrics' -promscrape.config takes of a prometheus.yml: it refuses rule_files (vmalert
evaluates rules) and, strictly parsed, global.evaluation_interval."""


class ServiceError(RuntimeError):
    """A service exited or did not become ready; the message ends with its log's tail."""


@dataclass
class Service:
    url: str
    proc: subprocess.Popen
    ready_s: float
    log: Path


def stop_process(proc: subprocess.Popen, *, timeout_s: float = 10.0) -> None:
    """TERM, wait, KILL: one process we started, by its id (and reaped, so no zombie is left)."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout_s)


def spawn(
    argv: list[str],
    log: Path,
    url: str,
    ready_path: str,
    what: str,
    *,
    on_start: Callable[[subprocess.Popen], None] | None = None,
) -> Service:
    """Start ``argv`` (its output to ``log``) and wait until ``url + ready_path`` answers 200."""
    ready_url = url + ready_path
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=open(log, "wb"),  # noqa: SIM115 -- the child holds it, stderr=subprocess.STDOUT, start_new_session=True
    )
    if on_start is not None:
        on_start(proc)  # registered for stopping before we wait: a failed start is still stopped
    deadline = t0 + READY_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise ServiceError(f"{what} exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(ready_url, timeout=1).status_code == 200:
                return Service(url=url, proc=proc, ready_s=time.monotonic() - t0, log=log)
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            stop_process(proc)
            raise ServiceError(f"{what} not ready after {READY_TIMEOUT_S:g}s: {log.read_text()[-2000:]}")
        time.sleep(0.1)


def start_prometheus(
    binary: str,
    workdir: Path,
    config_text: str,
    *,
    port: int,
    on_start: Callable[[subprocess.Popen], None] | None = None,
) -> Service:
    """Prometheus on 127.0.0.1:port with its data under ``workdir``, remote-write receiver on."""
    (workdir / "prometheus.yml").write_text(config_text)
    argv = [
        binary,
        f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-remote-write-receiver",
        "--storage.tsdb.retention.time=1d",
        "--log.level=warn",
    ]
    return spawn(
        argv, workdir / "prometheus.log", f"http://127.0.0.1:{port}", "/-/ready", "prometheus", on_start=on_start
    )


def start_alertmanager(
    binary: str,
    workdir: Path,
    config_text: str,
    *,
    port: int,
    on_start: Callable[[subprocess.Popen], None] | None = None,
) -> Service:
    """Alertmanager (Debian's prometheus-alertmanager 0.25) on 127.0.0.1:port, its data under ``workdir``,
    alone: ``--cluster.listen-address=`` (empty) turns off the gossip mesh, which would bind 0.0.0.0:9094."""
    (workdir / "alertmanager.yml").write_text(config_text)
    argv = [
        binary,
        f"--config.file={workdir / 'alertmanager.yml'}",
        f"--storage.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
        "--log.level=warn",
    ]
    return spawn(
        argv, workdir / "alertmanager.log", f"http://127.0.0.1:{port}", "/-/ready", "alertmanager", on_start=on_start
    )


def victoriametrics_scrape_config(config_text: str) -> tuple[str, list[str], float | None]:
    """(promscrape.config text, rule files, evaluation interval in s) out of a prometheus.yml text."""
    import yaml

    config = yaml.safe_load(config_text) or {}
    scrape = {k: v for k, v in config.items() if k in VM_SCRAPE_KEYS}
    glob = dict(scrape.get("global") or {})
    interval = glob.pop("evaluation_interval", None)
    scrape["global"] = glob
    scrape["scrape_configs"] = scrape.get("scrape_configs") or []
    seconds = float(str(interval).rstrip("s")) if interval is not None else None
    return json.dumps(scrape, indent=1), [str(f) for f in config.get("rule_files") or []], seconds


def start_victoriametrics(
    workdir: Path,
    config_text: str,
    *,
    port: int,
    vmalert_port: int | None = None,
    on_start: Callable[[subprocess.Popen], None] | None = None,
) -> Service:
    """A single-node VictoriaMetrics scraping what the prometheus.yml text scrapes, plus a vmalert for its
    rule_files on ``vmalert_port`` (needed when there are rule files)."""
    scrape, rule_files, eval_s = victoriametrics_scrape_config(config_text)
    (workdir / "promscrape.yml").write_text(scrape)
    url = f"http://127.0.0.1:{port}"
    # -search.latencyOffset: VictoriaMetrics hides the newest 30 s from range queries by default
    # (unfinished scrapes); the tests read what was scraped a second ago. Results cache off, for polling.
    vm = spawn(
        [
            shutil.which("victoria-metrics"),
            f"-storageDataPath={workdir / 'data'}",
            f"-httpListenAddr=127.0.0.1:{port}",
            f"-promscrape.config={workdir / 'promscrape.yml'}",
            "-retentionPeriod=1d",
            "-search.latencyOffset=1s",
            "-search.disableCache",
            "-loggerLevel=WARN",
        ],
        workdir / "victoriametrics.log",
        url,
        "/health",
        "victoria-metrics",
        on_start=on_start,
    )
    if rule_files:
        if vmalert_port is None:
            raise ServiceError("rule_files need a vmalert_port")
        # vmalert reads from and writes its recording rules' results back into the same VictoriaMetrics.
        spawn(
            [
                shutil.which("vmalert"),
                *[f"-rule={f}" for f in rule_files],
                f"-datasource.url={url}",
                f"-remoteWrite.url={url}",
                f"-evaluationInterval={eval_s or 1:g}s",
                "-remoteWrite.flushInterval=1s",
                f"-httpListenAddr=127.0.0.1:{vmalert_port}",
                "-loggerLevel=WARN",
            ],
            workdir / "vmalert.log",
            f"http://127.0.0.1:{vmalert_port}",
            "/health",
            "vmalert",
            on_start=on_start,
        )
    return vm


SLAPD = "/usr/sbin/slapd"
SLAPD_SCHEMAS = ("core", "cosine", "nis", "inetorgperson")


def start_slapd(
    workdir: Path,
    *,
    port: int,
    suffix: str,
    root_password: str,
    ldif: str,
    tls: tuple[Path, Path] | None = None,
    tls_port: int | None = None,
) -> Service:
    """OpenLDAP's slapd (Debian 2.5) on 127.0.0.1:port, an mdb database under ``workdir`` (a slapd.conf of its
    own, not the system's cn=config), in the foreground (``-d``, so it is stopped by its PID), loaded with
    ``ldif`` by ldapadd as ``cn=admin,<suffix>``. Passwords are readable by their own entry's bind only.
    With ``tls`` (certificate, key): StartTLS on ``port`` and ldaps on ``tls_port``."""
    (workdir / "db").mkdir(parents=True, exist_ok=True)
    conf = workdir / "slapd.conf"
    conf.write_text(
        "".join(f"include /etc/ldap/schema/{s}.schema\n" for s in SLAPD_SCHEMAS)
        + f"pidfile {workdir}/slapd.pid\nmodulepath /usr/lib/ldap\nmoduleload back_mdb\n"
        + f'database mdb\nmaxsize 10485760\nsuffix "{suffix}"\nrootdn "cn=admin,{suffix}"\n'
        + f"rootpw {root_password}\ndirectory {workdir}/db\n"
        + "access to attrs=userPassword by self read by anonymous auth by * none\naccess to * by * read\n"
        + (f"TLSCertificateFile {tls[0]}\nTLSCertificateKeyFile {tls[1]}\n" if tls else "")
    )
    url = f"ldap://127.0.0.1:{port}"
    listen = f"{url}/" + (f" ldaps://127.0.0.1:{tls_port}/" if tls and tls_port else "")
    log = workdir / "slapd.log"
    t0 = time.monotonic()
    argv = [SLAPD, "-f", str(conf), "-h", listen, "-d", "256"]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=open(log, "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    deadline = t0 + READY_TIMEOUT_S
    while subprocess.run(["ldapwhoami", "-x", "-H", url], capture_output=True).returncode != 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc)
            raise ServiceError(f"slapd not ready: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    (workdir / "data.ldif").write_text(ldif)
    added = subprocess.run(
        ["ldapadd", "-x", "-H", url, "-D", f"cn=admin,{suffix}", "-w", root_password, "-f", str(workdir / "data.ldif")],
        capture_output=True,
        text=True,
    )
    if added.returncode != 0:
        stop_process(proc)
        raise ServiceError(f"ldapadd: {added.stderr.strip()}")
    return Service(url=url, proc=proc, ready_s=time.monotonic() - t0, log=log)
