"""Slurm, polled: slurmrestd's API (``mode = "rest"``) or ``squeue``/``sacct``/``sinfo --json`` (``"cli"``).

Each poll stores the controller's jobs (a job seen again replaces its row), slurmdbd's jobs that
ended since the last poll (accounting), and one sample set of nodes and partitions. The accounting
window's start is a cursor committed with its jobs, so a restart neither misses nor re-asks a window
(re-asking would be harmless: jobs replace by id). Any failure (slurmrestd down, slurmctld down, an
error answer) raises ``BackendError``: the daemon records it and the next poll tries again.

Authentication: ``unix:/path`` uses rest_auth/local — slurmrestd refuses to run as root or SlurmUser
("slurmrestd should not be run as the root user", 22.05.8) and serves clients of its own uid (and
root): run it as the collector's user. ``http(s)://`` uses rest_auth/jwt: ``user`` and a token file.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from hpcwatch.collect.base import RunResult
from hpcwatch.collect.config import SlurmSection
from hpcwatch.collect.cursor import Cursor
from hpcwatch.errors import BackendError, HpcwatchError
from hpcwatch.records import Sample
from hpcwatch.sources.slurm import parse_sacct_records, parse_squeue_records
from hpcwatch.sources.slurmrest import (
    load_answer,
    parse_rest_accounting,
    parse_rest_job_records,
    parse_rest_nodes,
    parse_rest_partitions,
)
from hpcwatch.store import Store

__all__ = ["SlurmCollector"]


def _slurm_time(t: float) -> str:
    """slurmdbd's query time (22.05 refuses epoch seconds: "Invalid time specification"); local time."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


class SlurmCollector:
    def __init__(
        self,
        store: Store,
        section: SlurmSection,
        *,
        client: httpx.Client | None = None,
        run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    ) -> None:
        self.store, self.section, self._run = store, section, run
        self.cursor = Cursor(store, f"slurm:{section.name}")
        self._client = client if client is not None or section.mode != "rest" else self._make_client()

    def _make_client(self) -> httpx.Client:
        url = self.section.url
        if url.startswith("unix:"):
            transport = httpx.HTTPTransport(uds=url[len("unix:") :])
            return httpx.Client(
                transport=transport, base_url="http://slurmrestd", timeout=self.section.timeout_s, trust_env=False
            )
        return httpx.Client(base_url=url.rstrip("/"), timeout=self.section.timeout_s, trust_env=False)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def run(self) -> RunResult:
        now = time.time()
        since = float(self.cursor.state.get("accounting_since") or now - self.section.accounting_window_s)
        fetch = self._rest if self.section.mode == "rest" else self._cli
        jobs, accounted, samples = fetch(since, now)
        # The window's end moves with the jobs it found; a minute of overlap covers jobs slurmdbd records late.
        with self.cursor.commit({"accounting_since": now - 60.0}) as tx:
            counts = tx.add([*accounted, *jobs, *samples])  # controller's view last: it is the newest
        return RunResult(records=counts.total(), lag_s=0.0)

    # -- slurmrestd ------------------------------------------------------------------------------------

    def _get(self, path: str, params: dict[str, str] | None = None) -> str:
        headers = {}
        if self.section.token_file:
            try:
                token = Path(self.section.token_file).read_text().strip()
            except OSError as err:
                raise BackendError(f"{self.section.token_file}: cannot read the JWT: {err.strerror}") from err
            headers = {"X-SLURM-USER-NAME": self.section.user, "X-SLURM-USER-TOKEN": token}
        where = f"{self.section.url} {path}"
        if self._client is None:  # only mode "rest" asks slurmrestd, and that mode always makes a client
            raise BackendError(f"{where}: no slurmrestd client (mode {self.section.mode!r})")
        try:
            response = self._client.get(path, params=params, headers=headers)
        except httpx.HTTPError as err:
            raise BackendError(f"{where}: {type(err).__name__}: {err}") from err
        if response.status_code >= 400:
            try:
                load_answer(response.text, path=where, key="errors")  # slurmrestd's own words, when JSON
            except HpcwatchError as err:
                raise BackendError(f"HTTP {response.status_code}: {err}") from err
            raise BackendError(f"{where}: HTTP {response.status_code}: {response.text[:200]!r}")
        return response.text

    def _rest(self, since: float, now: float):
        v, s = self.section.api_version, self.section
        jobs = (
            list(parse_rest_job_records(self._get(f"/slurm/{v}/jobs"), path=f"slurmrestd /slurm/{v}/jobs", t=now))
            if s.jobs
            else []
        )
        accounted = []
        if s.accounting:
            text = self._get(f"/slurmdb/{v}/jobs", {"start_time": _slurm_time(since)})
            accounted = list(parse_rest_accounting(text, path=f"slurmrestd /slurmdb/{v}/jobs"))
        samples: list[Sample] = []
        if s.nodes:
            samples += parse_rest_nodes(self._get(f"/slurm/{v}/nodes"), t=now, path=f"slurmrestd /slurm/{v}/nodes")
        if s.partitions:
            samples += parse_rest_partitions(
                self._get(f"/slurm/{v}/partitions"), t=now, path=f"slurmrestd /slurm/{v}/partitions"
            )
        return jobs, accounted, samples

    # -- the commands ----------------------------------------------------------------------------------

    def _command(self, *argv: str) -> str:
        env = {**os.environ, **({"SLURM_CONF": self.section.slurm_conf} if self.section.slurm_conf else {})}
        try:
            done = self._run(list(argv), capture_output=True, text=True, timeout=self.section.timeout_s, env=env)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise BackendError(f"{' '.join(argv)}: {err}") from err
        if done.returncode != 0:
            raise BackendError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()[:200]}")
        return done.stdout

    def _cli(self, since: float, now: float):
        s = self.section
        squeue = self._command("squeue", "--json") if s.jobs else None
        jobs = list(parse_squeue_records(squeue, path="squeue --json", t=now)) if squeue is not None else []
        accounted = []
        if s.accounting:
            text = self._command("sacct", "--json", "-a", "-S", _slurm_time(since), "-E", "now")
            accounted = list(parse_sacct_records(text, path="sacct --json"))  # jobs, then CPU/memory used
        samples = (
            list(parse_rest_nodes(self._command("sinfo", "--json"), t=now, path="sinfo --json")) if s.nodes else []
        )
        return jobs, accounted, samples
