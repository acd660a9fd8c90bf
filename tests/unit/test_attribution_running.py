"""A running job's GPU-hours end at Slurm's snapshot of it, never past its time limit (issue #22 item 10).

Real inputs: slurmrestd answers of Slurm 24.05 (v0.0.41) and 25.11 (v0.0.44) with ``last_update``
(rackslab/Slurm-web fixtures), and the real 22.05 ``squeue --json`` (no ``last_update``: the file's own
time), whose running jobs 7 and 8 hold 2 and 4 GPUs with limits of 60 and 120 minutes."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from hpcwatch import vocab
from hpcwatch.ingest import ingest_paths
from hpcwatch.records import Job, Sample
from hpcwatch.reports.jobs import jobs_report
from hpcwatch.sources.slurm import parse_squeue_records, read_squeue_records
from hpcwatch.sources.slurmrest import parse_rest_job_records
from hpcwatch.store import Store
from tests.conftest import DATA

V41 = DATA / "slurm/slurmweb_24.05_v0041_slurm_jobs.json"
V44 = DATA / "slurm/slurmweb_25.11_v0044_slurm_jobs.json"
SQUEUE_22_05 = DATA / "slurm/squeue.json"
DAY = 86_400.0


def _raw_running(path) -> tuple[float, list[dict]]:
    """(last_update, the running jobs) as the file says them, read with json, not with our reader."""
    doc = json.loads(path.read_text())
    running = [j for j in doc["jobs"] if j["job_state"] == ["RUNNING"]]
    return float(doc["last_update"]["number"]), running


@pytest.mark.parametrize("path", [V41, V44], ids=["24.05-v0.0.41", "25.11-v0.0.44"])
def test_real_slurmrestd_running_jobs_end_at_last_update(tmp_path, path) -> None:
    last_update, running = _raw_running(path)
    assert running  # 3 (v0.0.41) and 4 (v0.0.44) running jobs, 2-minute limits
    with Store(tmp_path / "s") as store:
        ingest_paths(store, [path])
        with store.transaction() as tx:  # something seen 2.75 days later: the store's newest time
            tx.add(
                [
                    Sample(
                        metric=vocab.DCGM_FI_DEV_GPU_UTIL,
                        labels={"Hostname": "x"},
                        t=last_update + 2.75 * DAY,
                        value=0.0,
                    )
                ]
            )
        reports = {r.id: r for r in jobs_report(store)}
    for raw in running:
        start, limit_s = raw["start_time"]["number"], 60.0 * raw["time_limit"]["number"]
        expected = min(last_update - start, limit_s)  # 87, 78, 72 s (24.05); 77, 76, 74, 71 s (25.11)
        report = reports[str(raw["job_id"])]
        assert report.end is None and report.elapsed_s == pytest.approx(expected)
        assert report.gpu_hours == pytest.approx(report.gpus * expected / 3600.0)
        assert report.time_limit_used == pytest.approx(expected / limit_s)


def test_real_22_05_squeue_gpu_hours_capped_by_the_time_limit(tmp_path) -> None:
    """The issue's numbers: jobs 7 (2 GPUs, 1 h) and 8 (4 GPUs, 2 h) read with a store 2.75 days on counted
    132 and 264 GPU-h; Slurm ends them at their limits: 2 and 8 GPU-h at most."""
    copy = tmp_path / "squeue.json"
    shutil.copy(SQUEUE_22_05, copy)
    start = 1795991704.0  # jobs[*].start_time of the running jobs
    os.utime(copy, (start + 2.75 * DAY, start + 2.75 * DAY))  # squeue ran 2.75 days after they started
    with Store(tmp_path / "s") as store:
        ingest_paths(store, [copy])
        reports = {r.id: r for r in jobs_report(store)}
    assert reports["7"].gpus == 2 and reports["7"].gpu_hours == pytest.approx(2.0)
    assert reports["8"].gpus == 4 and reports["8"].gpu_hours == pytest.approx(8.0)
    # job 9: limit 525600 min (a year): 2.75 days of its 4 GPUs
    assert reports["9"].gpu_hours == pytest.approx(4 * 2.75 * 24)


def test_real_22_05_squeue_read_alone_counts_to_the_file_time(tmp_path) -> None:
    """Read alone, the store's newest time was the jobs' start: 0 GPU-h. Now: up to the snapshot."""
    copy = tmp_path / "squeue.json"
    shutil.copy(SQUEUE_22_05, copy)
    start = 1795991704.0
    os.utime(copy, (start + 1800.0, start + 1800.0))  # half an hour in
    with Store(tmp_path / "s") as store:
        ingest_paths(store, [copy])
        reports = {r.id: r for r in jobs_report(store)}
    assert reports["7"].elapsed_s == pytest.approx(1800.0) and reports["7"].gpu_hours == pytest.approx(1.0)
    assert reports["8"].gpu_hours == pytest.approx(2.0)


def test_last_update_wins_over_the_file_time_and_the_caller_time(tmp_path) -> None:
    last_update, running = _raw_running(V44)
    samples = [r for r in read_squeue_records(V44, t=0.0) if isinstance(r, Sample)]
    assert {s.t for s in samples} == {last_update}
    text = V44.read_text()
    for records in (parse_squeue_records(text, t=0.0), parse_rest_job_records(text, t=0.0)):
        out = list(records)
        assert [r.id for r in out if isinstance(r, Job)] == [str(j["job_id"]) for j in json.loads(text)["jobs"]]
        elapsed = {
            s.labels["job_id"]: s.value
            for s in out
            if isinstance(s, Sample) and s.metric == vocab.SLURM_JOB_ELAPSED_SECONDS
        }
        assert elapsed == {str(j["job_id"]): last_update - j["start_time"]["number"] for j in running}


def test_pending_and_finished_jobs_have_no_snapshot_samples() -> None:
    records = list(read_squeue_records(V41))
    ended = {r.id for r in records if isinstance(r, Job) and (r.end is not None or r.start is None)}
    assert ended and not {r.labels["job_id"] for r in records if isinstance(r, Sample)} & ended


def test_sacct_running_job_elapsed_is_a_sample() -> None:
    from hpcwatch.sources.slurm import read_sacct_records

    samples = [r for r in read_sacct_records(DATA / "slurm/sacct.json") if isinstance(r, Sample)]
    elapsed = {s.labels["job_id"]: s.value for s in samples if s.metric == vocab.SLURM_JOB_ELAPSED_SECONDS}
    assert elapsed["7"] == 10  # jobs[6].time.elapsed of the running job 7
    assert "2" not in elapsed  # finished: its elapsed is end - start


@pytest.mark.parametrize(
    "last_update", ['"soon"', "true", "[1]", '{"set": true, "number": "x"}', "1e999", "1" + "0" * 400]
)
def test_a_bad_last_update_is_one_parse_error(last_update) -> None:
    from hpcwatch.errors import ParseError

    text = V44.read_text()
    bad = text[: text.index('"last_update"')] + f'"last_update": {last_update},' + text[text.index('"meta"') - 2 :]
    with pytest.raises(ParseError, match="last_update"):
        list(parse_squeue_records(bad, path="q.json"))


class _ScrapedOnly:
    """A PromQL backend that holds scrapes only (dcgm-exporter, node-exporter), as a real one does when no
    Slurm exporter is scraped: here one GPU sample of job 7's node, two hours after it started."""

    def samples(self, metrics: list[str], *, t0: float | None) -> object:
        from hpcwatch.schemas import SAMPLE_SCHEMA

        assert vocab.SLURM_JOB_ELAPSED_SECONDS in metrics
        row = {"metric": vocab.DCGM_FI_DEV_GPU_UTIL, "host": "node1", "gpu": "0", "job": "7", "t": 1795991704.0 + 7200}
        columns = {f.name: [row.get(f.name)] for f in SAMPLE_SCHEMA}
        columns["value"], columns["labels"] = [50.0], ["{}"]
        import pyarrow as pa

        return pa.table(columns, schema=SAMPLE_SCHEMA)


def test_through_prometheus_a_running_job_still_ends_at_slurms_snapshot(tmp_path) -> None:
    """`jobs --prometheus` read every sample from Prometheus, which holds no Slurm figures: job 7's elapsed
    ran to the newest scrape (2 h, then capped at its 1 h limit) instead of Slurm's half an hour."""
    from hpcwatch.reports.jobs import prometheus_samples

    copy = tmp_path / "squeue.json"
    shutil.copy(SQUEUE_22_05, copy)
    start = 1795991704.0
    os.utime(copy, (start + 1800.0, start + 1800.0))
    with Store(tmp_path / "s") as store:
        ingest_paths(store, [copy])
        samples = prometheus_samples(_ScrapedOnly(), t0=start, store=store)  # type: ignore[arg-type]
        reports = {r.id: r for r in jobs_report(store, samples=samples)}
        from_store = {r.id: r for r in jobs_report(store)}
    assert reports["7"].elapsed_s == pytest.approx(1800.0) == from_store["7"].elapsed_s
