"""Flight Recorder dumps: a hostile pickle is refused without running; real dumps (torch 2.13 gloo) and the
twin's nccl_hang name the wavefront, mismatches and the last completed collective."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcwatch.analysis.hang import analyse_hang
from hpcwatch.cli import app
from hpcwatch.errors import ParseError
from hpcwatch.reports.nccl import hang_report
from hpcwatch.sources.flight_recorder import parse_flight_recorder, read_flight_recorder
from hpcwatch.sources.registry import detect

DATA = Path(__file__).resolve().parents[1] / "data" / "flight_recorder"


class _WritesAFile:
    """Unpickled by the standard unpickler, this calls open(path, 'w'): the test that nothing ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _hostile(tmp_path: Path, protocol: int) -> tuple[bytes, Path]:
    target = tmp_path / "pwned"
    dump = {"version": "2.10", "pg_config": {}, "entries": [_WritesAFile(str(target))]}
    return pickle.dumps(dump, protocol=protocol), target


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_a_hostile_pickle_is_refused_and_nothing_runs(tmp_path, protocol):
    data, target = _hostile(tmp_path, protocol)
    path = tmp_path / "fr_trace_rank_0"
    path.write_bytes(data)
    with pytest.raises(ParseError) as err:
        read_flight_recorder(path)
    assert "refused" in str(err.value) and "fr_trace_rank_0" in str(err.value)
    assert not target.exists()


def test_the_second_lock_refuses_a_global_even_without_the_opcode_walk(tmp_path):
    import io

    from hpcwatch.sources.flight_recorder import _NoClasses

    data, target = _hostile(tmp_path, 2)
    with pytest.raises(pickle.UnpicklingError):
        _NoClasses(io.BytesIO(data)).load()
    assert not target.exists()


BAD = [
    b"\x80\x02}q\x00.",  # a pickle of {} (no version, no entries)
    b"\x80\x02}q\x00(X\x07\x00\x00\x00version",  # cut short
    b'{"version": "2.10", "entries": 3}',  # entries is not a list
    b"{not json",  # broken JSON
]


@pytest.mark.parametrize("data", BAD)
def test_bad_dumps_are_one_parse_error(data):
    with pytest.raises(ParseError):
        parse_flight_recorder(data, path="fr_trace_rank_1")


@pytest.mark.parametrize("form", ["", ".json"])
def test_real_gloo_dumps_name_the_stuck_rank_seq_and_op(form):
    paths = sorted((DATA / "gloo_hang_rank2").glob(f"fr_trace_rank_?{form}"))
    assert all(detect(p).name == "flight-recorder" for p in paths)
    report = analyse_hang([read_flight_recorder(p).attrs for p in paths])
    assert report.verdict == "hang"
    (group,) = report.groups
    w = group.wavefront
    assert (w.seq, w.op, w.missing, w.arrived) == (5, "gloo:all_reduce", (2,), (0, 1, 3))
    assert w.input_sizes == [[1024]] and w.input_dtypes == ["Float"]
    assert (group.all_completed_seq, group.all_completed_op) == (4, "gloo:all_reduce")
    assert group.members == (0, 1, 2, 3) and group.no_dump == ()


def test_real_gloo_dumps_show_a_dtype_mismatch():
    report = hang_report([DATA / "gloo_dtype_mismatch_rank3"])
    assert report.verdict == "mismatch"
    fields = {(m.seq, m.field): dict(m.values) for m in report.groups[0].mismatches}
    assert fields[(4, "input_dtypes")] == {0: ["Float"], 1: ["Float"], 2: ["Float"], 3: ["Int"]}


def test_a_rank_without_a_dump_is_listed_apart():
    paths = [p for p in sorted((DATA / "gloo_hang_rank2").glob("fr_trace_rank_?")) if not p.name.endswith("3")]
    group = analyse_hang([read_flight_recorder(p).attrs for p in paths]).groups[0]
    assert group.no_dump == (3,) and group.wavefront.missing == (2,)


def test_the_twins_nccl_hang_is_named_from_its_dumps(tmp_path):
    from hpcwatch.twin.nccl import NcclHang
    from hpcwatch.twin.run import write_run

    write_run(_twin(["nccl_hang"]), tmp_path, duration_s=20)
    report = hang_report([tmp_path / "flight_recorder"])
    w = report.groups[0].wavefront
    assert (w.missing, w.seq, w.op) == ((NcclHang.stuck_rank,), NcclHang.hang_seq, "nccl:all_reduce")
    assert report.groups[0].all_completed_seq == NcclHang.hang_seq - 1
    result = CliRunner().invoke(app, ["hang", str(tmp_path / "flight_recorder"), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["verdict"] == "hang"


def test_the_twins_socket_fallback_fires_the_rule(tmp_path):
    from hpcwatch.reports.nccl import nccl_report
    from hpcwatch.twin.run import write_run

    write_run(_twin(["nccl_socket_fallback"]), tmp_path, duration_s=20)
    rules = {r.rule: r.hosts for r in nccl_report([tmp_path / "nccl"]).rules}
    assert rules["nccl_socket_fallback"] == ("node2",)
    clean = tmp_path / "clean"
    write_run(_twin([]), clean, duration_s=20)
    assert nccl_report([clean / "nccl"]).rules == ()


def _twin(scenarios):
    from hpcwatch.twin import Twin
    from hpcwatch.twin.run import sized_reference

    return Twin(sized_reference(None), seed=1, scenarios=scenarios)


def test_hang_cli_human_output_names_the_wavefront():
    result = CliRunner().invoke(app, ["hang", str(DATA / "gloo_hang_rank2")])
    assert result.exit_code == 0
    assert "wavefront" in result.stdout and "seq 5" in result.stdout
