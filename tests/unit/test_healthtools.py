"""Readers of dcgmi diag JSON, nccl-tests and ib_write_bw outputs."""

from __future__ import annotations

import pytest

from hpcwatch.errors import ParseError
from hpcwatch.sources.healthtools import (
    busbw_factor,
    parse_dcgmi_diag,
    parse_ib_write_bw,
    parse_nccl_tests,
    read_dcgmi_diag,
    read_ib_write_bw,
    read_nccl_tests,
)


def test_dcgm3_document_after_its_banner_reads_every_result(data_dir):
    (event,) = read_dcgmi_diag(data_dir / "health" / "dcgmi_diag_r1_dcgm3_pass.json", node="node1", level=1)
    assert event.kind == "dcgm_diag" and event.attrs["node"] == "node1" and event.attrs["level"] == 1
    assert event.attrs["version"] == "3.3.5"
    results = event.attrs["results"]
    assert len(results) == 7
    assert {r["status"] for r in results} == {"pass", "skip"}
    assert results[0]["gpu"] == "0,1,2,3,4,5,6,7"
    assert results[-1]["warnings"] == ["Inforom test is not supported on this GPU"]


def test_dcgm4_document_names_the_failing_gpu_and_its_warning(data_dir):
    (event,) = read_dcgmi_diag(data_dir / "health" / "dcgmi_diag_r3_dcgm4_fail.json", node="node2")
    assert event.attrs["version"] == "4.1.1" and event.attrs["driver"] == "550.90.07"
    failed = [r for r in event.attrs["results"] if r["status"] == "fail"]
    assert [(r["test"], r["gpu"], r["category"]) for r in failed] == [("memory", "5", "Hardware")]
    assert "double-bit ECC" in failed[0]["warnings"][0]
    warned = [r for r in event.attrs["results"] if r["status"] == "warn"]
    assert [(r["test"], r["gpu"]) for r in warned] == [("targeted_power", "2")]


@pytest.mark.parametrize(
    "text, where",
    [
        ("Error: unable to connect to host engine\n", 1),  # dcgmi failed: no document at all
        ('Successfully ran diagnostic for group.\n{"DCGM GPU Diagnostic": {"test_categories": [}}\n', 2),  # broken JSON
        ('{"something": "else"}', 1),  # JSON, but not a diagnostic
    ],
)
def test_dcgmi_diag_rejects_what_is_not_a_result_document(text, where):
    with pytest.raises(ParseError) as err:
        list(parse_dcgmi_diag(text, path="diag.json"))
    assert err.value.path == "diag.json" and err.value.line == where


def test_nccl_tests_single_node_rows_and_ranks(data_dir):
    (event,) = read_nccl_tests(data_dir / "health" / "nccl_all_reduce_perf_1node_8xh100.out")
    a = event.attrs
    assert a["collective"] == "all_reduce" and a["nranks"] == 8 and a["hosts"] == ["node1"]
    assert a["node"] == "node1" and a["gpu_model"] == "NVIDIA H100 80GB HBM3"
    assert len(a["rows"]) == 14 and a["avg_busbw_gbs"] == pytest.approx(359.392)
    top = a["rows"][-1]
    assert top["size_bytes"] == 8 * 2**30 and top["oop_busbw_gbs"] == pytest.approx(479.59)
    assert top["oop_busbw_gbs"] == pytest.approx(top["oop_algbw_gbs"] * 2 * 7 / 8, abs=0.02)
    assert not any(r["busbw_mismatch"] for r in a["rows"])


def test_nccl_tests_through_mpirun_keeps_wrong_counts(data_dir):
    (event,) = read_nccl_tests(data_dir / "health" / "nccl_all_reduce_perf_2node_wrong.out")
    a = event.attrs
    assert a["nranks"] == 16 and a["hosts"] == ["node1", "node2"]
    assert sum(r["oop_wrong"] + r["ip_wrong"] for r in a["rows"]) == 12


def test_nccl_tests_flags_a_busbw_that_is_not_algbw_times_the_factor(data_dir):
    text = (data_dir / "health" / "nccl_all_reduce_perf_1node_8xh100.out").read_text()
    doctored = text.replace("274.05  479.59", "274.05  400.00")  # busbw edited, algbw left
    (event,) = parse_nccl_tests(doctored, path="all_reduce_perf.out")  # the collective comes from the name
    assert [r["size_bytes"] for r in event.attrs["rows"] if r["busbw_mismatch"]] == [8 * 2**30]


@pytest.mark.parametrize(
    "collective, n, factor",
    [
        ("all_reduce", 8, 1.75),
        ("all_gather", 8, 0.875),
        ("reduce_scatter", 4, 0.75),
        ("broadcast", 8, 1.0),
        ("unknown", 8, None),
    ],
)
def test_busbw_factors_follow_nccl_tests_performance_doc(collective, n, factor):
    assert busbw_factor(collective, n) == (pytest.approx(factor) if factor is not None else None)


def test_nccl_tests_row_that_does_not_fit_the_header_names_its_line(data_dir):
    text = (data_dir / "health" / "nccl_all_reduce_perf_1node_8xh100.out").read_text().splitlines()
    text[15] = text[15] + "  42"
    with pytest.raises(ParseError) as err:
        list(parse_nccl_tests("\n".join(text), path="n.out"))
    assert err.value.line == 16


def test_nccl_tests_without_a_table_is_an_error():
    with pytest.raises(ParseError):
        list(parse_nccl_tests("# nThread 1 nGpus 1\n", path="n.out"))


def test_ib_write_bw_gbits(data_dir):
    (event,) = read_ib_write_bw(data_dir / "health" / "ib_write_bw_ndr_gbits.out", node="node1")
    a = event.attrs
    assert a["device"] == "mlx5_0" and a["test"] == "RDMA_Write BW Test"
    assert [r["size_bytes"] for r in a["rows"]] == [65536, 1048576]
    assert a["rows"][1]["bw_avg_gbps"] == pytest.approx(393.05)


def test_ib_write_bw_mb_per_s_is_mebibytes(data_dir):
    (event,) = read_ib_write_bw(data_dir / "health" / "ib_write_bw_degraded_mbs.out")
    (row,) = event.attrs["rows"]  # the CPU-frequency warning inside the table is skipped
    assert row["bw_avg_gbps"] == pytest.approx(23498.17 * 2**20 * 8 / 1e9)


def test_ib_write_bw_bad_row_names_its_line():
    text = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n 65536 5000 391.8\n"
    with pytest.raises(ParseError) as err:
        list(parse_ib_write_bw(text, path="ib.out"))
    assert err.value.line == 2


@pytest.mark.parametrize(
    "name, fmt",
    [
        ("dcgmi_diag_r1_dcgm3_pass.json", "dcgmi-diag"),
        ("dcgmi_diag_r3_dcgm4_fail.json", "dcgmi-diag"),
        ("nccl_all_reduce_perf_2node_wrong.out", "nccl-tests"),
        ("ib_write_bw_degraded_mbs.out", "ib-write-bw"),
    ],
)
def test_ingest_detects_health_tool_outputs(data_dir, name, fmt):
    from hpcwatch.sources.registry import detect, read_input

    path = data_dir / "health" / name
    assert detect(path).name == fmt
    assert [e.kind for e in read_input(path)] == [
        {"dcgmi-diag": "dcgm_diag", "nccl-tests": "nccl_test", "ib-write-bw": "ib_write_bw"}[fmt]
    ]
