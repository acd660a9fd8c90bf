"""NCCL Inspector JSON: the two output examples of NVIDIA's inspector README (format v4.0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcwatch.errors import ParseError
from hpcwatch.sources.nccl_inspector import parse_nccl_inspector, read_nccl_inspector
from hpcwatch.sources.registry import detect

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "nccl_inspector" / "readme_examples_v4.json"


def test_pretty_printed_objects_one_after_the_other_are_read_in_order():
    assert detect(SAMPLE).name == "nccl-inspector"
    events = list(read_nccl_inspector(SAMPLE))
    assert [(e.attrs["coll"], e.attrs["coll_sn"], e.attrs["rank"]) for e in events] == [
        ("AllReduce", 1407, 2),
        ("ReduceScatter", 1231, 4),
    ]
    first = events[0].attrs
    assert (first["busbw_gbs"], first["exec_time_us"], first["msg_size_bytes"]) == (485.119099, 61974, 17179869184)
    assert events[0].t == pytest.approx(1748030377.748202)
    assert events[1].attrs["timing_source"] == "kernel_gpu"


def test_one_object_a_line_is_read_too():
    text = "\n".join(line.strip() for line in SAMPLE.read_text().split("\n"))
    compact = "".join(text.split("\n")).replace("}{", "}\n{")
    assert len(list(parse_nccl_inspector(compact))) == 2


BAD = [
    '{"header": {"id": "0x1"}}',  # no coll_perf
    '{"header": {}, "coll_perf": {}} [1, 2]',  # a second value that is not a record
    '{"header": {"id": ',  # cut short
]


@pytest.mark.parametrize("text", BAD)
def test_bad_inspector_text_is_a_parse_error(text):
    with pytest.raises(ParseError):
        list(parse_nccl_inspector(text, path="inspector.log"))
