"""``ingest --remote-write``: the registry's readers, the samples handed to a remote-write function, not the store."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hpcwatch.errors import ParseError
from hpcwatch.ingest import REMOTE_WRITE_BATCH, remote_write_paths
from hpcwatch.records import Sample
from hpcwatch.sources.registry import read_input

DATA = Path(__file__).resolve().parents[1] / "data"
REAL_SCRAPES = [
    DATA / "prometheus" / "dcgm_exporter_h100_mig_kubernetes_issue512.prom",
    DATA / "prometheus" / "node_exporter_e2e_numa_drbd_infiniband.prom",
]


class Receiver:
    """A remote-write end that keeps what it was sent, one list per request."""

    def __init__(self) -> None:
        self.requests: list[list[Sample]] = []

    def __call__(self, samples: list[Sample]) -> int:
        self.requests.append(list(samples))
        return len({(s.metric, tuple(sorted(s.labels.items()))) for s in samples})


def test_every_sample_of_real_scrapes_is_sent_as_the_reader_reads_it(tmp_path):
    receiver = Receiver()
    report = remote_write_paths(receiver, REAL_SCRAPES, host="gpu-node-7")
    sent = [s for request in receiver.requests for s in request]
    want = [s for path in REAL_SCRAPES for s in read_input(path, host="gpu-node-7")]
    assert sent == want and len(sent) > 10
    assert [f.status for f in report.files] == ["sent", "sent"]
    assert report.totals()["samples"] == len(want)


def test_a_scontrol_capture_holds_no_samples_and_is_not_sent():
    receiver = Receiver()
    report = remote_write_paths(receiver, [DATA / "slurm" / "scontrol_show_job_detail.txt"])
    assert receiver.requests == []
    assert report.files[0].status == "not sent" and "samples only" in report.files[0].reason


def test_forcing_a_format_without_samples_is_a_parse_error():
    with pytest.raises(ParseError, match="samples only"):
        remote_write_paths(Receiver(), [DATA / "slurm" / "scontrol_show_job_detail.txt"], format="scontrol-job")


def test_a_long_file_goes_in_batches_of_remote_write_batch(tmp_path):
    lines = ["# TYPE m gauge"] + [f'm{{i="{i}"}} {i} 1700000000000' for i in range(REMOTE_WRITE_BATCH + 7)]
    (tmp_path / "big.prom").write_text("\n".join(lines) + "\n")
    receiver = Receiver()
    remote_write_paths(receiver, [tmp_path / "big.prom"], host="n1")
    assert [len(r) for r in receiver.requests] == [REMOTE_WRITE_BATCH, 7]


def test_a_bad_strict_file_stops_the_push_after_the_files_before_it(tmp_path):
    shutil.copy(REAL_SCRAPES[0], tmp_path / "a.prom")
    (tmp_path / "b.json").write_text('{"jobs": [')  # a squeue document cut short
    receiver = Receiver()
    with pytest.raises(ParseError):
        remote_write_paths(receiver, [tmp_path / "a.prom", tmp_path / "b.json"], format=None)
    assert receiver.requests, "a.prom was sent before b.json failed"
