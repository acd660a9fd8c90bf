"""Slurm readers on the real 22.05 captures and on the newer (v0.0.40) JSON shapes."""

from __future__ import annotations

import pytest

from hpcwatch.errors import ParseError
from hpcwatch.records import Event, Job
from hpcwatch.sources.slurm import (
    expand_hostlist,
    parse_gres_detail,
    parse_sacct_json,
    parse_sacct_records,
    parse_scontrol_show_job,
    parse_squeue_json,
    read_sacct_json,
    read_scontrol_show_job,
    read_squeue_json,
)
from hpcwatch.vocab import EventKind
from tests.conftest import DATA

SLURM = DATA / "slurm"


def _by_id(jobs):
    return {j.id: j for j in jobs}


def test_squeue_two_node_job_has_gpu_indices_per_node_in_nodelist_order():
    jobs = _by_id(read_squeue_json(SLURM / "squeue.json"))
    job = jobs["9"]
    assert (job.user, job.account, job.name, job.state) == ("alice", "proj-llm", "ddp-2node", "RUNNING")
    assert job.nodes == ("node1", "node2")
    assert job.gpus_by_node == {"node1": (6, 7), "node2": (0, 1)} and job.gpus == 4
    assert job.start == 1795991704.0 and job.end is None  # squeue's end_time of a running job is a forecast


def test_squeue_finished_pending_and_single_node_jobs():
    jobs = _by_id(read_squeue_json(SLURM / "squeue.json"))
    assert len(jobs) == 10
    assert (jobs["8"].user, jobs["8"].account) == ("bob", "proj-vision")
    assert jobs["8"].gpus_by_node == {"node1": (2, 3, 4, 5)}
    assert (jobs["2"].gpus, jobs["2"].start, jobs["2"].end) == (3, 1795991671.0, 1795991691.0)
    assert jobs["5"].state == "FAILED"
    pending = jobs["10"]
    assert (pending.state, pending.start, pending.end, pending.nodes) == ("PENDING", None, None, ())


def test_sacct_counts_gpus_from_tres_allocated():
    jobs = _by_id(read_sacct_json(SLURM / "sacct.json"))
    assert jobs["3"].gpus == 8 and jobs["3"].user == "bob" and jobs["3"].nodes == ("node2",)
    assert jobs["9"].gpus == 4 and jobs["9"].nodes == ("node1", "node2") and jobs["9"].gpus_by_node == {}
    assert jobs["6"].state == "CANCELLED" and jobs["6"].end == 1795991704.0
    assert jobs["10"].nodes == () and jobs["10"].start is None and jobs["10"].gpus == 8  # requested


def test_scontrol_detail_agrees_with_squeue():
    scontrol = _by_id(read_scontrol_show_job(SLURM / "scontrol_show_job_detail.txt"))
    squeue = _by_id(read_squeue_json(SLURM / "squeue.json"))
    for jid in ("1", "7", "8", "9"):
        a, b = scontrol[jid], squeue[jid]
        assert (a.user, a.account, a.nodes, a.gpus, a.gpus_by_node, a.start, a.end, a.state) == (
            b.user,
            b.account,
            b.nodes,
            b.gpus,
            b.gpus_by_node,
            b.start,
            b.end,
            b.state,
        )


def test_scontrol_multi_line_records_read_like_one_line():
    one = (SLURM / "scontrol_show_job_detail.txt").read_text().split("\n")[8]
    multi = "\n   ".join(one.split("   ")) + "\n\n"
    (job,) = parse_scontrol_show_job(one)
    (again,) = parse_scontrol_show_job(multi)
    assert job == again and job.gpus_by_node == {"node1": (6, 7), "node2": (0, 1)}


def test_squeue_v0040_shapes_numbers_wrapped_states_as_lists():
    jobs = _by_id(read_squeue_json(SLURM / "squeue_v0040_synthetic.json"))
    array = jobs["4100_3"]
    assert array.state == "RUNNING" and array.user == "carol" and array.gpus == 8
    assert array.gpus_by_node == {"gpu07": (0, 1, 2, 3), "gpu08": (4, 5, 6, 7)}
    assert array.start == 1795990000.0 and array.end is None
    pending = jobs["4200"]
    assert (pending.state, pending.start, pending.gpus) == ("PENDING", None, 2)
    assert jobs["4150"].end == 1795995000.0 and jobs["4150"].gpus_by_node == {"gpu09": (5,)}


def test_sacct_v0040_shapes():
    jobs = _by_id(read_sacct_json(SLURM / "sacct_v0040_synthetic.json"))
    assert jobs["4100_3"].state == "COMPLETED" and jobs["4100_3"].gpus == 8
    assert jobs["4100_3"].nodes == ("gpu07", "gpu08") and jobs["4100_3"].end == 1795995000.0
    assert jobs["4200"].start is None and jobs["4200"].gpus == 2 and jobs["4200"].nodes == ()


@pytest.mark.parametrize(
    "hostlist,hosts",
    [
        ("node1", ["node1"]),
        ("node[1-2,5]", ["node1", "node2", "node5"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("a[1-2],b3", ["a1", "a2", "b3"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("", []),
        ("None assigned", []),
    ],
)
def test_expand_hostlist(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("bad", ["node[1-", "node]1[", "node[2-1]", "node[a-b]", "a,,b"])
def test_expand_hostlist_rejects_malformed(bad):
    with pytest.raises(ValueError):
        expand_hostlist(bad)


@pytest.mark.parametrize(
    "entry,expected",
    [
        ("gpu:2(IDX:6-7)", (2, (6, 7))),
        ("gpu:h100:3(IDX:0,2-3)", (3, (0, 2, 3))),
        ("gpu:1(IDX:N/A)", (1, ())),
        ("", (0, ())),
    ],
)
def test_parse_gres_detail(entry, expected):
    assert parse_gres_detail(entry) == expected


BAD_JSON = [
    # not JSON at all: the syntax error's line
    ('{\n  "jobs": [\n  oops\n]}', 3, "not JSON"),
    # JSON, but no jobs list
    ('{"meta": {}}', 1, 'no "jobs" list'),
    # a job that is a string
    ('{"jobs": ["9"]}', 1, "jobs[0]"),
    # the second job has no id: the line where it starts
    ('{"jobs": [\n  {"job_id": 1},\n  {"user_name": "alice"}\n]}', 3, "jobs[1]: job without job_id"),
    # a node list that does not close its bracket
    ('{"meta": {"jobs": []},\n"jobs": [{"job_id": 1, "nodes": "node[1-2"}]}', 2, "jobs[0]: bad hostlist"),
    # a wrapped number that wraps a string
    ('{"jobs": [{"job_id": {"set": true, "infinite": false, "number": "x"}}]}', 1, "expected a number"),
]


@pytest.mark.parametrize("text,line,what", BAD_JSON)
def test_bad_squeue_json(text, line, what):
    with pytest.raises(ParseError) as err:
        list(parse_squeue_json(text, path="q.json"))
    assert err.value.line == line and what in err.value.what and err.value.path == "q.json"


def test_bad_sacct_json_names_the_job():
    with pytest.raises(ParseError, match=r"jobs\[1\]"):
        list(parse_sacct_json('{"jobs": [{"job_id": 1}, {"job_id": 2, "tres": {"allocated": 5}}]}'))


BAD_SCONTROL = [
    # a record that does not start with JobId=
    ("UserId=alice(1) JobState=RUNNING\n", 1, "JobId"),
    # a start time that is not ISO
    ("JobId=1 JobState=RUNNING StartTime=yesterday\n", 1, "bad time"),
    # a broken node list on the second record
    ("JobId=1 JobState=RUNNING\nJobId=2 JobState=RUNNING NodeList=n[1-\n", 2, "bad hostlist 'n[1-'"),
]


@pytest.mark.parametrize("text,line,what", BAD_SCONTROL)
def test_bad_scontrol(text, line, what):
    with pytest.raises(ParseError) as err:
        list(parse_scontrol_show_job(text, path="s.txt"))
    assert err.value.line == line and what in err.value.what


def test_sacct_requeued_attempts_are_kept_as_job_end_events():
    """Real 22.05 capture: a job ``scontrol requeue``d twice is three records of one id; the job is the last
    (RUNNING), each REQUEUED attempt an event with its own start, end and nodes."""
    records = list(parse_sacct_records((SLURM / "sacct_requeued.json").read_text()))
    jobs = [r for r in records if isinstance(r, Job)]
    attempts = [r for r in records if isinstance(r, Event)]
    assert [j.state for j in jobs] == ["REQUEUED", "REQUEUED", "RUNNING"]
    assert jobs[-1].start == 1796175834 and jobs[-1].end is None
    assert [(e.attrs["start"], e.attrs["end"], e.t) for e in attempts] == [
        (1796175802, 1796175806, 1796175806),
        (1796175828, 1796175833, 1796175833),
    ]
    assert {e.kind for e in attempts} == {EventKind.JOB_END}
    assert all(
        e.attrs["state"] == "REQUEUED"
        and e.attrs["nodes"] == ["node1", "node2"]
        and e.attrs["job"] == "1"
        and e.attrs["user"] == "alice"
        for e in attempts
    )
