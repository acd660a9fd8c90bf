"""collect/live.py on written streams (no torch): verdicts, hostile streams, the control file."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import orjson
import pytest

from hpcwatch.analysis.live import Stop, find_live_hang
from hpcwatch.collect.config import LiveSection
from hpcwatch.collect.live import LiveCollector, request_dump, request_trace
from hpcwatch.errors import InputError, ParseError
from hpcwatch.sources.livehook import MAX_LINE_BYTES, Control, parse_control, parse_live_line, read_control
from hpcwatch.store import Store, queries
from hpcwatch.vocab import EventKind

JOB = "j1"


def _step_lines(rank: int, step: int, t: float, *, slow: float = 0.0) -> list[dict]:
    """One step of the hook's stream: enter marks and spans, rank ``slow`` s longer in backward."""
    out, at = [], t
    for phase, dur in (("load", 0.01), ("forward", 0.02), ("backward", 0.04 + slow), ("allreduce", 0.01)):
        out.append({"kind": "enter", "job": JOB, "rank": rank, "step": step, "phase": phase, "t": at})
        out.append(
            {
                "kind": "span",
                "job": JOB,
                "rank": rank,
                "step": step,
                "phase": phase,
                "start": at,
                "dur": dur,
                "attrs": {"node": "n1", "gpu": rank, "clock": "cpu"},
            }
        )
        at += dur
    return out


def _write(spool: Path, rank: int, docs: list[dict] | None = None, raw: bytes = b"") -> None:
    folder = spool / JOB
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"rank-{rank}.jsonl", "ab") as f:
        f.write(b"".join(orjson.dumps(d) + b"\n" for d in docs or []) + raw)


def _job(spool: Path, *, steps: int, t0: float, straggler: int | None = None, ranks: int = 4) -> None:
    for step in range(steps):
        for rank in range(ranks):
            slow = 0.2 if rank == straggler else 0.0
            _write(spool, rank, _step_lines(rank, step, t0 + step * 0.5, slow=slow))


def _events(store: Store, kind: str) -> list:
    return queries.events_of_kinds(store, [kind])[1]


@pytest.fixture
def live(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    with Store(":memory:") as store:
        yield spool, store, LiveCollector(store, LiveSection(path=str(spool), hang_after_s=5.0))


def test_straggler_named_once_from_the_stream_and_spans_stored(live):
    spool, store, collector = live
    _job(spool, steps=4, t0=time.time() - 2, straggler=3)
    collector.run()
    collector.run()
    [event] = _events(store, EventKind.LIVE_STRAGGLER)
    assert (event.attrs["rank"], event.attrs["phase"], event.attrs["job"]) == (3, "backward", JOB)
    assert store.query("SELECT count(*) FROM spans")[0][0] == 4 * 4 * 4  # the player's source


def test_hang_names_where_each_rank_stopped_and_asks_for_a_dump(live):
    spool, store, collector = live
    t0 = time.time() - 60
    _job(spool, steps=3, t0=t0)
    for rank in range(3):  # three ranks reach step 3's all-reduce, rank 3 never leaves its backward
        _write(spool, rank, [{"kind": "enter", "job": JOB, "rank": rank, "step": 3, "phase": "allreduce",
                              "collective": "all_reduce", "t": t0 + 2}])  # fmt: skip
    _write(spool, 3, [{"kind": "enter", "job": JOB, "rank": 3, "step": 3, "phase": "backward", "t": t0 + 2}])
    collector.run()
    [hang] = _events(store, EventKind.LIVE_HANG)
    assert hang.attrs["step"] == 3 and hang.attrs["collectives"] == ["all_reduce", "backward"]
    assert hang.attrs["stalled_s"] > 50 and hang.attrs["behind"] == []
    assert read_control(spool / JOB) == Control(dump_id=hang.attrs["dump_request"])
    collector.run()
    assert len(_events(store, EventKind.LIVE_HANG)) == 1  # one event a hang, not one a run


def test_closed_ranks_are_not_a_hang():
    stops = {0: Stop(rank=0, t=0.0, step=5, phase="allreduce")}
    assert find_live_hang({}, last_progress=0.0, now=1e6, hang_after_s=1) is None
    assert find_live_hang(stops, last_progress=0.0, now=0.5, hang_after_s=1) is None
    hang = find_live_hang(
        {**stops, 1: Stop(rank=1, t=0.0, step=4, phase="backward")}, last_progress=0.0, now=2, hang_after_s=1
    )
    assert hang is not None and hang.behind == (1,) and hang.step == 4


def test_hostile_streams_refused_with_one_line_each_and_the_collector_goes_on(live, caplog):
    spool, store, collector = live
    t0 = time.time() - 5
    _job(spool, steps=4, t0=t0, straggler=1)
    _write(spool, 0, raw=b'\x00\xffnot json at all\n{"kind": "span"}\n')  # garbage, then a record missing fields
    _write(spool, 2, raw=b'{"kind": "sample", "pad": "' + b"x" * (2 * MAX_LINE_BYTES) + b'"}\n')  # one huge record
    _write(spool, 3, [_step_lines(0, 9, t0)[0]])  # rank 0's record in rank 3's stream
    with caplog.at_level(logging.WARNING, logger="hpcwatch.collect.live"):
        result = collector.run()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3 and all("\n" not in w for w in warnings)
    assert any("rank-0.jsonl: refused 2 line(s) (not a record)" in w for w in warnings)
    assert any("rank-2.jsonl: refused 1 line(s) (over the size cap)" in w for w in warnings)
    assert any("not this stream's job and rank" in w for w in warnings)
    refused = _events(store, EventKind.LIVE_REFUSED)
    assert sorted(e.attrs["rank"] for e in refused) == [0, 2, 3]
    assert result.records > 0 and [e.attrs["rank"] for e in _events(store, EventKind.LIVE_STRAGGLER)] == [1]
    # the streams go on being read after their bad lines
    _write(spool, 2, _step_lines(2, 4, t0 + 2))
    caplog.clear()
    collector.run()
    assert not caplog.records and collector.jobs[JOB].ranks[2].stop.step == 4


def test_a_flooding_rank_is_capped_and_its_backlog_skipped_unread(tmp_path, caplog):
    spool = tmp_path / "spool"
    line = _step_lines(0, 0, time.time())[0]
    _write(spool, 0, [line] * 20_000)  # ~2 MB at once, ten times what 1000 lines/s for 5 s allows
    with Store(":memory:") as store:
        collector = LiveCollector(store, LiveSection(path=str(spool), max_records_per_s=100))
        with caplog.at_level(logging.WARNING, logger="hpcwatch.collect.live"):
            collector.run()
        state = collector.jobs[JOB].ranks[0]
        assert state.offset == (spool / JOB / "rank-0.jsonl").stat().st_size
        assert [r.getMessage().count("over the rate cap") for r in caplog.records] == [1]
        assert collector.refused >= 1
        _write(spool, 0, [{**line, "step": 7}] * 5)
        state.seen_at -= 1.0  # a second later: the cap has refilled by 100 lines
        caplog.clear()
        collector.run()
        assert not caplog.records and state.stop is not None and state.stop.step == 7


def test_a_rotated_stream_is_read_from_its_start(live):
    spool, _store, collector = live
    t0 = time.time()
    _write(spool, 0, _step_lines(0, 0, t0))
    collector.run()
    path = spool / JOB / "rank-0.jsonl"
    path.rename(path.with_name(path.name + ".1"))
    _write(spool, 0, _step_lines(0, 1, t0 + 1))
    collector.run()
    assert list(collector.jobs[JOB].ranks[0].steps) == [0, 1]


def test_control_requests_and_their_refusals(tmp_path):
    trace = request_trace(tmp_path, JOB, 3)
    dump = request_dump(tmp_path, JOB)
    assert read_control(tmp_path / JOB) == Control(trace_id=trace, trace_steps=3, dump_id=dump)
    with pytest.raises(InputError, match="job id"):
        request_trace(tmp_path, "../etc", 3)
    with pytest.raises(InputError, match="steps"):
        request_trace(tmp_path, JOB, 10_000)
    for bad in (b"[]", b'{"live": "yes"}', b'{"trace": {"id": "a/b", "steps": 2}}', b"\xff", b'{"trace": {"id": "x"}}'):
        with pytest.raises(ParseError, match="control"):
            parse_control(bad)


def test_enter_lines_parse_and_bad_ones_name_the_line():
    event = parse_live_line(orjson.dumps(_step_lines(1, 2, 10.0)[0]), path="s", number=1)
    assert event.kind == EventKind.HOOK_ENTER and event.attrs == {"job": JOB, "rank": 1, "step": 2, "phase": "load"}
    with pytest.raises(ParseError, match=r"s:7"):
        parse_live_line(b'{"kind": "enter", "job": "x"}', path="s", number=7)


def test_the_player_plays_the_live_job_and_its_page_shows_the_verdicts(live):
    from fastapi.testclient import TestClient

    from hpcwatch.model import reference_cluster
    from hpcwatch.web.app import create_app

    spool, store, collector = live
    t0 = time.time() - 60
    _job(spool, steps=5, t0=t0, straggler=2)
    _write(spool, 2, [{"kind": "enter", "job": JOB, "rank": 2, "step": 5, "phase": "allreduce",
                       "collective": "all_reduce", "t": t0 + 3}])  # fmt: skip
    collector.run()
    with TestClient(create_app(store, reference_cluster())) as client:
        assert JOB in [s["job"] for s in client.get("/api/steps/sources").json()]
        step = client.get("/api/steps", params={"job": JOB}).json()
        assert step["step"] == 4 and step["straggler"]["rank"] == 2  # the last step every rank finished
        page = client.get("/job/" + JOB).text
        assert 'data-live="live_straggler"' in page and 'data-live="live_hang"' in page
        assert "rank 2 (n1 · GPU 2), slow in backward" in page
        doc = client.get("/api/job/" + JOB).json()
        assert [e["kind"] for e in doc["live"]] == [EventKind.LIVE_STRAGGLER, EventKind.LIVE_HANG] or {
            e["kind"] for e in doc["live"]
        } == {EventKind.LIVE_STRAGGLER, EventKind.LIVE_HANG}


def test_trace_command_writes_the_request_and_refuses_a_bad_job(tmp_path, run_cli):
    code, out, _ = run_cli(["trace", JOB, "--steps", "2", "--live-dir", str(tmp_path), "--json"])
    assert code == 0, out
    request = orjson.loads(out)["request"]
    assert read_control(tmp_path / JOB) == Control(trace_id=request, trace_steps=2)
    code, _, err = run_cli(["trace", "a/../b", "--live-dir", str(tmp_path)])
    assert code == 2 and err.count("\n") == 1 and "job id" in err


# --- the hook's side: the stream thread (needs torch for the Flight Recorder check, not a process group) ----


def _lines(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def _until(condition, what: str, deadline_s: float = 20.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.fixture
def stream(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from hpcwatch.instrument.live import LiveStream

    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "10")  # set: the stream leaves it alone
    s = LiveStream(tmp_path, job=JOB, rank=3, flush_s=0.02, max_bytes=4096, queue_max=50)
    yield s
    s.close()


def test_the_stream_pauses_and_resumes_through_the_control_file(stream):
    from hpcwatch.sources.livehook import write_control

    stream.enter(0, "forward")
    _until(lambda: len(_lines(stream.path)) == 1, "the first line written")
    write_control(stream.folder, Control(live=False))
    _until(lambda: not stream.enabled, "paused")
    stream.enter(1, "forward")
    write_control(stream.folder, Control(live=True))
    _until(lambda: stream.enabled, "resumed")
    stream.enter(2, "forward")
    _until(lambda: len(_lines(stream.path)) == 2, "the line after the resume")
    assert [d["step"] for d in _lines(stream.path)] == [0, 2]


def test_hpcwatch_trace_pauses_and_resumes_a_running_rank_and_keeps_a_pending_request(stream, tmp_path, run_cli):
    code, out, _ = run_cli(["trace", JOB, "--steps", "2", "--live-dir", str(tmp_path), "--json"])
    request = orjson.loads(out)["request"]
    code, out, _ = run_cli(["trace", JOB, "--pause", "--live-dir", str(tmp_path)])
    assert code == 0 and "paused" in out
    _until(lambda: not stream.enabled, "paused by the command")
    assert read_control(tmp_path / JOB) == Control(live=False, trace_id=request, trace_steps=2)
    code, out, _ = run_cli(["trace", JOB, "--resume", "--live-dir", str(tmp_path), "--json"])
    assert code == 0 and orjson.loads(out) == {"job": JOB, "kind": "live", "live": True}
    _until(lambda: stream.enabled, "resumed by the command")
    code, _, err = run_cli(["trace", JOB, "--pause", "--dump", "--live-dir", str(tmp_path)])
    assert code == 2 and err.count("\n") == 1 and "separate requests" in err


def test_a_full_queue_drops_and_counts_and_the_file_stays_bounded(stream):
    stream._stop.set()  # the writer stops: the queue fills
    stream._thread.join()
    for step in range(80):
        stream.enter(step, "backward")
    assert stream.dropped == 30 and len(stream._queue) == 50
    for _ in range(4):
        stream._flush()
        for step in range(50):
            stream.enter(step, "backward")
    stream._flush()
    total = stream.path.stat().st_size + stream.path.with_name(stream.path.name + ".1").stat().st_size
    assert total <= 2 * 4096 + 50 * 120  # the live file and one rotated one


def test_a_trace_request_is_handed_to_the_step_once(stream):
    from hpcwatch.sources.livehook import write_control

    write_control(stream.folder, Control(trace_id="t1", trace_steps=2))
    _until(lambda: stream._trace is not None, "the request seen")
    assert stream.take_trace() == ("t1", 2) and stream.take_trace() is None


def test_a_pushed_stream_lands_in_the_live_spool_and_a_wrong_token_is_dropped_and_counted(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import http.client

    from hpcwatch.collect.config import ReceiveSection
    from hpcwatch.collect.receive import Receiver
    from hpcwatch.instrument.live import LiveStream

    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "10")
    token = "a-node-token-0123456789"
    (tmp_path / "tokens").write_text(f"n1 {token}\n")
    (tmp_path / "in").mkdir()
    live_spool = tmp_path / "live"
    section = ReceiveSection(
        listen="127.0.0.1:0",
        spool=str(tmp_path / "in"),
        tokens_file=str(tmp_path / "tokens"),
        live_spool=str(live_spool),
    )
    receiver = Receiver(section)
    receiver.start()
    url = f"http://127.0.0.1:{receiver.port}"
    try:
        good = LiveStream(tmp_path / "node", job=JOB, rank=1, flush_s=0.02, push_url=url, token=token, node="n1")
        bad = LiveStream(tmp_path / "node", job=JOB, rank=2, flush_s=0.02, push_url=url, token="wrong", node="n1")
        for step in range(3):
            good.enter(step, "forward")
            bad.enter(step, "forward")
        _until(lambda: good.written == 3 and bad.dropped == 3, "the batches sent")
        good.close()
        bad.close()
        assert [d["step"] for d in _lines(live_spool / JOB / "rank-1.jsonl")][:3] == [0, 1, 2]
        assert not (live_spool / JOB / "rank-2.jsonl").exists() and receiver.refused[401] >= 1
        conn = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=5)
        conn.request("POST", "/v1/live/../etc/1", body=b"{}\n", headers={"Authorization": f"Bearer {token}"})
        assert conn.getresponse().status == 404
        with Store(":memory:") as store:
            collector = LiveCollector(store, LiveSection(path=str(live_spool)))
            collector.run()
            assert collector.jobs[JOB].ranks[1].closed  # the closed mark came through too
    finally:
        receiver.stop()


def test_a_span_pushed_twice_is_kept_and_stored_once(live):
    """A push whose answer was lost is sent again: the collector keeps each span once."""
    spool, store, collector = live
    lines = _step_lines(0, 0, time.time() - 1)
    _write(spool, 0, lines)
    _write(spool, 0, lines)
    collector.run()
    assert store.query("SELECT count(*) FROM spans")[0][0] == 4
    assert len(collector.jobs[JOB].ranks[0].steps[0]) == 4
