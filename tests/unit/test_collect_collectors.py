"""The Slurm and spool collectors over captured answers: what one run stores, what a second run adds."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from hpcwatch import vocab
from hpcwatch.collect.config import SlurmSection, SpoolSection
from hpcwatch.collect.slurm import SlurmCollector
from hpcwatch.collect.spool import SpoolCollector
from hpcwatch.errors import BackendError
from hpcwatch.store import Store

DATA = Path(__file__).resolve().parents[1] / "data"
ANSWERS = {
    "/slurm/v0.0.38/jobs": "slurmrestd_v0038_jobs.json",
    "/slurm/v0.0.38/nodes": "slurmrestd_v0038_nodes.json",
    "/slurm/v0.0.38/partitions": "slurmrestd_v0038_partitions.json",
    "/slurmdb/v0.0.38/jobs": "slurmrestd_dbv0038_jobs_nothing_found.json",
}


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "store") as s:
        yield s


def slurmrestd(asked: list[httpx.Request], *, down: bool = False) -> httpx.Client:
    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        if down:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return httpx.Response(200, text=(DATA / "slurm" / ANSWERS[request.url.path]).read_text())

    return httpx.Client(transport=httpx.MockTransport(answer), base_url="http://slurmrestd")


def test_slurm_rest_poll_stores_jobs_nodes_and_partitions(store):
    asked: list[httpx.Request] = []
    collector = SlurmCollector(store, SlurmSection(name="slurm"), client=slurmrestd(asked))
    collector.run()
    assert {j.user for j in store.jobs()} == {"alice", "bob"}
    assert set(store.metrics()) >= {vocab.SLURM_NODE_UP, vocab.SLURM_PARTITION_CPUS}
    since = next(r for r in asked if r.url.path.startswith("/slurmdb")).url.params["start_time"]
    assert len(since) == 19 and since[10] == "T"  # ISO local time: 22.05 refuses epoch seconds


def test_slurm_accounting_window_resumes_from_the_store_after_a_restart(store):
    asked: list[httpx.Request] = []
    SlurmCollector(store, SlurmSection(name="slurm"), client=slurmrestd(asked)).run()
    first = SlurmCollector(store, SlurmSection(name="slurm"), client=slurmrestd(asked)).cursor.state
    assert first["accounting_since"] > 0  # a new process reads the window where the last ended


def test_slurm_down_is_a_backend_error_naming_the_url(store):
    collector = SlurmCollector(
        store, SlurmSection(name="slurm", url="unix:/run/x.sock"), client=slurmrestd([], down=True)
    )
    with pytest.raises(BackendError, match=r"unix:/run/x.sock /slurm/v0.0.38/jobs: ConnectError"):
        collector.run()


def test_spool_ingests_settled_files_once_and_reports_refused_ones(store, tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    shutil.copy(DATA / "slurm" / "squeue.json", spool / "squeue.json")
    (spool / "broken.json").write_text('{"jobs": [{"job_id": true}]}')
    collector = SpoolCollector(store, SpoolSection(path=str(spool), settle_s=0, format="squeue-json"))
    first = collector.run()
    assert first.records > 0 and "broken.json" in first.note
    assert collector.run().records == 0  # nothing changed: nothing read again


def test_a_bad_file_in_a_spool_sub_folder_does_not_hold_back_the_files_after_it(store, tmp_path):
    """An epilog's folder per job: a bad scrape sorted first in it used to stop the folder's ingest, every run."""
    job = tmp_path / "spool" / "job-9"
    job.mkdir(parents=True)
    (job / "a_bad.prom").write_text("# TYPE up gauge\nup{broken 2\n")
    shutil.copy(DATA / "slurm" / "squeue.json", job / "squeue.json")
    collector = SpoolCollector(store, SpoolSection(path=str(job.parent), settle_s=0))
    run = collector.run()
    running = sum(1 for j in store.jobs() if j.state == "RUNNING")  # each also gives elapsed and time-limit samples
    assert len(store.jobs()) == 10 and run.records == 10 + 2 * running
    assert collector.rejected == {str(job): collector.rejected[str(job)]}
    assert collector.rejected[str(job)].startswith(f"{job / 'a_bad.prom'}:2: not a sample line")
