"""Every reader of ``sources`` (each ``read_*`` and ``parse_*``), fed hostile bytes, yields records or
raises ParseError: never another exception. Bounded: the whole file runs in well under a minute."""

from __future__ import annotations

import gzip
import importlib
import inspect
import pkgutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hpcwatch.sources
from hpcwatch.errors import ParseError

_SKIP_MODULES = {"detect", "lines"}  # detect is the registry; lines holds the helpers every reader uses


def _readers(prefix: str) -> list[tuple[str, object]]:
    found = []
    for info in pkgutil.iter_modules(hpcwatch.sources.__path__):
        if info.name in _SKIP_MODULES:
            continue
        module = importlib.import_module(f"hpcwatch.sources.{info.name}")
        for name in getattr(module, "__all__", ()):
            if name.startswith(prefix) and callable(getattr(module, name)):
                found.append((f"{info.name}.{name}", getattr(module, name)))
    return sorted(found, key=lambda pair: pair[0])


READ = _readers("read_")


def _takes_text(fn) -> bool:
    """Parsers of text, bytes or lines (not those of an already decoded table or document)."""
    first = str(next(iter(inspect.signature(fn).parameters.values())).annotation)
    return any(kind in first for kind in ("str", "bytes", "Iterable"))


PARSE = [(name, fn) for name, fn in _readers("parse_") if name != "falco.parse_rfc3339" and _takes_text(fn)]

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
    max_examples=60,
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
