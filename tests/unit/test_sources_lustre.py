"""Lustre job_stats of an OST and an MDT (GSI-HPC/lustre_exporter fixtures)."""

from __future__ import annotations

import pytest

from hpcwatch.errors import ParseError
from hpcwatch.sources.lustre import parse_job_stats, read_job_stats
from tests.conftest import DATA

LUSTRE = DATA / "lustre"


def _by(samples):
    return {(s.metric, s.labels["jobid"]): s for s in samples}


def test_ost_read_and_write_bytes_per_job():
    samples = _by(read_job_stats(LUSTRE / "obdfilter_OST0000_job_stats.txt"))
    write = samples[("lustre_job_write_bytes_total", "24")]
    assert write.value == 215147593728 and write.t == 1510782606.0
    assert write.labels == {"jobid": "24", "target": "OST0000"}
    assert samples[("lustre_job_write_total", "26")].value == 56048
    assert samples[("lustre_job_read_bytes_total", "28")].value == 512000
    assert samples[("lustre_job_punch_total", "24")].value == 1


def test_empty_job_id_is_kept_as_written():
    samples = _by(read_job_stats(LUSTRE / "obdfilter_OST0000_job_stats.txt"))
    assert samples[("lustre_job_write_bytes_total", "")].value == 215147593728


def test_mdt_operations_per_job():
    samples = _by(read_job_stats(LUSTRE / "mdt_MDT0000_job_stats.txt"))
    assert samples[("lustre_job_open_total", "43")].value == 93
    assert samples[("lustre_job_crossdir_rename_total", "44")].value == 2
    assert samples[("lustre_job_open_total", "43")].labels["target"] == "MDT0000"
    assert ("lustre_job_open_bytes_total", "43") not in samples


def test_lctl_param_header_names_the_target_and_usecs_ops_give_seconds():
    text = (
        "obdfilter.scratch-OST0003.job_stats=\njob_stats:\n- job_id:          train.1001\n"
        "  snapshot_time:   1700000000.5\n  start_time:      1699999000\n"
        "  read_bytes:      { samples: 2, unit: bytes, min: 4096, max: 4096, sum: 8192, sumsq: 1 }\n"
        "  read:            { samples: 2, unit: usecs, min: 10, max: 20, sum: 1500000, sumsq: 500 }\n"
    )
    samples = _by(parse_job_stats(text))
    assert samples[("lustre_job_read_bytes_total", "train.1001")].labels["target"] == "scratch-OST0003"
    assert samples[("lustre_job_read_seconds_total", "train.1001")].value == 1.5
    assert samples[("lustre_job_read_total", "train.1001")].value == 2  # counted once, from read_bytes
    assert samples[("lustre_job_read_total", "train.1001")].t == 1700000000.5


BAD = [
    # a counter before any job
    ("job_stats:\n  read_bytes: { samples: 1, unit: bytes, sum: 4 }\n", 2, "job_id"),
    # a counter without samples
    ("- job_id: 1\n  snapshot_time: 5\n  read_bytes: { unit: bytes, sum: 4 }\n", 3, "without samples"),
    # a sum that is not a number
    ("- job_id: 1\n  snapshot_time: 5\n  read_bytes: { samples: 1, unit: bytes, sum: lots }\n", 3, "sum is not"),
    # a counter before the snapshot time, and no time given
    ("- job_id: 1\n  open: { samples: 1, unit: reqs }\n", 2, "snapshot_time"),
    # a field we do not know
    ("- job_id: 1\n  snapshot_time: 5\n  colour: blue\n", 3, "unknown job_stats field"),
]


@pytest.mark.parametrize("text,line,what", BAD)
def test_bad_job_stats(text, line, what):
    with pytest.raises(ParseError) as err:
        list(parse_job_stats(text, path="js.txt"))
    assert err.value.line == line and what in err.value.what
