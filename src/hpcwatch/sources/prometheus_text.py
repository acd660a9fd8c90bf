"""Prometheus text exposition (format 0.0.4): dcgm-exporter, node-exporter, Slurm and Lustre exporters.

Two ways in, one grammar:

- ``parse_prometheus_text(text, path=, t=)`` yields one ``Sample`` per line; it is
  the reference path and the one that finds the line of an error.
- ``parse_prometheus_columns(text, path=, t=)`` returns a ``pyarrow.Table`` with
  the store's ``SAMPLE_SCHEMA`` (metric, t, value, host, gpu, job, labels JSON)
  without building a Python object per sample: the text is cut by byte offsets
  (numpy) into a zero-copy Arrow string array, names and values are checked and
  converted by Arrow kernels, and each distinct label string is parsed once
  (dcgm-exporter repeats the same ``{gpu=..,UUID=..,Hostname=..}`` on every
  metric of a GPU). Text the fast path does not take whole goes through the
  reference path, so both accept and reject exactly the same inputs.

Samples keep the metric name exactly as exposed (a counter ``foo`` stays ``foo``,
as the Prometheus server stores it; ``prometheus_client``'s parser renames it
``foo_total``), every label as written (``Hostname`` and ``hostname`` are both
kept; ``store.sample_keys`` picks the host), and ``t`` from the line's
millisecond timestamp, else the ``t`` argument, else the time of the parse
(which is what a scraper stamps).

Grammar: https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format

Not checked (like ``prometheus_client``'s parser, a successful parse does not
mean the text meets the specification): that HELP/TYPE come before their
samples or appear once, that the TYPE is a known one, that histogram buckets
are cumulative, that series are unique; escapes other than ``\\\\ \\" \\n`` are
kept as written. Not supported: OpenMetrics-only syntax (``# EOF``, exemplars)
and quoted UTF-8 metric names (``{"my.metric"}``): they are parse errors.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from hpcwatch.errors import ParseError
from hpcwatch.records import Sample
from hpcwatch.schemas import NODE_NOT_HOST_PREFIXES, SAMPLE_SCHEMA, sample_keys
from hpcwatch.sources.lines import MAX_LINE_BYTES, MAX_STREAM_BYTES, decode_utf8, file_time, open_binary

__all__ = [
    "parse_prometheus_text",
    "read_prometheus_text",
    "parse_prometheus_columns",
    "read_prometheus_columns",
    "parse_labels",
    "is_prometheus_text",
    "CHUNK_BYTES",
]

#: Bytes of whole lines read and parsed at a time by the file readers (a few MB: tens of thousands of lines).
CHUNK_BYTES = 4 << 20

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
# One sample line. Labels run to the last "}" of the line: neither the value nor
# the timestamp may contain one, so a "}" inside a quoted label value is safe.
_SAMPLE_RE = re.compile(
    rf"^[ \t]*({_NAME})[ \t]*(?:\{{(.*)\}}[ \t]*|[ \t])([^ \t\r\n]+)(?:[ \t]+([^ \t\r\n]+))?[ \t\r]*$", re.MULTILINE
)
_LABEL_HEAD_RE = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"')
_LABEL_TAIL_RE = re.compile(r"[ \t]*(?:,|\Z)")
_BLANK_REST_RE = re.compile(r"\s*\Z")
_NAME_RE = re.compile(rf"{_NAME}\Z")


#: Distinct label sets a streaming read remembers across chunks before it starts afresh.
LABEL_CACHE_ENTRIES = 100_000
#: One label text's ``(host, gpu, job, labels JSON)``.
_LabelRow = tuple[str | None, str | None, str | None, str]
#: Label text -> its row, kept by a caller across the chunks of one file (``parse_prometheus_columns``).
LabelCache = dict[str, _LabelRow]


def _unescape(value: str) -> str:
    """Undo ``\\\\``, ``\\"`` and ``\\n`` (others kept as written), in linear time.

    Backslashes pair up left to right, so splitting at ``\\\\`` first leaves pieces whose
    only escapes are ``\\"`` and ``\\n``.
    """
    if "\\" not in value:
        return value
    return "\\".join(piece.replace('\\"', '"').replace("\\n", "\n") for piece in value.split("\\\\"))


def parse_labels(inner: str, *, path: str | os.PathLike[str] | None = None, line: int | None = None) -> dict[str, str]:
    """The labels between ``{`` and ``}``: ``a="x",b="y\\"z"`` -> ``{"a": "x", "b": 'y"z'}``.

    Linear in the length of ``inner``: a value's closing quote is found with ``str.find``
    (not a regex repeat, whose state grows with every escape), and its escapes are
    undone with ``str.replace``.
    """
    if "\\" not in inner and _PLAIN_LABELS_RE.match(inner):
        pairs = _PLAIN_LABEL_RE.findall(inner)
        labels = dict(pairs)
        if len(labels) == len(pairs):
            return labels
    labels = {}
    pos, end = 0, len(inner)
    while pos < end:
        if _BLANK_REST_RE.match(inner, pos):
            break
        m = _LABEL_HEAD_RE.match(inner, pos)
        close = _closing_quote(inner, m.end()) if m else -1
        after = _LABEL_TAIL_RE.match(inner, close + 1) if close >= 0 else None
        if m is None or after is None:  # (no head: no closing quote looked for, so no tail either)
            raise ParseError('bad label (want name="value")', path=path, line=line, text=inner[pos : pos + 200])
        name = m.group(1)
        if name in labels:
            raise ParseError(f"label {name!r} given twice", path=path, line=line, text=inner[:200])
        labels[name] = _unescape(inner[m.end() : close])
        pos = after.end()
    return labels


def _closing_quote(text: str, start: int) -> int:
    """Index of the first ``"`` at or after ``start`` not escaped by a backslash; -1 if none.

    Each backslash is looked at once: the run before a quote ends at the previous quote.
    """
    at = text.find('"', start)
    while at >= 0:
        run = 0
        while at - run - 1 >= start and text[at - run - 1] == "\\":
            run += 1
        if run % 2 == 0:
            return at
        at = text.find('"', at + 1)
    return -1


def _check_comment(body: str, *, path: str | os.PathLike[str] | None, line: int | None) -> None:
    """``body`` is what follows ``#``; HELP and TYPE must name a valid metric, TYPE must give a type."""
    parts = body.split(None, 2)
    if len(parts) < 2 or parts[0] not in ("HELP", "TYPE"):
        return  # any other comment is free text
    if not _NAME_RE.match(parts[1]):
        raise ParseError(f"# {parts[0]} names an invalid metric", path=path, line=line, text="#" + body)
    if parts[0] == "TYPE" and (len(parts) < 3 or not parts[2].strip()):
        raise ParseError("# TYPE without a type", path=path, line=line, text="#" + body)


def _value(token: str, *, path: str | os.PathLike[str] | None, line: int, text: str) -> float:
    # prometheus_client refuses "_" although float() would take "1_000".
    if "_" in token:
        raise ParseError("sample value is not a number", path=path, line=line, text=text)
    try:
        return float(token)
    except ValueError as err:
        raise ParseError("sample value is not a number", path=path, line=line, text=text) from err


def _timestamp_s(token: str, *, path: str | os.PathLike[str] | None, line: int, text: str) -> float:
    try:
        if "_" in token:  # as for values: int() takes "1_000", prometheus_client does not
            raise ValueError(token)
        return int(token, 10) / 1000.0
    except (ValueError, OverflowError) as err:
        raise ParseError("timestamp is not an integer of milliseconds", path=path, line=line, text=text) from err


def parse_prometheus_text(
    text: str, *, path: str | os.PathLike[str] = "<input>", t: float | None = None, first_line: int = 1
) -> Iterator[Sample]:
    """One ``Sample`` per sample line of ``text``; see the module docstring for what is not checked.

    ``first_line`` is the number of ``text``'s first line in its file (for a chunk of a file).
    """
    now = time.time() if t is None else float(t)
    cache: dict[str, dict[str, str]] = {}
    for number, raw in enumerate(text.split("\n"), start=first_line):
        stripped = raw.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            _check_comment(stripped[1:], path=path, line=number)
            continue
        m = _SAMPLE_RE.match(raw)
        if m is None:
            raise ParseError(
                "not a sample line (want: name{labels} value [timestamp_ms])", path=path, line=number, text=raw
            )
        name, inner, value, stamp = m.groups()
        labels = cache.get(inner or "")
        if labels is None:
            labels = cache[inner or ""] = parse_labels(inner or "", path=path, line=number)
        number_value = _value(value, path=path, line=number, text=raw)
        when = _timestamp_s(stamp, path=path, line=number, text=raw) if stamp else now
        yield Sample(metric=name, labels=labels, t=when, value=number_value)


def read_prometheus_text(path: str | os.PathLike[str], *, t: float | None = None) -> Iterator[Sample]:
    """Samples of a saved scrape; lines without a timestamp get ``t``, else the file's write time.

    Read a chunk of lines at a time (``CHUNK_BYTES``), so memory does not grow with the file.
    """
    when = file_time(path) if t is None else t
    for first_line, text in _text_chunks(path, CHUNK_BYTES):
        yield from parse_prometheus_text(text, path=path, t=when, first_line=first_line)


# -- the columnar fast path ------------------------------------------------------------------
#
# The text is cut into pieces by byte offsets computed with numpy, and the pieces become one
# zero-copy Arrow string array over the text's bytes. Each sample line gives eight pieces:
#
#     DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-..",Hostname="node1"} 97 1796000000000\n# HELP ...\n
#     [name               ][{][inner                             ][} ][v][ ][stamp      ][gap ...]
#
# (no labels: name, "", "", " ", value, ...; no timestamp: the blank and the stamp are empty).
# Only lines of exactly these shapes, with names, values and stamps matching the strict patterns
# below, are taken; anything else (tabs, two blanks, leading blanks, "1_000", "nan") sends the whole
# text to the reference path, which then accepts or rejects it line by line.

_NAME_FULL = rf"^{_NAME}$"
# Values and timestamps that Python (the reference path) and Arrow's cast both read, and read alike.
_PLAIN_STAMP = r"^(?:[+-]?[0-9]{1,18})?$"
_PLAIN_VALUE = r"^[+-]?(?:[0-9]+\.?[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|Inf)$|^NaN$"
# Label strings without escapes, the usual case, read with one findall.
_PLAIN_LABELS_RE = re.compile(r'(?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*",)*(?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*",?)?\Z')
_PLAIN_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\]*)"')
_NL, _HASH, _CLOSE = (ord(c) for c in "\n#}")


class _NotPlain(Exception):
    """The text is not in the plain shape the fast path takes; the reference path will read it."""


def _lines(data: bytes, buf: np.ndarray) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """Every line (with its newline) as one zero-copy string array, and its start and end offsets."""
    newlines = np.flatnonzero(buf == _NL)
    bounds = np.concatenate(([0], newlines + 1))
    if bounds[-1] != len(buf):
        bounds = np.append(bounds, len(buf))
    width = np.int32 if len(buf) < 2**31 - 1 else np.int64
    kind = pa.string() if width is np.int32 else pa.large_string()
    lines = pa.Array.from_buffers(kind, len(bounds) - 1, [None, pa.py_buffer(bounds.astype(width)), pa.py_buffer(data)])
    return lines, bounds[:-1], bounds[1:]


def _blank_from_end(raw: pa.Array, stops: np.ndarray, *, skip_first: bool) -> np.ndarray:
    """Offset of the last blank of each line (or the one before it), found in the reversed line."""
    reverse = pc.binary_reverse(raw)
    if skip_first:
        reverse = pc.replace_substring(reverse, b" ", b"\x00", max_replacements=1)
    blanks: np.ndarray = stops - 1 - pc.find_substring(reverse, b" ").to_numpy(zero_copy_only=False)
    return blanks


def _piece_offsets(data: bytes, *, path: str | os.PathLike[str]) -> np.ndarray:
    """Offsets cutting ``data`` into [gap] + 8 pieces per sample line (see the diagram above)."""
    buf = np.frombuffer(data, np.uint8)
    lines, starts, stops = _lines(data, buf)
    ends = stops - (buf[stops - 1] == _NL) if len(stops) else stops  # before the newline
    sample = (ends > starts) & (buf[np.minimum(starts, len(buf) - 1)] != _HASH)
    _check_comments(lines.filter(pa.array((ends > starts) & ~sample)), path=path)
    if not sample.any():
        raise _NotPlain("no sample line")
    raw = lines.filter(pa.array(sample))
    raw = raw.cast(pa.binary() if raw.type == pa.string() else pa.large_binary())
    starts, stops, ends = starts[sample], stops[sample], ends[sample]
    opens = pc.find_substring(raw, b"{").to_numpy(zero_copy_only=False)
    last_blank = _blank_from_end(raw, stops, skip_first=False)
    if (last_blank >= stops).any():
        raise _NotPlain("a line without a blank")
    labelled = opens >= 0
    # The first blank matters only without labels (it ends the name); a label value may hold blanks.
    first_blank = np.full(len(starts), -1, dtype=np.int64)
    if not labelled.all():
        bare = ~labelled
        first_blank[bare] = starts[bare] + pc.find_substring(raw.filter(pa.array(bare)), b" ").to_numpy(
            zero_copy_only=False
        )
    o = starts + opens
    # With a timestamp, the value sits between the last two blanks.
    stamped = np.where(labelled, buf[last_blank - 1] != _CLOSE, first_blank != last_blank)
    value_blank = last_blank
    if stamped.any():
        before_last = _blank_from_end(raw, stops, skip_first=True)
        if (stamped & (before_last >= stops)).any():
            raise _NotPlain("a timestamp without a value before it")
        value_blank = np.where(stamped, before_last, last_blank)
    c = value_blank - 1
    if labelled.any() and not ((c[labelled] > o[labelled]) & (buf[c[labelled]] == _CLOSE)).all():
        raise _NotPlain("labels not closed by '} '")
    if not (labelled | (first_blank == value_blank)).all():
        raise _NotPlain("extra blanks in a line without labels")
    value_end = np.where(stamped, last_blank, ends)
    stamp_start = np.where(stamped, last_blank + 1, ends)
    cuts = np.column_stack(
        [
            starts,
            np.where(labelled, o, first_blank),
            np.where(labelled, o + 1, first_blank),
            np.where(labelled, c, first_blank),
            value_blank + 1,
            value_end,
            stamp_start,
            ends,
        ]
    ).ravel()
    offsets = np.concatenate(([0], cuts, [len(buf)]))
    if (np.diff(offsets) < 0).any():  # never hand Arrow offsets that run backwards
        raise _NotPlain("pieces out of order")
    return offsets


def _check_comments(comments: pa.Array, *, path: str | os.PathLike[str]) -> None:
    """HELP/TYPE lines, each distinct one checked once."""
    for line in pc.unique(comments).to_pylist():
        _check_comment(line.rstrip("\n")[1:], path=path, line=None)


def _fast_table(text: str, now: float, *, path: str | os.PathLike[str], cache: LabelCache | None = None) -> pa.Table:
    if "\r" in text or "\t" in text:
        raise _NotPlain("tabs or carriage returns")
    data = text.encode()
    offsets = _piece_offsets(data, path=path)
    width = np.int32 if len(data) < 2**31 - 1 else np.int64
    kind = pa.string() if width is np.int32 else pa.large_string()
    pieces = pa.Array.from_buffers(
        kind, len(offsets) - 1, [None, pa.py_buffer(offsets.astype(width)), pa.py_buffer(data)]
    )
    n = (len(offsets) - 2) // 8
    every = pa.array(np.arange(n) * 8)
    names, inners, values, stamps = (pieces.slice(1 + k).take(every) for k in (0, 2, 4, 6))
    # A scrape repeats a few dozen names thousands of times: check each distinct name once.
    stamped = pc.any(pc.greater(pc.binary_length(stamps), 0)).as_py()
    if not (
        pc.all(pc.match_substring_regex(pc.unique(names), _NAME_FULL)).as_py()
        and pc.all(pc.match_substring_regex(values, _PLAIN_VALUE)).as_py()
        and (not stamped or pc.all(pc.match_substring_regex(stamps, _PLAIN_STAMP)).as_py())
    ):
        raise _NotPlain("a name, value or timestamp outside the plain patterns")
    encoded = inners.cast(pa.string()).dictionary_encode()
    hosts, gpus, jobs, blobs = _label_columns(
        encoded.dictionary.to_pylist(), path=path, cache={} if cache is None else cache
    )
    index = encoded.indices
    names = names.cast(pa.string())
    return pa.table(
        {
            "metric": names,
            "t": _times(stamps, now, n),
            "value": pc.cast(values, pa.float64()),
            "host": _hosts(names, pa.array(hosts, pa.string()).take(index), index, encoded.dictionary),
            "gpu": pa.array(gpus, pa.string()).take(index),
            "job": pa.array(jobs, pa.string()).take(index),
            "labels": pa.array(blobs, pa.string()).take(index),
        },
        schema=SAMPLE_SCHEMA,
    )


def _hosts(names: pa.Array, hosts: pa.Array, index: pa.Array, label_texts: pa.Array) -> pa.Array:
    """The host column, without the ``node`` label of the node-exporter families where it is no host (NUMA,
    DRBD: ``schemas.NODE_NOT_HOST_PREFIXES``): those rows get Hostname/hostname or instance, else null."""
    local = pc.starts_with(names, NODE_NOT_HOST_PREFIXES[0])
    for prefix in NODE_NOT_HOST_PREFIXES[1:]:
        local = pc.or_(local, pc.starts_with(names, prefix))
    if not pc.any(local).as_py():
        return hosts
    texts = label_texts.to_pylist()
    fixed = {
        code: sample_keys(parse_labels(texts[code]), NODE_NOT_HOST_PREFIXES[0])[0]
        for code in pc.unique(index.filter(local)).to_pylist()
    }
    patched = pa.array([fixed.get(code) for code in index.to_pylist()], pa.string())
    return pc.if_else(local, patched, hosts)


def _times(stamps: pa.Array, now: float, n: int) -> pa.Array:
    """Seconds from the millisecond timestamps; ``now`` where a line has none."""
    if pc.all(pc.equal(pc.binary_length(stamps), 0)).as_py():
        return pa.repeat(pa.scalar(now, pa.float64()), n)
    missing = pc.equal(pc.binary_length(stamps), 0)
    millis = pc.cast(pc.if_else(missing, "0", stamps.cast(pa.string())), pa.int64())
    return pc.if_else(missing, now, pc.divide(pc.cast(millis, pa.float64()), 1000.0))


def _label_columns(
    uniq: list[str], *, path: str | os.PathLike[str], cache: LabelCache
) -> tuple[list[str | None], list[str | None], list[str | None], list[str]]:
    """host, gpu, job and labels JSON of each distinct label text. ``cache`` carries them from one chunk
    of a file to the next: a scrape file repeats the same few thousand label sets in every chunk."""
    if len(cache) > LABEL_CACHE_ENTRIES:
        cache.clear()  # bounded memory, whatever the file's cardinality
    rows: list[_LabelRow] = []
    for inner in uniq:
        row = cache.get(inner)
        if row is None:
            labels = parse_labels(inner, path=path)
            row = cache[inner] = (*sample_keys(labels), orjson.dumps(labels).decode())
        rows.append(row)
    if not rows:
        return [], [], [], []
    hosts, gpus, jobs, blobs = (list(c) for c in zip(*rows))
    return hosts, gpus, jobs, blobs


def parse_prometheus_columns(
    text: str,
    *,
    path: str | os.PathLike[str] = "<input>",
    t: float | None = None,
    first_line: int = 1,
    label_cache: LabelCache | None = None,
) -> pa.Table:
    """The samples of ``text`` as a table with ``store.SAMPLE_SCHEMA`` columns, ready for
    ``Store.add_sample_table``. Same grammar, results and errors as ``parse_prometheus_text``.
    ``label_cache`` (a dict the caller keeps) saves re-reading label sets seen in an earlier chunk."""
    now = time.time() if t is None else float(t)
    try:
        return _fast_table(text, now, path=path, cache=label_cache)
    except (_NotPlain, ParseError, pa.ArrowInvalid):
        # Let the reference path judge each line and say what is wrong with it.
        return _columns_from_samples(parse_prometheus_text(text, path=path, t=now, first_line=first_line))


def _columns_from_samples(samples: Iterator[Sample]) -> pa.Table:
    rows = list(samples)
    keys = [sample_keys(s.labels, s.metric) for s in rows]
    return pa.table(
        {
            "metric": [s.metric for s in rows],
            "t": [s.t for s in rows],
            "value": [s.value for s in rows],
            "host": [k[0] for k in keys],
            "gpu": [k[1] for k in keys],
            "job": [k[2] for k in keys],
            "labels": [orjson.dumps(dict(s.labels)).decode() for s in rows],
        },
        schema=SAMPLE_SCHEMA,
    )


def read_prometheus_columns(
    path: str | os.PathLike[str], *, t: float | None = None, chunk_bytes: int | None = None
) -> Iterator[pa.Table]:
    """A saved scrape as ``SAMPLE_SCHEMA`` tables, one per chunk of whole lines of about
    ``chunk_bytes`` (default ``CHUNK_BYTES``), so memory stays bounded however large the file.

    Untimed lines get ``t``, else the file's write time. Strict: a bad line anywhere raises
    its ParseError (file and line) when its chunk is reached; a caller that must not keep
    part of a file discards the chunks it already took (the store's transaction).
    """
    when = file_time(path) if t is None else t
    labels: LabelCache = {}
    for first_line, text in _text_chunks(path, chunk_bytes or CHUNK_BYTES):
        yield parse_prometheus_columns(text, path=path, t=when, first_line=first_line, label_cache=labels)


def _text_chunks(path: str | os.PathLike[str], chunk_bytes: int) -> Iterator[tuple[int, str]]:
    """(number of the first line, text) of runs of whole lines of about ``chunk_bytes``.

    A line longer than a chunk grows its chunk, up to ``MAX_LINE_BYTES``.
    """
    first_line, carry, carried = 1, [], 0  # carry: the pieces of a line not yet ended
    with open_binary(path, max_bytes=MAX_STREAM_BYTES) as stream:
        while block := stream.read(chunk_bytes):
            cut = block.rfind(b"\n") + 1
            if cut == 0:
                carry.append(block)
                carried += len(block)
                if carried > MAX_LINE_BYTES:
                    raise ParseError(
                        f"line longer than the limit of {MAX_LINE_BYTES} bytes", path=path, line=first_line
                    )
                continue
            chunk = b"".join(carry + [block[:cut]]) if carry else block[:cut]
            carry, carried = [block[cut:]], len(block) - cut
            yield first_line, decode_utf8(chunk, path=path, first_line=first_line)
            first_line += chunk.count(b"\n")
        if rest := b"".join(carry):
            yield first_line, decode_utf8(rest, path=path, first_line=first_line)


def is_prometheus_text(head: str) -> bool:
    """Sniff: the first line that is not blank or a free comment is HELP/TYPE or a sample line."""
    for raw in head.split("\n")[:50]:
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line[1:].split(None, 1)
            if parts and parts[0] in ("HELP", "TYPE"):
                return True
            continue
        m = _SAMPLE_RE.match(raw)
        if m is None or "_" in m.group(3):
            return False
        try:
            float(m.group(3))  # "garbage here" has the shape of a sample but no number
        except ValueError:
            return False
        return True
    return False
