"""A job's settled checkpoints kept on disk by one process and read on from by the next
(``reports.checkpointfiles``): a restarted server's first page reads what followed the checkpoint, and reports
what a fresh read reports; a checkpoint no longer true, or a file not one of ours, is skipped, never trusted."""

from __future__ import annotations

import logging
import os
import pickle
import shutil

import orjson
import pytest

from hpcwatch import vocab
from hpcwatch.analysis.attribution import report_dict
from hpcwatch.records import Job, Sample
from hpcwatch.reports import checkpointfiles, jobstretches
from hpcwatch.reports.checkpointfiles import CheckpointFiles, Saved
from hpcwatch.reports.jobpage import job_overview
from hpcwatch.reports.jobs import job_report
from hpcwatch.reports.jobstretches import KeptStretches
from hpcwatch.store import Store
from tests.conftest import reference_twin
from tests.unit.stretch_fixtures import reads, small_stretches  # noqa: F401  (fixtures)
from tests.unit.test_jobstretches import _same_series


@pytest.fixture
def live(tmp_path):
    """Seven minutes of the reference twin in a store on disk (seven stretches), then more on demand."""
    store = Store(tmp_path / "store")
    yield store, reference_twin(store, seed=21, ticks=42)
    store.close()


def _running(store: Store) -> Job:
    return next(j for j in store.jobs() if j.end is None and j.start is not None and j.gpus >= 8)


def _report(store: Store, job: str, kept: KeptStretches | None = None) -> dict:
    return report_dict(job_report(store, job, kept=kept), per_gpu=True)


def _files(store: Store) -> list[str]:
    return sorted(os.listdir(store.path / checkpointfiles.FOLDER))


def _saved_upto(store: Store, kind: str, job: str) -> float:
    saved = CheckpointFiles.of(store).load(kind, job)
    assert saved is not None
    return saved.upto


def test_a_restarted_server_reads_on_from_the_checkpoints_the_last_one_wrote(live, reads) -> None:
    store, twin = live
    job = _running(store)
    job_overview(store, job.id, kept=KeptStretches(on_disk=True))  # the server before its restart
    assert [name.split("-")[0] for name in _files(store)] == ["charts", "report"]
    saved = _saved_upto(store, "report", job.id)
    newest = store.time_range()[1] or 0.0
    assert saved == newest - jobstretches.SETTLE_S  # the newest settled checkpoint
    for _ in range(3):
        twin.step()
    reads.clear()
    page = job_overview(store, job.id, kept=KeptStretches(on_disk=True))  # a new process: nothing in memory
    assert reads and min(reads) == saved  # what followed the checkpoint, report and charts: not the job's life
    fresh = job_overview(store, job.id)
    assert report_dict(page.job, per_gpu=True) == report_dict(fresh.job, per_gpu=True)
    _same_series(page.series, fresh.series)


def test_files_are_written_once_a_minute_of_the_jobs_time(live) -> None:
    store, twin = live
    job = _running(store)
    kept = KeptStretches(on_disk=True)
    _report(store, job.id, kept)
    first = _saved_upto(store, "report", job.id)
    for _ in range(3):  # 30 s: the page keeps newer checkpoints in memory, the file stays
        twin.step()
        _report(store, job.id, kept)
    assert _saved_upto(store, "report", job.id) == first
    seen = set()
    for _ in range(7):  # a page every 10 s: the newest settled checkpoint passes a minute after the first
        twin.step()
        _report(store, job.id, kept)
        seen.add(_saved_upto(store, "report", job.id))
    assert len(seen) == 2 and max(seen) >= first + checkpointfiles.SAVE_EVERY_S


def test_a_row_landed_before_the_saved_checkpoint_makes_the_next_process_read_the_job_again(live, reads) -> None:
    store, _ = live
    job = _running(store)
    _report(store, job.id, KeptStretches(on_disk=True))
    saved, first_read = _saved_upto(store, "report", job.id), min(reads)
    host = job.nodes[0]
    labels = {"Hostname": host, "gpu": str(job.gpus_by_node[host][0]), "hpc_job": job.id}
    store.add([Sample(metric=vocab.DCGM_FI_DEV_GPU_UTIL, labels=labels, t=saved - 30.0, value=7.0)])  # late
    reads.clear()
    assert _report(store, job.id, KeptStretches(on_disk=True)) == _report(store, job.id)
    assert min(reads) == first_read  # the job's life again: the file was not true any more


def test_a_file_of_other_nodes_or_a_newer_store_is_not_resumed(live, reads) -> None:
    """A requeued job's file (its allocation since is another), or a file from a store made again since at the
    same path (its version is past the store's): both read the job from its start."""
    store, _ = live
    job = _running(store)
    _report(store, job.id, KeptStretches(on_disk=True))
    first_read = min(reads)
    files = CheckpointFiles.of(store)
    saved = files.load("report", job.id)
    for changed in (
        Saved(**{**_fields(saved), "hosts": ("elsewhere",)}),
        Saved(**{**_fields(saved), "version": 10**9}),
    ):
        files.save(changed)
        reads.clear()
        assert _report(store, job.id, KeptStretches(on_disk=True)) == _report(store, job.id)
        assert min(reads) == first_read  # the job's life again


def _fields(saved: Saved) -> dict:
    return {name: getattr(saved, name) for name in Saved.__slots__}


def test_a_file_that_is_not_ours_is_skipped_with_one_line_and_runs_nothing(tmp_path, caplog) -> None:
    files = CheckpointFiles(tmp_path / "checkpoints")
    files.save(Saved("7", "report", 0.0, ("n1",), 1, None, 5.0, (), {"x": 1}))
    path = files.path("report", "7")
    assert files.load("report", "7") == Saved("7", "report", 0.0, ("n1",), 1, None, 5.0, (), {"x": 1})
    witness = tmp_path / "ran"

    class Hostile:
        def __reduce__(self):
            return (os.mkdir, (str(witness),))

    caplog.set_level(logging.WARNING)
    for body in (
        pickle.dumps(("hpcwatch-checkpoint/3", "7", "report", 0.0, (), 1, Hostile(), 5.0, (), None)),
        path.read_bytes()[:-9],  # truncated
        pickle.dumps(("hpcwatch-checkpoint/1", "7", "report", 0.0, (), 1, None, 5.0, (), None)),
        pickle.dumps(("hpcwatch-checkpoint/2", "7", "report", 0.0, (), 1, None, 5.0, (), None)),  # read without lead-in
        pickle.dumps(("hpcwatch-checkpoint/3", "8", "report", 0.0, (), 1, None, 5.0, (), None)),  # another job's
        b"\x1b[2J not a pickle",
    ):
        path.write_bytes(body)
        caplog.clear()
        assert files.load("report", "7") is None
        assert len(caplog.records) == 1 and str(path) in caplog.text and "\x1b" not in caplog.text
    assert not witness.exists()


def test_a_file_past_the_size_a_checkpoint_has_is_not_read(tmp_path, monkeypatch, caplog) -> None:
    files = CheckpointFiles(tmp_path / "checkpoints")
    files.save(Saved("7", "report", 0.0, ("n1",), 1, None, 5.0, (), list(range(1000))))
    monkeypatch.setattr(checkpointfiles, "MAX_FILE_BYTES", 1000)
    assert files.load("report", "7") is None
    assert "more than a checkpoint holds" in caplog.text


def test_a_folder_that_cannot_be_written_is_said_once(tmp_path, caplog) -> None:
    (tmp_path / "checkpoints").write_text("a file where the folder goes")
    files = CheckpointFiles(tmp_path / "checkpoints")
    caplog.set_level(logging.WARNING)
    saved = Saved("7", "report", 0.0, ("n1",), 1, None, 5.0, (), None)
    assert files.save(saved) is False
    assert files.save(saved) is False
    assert len(caplog.records) == 1 and "cannot keep the jobs' checkpoints" in caplog.text


def test_only_the_newest_jobs_files_are_kept(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(checkpointfiles, "MAX_JOBS_ON_DISK", 2)
    files = CheckpointFiles(tmp_path / "checkpoints")
    for age, job in enumerate(("old", "middle", "new")):
        for kind in ("report", "charts"):
            files.save(Saved(job, kind, 0.0, (), 1, None, 5.0, (), None))
            os.utime(files.path(kind, job), (1000.0 + age, 1000.0 + age))  # written in this order
    abandoned = files.folder / ".writing-abc"
    abandoned.write_bytes(b"half a file")
    os.utime(abandoned, (1.0, 1.0))
    files.save(Saved("new", "report", 0.0, (), 1, None, 6.0, (), None))
    assert {files.load(kind, job) is not None for kind in ("report", "charts") for job in ("middle", "new")} == {True}
    assert files.load("report", "old") is None and files.load("charts", "old") is None
    assert not abandoned.exists()


def test_a_store_in_memory_keeps_nothing_on_disk() -> None:
    with Store(":memory:") as store:
        assert CheckpointFiles.of(store) is None


def test_hpcwatch_job_reads_on_from_the_servers_checkpoint_and_writes_nothing(live, reads, run_cli) -> None:
    store, twin = live
    job = _running(store)
    job_overview(store, job.id, kept=KeptStretches(on_disk=True))
    saved = _saved_upto(store, "report", job.id)
    for _ in range(7):  # past the minute after which a writer writes a newer one
        twin.step()
    folder = store.path / checkpointfiles.FOLDER
    written = {name: (folder / name).stat().st_mtime_ns for name in _files(store)}
    reads.clear()
    code, out, err = run_cli(["job", job.id, "--db", str(store.path), "--json"])
    assert code == 0, err
    assert min(reads) == saved
    found = orjson.loads(out)
    del found["cost"]
    assert found == orjson.loads(orjson.dumps(_report(store, job.id)))
    assert {name: (folder / name).stat().st_mtime_ns for name in _files(store)} == written


def test_a_job_evicted_from_memory_reads_on_from_the_file_this_process_wrote(live, reads) -> None:
    store, _ = live
    job = _running(store)
    kept = KeptStretches(size=1, on_disk=True)
    _report(store, job.id, kept)
    saved = _saved_upto(store, "report", job.id)
    for other in [j for j in store.jobs() if j.id != job.id and j.start is not None and j.nodes]:
        job_overview(store, other.id, kept=kept)  # one job's kinds kept: the first one's leave memory
    reads.clear()
    _report(store, job.id, kept)
    assert min(reads) == saved  # from the file (from memory, nothing would be read: the store did not change)


def test_a_store_made_again_in_the_folder_drops_the_checkpoints_of_the_one_before(live) -> None:
    """Its versions start again from 0: a file of the store before would pass its checks once it had as many."""
    store, _ = live
    _report(store, _running(store).id, KeptStretches(on_disk=True))
    store.close()
    assert (store.path / checkpointfiles.FOLDER).is_dir()
    for entry in store.path.iterdir():
        if entry.name != checkpointfiles.FOLDER:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    with Store(store.path) as again:
        assert again.version == 0
    assert not (store.path / checkpointfiles.FOLDER).exists()


def test_a_checkpoint_that_cannot_be_written_costs_the_page_nothing(live, monkeypatch, caplog) -> None:
    store, _ = live
    job = _running(store)

    def failing(partial):
        raise TypeError("a field of a kind pickle does not take\x1b[2J")

    monkeypatch.setattr(jobstretches, "REPORT_ON_DISK", jobstretches.OnDisk(failing, failing))
    assert _report(store, job.id, KeptStretches(on_disk=True)) == _report(store, job.id)
    assert "checkpoint not written" in caplog.text and "\x1b" not in caplog.text


def test_the_files_are_readable_by_whom_the_store_is(live) -> None:
    """The store's group (the epilog's job-end notice runs as Slurm's user in it) reads them; nobody else."""
    store, _ = live
    os.chmod(store.path, 0o2750)
    os.chmod(store.path / "manifest.json", 0o640)
    job = _running(store)
    _report(store, job.id, KeptStretches(on_disk=True))
    folder = store.path / checkpointfiles.FOLDER
    assert folder.stat().st_mode & 0o777 == 0o750
    assert {(folder / name).stat().st_mode & 0o777 for name in _files(store)} == {0o640}
