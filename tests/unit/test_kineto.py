"""The Kineto reader on real traces (H200, HTA's A100, our gloo job) and on broken ones."""

from __future__ import annotations

import gzip
import warnings

import numpy as np
import orjson
import pytest

from hpcwatch.errors import ParseError
from hpcwatch.sources.kineto import CAT, EVENT_COLUMNS, is_comm_name, parse_kineto, read_kineto


def _quiet_read(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return read_kineto(path)


def test_h200_trace_has_steps_annotations_and_kernels_as_columns(data_dir):
    trace = _quiet_read(data_dir / "kineto" / "h200_annotated_steps.json.gz")
    ev = trace.events
    assert set(ev) == set(EVENT_COLUMNS)
    assert len({len(col) for col in ev.values()}) == 1 and len(trace) > 20_000
    assert ev["ts_us"].dtype == np.float64 and ev["cat"].dtype == np.int8
    names = {trace.names[i] for i in np.unique(ev["name_id"][ev["cat"] == CAT["user_annotation"]])}
    assert {"ProfilerStep#1", "ProfilerStep#2", "data_load", "forward", "backward", "optimizer"} <= names
    kernels = ev["cat"] == CAT["kernel"]
    assert kernels.sum() == 2942 and (ev["stream"][kernels] >= 0).all()
    assert (ev["stream"][ev["cat"] == CAT["cpu_op"]] == -1).all()
    assert trace.devices == ("NVIDIA H200",)
    assert not hasattr(trace, "flows")  # skipped: correlation links a launch to its kernel (hpcwatch.traces)


def test_nccl_kernels_carry_collective_name_and_message_bytes(data_dir):
    trace = read_kineto(data_dir / "kineto" / "hta_a100_nccl_rank0.json.gz")
    assert (trace.rank, trace.world_size, trace.rank_from, trace.backend) == (0, 2, "distributedInfo", "nccl")
    ev = trace.events
    nccl = ev["comm"] & (ev["cat"] == CAT["kernel"])
    assert nccl.sum() > 0
    assert "allreduce" in {trace.names[i] for i in ev["coll_id"][nccl]}
    # ncclKernel_AllReduce of 6,637,568 floats = 26,550,272 bytes
    assert 6637568 * 4 in set(ev["msg_bytes"][nccl].tolist())


def test_gloo_collectives_are_communication(data_dir):
    trace = read_kineto(data_dir / "kineto" / "gloo_straggler" / "rank-2.json.gz")
    assert (trace.rank, trace.world_size, trace.backend) == (2, 4, "gloo")
    comm_names = {trace.names[i] for i in np.unique(trace.events["name_id"][trace.events["comm"]])}
    assert "gloo:all_reduce" in comm_names
    assert trace.metadata["host_name"]


@pytest.mark.parametrize(
    "name, comm",
    [
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", True),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", True),
        ("gloo:all_reduce", True),
        ("nccl:all_reduce", True),
        ("c10d::allreduce_", True),
        ("void at::native::vectorized_elementwise_kernel<4>", False),
        ("ncclCommInitRank", False),  # a host call, not a collective kernel
    ],
)
def test_communication_names(name, comm):
    assert is_comm_name(name) is comm


def test_rank_falls_back_to_the_file_name_with_a_warning(data_dir, tmp_path):
    doc = orjson.loads(gzip.decompress((data_dir / "kineto" / "gloo_straggler" / "rank-3.json.gz").read_bytes()))
    del doc["distributedInfo"]
    path = tmp_path / "trace_rank-7.json"
    path.write_bytes(orjson.dumps(doc))
    with pytest.warns(UserWarning, match="rank 7 taken from the file name"):
        trace = read_kineto(path)
    assert (trace.rank, trace.rank_from, trace.world_size) == (7, "filename", None)


BAD = [
    # truncated JSON: the position is in the message
    (b'{"traceEvents": [{"ph": "X", "ts": 1', "not JSON"),
    # a JSON document that is not a Chrome trace
    (b'{"events": []}', "no traceEvents"),
    (b"[1, 2]", "no traceEvents"),
    # a complete event without a time
    (b'{"traceEvents": [{"ph": "X", "name": "a", "dur": 1}]}', r"traceEvents\[0\]"),
    # a time that is not a number
    (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": "soon", "dur": 1}]}', "non-numeric"),
]


@pytest.mark.parametrize("text, message", BAD)
def test_bad_traces_raise_parse_error_naming_the_file(text, message, tmp_path):
    path = tmp_path / "rank-0.json"
    path.write_bytes(text)
    with pytest.raises(ParseError, match=message) as err:
        read_kineto(path)
    assert str(path) in str(err.value)


def test_truncated_gzip_is_a_parse_error(data_dir, tmp_path):
    raw = (data_dir / "kineto" / "gloo_straggler" / "rank-0.json.gz").read_bytes()
    path = tmp_path / "rank-0.json.gz"
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ParseError, match="gzip stream is truncated"):
        read_kineto(path)


def test_parse_accepts_text_and_keeps_units():
    doc = {
        "distributedInfo": {"rank": 1, "world_size": 2},
        "baseTimeNanoseconds": 1_000_000_000,
        "traceEvents": [
            {
                "ph": "X",
                "cat": "kernel",
                "name": "k",
                "ts": 10.5,
                "dur": 2.25,
                "pid": 0,
                "tid": 7,
                "args": {"stream": 7, "correlation": 3},
            },
            {"ph": "X", "cat": "weird", "name": "x", "ts": 1, "pid": "Spans", "tid": 1},
        ],
    }
    trace = parse_kineto(orjson.dumps(doc).decode())
    assert trace.events["dur_us"].tolist() == [2.25, 0.0]
    assert trace.events["cat"].tolist() == [CAT["kernel"], CAT["other"]]
    assert trace.events["correlation"].tolist() == [3, -1]
    assert trace.events["pid"].tolist() == [0, -1]  # old Kineto writes pid "Spans"; not a failure
    assert trace.to_utc_s(10.5) == pytest.approx(1.0000105)


@pytest.mark.parametrize("name", ["hta_a100_nccl_rank0.json.gz", "gloo_straggler/rank-1.json.gz"])
def test_reading_in_pieces_gives_the_same_columns_as_decoding_whole(data_dir, name):
    path = data_dir / "kineto" / name
    pieces = read_kineto(path)
    whole = parse_kineto(orjson.loads(gzip.decompress(path.read_bytes())), path=path)
    assert pieces.names == whole.names and pieces.metadata == whole.metadata
    for key in EVENT_COLUMNS:
        assert np.array_equal(pieces.events[key], whole.events[key], equal_nan=True), key


# Events the fast scan hands to the lenient one (and what each must become).
UNUSUAL = [
    {
        "ph": "X",
        "cat": "kernel",
        "name": "k",
        "ts": 1.0,
        "dur": 2.0,
        "pid": 0,
        "tid": 7,
        "args": {"stream": 7, "correlation": 3},
    },
    {"ph": "X", "cat": "no_such_category", "name": "odd", "ts": 3, "pid": 1, "tid": 1},  # no dur, no args
    {
        "ph": "X",
        "cat": "cpu_op",
        "name": "c10d::allreduce_",
        "ts": 4,
        "dur": 1,
        "pid": 1,
        "tid": 1,
        "args": {"Collective name": "allreduce", "In msg nelems": 10, "dtype": "BFloat16"},
    },
    {"ph": "s", "id": "0x1f", "ts": 0.5, "cat": "ac2g", "pid": 1, "tid": 1},  # flows are skipped, however odd
    {"ph": "f", "id": 4, "ts": "soon", "cat": "ac2g", "pid": 0, "tid": 7},
    {"ph": "i", "name": "instant", "ts": 2},
    {"name": "no ph at all"},
]
_USUAL = {
    "ph": "X",
    "cat": "cpu_op",
    "name": "aten::add",
    "ts": 10,
    "dur": 1,
    "pid": 1,
    "tid": 1,
    "args": {"External id": 1},
}


@pytest.mark.parametrize("first", [0, 1, 3, 6])
def test_unusual_events_among_usual_ones_read_as_documented(first):
    # ~250 kB of usual events around them: several pieces, most of them read by the fast scan
    unusual = UNUSUAL[first:] + UNUSUAL[:first]
    events = [_USUAL] * 1500 + unusual + [_USUAL] * 1500
    trace = parse_kineto(orjson.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}))
    ev = trace.events
    assert len(trace) == 3003
    row = {trace.names[n]: i for i, n in enumerate(ev["name_id"])}
    kernel, odd, coll = row["k"], row["odd"], row["c10d::allreduce_"]
    assert (ev["stream"][kernel], ev["correlation"][kernel], ev["cat"][kernel]) == (7, 3, CAT["kernel"])
    assert (ev["cat"][odd], ev["dur_us"][odd], ev["stream"][odd], ev["correlation"][odd]) == (CAT["other"], 0, -1, -1)
    assert trace.names[ev["coll_id"][coll]] == "allreduce" and ev["msg_bytes"][coll] == 20
    assert (ev["coll_id"] >= 0).sum() == 1 and np.isnan(ev["msg_bytes"]).sum() == len(trace) - 1
    assert (ev["stream"] == -1).sum() == len(trace) - 1


BAD_EVENTS = [
    # args that are not an object
    ({"ph": "X", "name": "a", "ts": 1, "args": [1, 2]}, "bad event"),
    # a name that is not a string but an object
    ({"ph": "X", "name": {"a": 1}, "ts": 1}, "bad event"),
]


@pytest.mark.parametrize("event, message", BAD_EVENTS)
def test_bad_event_after_good_ones_is_named_by_its_index(event, message, tmp_path):
    good = {"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1, "pid": 1, "tid": 1, "args": {}}
    path = tmp_path / "rank-0.json"
    path.write_bytes(orjson.dumps({"traceEvents": [good] * 5000 + [event]}))
    with pytest.raises(ParseError, match=rf"traceEvents\[5000\]: {message}") as err:
        read_kineto(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("enabled", [True, False])
def test_reading_leaves_garbage_collection_as_it_was(data_dir, enabled):
    import gc

    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        read_kineto(data_dir / "kineto" / "gloo_straggler" / "rank-0.json.gz")
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


# Events among usual ones, each read from text (typed decode, or the dict scan when it does not validate)
# and from an already decoded document (the dict scan): both must give the same columns.
ODD_EVENTS = [
    {"ph": "X", "cat": "cpu_op", "name": "spans", "ts": 5, "dur": 1, "pid": "Spans", "tid": "Spans"},  # old Kineto pid
    {
        "ph": "X",
        "cat": "kernel",
        "name": "Context Sync",
        "ts": 5,
        "dur": 1,
        "pid": 0,
        "tid": 7,
        "args": {"stream": 4294967295, "correlation": 2**64 - 1},
    },  # unsigned -1 stream
    {"ph": "X", "cat": "cpu_op", "name": 5, "ts": 5, "dur": 1, "pid": 1, "tid": 1},  # a name that is a number
    {"ph": "X", "cat": "cpu_op", "name": "nodur", "ts": 5, "dur": None, "pid": 1, "tid": 1},  # dur null: NaN
    {"ph": "X", "cat": "cpu_op", "name": "noargs", "ts": 5, "dur": 1, "pid": 1, "tid": 1, "args": None},
    {"ph": "X", "cat": "cpu_op", "name": "textts", "ts": "12.5", "dur": 1, "pid": 1, "tid": 1},  # time as text
    {"ph": "X", "cat": 3, "name": "intcat", "ts": 5, "dur": 1, "pid": 1, "tid": 1},  # category not a string
    {"ph": "X", "cat": "kernel", "name": "floatpid", "ts": 5, "dur": 1, "pid": 2.0, "tid": 1},
    {"ph": "s", "id": "0x1f", "ts": 0.5, "cat": "ac2g"},  # flows: skipped
    {"ph": "f", "id": 3.0, "ts": "soon", "cat": "ac2g"},
    {"ph": "Z", "name": "a phase the format does not have"},  # dict scan: skipped
    {"ph": "(", "name": "context begin", "ts": 5},
    {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python", "hostname": "node7"}},
    {
        "ph": "X",
        "cat": "cpu_op",
        "name": "record_param_comms",
        "ts": 6,
        "dur": 1,
        "pid": 1,
        "tid": 1,
        "args": {"Collective name": "allreduce", "In msg nelems": 8, "dtype": "Float", "Group size": 4},
    },
    {"ph": 7, "name": "ph not a string"},
]


@pytest.mark.parametrize("odd", ODD_EVENTS, ids=lambda e: str(e.get("name", e.get("id"))))
def test_typed_and_dict_scans_give_the_same_columns(odd):
    events = [_USUAL] * 1500 + [odd] + [dict(_USUAL, name="after")] * 1500
    doc = {"distributedInfo": {"rank": 0}, "traceEvents": events}
    from_text, from_doc = parse_kineto(orjson.dumps(doc)), parse_kineto(doc)
    assert from_text.names == from_doc.names and from_text.hostname == from_doc.hostname
    for key in EVENT_COLUMNS:
        assert np.array_equal(from_text.events[key], from_doc.events[key], equal_nan=True), key
    assert len(from_text) == 3000 + (odd["ph"] == "X")
