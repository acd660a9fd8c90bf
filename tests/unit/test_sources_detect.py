"""Format detection: every captured file finds its reader; unknown files are named errors."""

from __future__ import annotations

import gzip

import pytest

from hpcwatch.errors import ParseError
from hpcwatch.records import Job, Sample
from hpcwatch.sources.detect import FORMATS, detect_format, read_any, read_paths
from tests.conftest import DATA


@pytest.mark.parametrize("relpath,name", [
    ("prometheus/dcgm_exporter_node1.prom", "prometheus"),
    ("prometheus/node_exporter_infiniband.prom", "prometheus"),
    ("prometheus/timestamps_and_escapes.prom", "prometheus"),
    ("slurm/squeue.json", "squeue-json"),
    ("slurm/squeue_v0040_synthetic.json", "squeue-json"),
    ("slurm/sacct.json", "sacct-json"),
    ("slurm/sacct_v0040_synthetic.json", "sacct-json"),
    ("slurm/scontrol_show_job_detail.txt", "scontrol-job"),
    ("infiniband/perfquery_x_switch_2ports.out", "perfquery"),
    ("infiniband/perfquery_basic_hca.txt", "perfquery"),
    ("infiniband/ibstat_two_cas.txt", "ibstat"),
    ("lustre/obdfilter_OST0000_job_stats.txt", "lustre-job-stats"),
    ("lustre/mdt_MDT0000_job_stats.txt", "lustre-job-stats"),
    ("nvidia_smi/nvidia_smi_q.xml", "nvidia-smi-xml"),
    ("nvidia_smi/nvidia_smi_query.csv", "nvidia-smi-csv"),
])
def test_each_captured_file_is_recognised(relpath, name):
    assert detect_format(DATA / relpath).name == name


def test_empty_file_is_no_format_and_no_records():
    assert detect_format(DATA / "infiniband/perfquery_x_empty.out") is None
    assert list(read_any(DATA / "infiniband/perfquery_x_empty.out")) == []


def test_unknown_format_names_the_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("dear diary, the GPUs were hot today\n")
    with pytest.raises(ParseError) as err:
        list(read_any(path))
    assert str(path) in str(err.value) and "unknown format" in str(err.value)


def test_gzipped_files_are_read(tmp_path):
    path = tmp_path / "squeue.json.gz"
    path.write_bytes(gzip.compress((DATA / "slurm/squeue.json").read_bytes()))
    jobs = list(read_any(path))
    assert len(jobs) == 10 and all(isinstance(j, Job) for j in jobs)


def test_read_paths_walks_folders_in_name_order():
    records = list(read_paths([DATA / "lustre", DATA / "infiniband"]))
    assert all(isinstance(r, Sample) for r in records)
    assert {r.metric for r in records} >= {"lustre_job_write_bytes_total", "ib_PortXmitData_bytes", "ib_port_up"}


def test_forced_format_and_unknown_format_name():
    assert len(list(read_any(DATA / "slurm/squeue.json", format="squeue-json"))) == 10
    with pytest.raises(ParseError, match="unknown format 'yaml'"):
        list(read_any(DATA / "slurm/squeue.json", format="yaml"))


def test_format_names_are_unique():
    names = [f.name for f in FORMATS]
    assert len(names) == len(set(names))
