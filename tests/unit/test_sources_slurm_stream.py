"""The Slurm JSON readers stream the ``jobs`` list (issue #22 items 16, 17): the same records as a whole-document
read on every real capture, memory bounded by a job rather than the file, numbers past what the store holds a
one-line error naming the job's line."""

from __future__ import annotations

import gzip
import json
import re
import tracemalloc
from pathlib import Path

import pytest

from hpcwatch.errors import ParseError
from hpcwatch.sources import jsonstream, slurm
from hpcwatch.sources.jsonstream import JsonArrayStream
from hpcwatch.sources.slurmrest import parse_rest_accounting, parse_rest_jobs

SLURM = Path(__file__).parents[1] / "data" / "slurm"
#: Real captures in squeue's shape: Slurm 22.05 squeue and slurmrestd, Slurm-web's 24.05 and 25.11 slurmrestd.
SQUEUE = [
    "squeue.json",
    "slurmrestd_v0038_jobs.json",
    "slurmweb_24.05_v0041_slurm_jobs.json",
    "slurmweb_25.11_v0044_slurm_jobs.json",
    "squeue_v0040_synthetic.json",
]
#: In sacct's shape: Slurm 22.05 sacct (one requeued), Slurm-web's 24.05 and 25.11 slurmdbd answers.
SACCT = [
    "sacct.json",
    "sacct_requeued.json",
    "slurmweb_24.05_v0041_slurmdb_job_gpus_multi_nodes.json",
    "slurmweb_25.11_v0044_slurmdb_job_completed.json",
    "slurmweb_25.11_v0044_slurmdb_job_gpus_multi_nodes.json",
    "sacct_v0040_synthetic.json",
]
TOO_BIG = 2**64 + 1


def _whole(path: Path, build) -> list:
    """What the readers gave before streaming: the document decoded whole, then each job built."""
    out = []
    for raw in json.loads(path.read_text())["jobs"]:
        built = build(raw)
        out += built if isinstance(built, list) else [built]
    return out


@pytest.mark.parametrize("block", [jsonstream.BLOCK_CHARS, 7])
@pytest.mark.parametrize("name", SQUEUE)
def test_streamed_squeue_read_equals_the_whole_document_read(name, block, monkeypatch):
    """``block`` 7: every job is cut by the end of a block somewhere, and decoded again once it is whole."""
    monkeypatch.setattr(jsonstream, "BLOCK_CHARS", block)
    expected = _whole(SLURM / name, slurm._squeue_job)
    assert expected and list(slurm.read_squeue_json(SLURM / name)) == expected
    assert list(slurm.parse_squeue_json((SLURM / name).read_text())) == expected


@pytest.mark.parametrize("block", [jsonstream.BLOCK_CHARS, 7])
@pytest.mark.parametrize("name", SACCT)
def test_streamed_sacct_read_equals_the_whole_document_read(name, block, monkeypatch):
    monkeypatch.setattr(jsonstream, "BLOCK_CHARS", block)
    expected = _whole(SLURM / name, slurm._sacct_job_and_usage)
    assert expected and list(slurm.read_sacct_records(SLURM / name)) == expected
    assert list(slurm.read_sacct_json(SLURM / name)) == _whole(SLURM / name, slurm._sacct_job)


def test_a_gzipped_document_streams_too(tmp_path):
    path = tmp_path / "sacct.json.gz"
    path.write_bytes(gzip.compress((SLURM / "sacct.json").read_bytes()))
    assert list(slurm.read_sacct_records(path)) == _whole(SLURM / "sacct.json", slurm._sacct_job_and_usage)


def test_top_level_members_stay_reachable_before_and_after_the_jobs():
    """Slurm 24.05+ writes ``last_update`` after ``jobs`` (Slurm-web's 25.11 capture); 22.05 ``meta`` before."""
    after = JsonArrayStream.from_text((SLURM / "slurmweb_25.11_v0044_slurm_jobs.json").read_text(), "jobs")
    assert sum(1 for _ in after) == 15
    assert (
        after.members["last_update"]
        == json.loads((SLURM / "slurmweb_25.11_v0044_slurm_jobs.json").read_text())["last_update"]
    )
    before = JsonArrayStream.from_text((SLURM / "squeue.json").read_text(), "jobs")
    next(iter(before))
    assert before.members["meta"]["plugin"]["type"] == "openapi/v0.0.38"


# -- memory (item 17) --------------------------------------------------------------------------------------------


def _big_sacct(path: Path, size_bytes: int) -> int:
    """A one-line sacct document of real 22.05 jobs with distinct ids, about ``size_bytes`` long; job count."""
    jobs = json.loads((SLURM / "sacct.json").read_text())["jobs"]
    parts, written, n = [], 0, 0
    while written < size_bytes:
        text = json.dumps(dict(jobs[n % len(jobs)], job_id=10_000 + n))
        parts.append(text)
        written += len(text) + 1
        n += 1
    path.write_text('{"meta": {}, "errors": [], "jobs": [' + ",".join(parts) + "]}")
    return n


def test_a_big_document_costs_a_block_and_a_job_not_the_file(tmp_path, monkeypatch):
    """A one-line 12 MB sacct document: the whole-document read peaked at ~11x the file (issue #22 item 17);
    streamed, the peak is a block (here 64 KiB) and a job, whatever the file's size."""
    monkeypatch.setattr(jsonstream, "BLOCK_CHARS", 64 << 10)
    path = tmp_path / "sacct.json"
    n = _big_sacct(path, 12 << 20)
    tracemalloc.start()
    try:
        jobs = sum(1 for r in slurm.read_sacct_records(path) if isinstance(r, slurm.Job))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert jobs == n
    assert peak < path.stat().st_size / 6, f"peak {peak / 1e6:.1f} MB for a {path.stat().st_size / 1e6:.1f} MB file"


# -- errors keep FILE:LINE -----------------------------------------------------------------------------------


def _pretty_jobs(count: int) -> str:
    jobs = json.loads((SLURM / "squeue.json").read_text())["jobs"]
    return json.dumps({"jobs": [dict(jobs[i % len(jobs)], job_id=i + 1) for i in range(count)]}, indent=2)


def _element_starts(text: str) -> list[int]:
    """Offsets of the ``{`` of each job in a document indented by 2 (each job starts a line ``    {``)."""
    return [m.start() for m in re.finditer(r"^    \{$", text, re.M)]


def _line_of_element(text: str, index: int) -> int:
    return text.count("\n", 0, _element_starts(text)[index]) + 1


def test_a_bad_job_past_many_blocks_names_its_own_line(tmp_path):
    text = _pretty_jobs(600)  # ~2 MB: the bad job is blocks away from the start
    bad = re.sub(r'"job_id": 555,', '"job_id": null,', text)
    path = tmp_path / "squeue.json"
    path.write_text(bad)
    with pytest.raises(ParseError) as err:
        list(slurm.read_squeue_json(path))
    assert err.value.line == _line_of_element(text, 554) and "jobs[554]: job without job_id" in str(err.value)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "cut, what",
    [(b'"user_name": "alice"', b'"user_name": "alice" oops'), (b'"user_name": "alice"', b'"user_name": "\xff"')],
    ids=["not JSON", "not UTF-8"],
)
def test_bad_text_past_many_blocks_names_its_line(tmp_path, cut, what):
    data = _pretty_jobs(600).encode()
    at = data.index(cut, len(data) * 3 // 4)
    path = tmp_path / "squeue.json"
    path.write_bytes(data[:at] + what + data[at + len(cut) :])
    with pytest.raises(ParseError) as err:
        list(slurm.read_squeue_json(path))
    assert err.value.line == data.count(b"\n", 0, at) + 1


@pytest.mark.parametrize(
    "text, what",
    [
        ('{"jobs": [{"job_id": 1}], "jobs": []}', 'two "jobs"'),
        ('{"jobs": [{"job_id": 1}]} {}', "Extra data"),
        ('{"jobs": {"job_id": 1}}', 'no "jobs" list'),
        ("[1, 2]", 'no "jobs" list'),
        ('{"jobs": [{"job_id": 1}', "Expecting"),
        ('{"jobs": [{"job_id": 1},]}', "Expecting value"),
    ],
)
def test_malformed_documents_are_one_line_errors(text, what):
    with pytest.raises(ParseError, match=what):
        list(slurm.parse_squeue_json(text, path="q.json"))


def test_an_empty_jobs_list_is_no_job():
    assert list(slurm.parse_squeue_json('{"jobs": [], "last_update": 1}')) == []


def test_a_number_cut_by_a_block_is_read_whole(monkeypatch):
    monkeypatch.setattr(jsonstream, "BLOCK_CHARS", 3)
    assert [line for line, _ in JsonArrayStream.from_text('{"jobs": [12345678, 9]}', "jobs")] == [1, 1]
    assert [v for _, v in JsonArrayStream.from_text('{"jobs": [12345678, 9]}', "jobs")] == [12345678, 9]


# -- numbers the store cannot hold (item 16) -------------------------------------------------------------------


def _with_huge_gpus_squeue(name: str, index: int) -> str:
    """The real capture with job ``index``'s ``gres_detail`` saying 2**64+1 GPUs."""
    text = (SLURM / name).read_text()
    at = text.index('"gres_detail": [', _element_starts(text)[index])
    end = text.index("]", at) + 1
    return text[:at] + f'"gres_detail": ["gpu:{TOO_BIG}(IDX:0)"]' + text[end:]


def _with_huge_gpus_sacct(name: str, index: int) -> str:
    """The real capture with a ``gres/gpu`` TRES of 2**64+1 in job ``index``'s ``tres.allocated``."""
    text = (SLURM / name).read_text()
    at = re.compile(r'\n        "allocated": \[').search(text, _element_starts(text)[index]).end()
    item = f'{{"type": "gres", "name": "gpu", "id": 1001, "count": {TOO_BIG}}},'
    return text[:at] + item + text[at:]


@pytest.mark.parametrize(
    "name, index, edit, read",
    [
        ("squeue.json", 6, _with_huge_gpus_squeue, slurm.read_squeue_json),
        ("slurmweb_25.11_v0044_slurm_jobs.json", 9, _with_huge_gpus_squeue, slurm.read_squeue_json),
        ("sacct.json", 4, _with_huge_gpus_sacct, slurm.read_sacct_records),
        ("slurmweb_25.11_v0044_slurmdb_job_completed.json", 0, _with_huge_gpus_sacct, slurm.read_sacct_records),
    ],
)
def test_a_number_above_2_64_is_a_one_line_error_on_its_jobs_line(tmp_path, name, index, edit, read):
    """Before: the reader passed 2**64+1 GPUs on, and the store's pyarrow raised OverflowError (a traceback)."""
    text = edit(name, index)
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ParseError) as err:
        list(read(path))
    assert err.value.line == _line_of_element(text, index) and f"jobs[{index}]" in str(err.value)
    assert "out of range" in str(err.value) and "\n" not in str(err.value)


def test_slurmrestd_answers_with_a_number_above_2_64_are_one_line_errors():
    jobs = _with_huge_gpus_squeue("slurmweb_25.11_v0044_slurm_jobs.json", 3)
    with pytest.raises(ParseError) as err:
        list(parse_rest_jobs(jobs, path="slurmrestd /slurm/v0.0.44/jobs"))
    assert err.value.line == _line_of_element(jobs, 3) and "out of range" in str(err.value)
    accounting = _with_huge_gpus_sacct("slurmweb_25.11_v0044_slurmdb_job_gpus_multi_nodes.json", 0)
    with pytest.raises(ParseError) as err:
        list(parse_rest_accounting(accounting, path="slurmrestd /slurmdb/v0.0.44/jobs"))
    assert err.value.line == _line_of_element(accounting, 0) and "out of range" in str(err.value)


@pytest.mark.parametrize(
    "entry",
    [f"gpu:1(IDX:{TOO_BIG})", f"gpu:{TOO_BIG}", f"gpu:{2**31}(IDX:0)"],
)
def test_gres_counts_and_indices_past_the_store_are_refused(entry):
    with pytest.raises(ValueError, match="out of range"):
        slurm.parse_gres_detail(entry)


def test_a_huge_number_in_a_field_not_read_is_no_error():
    """Slurm writes NO_VAL64 (2**64 - 2) in fields of its own; bigger ones where nothing is read are kept out."""
    text = '{"jobs": [{"job_id": 7, "priority": %d, "job_state": "PENDING"}]}' % TOO_BIG
    assert [j.id for j in slurm.parse_squeue_json(text)] == ["7"]
