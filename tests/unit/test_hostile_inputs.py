"""Inputs a new user met on main: each is refused with one ParseError naming the file (and line),
or, for line-oriented logs, the good lines are kept and the bad ones reported."""

from __future__ import annotations

import gzip
import io
import os
import socket
import time
import zipfile
import zlib
from pathlib import Path

import pytest

from hpcwatch.errors import ParseError
from hpcwatch.sources import falco, healthtools, hook, kineto, lines, opensm, osv, prometheus_text, tetragon
from hpcwatch.sources.lines import iter_lines, read_bytes, read_head
from tests.conftest import DATA


def _gzip_bomb(path: Path, inflated_bytes: int) -> None:
    """A small gzip that inflates to ``inflated_bytes`` of zeros, written without holding them."""
    with gzip.open(path, "wb", compresslevel=9) as out:
        block = b"\0" * (1 << 20)
        for _ in range(inflated_bytes // len(block)):
            out.write(block)


def _half(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _kineto_event(name: str, **args) -> str:
    import orjson

    return orjson.dumps(
        {"ph": "X", "cat": "kernel", "name": name, "pid": 1, "tid": 7, "ts": 10, "dur": 2, "args": args}
    ).decode()


def _zip_with(member: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("MAL-1.json", member)
    return buf.getvalue()


HOOK_GOOD = b'{"kind": "span", "job": "1", "rank": 0, "step": 3, "phase": "forward", "start": 1.0, "dur": 0.5}'
NCCL_HEAD = (
    "# nThread 1 nGpus 1 minBytes 8 maxBytes 8 step: 2(factor) warmup iters: 5 iters: 20\n"
    "#       size         count      type   redop    root     time   algbw   busbw #wrong"
    "     time   algbw   busbw #wrong\n"
)
IB_HEAD = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"

# (case id, file name, bytes, reader, line the error names or None, text the message contains)
CASES = [
    # A Prometheus line without a value: strict format, the whole file is rejected at that line.
    ("prom-bad-line", "a.prom", b'up 1\nup{a="1"}\n', prometheus_text.read_prometheus_columns, 2, "not a sample"),
    # A bad line deep in a file: found in a later chunk, still with its file line number.
    (
        "prom-bad-line-late",
        "b.prom",
        b"up 1\n" * 200_000 + b"bad line here\n",
        prometheus_text.read_prometheus_columns,
        200_001,
        "not a number",
    ),
    # Not UTF-8 on line 3 of a scrape.
    ("prom-not-utf8", "c.prom", b'up 1\nup 2\nup{a="\xff"} 3\n', prometheus_text.read_prometheus_text, 3, "UTF-8"),
    # ESC bytes in the offending text: quoted escaped, never raw.
    (
        "prom-escape-bytes",
        "d.prom",
        b'up{a="1"} \x1b]0;pwned\x07\n',
        prometheus_text.read_prometheus_text,
        1,
        "not a number",
    ),
    # A gzip that would inflate past the document limit (scaled: 8 MiB, under the ratio-free 16 MiB).
    ("gzip-bomb", "bomb.json.gz", None, lambda p: read_bytes(p, max_bytes=8 << 20), None, "inflates past the limit"),
    # A gzip cut in half.
    (
        "gzip-truncated",
        "t.jsonl.gz",
        _half(
            gzip.compress(b"".join(HOOK_GOOD.replace(b'"step": 3', b'"step": %d' % i) + b"\n" for i in range(20_000)))
        ),
        hook.read_hook_jsonl,
        None,
        "truncated",
    ),
    # Bytes after the gzip magic that are not deflate.
    (
        "gzip-garbage",
        "g.prom",
        b"\x1f\x8bnot deflate at all",
        prometheus_text.read_prometheus_text,
        None,
        "not valid gzip",
    ),
    # nccl-tests size beyond 64 bits.
    (
        "nccl-huge-size",
        "n.out",
        (NCCL_HEAD + "  " + "9" * 30 + "  2  float  sum  -1  10  0.1  0.1  0  10  0.1  0.1  0\n").encode(),
        healthtools.read_nccl_tests,
        3,
        "64 bits",
    ),
    # nccl-tests count that float() makes infinite (int(inf) raised OverflowError).
    (
        "nccl-inf-count",
        "n2.out",
        (NCCL_HEAD + "  8  " + "9" * 400 + "  float  sum  -1  10  0.1  0.1  0  10  0.1  0.1  0\n").encode(),
        healthtools.read_nccl_tests,
        3,
        "64 bits",
    ),
    # ib_write_bw #bytes beyond 64 bits.
    (
        "ib-huge-bytes",
        "ib.out",
        (IB_HEAD + " " + "9" * 25 + "  1000  10.0  10.0  0.1\n").encode(),
        healthtools.read_ib_write_bw,
        2,
        "64 bits",
    ),
    # The hook's step beyond 64 bits (orjson reads it as a float, int() makes it huge).
    (
        "hook-huge-step",
        "rank-0.jsonl",
        b'{"kind": "span", "job": "1", "rank": 0, "step": 1e30, "phase": "forward", "start": 1, "dur": 1}\n',
        hook.read_hook_jsonl,
        1,
        "64 bits",
    ),
    # The hook's rank beyond 64 bits as a JSON integer.
    (
        "hook-huge-rank",
        "rank-1.jsonl",
        b'{"kind": "span", "job": "1", "rank": ' + b"9" * 40 + b', "step": 1, '
        b'"phase": "forward", "start": 1, "dur": 1}\n',
        hook.read_hook_jsonl,
        1,
        "bad hook record",
    ),
    # A Kineto trace with no complete events (analysis used to take min() of nothing).
    (
        "kineto-no-events",
        "rank-0.json",
        b'{"traceEvents": [{"ph": "i", "ts": 1, "name": "x"}]}',
        kineto.read_kineto,
        None,
        "without complete events",
    ),
    # A Kineto number field that is not a number.
    (
        "kineto-ts-string",
        "rank-2.json",
        ('{"traceEvents": [' + _kineto_event("k").replace('"ts":10', '"ts":"x"') + "]}").encode(),
        kineto.read_kineto,
        None,
        "non-numeric ts_us",
    ),
    # Not JSON at all.
    ("kineto-not-json", "rank-3.json", b'{"traceEvents": [oops', kineto.read_kineto, 1, "not JSON"),
    # A corrupt OSV zip (the central directory cut off).
    ("osv-corrupt-zip", "all.zip", _zip_with(b'{"id": "MAL-1"}')[:-30], osv.read_osv, None, "zip"),
    # A zip member that is not JSON.
    ("osv-member-not-json", "all2.zip", _zip_with(b"\x1b[2J not json"), osv.read_osv, None, "not JSON"),
    # Free text forced as partitions.conf.
    ("partitions-free-text", "partitions.conf", b"hello\nworld\n", opensm.read_partitions_conf, 1, "not ended by"),
    # A partitions.conf member that is no port GUID nor ALL...
    (
        "partitions-bad-member",
        "p2.conf",
        b"Default=0x7fff, ipoib : ALL=full;\nstore=0x8001 :\n  bogus=full ;\n",
        opensm.read_partitions_conf,
        3,
        "a member is",
    ),
    # A partitions.conf P_Key that is not hex.
    ("partitions-bad-pkey", "p3.conf", b"Default=0xZZZZ : ALL=full;\n", opensm.read_partitions_conf, 1, "PKey"),
    # A Tetragon exec event without time (strict reading).
    (
        "tetragon-no-time",
        "t.json",
        b'{"process_exec": {"process": {"binary": "/bin/sh"}}, "node_name": "n1"}\n',
        tetragon.read_tetragon_json,
        1,
        "needs 'time'",
    ),
    # A Falco alert whose time is a 5 MB string.
    (
        "falco-huge-time",
        "f.json",
        b'{"rule": "r", "priority": "p", "output": "o", "time": "' + b"9" * (5 << 20) + b'"}\n',
        falco.read_falco_json,
        1,
        "RFC 3339",
    ),
    # A JSON line longer than the line limit (read line by line, never whole).
    ("jsonl-no-newline", "l.jsonl", None, lambda p: list(iter_lines(p, max_line_bytes=1 << 20)), 1, "line longer"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case, name, data, reader, line, what", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_is_one_line_parse_error(tmp_path, case, name, data, reader, line, what):
    path = tmp_path / name
    if case == "gzip-bomb":
        _gzip_bomb(path, 80 << 20)
        assert path.stat().st_size < 2 << 20
    elif case == "jsonl-no-newline":
        path.write_bytes(b"{" + b" " * (2 << 20))
    else:
        path.write_bytes(data)
    with pytest.raises(ParseError) as err:
        result = reader(path)
        list(result) if not isinstance(result, osv.OsvDatabase) else None
    message = str(err.value)
    assert message.startswith(str(path)), message
    assert what in message
    assert err.value.line == line
    assert "\n" not in message and "\x1b" not in message and "\x07" not in message
    assert len(message) < len(str(path)) + 400


def _special_paths(tmp_path: Path) -> list[tuple[str, Path]]:
    fifo = tmp_path / "fifo.prom"
    os.mkfifo(fifo)
    sock_path = tmp_path / "s.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    zero = tmp_path / "zero.prom"
    zero.symlink_to("/dev/zero")
    loop = tmp_path / "loop.prom"
    loop.symlink_to(loop)
    return [
        ("a FIFO", fifo),
        ("a socket", sock_path),
        ("a character device", zero),
        ("a directory", tmp_path),
        ("cannot read", loop),
    ]


READERS = [
    prometheus_text.read_prometheus_columns,
    prometheus_text.read_prometheus_text,
    kineto.read_kineto,
    hook.read_hook_jsonl,
    falco.read_falco_json,
    tetragon.read_tetragon_json,
    osv.read_osv,
    opensm.read_partitions_conf,
    healthtools.read_nccl_tests,
    read_head,
]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("reader", READERS, ids=lambda r: r.__name__)
def test_special_files_are_refused_without_blocking(tmp_path, reader):
    for kind, path in _special_paths(tmp_path):
        if reader is osv.read_osv and kind == "a directory":
            continue  # a folder of OSV records is a database
        with pytest.raises(ParseError) as err:
            result = reader(path)
            list(result) if not isinstance(result, (bytes, osv.OsvDatabase)) else None
        assert str(path) in str(err.value) and kind in str(err.value), (kind, str(err.value))


def test_read_head_inflates_only_the_head(tmp_path):
    path = tmp_path / "big.prom.gz"
    _gzip_bomb(path, 32 << 20)
    started = time.perf_counter()
    assert read_head(path) == b"\0" * (64 << 10)
    assert time.perf_counter() - started < 1.0


# -- linear time on long tokens (quadratic would take minutes at these sizes) --------------------


@pytest.mark.timeout(30)
def test_long_kineto_event_name_reads_in_linear_time(tmp_path):
    path = tmp_path / "rank-0.json"
    path.write_text('{"traceEvents": [' + _kineto_event("a" * (20 << 20)) + "," + _kineto_event("b") + "]}")
    started = time.perf_counter()
    trace = kineto.read_kineto(path)
    assert len(trace) == 2 and len(trace.names[0]) == 20 << 20
    assert time.perf_counter() - started < 5


@pytest.mark.timeout(30)
def test_kineto_name_full_of_cut_points_reads_in_linear_time(tmp_path):
    path = tmp_path / "rank-0.json"
    path.write_text('{"traceEvents": [' + _kineto_event("x") + "," + _kineto_event("},{" * (4 << 20)) + "]}")
    started = time.perf_counter()
    assert len(kineto.read_kineto(path)) == 2
    assert time.perf_counter() - started < 5


@pytest.mark.timeout(30)
def test_escaped_label_value_of_20_mb_parses_in_linear_time():
    value = '\\"\\\\\\n' * (20 << 20 // 6)
    started = time.perf_counter()
    (sample,) = prometheus_text.parse_prometheus_text(f'up{{a="{value}"}} 1\n', t=0)
    assert sample.labels["a"] == '"\\\n' * (20 << 20 // 6)
    assert time.perf_counter() - started < 10


def test_kineto_context_sync_stream_and_huge_ids_become_minus_one(tmp_path):
    path = tmp_path / "rank-0.json"
    events = [_kineto_event("Context Sync", stream=4294967295, correlation=2**64 - 1), _kineto_event("k", stream=7)]
    path.write_text('{"traceEvents": [' + ",".join(events) + "]}")
    trace = kineto.read_kineto(path)
    assert trace.events["stream"].tolist() == [-1, 7]
    assert trace.events["correlation"].tolist() == [-1, -1]


# -- line-oriented logs keep their good lines ------------------------------------------------------

TETRAGON_GOOD = (
    b'{"process_exec": {"process": {"binary": "/bin/sh", "pid": 5}}, "node_name": "n1", "time": "2024-05-01T10:00:00Z"}'
)
FALCO_GOOD = b'{"rule": "r", "priority": "Warning", "output": "o", "time": "2024-05-01T10:00:00.123456789Z"}'

LINE_LOGS = [
    # A Tetragon exec without time, and a line that is not JSON, between good ones.
    (
        tetragon.read_tetragon_json,
        [TETRAGON_GOOD, b'{"process_exec": {}, "node_name": "n1"}', b"{oops", TETRAGON_GOOD],
        [2, 3],
    ),
    # A Falco alert without rule, and one whose time is no time.
    (
        falco.read_falco_json,
        [FALCO_GOOD, b'{"time": "2024-05-01T10:00:00Z"}', FALCO_GOOD, b'{"rule": "r", "time": "yesterday"}'],
        [2, 4],
    ),
    # A hook line of an unknown kind, one with a rank beyond 64 bits, one not UTF-8.
    (
        hook.read_hook_jsonl,
        [
            HOOK_GOOD,
            b'{"kind": "other"}',
            HOOK_GOOD.replace(b'"rank": 0', b'"rank": 1e30'),
            b'{"kind": "span", "job": "\xff"}',
            HOOK_GOOD,
        ],
        [2, 3, 4],
    ),
]


@pytest.mark.parametrize("reader, lines, bad", LINE_LOGS, ids=lambda x: getattr(x, "__name__", None))
def test_line_logs_keep_good_lines_and_report_bad_ones(tmp_path, reader, lines, bad):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    reported: list[ParseError] = []
    records = list(reader(path, on_bad_line=reported.append))
    assert len(records) == len(lines) - len(bad)
    assert [e.line for e in reported] == bad
    assert all(str(e).startswith(f"{path}:{e.line}: ") for e in reported)
    with pytest.raises(ParseError) as strict:
        list(reader(path))
    assert strict.value.line == bad[0]


# -- advisories --------------------------------------------------------------------------------------


def test_withdrawn_osv_record_never_matches():
    db = osv.read_osv(DATA / "security" / "osv_withdrawn")
    (entry,) = db.by_package["lodestone"]
    assert entry.withdrawn == "2023-12-12T00:33:23Z"
    assert entry.malicious
    assert db.matching("lodestone", "0.0.58") == []
    assert db.matching("lodestone", None) == []


def test_aliased_malicious_and_ghsa_records_give_one_advisory(tmp_path):
    import orjson

    mal = orjson.loads((DATA / "security" / "osv" / "MAL-2024-4720.json").read_bytes())
    ghsa = {
        "schema_version": "1.5.0",
        "id": "GHSA-xxxx-yyyy-zzzz",
        "modified": "2024-08-01T00:00:00Z",
        "aliases": [mal["id"]],
        "summary": "Malicious code in 1337test",
        "affected": mal["affected"],
    }
    (tmp_path / "a.json").write_bytes(orjson.dumps(mal))
    (tmp_path / "b.json").write_bytes(orjson.dumps(ghsa))
    db = osv.read_osv(tmp_path)
    assert len(db) == 2
    assert [e.id for e in db.matching("1337test", "1")] == [mal["id"]]


def test_osv_folder_with_a_subfolder_named_like_a_record(tmp_path):
    (tmp_path / "x.json").mkdir()
    (tmp_path / "MAL-2024-4720.json").write_bytes((DATA / "security" / "osv" / "MAL-2024-4720.json").read_bytes())
    assert len(osv.read_osv(tmp_path)) == 1


# -- gzip bombs: refused by their ratio, in seconds -------------------------------------------------


def _zeros_bomb(path: Path, inflated_bytes: int, line: bytes = b"\0") -> None:
    """A gzip of ``inflated_bytes`` of ``line`` repeated, compressed a block at a time (never held whole)."""
    pack = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = line * ((1 << 20) // len(line))
    with path.open("wb") as out:
        for _ in range(inflated_bytes // len(block)):
            out.write(pack.compress(block))
        out.write(pack.flush())


BOMB_READERS = [
    ("document", "bomb.json.gz", b"\0", read_bytes),
    ("streamed-lines", "bomb.jsonl.gz", b"x" * 99 + b"\n", lambda p: list(iter_lines(p))),
    ("prometheus", "bomb.prom.gz", b'up{a="1"} 1\n', prometheus_text.read_prometheus_columns),
    ("kineto", "rank-0.json.gz", b"\0", kineto.read_kineto),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case, name, line, reader", BOMB_READERS, ids=[c[0] for c in BOMB_READERS])
def test_gzip_bomb_is_refused_by_its_ratio_in_seconds(tmp_path, monkeypatch, case, name, line, reader):
    # The ratio-free allowance scaled down (16 MiB -> 1 MiB) so the bomb can be small: 24 MiB in ~25 KB.
    monkeypatch.setattr(lines, "GZIP_RATIO_FREE_BYTES", 1 << 20)
    path = tmp_path / name
    _zeros_bomb(path, 24 << 20, line)
    assert path.stat().st_size * lines.GZIP_MAX_RATIO < 24 << 20
    started = time.perf_counter()
    with pytest.raises(ParseError) as err:
        result = reader(path)
        list(result) if not isinstance(result, bytes) else None
    message = str(err.value)
    assert message.startswith(f"{path}: gzip inflates more than 200x"), message
    assert "\n" not in message
    assert time.perf_counter() - started < 5


def test_the_default_ratio_bound():
    free, ratio = lines.GZIP_RATIO_FREE_BYTES, lines.GZIP_MAX_RATIO
    assert (free, ratio) == (16 << 20, 200)
    assert not lines.gzip_ratio_exceeded(free, 1)  # anything may inflate to 16 MiB
    assert lines.gzip_ratio_exceeded(free + 1, (free + 1) // ratio - 1)
    assert not lines.gzip_ratio_exceeded(free + 1, (free + 1) // ratio + 1)
    assert lines.gzip_ratio_exceeded(4 << 30, 8 << 20)  # the 8 MB -> 4 GB bomb (512x)
    assert not lines.gzip_ratio_exceeded(60 << 30, 2 << 30)  # a 2 GB gzip of a 60 GB log (30x)


@pytest.mark.timeout(30)
def test_a_real_kineto_gzip_past_the_free_allowance_is_read_whole():
    # HTA's 1.4 MB trace inflates to 25.8 MB (18.6x): past the 16 MiB allowance, far under 200x.
    path = DATA / "kineto" / "hta_gpu_lags_host_rank0.json.gz"
    with lines.open_binary(path) as stream:
        inflated = sum(len(block) for block in iter(lambda: stream.read(1 << 20), b""))
    assert inflated > lines.GZIP_RATIO_FREE_BYTES
    assert inflated < 20 * path.stat().st_size


@pytest.mark.timeout(60)
def test_a_large_zero_bomb_is_refused_after_16_mib(tmp_path):
    # 64 MiB of zeros in ~65 KB, at the default bounds: refused once 16 MiB are out, not read to the limit.
    path = tmp_path / "bomb.json.gz"
    _zeros_bomb(path, 64 << 20)
    started = time.perf_counter()
    with pytest.raises(ParseError, match="200x"):
        read_bytes(path)
    assert time.perf_counter() - started < 2


# -- numbers past 64 bits in real files: one line naming the file ------------------------------------

HUGE_NUMBERS = ["18446744073709551617", "1e400", "-18446744073709551616"]  # 2^64+1, infinite, -2^64


def _with_number(text: str, field: str, number: str) -> str:
    """``text`` with the first numeric value of ``field`` replaced by ``number``."""
    import re

    found = re.search(rf'"{field}": ?(-?[0-9][0-9.e+]*)', text)
    assert found, field
    return text[: found.start(1)] + number + text[found.end(1) :]


NUMBER_FILES = [
    # (case, real file, field mutated, reader, the message's words)
    ("squeue-job_id", "slurm/squeue.json", "job_id", "squeue-json", "jobs[0]: number out of range"),
    ("squeue-end_time", "slurm/squeue.json", "end_time", "squeue-json", "jobs[0]: number out of range"),
    (
        "sacct-v0044-start",
        "slurm/slurmweb_25.11_v0044_slurmdb_job_completed.json",
        "start",
        "sacct-json",
        "number out of range",
    ),
    ("sacct-job_id", "slurm/sacct.json", "job_id", "sacct-json", "jobs[0]: number out of range"),
    ("kineto-ts", "kineto/hta_alexnet_stream_sync.json.gz", "ts", "kineto", "ts_us"),
    ("kineto-dur", "kineto/hta_alexnet_stream_sync.json.gz", "dur", "kineto", "dur_us"),
]


@pytest.mark.parametrize("number", HUGE_NUMBERS)
@pytest.mark.parametrize("case, source, field, fmt, what", NUMBER_FILES, ids=[c[0] for c in NUMBER_FILES])
def test_a_number_past_64_bits_in_a_real_file_is_one_line(tmp_path, case, source, field, fmt, what, number):
    from hpcwatch.sources.registry import read_input

    raw = (DATA / source).read_bytes()
    text = gzip.decompress(raw).decode() if source.endswith(".gz") else raw.decode()
    path = tmp_path / ("rank-0.json" if fmt == "kineto" else "jobs.json")
    path.write_text(_with_number(text, field, number))
    with pytest.raises(ParseError) as err:
        result = read_input(path, format=fmt)
        list(result) if fmt != "kineto" else None
    message = str(err.value)
    assert message.startswith(f"{path}:"), message
    # 1e400 is refused by the JSON decoder itself in Kineto (orjson: "not JSON"); the rest by the field's check.
    assert what in message or (number == "1e400" and "not JSON" in message), message
    assert "\n" not in message


def test_a_hook_step_past_the_store_s_int32_is_a_bad_line_not_a_traceback(tmp_path):
    from hpcwatch.store import Store

    lines_in = (DATA / "kineto" / "gloo_straggler" / "hook" / "rank-0.jsonl").read_text().splitlines()
    lines_in[1] = lines_in[1].replace('"step":0', '"step":1099511627776')
    path = tmp_path / "rank-0.jsonl"
    path.write_text("\n".join(lines_in) + "\n")
    with pytest.raises(ParseError) as err:
        list(hook.read_hook_jsonl(path))
    assert str(err.value).startswith(f"{path}:2: bad hook record") and "32 bits" in str(err.value)
    reported: list[ParseError] = []
    spans = [r for r in hook.read_hook_jsonl(path, on_bad_line=reported.append) if hasattr(r, "step")]
    Store(":memory:").add(spans)  # pyarrow raised ArrowInvalid on the int32 step column before
    assert [e.line for e in reported] == [2]
