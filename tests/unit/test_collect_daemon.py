"""The daemon: collectors on their own intervals, one failing never stops another, the status file says so."""

from __future__ import annotations

import time

import pytest

from hpcwatch.collect.base import RunResult
from hpcwatch.collect.config import parse_config
from hpcwatch.collect.daemon import Daemon
from hpcwatch.errors import BackendError, StoreError
from hpcwatch.exporter import registry_for
from hpcwatch.reports.collectors import read_status
from hpcwatch.store import Store


class Flaky:
    """Fails while ``down`` is set, like a Slurm that was stopped."""

    def __init__(self):
        self.down, self.runs = False, 0

    def run(self):
        self.runs += 1
        if self.down:
            raise BackendError("slurmrestd: ConnectError: [Errno 111] Connection refused")
        return RunResult(records=2, lag_s=0.0)

    def close(self):
        pass


def _until(condition, timeout_s: float = 60.0) -> None:
    """Wait for the daemon's threads to get there: on a loaded machine 0.3 s was seen not to be enough."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the daemon did not get there in time"
        time.sleep(0.02)


def config(tmp_path):
    return parse_config(
        f'[store]\npath = "{tmp_path / "store"}"\n[collect]\nstatus_every_s = 0.1\n'
        f'[[slurm]]\ninterval_s = 0.05\n[[spool]]\npath = "{tmp_path}"\ninterval_s = 0.05\n',
        path="test.toml",
    )


def test_one_failing_collector_never_stops_the_others_and_recovers(tmp_path):
    slurm, spool = Flaky(), Flaky()
    daemon = Daemon(
        config(tmp_path), node="head1", build=lambda store, section, node: slurm if section.name == "slurm" else spool
    )
    daemon.start()
    try:
        _until(lambda: slurm.runs > 0 and spool.runs > 0)
        slurm.down = True
        runs_before = spool.runs
        _until(lambda: daemon.statuses()["slurm"].errors >= 1 and spool.runs > runs_before)
        s = daemon.statuses()
        assert s["slurm"].last_error.startswith("slurmrestd: ConnectError") and s["slurm"].errors >= 1
        assert s["spool"].last_error is None
        slurm.down = False
        _until(lambda: daemon.statuses()["slurm"].last_error is None)
    finally:
        daemon.stop()
    found = read_status(tmp_path / "store")
    assert {c.name: c.answering for c in found.collectors} == {"slurm": True, "spool": True}
    assert found.daemons["head1"]["stale"] is False


def test_a_store_that_cannot_be_opened_yet_is_the_collectors_error_and_is_retried(tmp_path):
    opens = []

    def open_store():
        opens.append(1)
        if len(opens) <= 2:
            raise StoreError(f"{tmp_path}: cannot open the store: No space left on device")
        return Store(tmp_path / "store")

    slurm, spool = Flaky(), Flaky()
    daemon = Daemon(
        config(tmp_path),
        node="head1",
        open_store=open_store,
        build=lambda store, section, node: slurm if section.name == "slurm" else spool,
    )
    daemon.start()
    try:
        _until(lambda: slurm.runs > 0 and spool.runs > 0)
    finally:
        daemon.stop()
    errors = {name: s.errors for name, s in daemon.statuses().items()}
    assert sum(errors.values()) == 2 and all(s.last_error is None for s in daemon.statuses().values())


def test_a_collector_that_raises_a_bug_is_recorded_with_its_type(tmp_path):
    class Broken(Flaky):
        def run(self):
            raise KeyError("jobs")

    daemon = Daemon(config(tmp_path), node="n", build=lambda store, section, node: Broken())
    found = daemon.run_once()
    assert found["slurm"].last_error == "KeyError: 'jobs'" and found["spool"].runs == 1


def test_status_goes_stale_when_the_daemon_is_gone_and_exporter_says_down(tmp_path):
    daemon = Daemon(config(tmp_path), node="n", build=lambda store, section, node: Flaky())
    daemon.run_once()
    assert all(c.answering for c in read_status(tmp_path / "store").collectors)
    later = read_status(tmp_path / "store", now=time.time() + 3600)
    assert later.stale and not any(c.answering for c in later.collectors)
    with Store(tmp_path / "store") as store:
        text = registry_for(store)
        from prometheus_client import generate_latest

        body = generate_latest(text).decode()
    assert 'hpcwatch_collector_up{collector="slurm",daemon="n",kind="slurm-rest"} 1.0' in body
    assert 'hpcwatch_collector_records_total{collector="spool",daemon="n",kind="spool"} 2.0' in body
    # the freshness alert's yardstick (deploy/prometheus/hpcwatch-alerts.yml): 3 intervals since the last success
    assert 'hpcwatch_collector_interval_seconds{collector="slurm",daemon="n",kind="slurm-rest"} 0.05' in body


def test_live_snapshot_names_the_collectors_that_answer(tmp_path):
    from hpcwatch.reports.live import live_snapshot

    Daemon(config(tmp_path), node="n", build=lambda store, section, node: Flaky()).run_once()
    with Store(tmp_path / "store") as store:
        doc = live_snapshot(store, weights_path="/ckpt", now=None)
    assert [(c["name"], c["answering"]) for c in doc["collect"]] == [("slurm", True), ("spool", True)]


def test_no_daemon_means_no_collect_entry(tmp_path):
    from hpcwatch.reports.live import live_snapshot

    with Store(tmp_path / "store") as store:
        assert live_snapshot(store, weights_path="/ckpt", now=None)["collect"] is None


@pytest.mark.parametrize("name", ["slurm", "spool"])
def test_status_file_names_every_collector(tmp_path, name):
    daemon = Daemon(config(tmp_path), node="n", build=lambda store, section, node: Flaky())
    daemon.run_once()
    assert name in {c.name for c in read_status(tmp_path / "store").collectors}
