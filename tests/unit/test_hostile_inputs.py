"""The one hostile-input harness: every reader, fed hostile input, yields records or raises the
project's input error (one line naming the file, and its line where it has one), in bounded time.

- every registered format (``sources.registry``: a new format is covered when registered) on each
  mutation of a real sample: truncated, huge numbers, a huge line, bad UTF-8, NUL bytes, deeply
  nested JSON, a gzip bomb, an empty file;
- every ``read_*`` / ``parse_*`` of ``sources`` (found by name) on hypothesis-made hostile bytes,
  plain, gzipped and cut gzip; the text parsers on mutated seeds; Slurm JSON of any shape;
- inputs users met on main (each refused with one ParseError naming the file and line), special
  files (FIFO, socket, device, loop), gzip bombs, numbers past 64 bits in real files, long tokens
  read in linear time, line-oriented logs keeping their good lines.

Kept small enough to run in well under half a minute on one core (hypothesis examples are few:
the fixed mutations carry most of the coverage)."""

from __future__ import annotations

import gzip
import importlib
import inspect
import io
import json
import os
import pkgutil
import re
import socket
import time
import zipfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hpcwatch.sources
from hpcwatch.errors import ParseError
from hpcwatch.records import Job, Sample
from hpcwatch.sources import (
    chrony,
    df,
    edac,
    falco,
    healthtools,
    hook,
    infiniband,
    ipmitool,
    ipmitool_sdr,
    kernel_log,
    kineto,
    lines,
    lspci,
    lustre,
    mapping,
    nvidia_smi,
    ofed_info,
    opensm,
    osv,
    prometheus_text,
    slurm,
    smartctl,
    systemd_units,
    tetragon,
)
from hpcwatch.sources.lines import iter_lines, read_bytes, read_head
from hpcwatch.sources.registry import read_input
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
    # A gzip that would inflate past the document limit (scaled: 512 KiB, under the ratio-free 1 MiB).
    ("gzip-bomb", "bomb.json.gz", None, lambda p: read_bytes(p, max_bytes=512 << 10), None, "inflates past the limit"),
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
    # smartctl --json with a count that is not a number: the document is refused at that key's line.
    (
        "smartctl-string-count",
        "nvme0.json",
        b'{"json_format_version": [1, 0], "smartctl": {"exit_status": 0},\n "device": {"name": "/dev/nvme0"},\n'
        b' "nvme_smart_health_information_log": {\n  "media_errors": "12"}}',
        smartctl.read_smartctl_json,
        4,
        "media_errors is not a number",
    ),
    # smartctl --json whose media error count passes 64 bits (orjson reads it as a float).
    (
        "smartctl-huge-count",
        "nvme1.json",
        b'{"json_format_version": [1, 0], "smartctl": {},\n "device": {"name": "/dev/nvme1"},\n'
        b' "nvme_smart_health_information_log": {"media_errors": ' + b"9" * 30 + b"}}",
        smartctl.read_smartctl_json,
        3,
        "64 bits",
    ),
    # lspci -vv whose link width passes 64 bits.
    (
        "lspci-huge-width",
        "lspci.txt",
        b"01:00.0 3D controller: NVIDIA Corporation GH100\n\tSubsystem: NVIDIA Corporation Device\n"
        b"\t\tLnkSta:\tSpeed 32GT/s, Width x" + b"9" * 30 + b"\n",
        lspci.read_lspci_vv,
        3,
        "64 bits",
    ),
    # chronyc tracking whose offset is not a number.
    (
        "chrony-offset-word",
        "tracking.txt",
        b"Reference ID    : 00000000 ()\nStratum         : 0\nSystem time     : 1e999x seconds fast of NTP time\n",
        chrony.read_chronyc_tracking,
        3,
        "System time",
    ),
    # df whose Available column is a word.
    (
        "df-avail-word",
        "df.txt",
        b"Filesystem 1024-blocks Used Available Capacity Mounted on\n/dev/sda1 100 50 lots 50% /\n",
        df.read_df,
        2,
        "df avail is not a number",
    ),
    # df whose inode count passes 64 bits.
    (
        "df-huge-inodes",
        "df.txt",
        b"Filesystem Inodes IUsed IFree IUse% Mounted on\n/dev/sda1 " + b"9" * 30 + b" 1 1 1% /\n",
        df.read_df,
        2,
        "64 bits",
    ),
    # An EDAC counter that is not a number.
    (
        "edac-count-word",
        "edac.txt",
        b"/sys/devices/system/edac/mc/mc0/ce_count:0\n/sys/devices/system/edac/mc/mc0/ue_count:many\n",
        edac.read_edac,
        2,
        "EDAC error count is not",
    ),
    # nvidia-smi -q whose link width is a word.
    (
        "nvidia-smi-q-width-word",
        "smi.txt",
        b"==============NVSMI LOG==============\n\nTimestamp : Mon Nov 18 12:16:13 2024\nGPU 00000000:00:04.0\n"
        b"    PCI\n        GPU Link Info\n            Link Width\n                Max : wide\n",
        nvidia_smi.read_nvidia_smi_q,
        8,
        "Link Width/Max",
    ),
    # ofed_info without -s: its package list after the version line.
    (
        "ofed-info-full-listing",
        "ofed.txt",
        b"MLNX_OFED_LINUX-23.07-0.5.1.2 (OFED-23.07-0.5.1):\n\nclusterkit:\n",
        ofed_info.read_ofed_info,
        1,
        "not an ofed_info -s line",
    ),
    # A kernel log whose Xid code passes 64 bits.
    (
        "kernel-huge-xid",
        "dmesg.txt",
        b"[    1.5] NVRM: Xid (PCI:0000:18:00): " + b"9" * 30 + b", pid=1, GPU has fallen off the bus.\n",
        kernel_log.read_kernel_log,
        1,
        "64 bits",
    ),
    # systemctl --output=json whose array holds something that is not a unit.
    (
        "systemctl-not-a-unit",
        "failed.json",
        b'[{"unit":"a.service","load":"loaded","active":"failed","sub":"failed"}, 7]',
        systemd_units.read_systemctl_json,
        1,
        "want an array of units",
    ),
    # An ipmitool SEL record id past 64 bits.
    (
        "ipmi-huge-record",
        "sel.txt",
        b"   " + b"f" * 30 + b" | 01/18/2023 | 14:49:30 | Critical Interrupt #0x90 | Bus Fatal Error | Asserted\n",
        ipmitool.read_ipmitool_sel,
        1,
        "64 bits",
    ),
    # An ipmitool sensor threshold past a double.
    (
        "ipmi-sensor-huge-threshold",
        "sensor.txt",
        b"FAN1 | 700.000 | RPM | nc | na | 500.000 | 1" + b"0" * 400 + b" | na | na | na\n",
        ipmitool_sdr.read_ipmitool_sdr,
        1,
        "finite",
    ),
    # An ipmitool sdr elist line whose entity is not N.N.
    (
        "ipmi-sdr-elist-entity",
        "sdr.txt",
        b"Fan1 | 30h | ok | seven | 3500 RPM\n",
        ipmitool_sdr.read_ipmitool_sdr,
        1,
        "entity",
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
    started = time.process_time()
    assert read_head(path) == b"\0" * (64 << 10)
    assert time.process_time() - started < 1.0


# -- linear time on long tokens (quadratic would take minutes at these sizes) --------------------
# Bounds are in this process's CPU seconds (time.process_time): a loaded machine slows the wall clock, not them.


@pytest.mark.timeout(30)
def test_long_kineto_event_name_reads_in_linear_time(tmp_path):
    path = tmp_path / "rank-0.json"
    path.write_text('{"traceEvents": [' + _kineto_event("a" * (20 << 20)) + "," + _kineto_event("b") + "]}")
    started = time.process_time()
    trace = kineto.read_kineto(path)
    assert len(trace) == 2 and len(trace.names[0]) == 20 << 20
    assert time.process_time() - started < 5


@pytest.mark.timeout(30)
def test_kineto_name_full_of_cut_points_reads_in_linear_time(tmp_path):
    path = tmp_path / "rank-0.json"
    path.write_text('{"traceEvents": [' + _kineto_event("x") + "," + _kineto_event("},{" * (4 << 20)) + "]}")
    started = time.process_time()
    assert len(kineto.read_kineto(path)) == 2
    assert time.process_time() - started < 5


@pytest.mark.timeout(30)
def test_escaped_label_value_of_20_mb_parses_in_linear_time():
    value = '\\"\\\\\\n' * (20 << 20 // 6)
    started = time.process_time()
    (sample,) = prometheus_text.parse_prometheus_text(f'up{{a="{value}"}} 1\n', t=0)
    assert sample.labels["a"] == '"\\\n' * (20 << 20 // 6)
    assert time.process_time() - started < 10


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
    # The ratio-free allowance scaled down (1 MiB -> 128 KiB) so the test stays fast: 24 MiB in ~25 KB.
    monkeypatch.setattr(lines, "GZIP_RATIO_FREE_BYTES", 128 << 10)
    path = tmp_path / name
    _zeros_bomb(path, 24 << 20, line)
    assert path.stat().st_size * lines.GZIP_MAX_RATIO < 24 << 20
    started = time.process_time()
    with pytest.raises(ParseError) as err:
        result = reader(path)
        list(result) if not isinstance(result, bytes) else None
    message = str(err.value)
    assert message.startswith(f"{path}: gzip inflates more than 200x"), message
    assert "\n" not in message
    assert time.process_time() - started < 5


def test_the_default_ratio_bound():
    free, ratio = lines.GZIP_RATIO_FREE_BYTES, lines.GZIP_MAX_RATIO
    assert (free, ratio) == (1 << 20, 200)
    assert not lines.gzip_ratio_exceeded(free, 1)  # anything may inflate to 1 MiB
    assert lines.gzip_ratio_exceeded(free + 1, (free + 1) // ratio - 1)
    assert not lines.gzip_ratio_exceeded(free + 1, (free + 1) // ratio + 1)
    assert lines.gzip_ratio_exceeded(4 << 30, 8 << 20)  # the 8 MB -> 4 GB bomb (512x)
    assert not lines.gzip_ratio_exceeded(60 << 30, 2 << 30)  # a 2 GB gzip of a 60 GB log (30x)


@pytest.mark.timeout(30)
def test_a_real_kineto_gzip_past_the_free_allowance_is_read_whole():
    # HTA's 1.4 MB trace inflates to 25.8 MB (18.6x): past the 1 MiB allowance, far under 200x.
    path = DATA / "kineto" / "hta_gpu_lags_host_rank0.json.gz"
    with lines.open_binary(path) as stream:
        inflated = sum(len(block) for block in iter(lambda: stream.read(1 << 20), b""))
    assert inflated > lines.GZIP_RATIO_FREE_BYTES
    assert inflated < 20 * path.stat().st_size


@pytest.mark.timeout(60)
def test_a_large_zero_bomb_is_refused_after_1_mib(tmp_path):
    # 64 MiB of zeros in ~65 KB, at the default bounds: refused once 1 MiB is out, not read to the limit.
    path = tmp_path / "bomb.json.gz"
    _zeros_bomb(path, 64 << 20)
    started = time.process_time()
    with pytest.raises(ParseError, match="200x"):
        read_bytes(path)
    assert time.process_time() - started < 2


# -- numbers past 64 bits in real files: one line naming the file ------------------------------------

HUGE_NUMBERS = ["18446744073709551617", "1e400", "-18446744073709551616"]  # 2^64+1, infinite, -2^64


def _with_number(text: str, field: str, number: str) -> str:
    """``text`` with the first numeric value of ``field`` replaced by ``number``."""
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


# -- every registered format x every mutation -------------------------------------------------------
#
# Each format of the registry (so a new one is covered on registration) gets a sample, its smallest
# file in tests/data (real captures; the twin's threat fixtures, in the real formats, for those with
# none), mutated each way below. Reading it may yield records or raise InputError (ParseError,
# UnsupportedVersion), never another exception; the message is one line naming the file; each
# read is bounded in time.

MUTATIONS = ("truncated", "huge-numbers", "huge-line", "bad-utf8", "nul-bytes", "deep-json", "gzip-bomb", "empty")
_HUGE = [b"18446744073709551617", b"1e400", b"-18446744073709551616", b"9" * 400, b"NaN"]
_BOMB_PADDING = 2 << 20  # blank lines after the sample: past the 128 KiB allowance the test sets
_SECONDS_PER_READ = 10


def _sample_paths() -> dict[str, Path]:
    """The smallest file (or folder, for folder formats) of each format under tests/data."""
    best: dict[str, Path] = {}
    for path in sorted(DATA.rglob("*")):
        if path.name.startswith(".") or path.is_symlink() or (path.is_file() and path.stat().st_size > 256 << 10):
            continue  # a large file is never the smallest sample (and sniffing it costs time)
        fmt = _format_of(path)
        if fmt is not None and (fmt.name not in best or _size(path) < _size(best[fmt.name])):
            best[fmt.name] = path
    return best


def _format_of(path: Path):
    """What the registry says ``path`` is; None for an empty file or one no format recognises."""
    from hpcwatch.sources.registry import detect

    try:
        return detect(path, is_dir=path.is_dir())
    except ParseError:
        return None


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> dict[str, Path]:
    from hpcwatch.twin.threats import THREAT_SCENARIOS, write_threat_fixtures

    found = _sample_paths()
    twin = tmp_path_factory.mktemp("threat-fixtures")
    for scenario in THREAT_SCENARIOS:
        write_threat_fixtures(twin / scenario, scenario)
    for path in sorted(twin.rglob("*")):
        fmt = _format_of(path)
        if fmt is not None:
            found.setdefault(fmt.name, path)
    return found


def _mutated(data: bytes, mutation: str) -> bytes:
    """``data`` (a sample's bytes, inflated) hurt one way; the gzip bomb is written by ``_write_mutated``."""
    middle = len(data) // 2
    if mutation == "truncated":
        return data[:middle]
    if mutation == "huge-numbers":
        runs = list(re.finditer(rb"\d+", data))[:: max(1, len(re.findall(rb"\d+", data)) // 40)][:40]
        for run, huge in reversed(list(zip(runs, _HUGE * 8))):
            data = data[: run.start()] + huge + data[run.end() :]
        return data
    if mutation == "huge-line":
        return data[:middle] + b"x" * (2 << 20) + data[middle:]
    if mutation == "bad-utf8":
        return data[:middle] + b"\xff\xfe\xc3(" + data[middle:]
    if mutation == "nul-bytes":
        return data[:middle] + b"\0" * 64 + data[middle:]
    if mutation == "deep-json":
        at = next((i + 1 for i, c in enumerate(data[:4096]) if c in b"[{"), 0)
        return data[:at] + b"[" * 100_000 + data[at:]
    return b""


def _write_mutated(sample: Path, out: Path, mutation: str) -> Path:
    """The sample (a file, or a folder whose largest file is hurt) mutated, under ``out``; its path."""
    import shutil

    if sample.is_dir():
        target = out / sample.name
        shutil.copytree(sample, target, symlinks=True)
        victim = max(
            (p for p in target.rglob("*") if p.is_file() and not p.is_symlink()), key=lambda p: p.stat().st_size
        )
        _write_mutated_file(victim, victim, mutation)
        return target
    target = out / sample.name
    _write_mutated_file(sample, target, mutation)
    return target


def _write_mutated_file(source: Path, target: Path, mutation: str) -> None:
    raw = source.read_bytes()
    data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    if mutation != "gzip-bomb":
        target.write_bytes(_mutated(data, mutation))
        return
    pack = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    with target.open("wb") as out:
        out.write(pack.compress(data))
        for _ in range(_BOMB_PADDING >> 20):
            out.write(pack.compress(b"\n" * (1 << 20)))
        out.write(pack.flush())


def _consume(result) -> None:
    """Read what a format yields to its end (records come as iterators, documents whole)."""
    if result is None or isinstance(result, (bytes, str)) or hasattr(result, "num_rows"):
        return
    if hasattr(result, "__next__") or isinstance(result, (list, tuple)):
        for item in result:
            _consume(item) if hasattr(item, "__next__") else None


def _registered_formats():
    from hpcwatch.sources.registry import formats

    return list(formats())


FORMATS = _registered_formats()


#: Cases a fix on another branch resolves: drop an entry once that branch is merged.
KNOWN_SLOW: dict[tuple[str, str], str] = {}


def test_every_registered_format_has_a_sample(samples):
    missing = [f.name for f in FORMATS if f.name not in samples]
    assert not missing, f"add a real file of these formats to tests/data: {missing}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mutation", MUTATIONS)
@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
def test_every_format_on_every_mutation_reads_or_raises_one_line(tmp_path, monkeypatch, samples, fmt, mutation):
    from hpcwatch.errors import InputError
    from hpcwatch.sources.registry import ReadContext

    if (fmt.name, mutation) in KNOWN_SLOW:
        pytest.skip(KNOWN_SLOW[fmt.name, mutation])
    monkeypatch.setattr(lines, "GZIP_RATIO_FREE_BYTES", 128 << 10)  # the bomb read stays short (2 MiB in ~3 KB)
    path = _write_mutated(samples[fmt.name], tmp_path, mutation)
    readers = [fmt.read] + ([fmt.columns] if fmt.columns else [])
    for read in readers:
        started = time.process_time()
        try:
            _consume(read(path, ReadContext(on_bad_line=lambda err: None)))
            refused = False
        except InputError as err:
            message = str(err)
            assert str(path) in message, message
            assert "\n" not in message and "\x1b" not in message and len(message) <= 500, message
            refused = True
        assert time.process_time() - started < _SECONDS_PER_READ, (fmt.name, mutation)
        # A bomb is refused whole (by its ratio, or as not the format), never read to its end.
        assert refused or mutation != "gzip-bomb", f"{fmt.name} read a gzip bomb to its end"


# -- hypothesis: every read_* / parse_* of sources on hostile bytes (was test_fuzz_readers) ---------

_SKIP_MODULES = {"lines"}  # the helpers every reader uses (tested by the readers)


def _module_readers(prefix: str) -> list[tuple[str, object]]:
    found = []
    for info in pkgutil.iter_modules(hpcwatch.sources.__path__):
        if info.name in _SKIP_MODULES:
            continue
        module = importlib.import_module(f"hpcwatch.sources.{info.name}")
        for name in getattr(module, "__all__", ()):
            if name.startswith(prefix) and callable(getattr(module, name)):
                found.append((f"{info.name}.{name}", getattr(module, name)))
    return sorted(found, key=lambda pair: pair[0])


READ = _module_readers("read_")


def _takes_text(fn) -> bool:
    """Parsers of text, bytes or lines (not those of an already decoded table or document)."""
    first = str(next(iter(inspect.signature(fn).parameters.values())).annotation)
    return any(kind in first for kind in ("str", "bytes", "Iterable"))


PARSE = [(name, fn) for name, fn in _module_readers("parse_") if name != "falco.parse_rfc3339" and _takes_text(fn)]

# Pieces that reach past the first checks of the formats, joined at random with hostile ones.
_PIECES = st.sampled_from(
    [
        b'{"traceEvents": [',
        b'{"ph": "X", "ts": 1, "dur": 2, "name": "k", "args": {"stream": ',
        b"}",
        b"]}",
        b'{"kind": "span", "job": "1", "rank": 0, "step": ',
        b'"phase": "forward", "start": 1, "dur": 1}',
        b'{"rule": "r", "priority": "p", "output": "o", "time": "2024-01-01T00:00:00Z"}',
        b'{"process_exec": {"process": {}}, "time": "2024-01-01T00:00:00Z"}',
        b'{"id": "MAL-1", "affected": [',
        b'{"jobs": [{"job_id": ',
        b"JobId=1 JobState=RUNNING ",
        b'up{a="',
        b'\\"',
        b'"} 1 1000\n',
        b"# TYPE up gauge\n",
        b"# nThread 1\n#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n",
        b" #bytes #iterations BW peak[Gb/sec] BW average[Gb/sec] MsgRate[Mpps]\n",
        b"Default=0x7fff, ipoib : ALL=full;\n",
        b"- job_id: 1\n  snapshot_time: 5\n",
        b"<nvidia_smi_log><gpu>",
        b"# Port counters: Lid 1 port 1\nPortXmitData:.....",
        b"CA 'mlx5_0'\n\tPort 1:\n",
        b"NVreg_",
        b"==",
        b"9" * 30,
        b"9" * 5000,
        b"1e400",
        b"-" + b"9" * 25,
        b"NaN",
        b"[" * 600,
        b'{"a":' * 300,
        b"\x1b[2J\x07\x00",
        b"\xff\xfe",
        b"x" * 5000,
        b"\n",
        b",",
        b":",
        b"=",
        b" ",
        b"\t",
    ]
)
_HOSTILE = st.one_of(
    st.lists(_PIECES, max_size=12).map(b"".join),
    st.binary(max_size=300),
)


def _call(fn, data: bytes, *, path, text: bool):
    if text:
        params = list(inspect.signature(fn).parameters.values())
        first = str(params[0].annotation)
        decoded = data.decode("utf-8", errors="replace")
        arg = (
            data
            if "bytes" in first and "str" not in first
            else (decoded.splitlines() if "Iterable" in first else decoded)
        )
        result = fn(arg)
    else:
        result = fn(path)
    if inspect.isgenerator(result) or isinstance(result, (list, tuple, map)) or hasattr(result, "__next__"):
        list(result)


_SETTINGS = settings(
    max_examples=12,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, fn", READ, ids=[n for n, _ in READ])
@_SETTINGS
@given(data=_HOSTILE, gzipped=st.sampled_from(["plain", "gzip", "truncated-gzip"]))
def test_read_on_hostile_bytes_yields_or_raises_parse_error(tmp_path, name, fn, data, gzipped):
    path = tmp_path / "input"
    if gzipped != "plain":
        data = gzip.compress(data)
        data = data[: len(data) // 2] if gzipped == "truncated-gzip" else data
    path.write_bytes(data)
    try:
        _call(fn, data, path=path, text=False)
    except ParseError as err:
        assert "\n" not in str(err) and "\x1b" not in str(err)
        assert str(path) in str(err), str(err)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, fn", PARSE, ids=[n for n, _ in PARSE])
@_SETTINGS
@given(data=_HOSTILE)
def test_parse_on_hostile_text_yields_or_raises_parse_error(name, fn, data):
    try:
        _call(fn, data, path=None, text=True)
    except ParseError as err:
        assert "\n" not in str(err) and "\x1b" not in str(err)


def test_every_reader_is_fuzzed():
    names = {n for n, _ in READ + PARSE}
    assert {
        "kineto.read_kineto",
        "hook.read_hook_jsonl",
        "osv.read_osv",
        "prometheus_text.read_prometheus_columns",
        "healthtools.parse_nccl_tests",
        "tetragon.parse_tetragon_json",
    } <= names


# -- hypothesis: text parsers on mutated seeds, Slurm JSON of any shape (was test_sources_fuzz) ------

PARSERS = {
    "prometheus": lambda text: list(prometheus_text.parse_prometheus_text(text, t=0)),
    "prometheus-columns": lambda text: prometheus_text.parse_prometheus_columns(text, t=0),
    "squeue": lambda text: list(slurm.parse_squeue_json(text)),
    "squeue-records": lambda text: list(slurm.parse_squeue_records(text, t=0)),
    "sacct": lambda text: list(slurm.parse_sacct_json(text)),
    "scontrol": lambda text: list(slurm.parse_scontrol_show_job(text)),
    "perfquery": lambda text: list(infiniband.parse_perfquery(text)),
    "ibstat": lambda text: list(infiniband.parse_ibstat(text)),
    "lustre": lambda text: list(lustre.parse_job_stats(text, t=0)),
    "nvidia-smi-xml": lambda text: list(nvidia_smi.parse_nvidia_smi_xml(text, t=0)),
    "nvidia-smi-q": lambda text: list(nvidia_smi.parse_nvidia_smi_q(text, t=0)),
    "nvidia-smi-csv": lambda text: list(nvidia_smi.parse_nvidia_smi_csv(text, t=0)),
    "mapping-file": lambda text: mapping.parse_job_mapping_file(text),
    "smartctl-json": lambda text: list(smartctl.parse_smartctl_json(text, t=0)),
    "lspci-vv": lambda text: list(lspci.parse_lspci_vv(text)),
    "chronyc-tracking": lambda text: list(chrony.parse_chronyc_tracking(text)),
    "df": lambda text: list(df.parse_df(text)),
    "edac": lambda text: list(edac.parse_edac(text)),
    "ofed-info": lambda text: list(ofed_info.parse_ofed_info(text)),
    "kernel-log": lambda text: list(kernel_log.parse_kernel_log(text)),
    "systemctl-json": lambda text: list(systemd_units.parse_systemctl_json(text)),
    "ipmitool-sel": lambda text: list(ipmitool.parse_ipmitool_sel(text)),
    "ipmitool-sdr": lambda text: list(ipmitool_sdr.parse_ipmitool_sdr(text)),
}

# Text that looks a little like each format, so the fuzzing reaches past the first line.
_SEEDS = [
    '{"jobs": [{"job_id": 1, "nodes": "n[1-2]", "gres_detail": ["gpu:2(IDX:0-1)"], "job_state": ["RUNNING"]}]}',
    "JobId=1 JobState=RUNNING NodeList=n[1-2] Nodes=n1 GRES=gpu:1(IDX:0) StartTime=2026-01-01T00:00:00",
    "# Port counters: Lid 1 port 1\nPortXmitData:.....5\n",
    "CA 'mlx5_0'\n\tPort 1:\n\t\tState: Active\n\t\tRate: 400\n",
    "- job_id: 1\n  snapshot_time: 5\n  read_bytes: { samples: 1, unit: bytes, sum: 4 }\n",
    "<nvidia_smi_log><gpu><fb_memory_usage><used>4 MiB</used></fb_memory_usage></gpu></nvidia_smi_log>",
    "index, utilization.gpu [%]\n0, 5 %\n",
    'up{a="1"} 1 1000\n# TYPE up gauge\n',
    "MLNX_OFED_LINUX-23.07-0.5.1.2:\n",
    "==============NVSMI LOG==============\nTimestamp : Mon Nov 18 12:16:13 2024\nGPU 00000000:00:04.0\n    PCI\n"
    "        GPU Link Info\n            Link Width\n                Max : 16x\n",
]
_ALPHABET = st.sampled_from(list("{}[]()\",:=-_.0123456789 \n\tabcJobIdPortCA<>/#%'+eNaInf\\") + ["\x00", "é"])


def _texts():
    mutated = st.builds(
        lambda seed, cut, junk: seed[:cut] + junk + seed[cut:],
        st.sampled_from(_SEEDS),
        st.integers(0, 120),
        st.text(_ALPHABET, max_size=8),
    )
    return st.one_of(st.text(_ALPHABET, max_size=80), mutated, st.text(max_size=40))


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_texts())
def test_reader_yields_or_raises_parse_error(name, text):
    try:
        PARSERS[name](text)
    except ParseError:
        pass


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=200))
def test_read_any_on_arbitrary_bytes(tmp_path, data):
    path = tmp_path / "blob"
    path.write_bytes(data)
    try:
        list(read_input(path))
    except ParseError as err:
        assert str(path) in str(err)


_KEYS = st.sampled_from(
    [
        "jobs",
        "job_id",
        "nodes",
        "gres_detail",
        "job_state",
        "start_time",
        "end_time",
        "time",
        "start",
        "end",
        "tres",
        "allocated",
        "requested",
        "type",
        "name",
        "count",
        "set",
        "number",
        "infinite",
        "array",
        "task_id",
        "array_job_id",
        "array_task_id",
        "state",
        "current",
        "user_name",
        "user",
        "tres_alloc_str",
        "tres_req_str",
    ]
)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 2**64),
    st.floats(),
    st.sampled_from(
        ["", "gres", "gpu", "gpu:2(IDX:0-1)", "node[1-2]", "RUNNING", "PENDING", "gres/gpu=4", "None assigned"]
    ),
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=5)),
    max_leaves=25,
)


@pytest.mark.parametrize("name", ["squeue", "squeue-records", "sacct"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=st.lists(_JSON, max_size=3))
def test_slurm_json_of_any_shape(name, jobs):
    text = json.dumps({"jobs": jobs})
    try:
        records = PARSERS[name](text)
    except ParseError as err:
        assert "\n" not in str(err) and str(err).startswith("<input>")  # one line, naming the input
    else:
        assert all(isinstance(r, (Job, Sample)) for r in records)


BYTE_READERS = {
    "prometheus": prometheus_text.read_prometheus_text,
    "prometheus-columns": prometheus_text.read_prometheus_columns,
    "squeue": slurm.read_squeue_json,
    "squeue-records": slurm.read_squeue_records,
    "sacct": slurm.read_sacct_json,
    "scontrol": slurm.read_scontrol_show_job,
    "perfquery": infiniband.read_perfquery,
    "ibstat": infiniband.read_ibstat,
    "lustre": lustre.read_job_stats,
    "nvidia-smi-xml": nvidia_smi.read_nvidia_smi_xml,
    "nvidia-smi-q": nvidia_smi.read_nvidia_smi_q,
    "nvidia-smi-csv": nvidia_smi.read_nvidia_smi_csv,
    "smartctl-json": smartctl.read_smartctl_json,
    "lspci-vv": lspci.read_lspci_vv,
    "chronyc-tracking": chrony.read_chronyc_tracking,
    "df": df.read_df,
    "edac": edac.read_edac,
    "ofed-info": ofed_info.read_ofed_info,
    "kernel-log": kernel_log.read_kernel_log,
    "systemctl-json": systemd_units.read_systemctl_json,
    "ipmitool-sel": ipmitool.read_ipmitool_sel,
    "ipmitool-sdr": ipmitool_sdr.read_ipmitool_sdr,
}


@pytest.mark.parametrize("name", sorted(BYTE_READERS))
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(data=st.one_of(st.binary(max_size=120), st.sampled_from(_SEEDS).map(lambda s: s.encode() + b"\xff\xfe")))
def test_reader_of_arbitrary_bytes(tmp_path, name, data):
    path = tmp_path / "blob"
    path.write_bytes(data)
    try:
        result = BYTE_READERS[name](path)
        if not hasattr(result, "num_rows"):
            list(result)
    except ParseError as err:
        assert str(path) in str(err)
