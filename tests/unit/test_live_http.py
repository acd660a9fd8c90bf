"""Requests and answers over HTTP: a pushing hook gets its control file in the receiver's answers and POSTs
its dumps and traces back; hostile answers are refused with one line and the receiver goes on.

The stream threads here have no process group (the real torch gloo job over HTTP is in test_live_gloo.py);
the answers posted are real ones: a gloo job's Kineto trace and Flight Recorder dump from tests/data.
"""

from __future__ import annotations

import gzip
import http.client
import time
from pathlib import Path

import orjson
import pytest

from hpcwatch.collect.config import LiveSection, ReceiveSection
from hpcwatch.collect.live import LiveCollector, land_answer, request_dump, request_trace
from hpcwatch.collect.receive import Receiver
from hpcwatch.errors import InputError
from hpcwatch.sources.livehook import MAX_ANSWER_BYTES, Control, answer_path, trace_name, write_control
from hpcwatch.store import Store, queries
from hpcwatch.vocab import EventKind

JOB = "j1"
TOKEN = "a-node-token-0123456789"
DATA = Path(__file__).parent.parent / "data"
TRACE_RANK_1 = DATA / "kineto" / "gloo_straggler" / "rank-1.json.gz"
DUMP_RANK_0 = DATA / "flight_recorder" / "gloo_hang_rank2" / "fr_trace_rank_0.json"


def _until(condition, what: str, deadline_s: float = 20.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.fixture
def receiver(tmp_path):
    (tmp_path / "tokens").write_text(f"n1 {TOKEN}\n")
    (tmp_path / "in").mkdir()
    section = ReceiveSection(
        listen="127.0.0.1:0",
        spool=str(tmp_path / "in"),
        tokens_file=str(tmp_path / "tokens"),
        live_spool=str(tmp_path / "live"),
    )
    r = Receiver(section)
    r.start()
    yield r
    r.stop()


def _post(receiver: Receiver, path: str, body: bytes, *, token: str = TOKEN, length: int | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=10)
    headers = {"Authorization": f"Bearer {token}", "X-Hpcwatch-Node": "n1"}
    if length is not None:  # a lie about the size: refused before the body is read
        conn.putrequest("POST", path)
        for k, v in {**headers, "Content-Length": str(length)}.items():
            conn.putheader(k, v)
        conn.endheaders()
        conn.send(body)
    else:
        conn.request("POST", path, body=body, headers=headers)
    answer = conn.getresponse()
    status, text = answer.status, answer.read().decode()
    conn.close()
    return status, text


def test_a_pushing_stream_gets_its_requests_in_the_answers_and_posts_its_trace_back(receiver, tmp_path, monkeypatch):
    from hpcwatch.instrument.live import LiveStream

    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "10")  # set: the stream leaves torch alone
    live_spool = Path(receiver.section.live_spool)
    url = f"http://127.0.0.1:{receiver.port}"
    stream = LiveStream(
        tmp_path / "node", job=JOB, rank=1, flush_s=0.02, poll_s=0.05, push_url=url, token=TOKEN, node="n1"
    )
    try:
        stream.enter(0, "forward")
        _until(lambda: (live_spool / JOB / "rank-1.jsonl").exists(), "the first batch pushed")
        request = request_trace(live_spool, JOB, 2)  # on the collector's side, as `hpcwatch trace` does
        _until(lambda: stream._trace is not None, "the request carried by an answer (the rank sends nothing: a poll)")
        assert stream.take_trace() == (request, 2)

        local = stream.folder / trace_name(request, 1)  # what StepRecorder writes when its N steps are traced
        local.write_bytes(gzip.decompress(TRACE_RANK_1.read_bytes()))
        stream.answered("trace", request, local)
        landed = live_spool / JOB / trace_name(request, 1)
        _until(lambda: landed.exists() and not local.exists(), "the trace posted, and gone from the node")

        write_control(live_spool / JOB, Control(live=False))
        _until(lambda: not stream.enabled, "paused through the answers")
    finally:
        stream.close()
    with Store(":memory:") as store:
        LiveCollector(store, LiveSection(path=str(live_spool))).run()
        (trace,) = queries.events_of_kinds(store, [EventKind.LIVE_TRACE])[1]
        assert trace.attrs["request"] == request and trace.attrs["rank"] == 1 and trace.attrs["steps"]


def test_hostile_answers_are_refused_with_one_line_and_the_receiver_goes_on(receiver):
    live_spool = Path(receiver.section.live_spool)
    dump_body = DUMP_RANK_0.read_bytes()
    trace_body = gzip.decompress(TRACE_RANK_1.read_bytes())

    status, text = _post(receiver, answer_path(JOB, 0, "dump", "d1"), dump_body)
    assert (status, text.count("\n")) == (404, 1) and "asked for no dump" in text  # no job, no request

    dump = request_dump(live_spool, JOB)
    trace = request_trace(live_spool, JOB, 2)
    refusals = [
        (answer_path(JOB, 0, "dump", "d-other"), dump_body, {}, 404),  # not the request of the control file
        (answer_path(JOB, 0, "dump", dump), b"\x00garbage{", {}, 400),  # malformed
        (answer_path(JOB, 0, "dump", dump), (DUMP_RANK_0.parent / "fr_trace_rank_0").read_bytes(), {}, 400),  # pickle
        (answer_path(JOB, 0, "dump", dump), b'{"entries": []}', {}, 400),  # JSON, not a dump
        (answer_path(JOB, 2, "trace", trace), trace_body, {}, 400),  # rank 1's trace posted as rank 2
        (answer_path(JOB, 0, "dump", dump), b"{}", {"length": MAX_ANSWER_BYTES + 1}, 413),  # too big: never read
        (answer_path(JOB, 0, "dump", dump), dump_body, {"token": "wrong-token-0123456789"}, 401),
        (f"/v1/live/{JOB}/0/dump/../../x", dump_body, {}, 404),  # no other folder
        (f"/v1/live/{JOB}/0/core/{dump}", dump_body, {}, 404),  # no other kind
    ]
    for path, body, how, want in refusals:
        status, text = _post(receiver, path, body, **how)
        assert (status, text.count("\n")) == (want, 1), (path, status, text)

    assert _post(receiver, answer_path(JOB, 0, "dump", dump), dump_body)[0] == 201
    assert _post(receiver, answer_path(JOB, 0, "dump", dump), dump_body)[0] == 409  # the first answer stays
    assert _post(receiver, answer_path(JOB, 1, "trace", trace), trace_body)[0] == 201
    assert sorted(p.name for p in (live_spool / JOB).iterdir() if not p.name.startswith(".")) == [
        "control.json",
        f"fr-{dump}_0.json",
        trace_name(trace, 1),
    ]
    assert receiver.refused == {400: 4, 401: 1, 404: 2, 409: 1, 413: 1}  # a path that names nothing is not counted
    conn = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=10)
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200  # still answering


def test_land_answer_refuses_what_it_cannot_read_and_a_body_over_the_cap(tmp_path):
    dump = request_dump(tmp_path, JOB)
    with pytest.raises(InputError, match="over the"):
        land_answer(tmp_path, JOB, 0, "dump", dump, b" " * (MAX_ANSWER_BYTES + 1))
    with pytest.raises(InputError, match="fr-"):
        land_answer(tmp_path, JOB, 0, "dump", dump, b"[1, 2")
    assert not list((tmp_path / JOB).glob("fr-*"))


def test_a_batch_the_collector_could_not_take_now_is_sent_again_after_its_retry_after(tmp_path, monkeypatch):
    """A receiver that allows one push a second (burst 1): the second batch is answered 429 with
    Retry-After, kept by the rank and appended once the pause is over; nothing is dropped, nothing
    doubled, the lines in the order they were made. (The old hook dropped the refused batch, and with
    it where the rank last stood.)"""
    from hpcwatch.instrument.live import LiveStream

    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "10")
    (tmp_path / "tokens").write_text(f"n1 {TOKEN}\n")
    (tmp_path / "in").mkdir()
    section = ReceiveSection(
        listen="127.0.0.1:0",
        spool=str(tmp_path / "in"),
        tokens_file=str(tmp_path / "tokens"),
        live_spool=str(tmp_path / "live"),
        rate_per_s=1.0,
        burst=1,
    )
    receiver = Receiver(section)
    receiver.start()
    url = f"http://127.0.0.1:{receiver.port}"
    stream = LiveStream(tmp_path / "node", job=JOB, rank=1, flush_s=0.02, push_url=url, token=TOKEN, node="n1")
    landed = tmp_path / "live" / JOB / "rank-1.jsonl"
    try:
        stream.enter(0, "forward")
        _until(lambda: landed.exists(), "the first batch pushed")
        for phase in ("backward", "allreduce", "optimizer"):
            stream.enter(0, phase)
        _until(lambda: stream.written == 4, "the refused batch sent again", deadline_s=30)
        assert receiver.refused.get(429, 0) >= 1 and stream.dropped == 0
        phases = [orjson.loads(line)["phase"] for line in landed.read_bytes().splitlines()]
        assert phases == ["forward", "backward", "allreduce", "optimizer"]
    finally:
        stream.close()
        receiver.stop()


def test_retry_after_is_read_as_seconds_within_bounds():
    from hpcwatch.instrument.live import _retry_seconds

    assert _retry_seconds("7") == 7.0
    assert _retry_seconds(None) == _retry_seconds("Wed, 21 Oct 2026 07:28:00 GMT") == 1.0  # no number: the default
    assert _retry_seconds("0") == 1.0 and _retry_seconds("nan") == 1.0 and _retry_seconds("1e9") == 60.0
