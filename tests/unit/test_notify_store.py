"""The ``notices`` table: a delivery's latest row wins, and a store made before the table opens."""

from __future__ import annotations

import orjson
import pytest

from hpcwatch.store import NoticeRow, Store, queries


def _row(key: str, state: str, t: float, attempts: int = 0) -> NoticeRow:
    notice = key.split("|")[0]
    return NoticeRow(
        key=key, notice=notice, kind="job_end", channel="mail", recipient="a@x", state=state, t=t, attempts=attempts
    )


def test_a_delivery_sent_in_a_later_commit_is_no_longer_pending(tmp_path):
    with Store(tmp_path / "s") as store:
        store.add([_row("job-end/1|mail|a@x", "pending", 1.0), _row("job-end/2|mail|a@x", "pending", 2.0)])
        store.add([_row("job-end/1|mail|a@x", "pending", 3.0, attempts=1)])
        assert [(r.key, r.attempts) for r in queries.pending_notices(store)] == [
            ("job-end/2|mail|a@x", 0),
            ("job-end/1|mail|a@x", 1),
        ]
        store.add([_row("job-end/1|mail|a@x", "sent", 4.0, attempts=1)])
        assert [r.key for r in queries.pending_notices(store)] == ["job-end/2|mail|a@x"]
        assert [r.t for r in queries.sent_notices(store)] == [4.0]
        assert queries.notice_keys(store, ["job-end/1", "job-end/3"]) == {"job-end/1"}
        assert queries.sent_counts_by_recipient(store, since=0.0) == {"a@x": 1}
        assert queries.sent_counts_by_recipient(store, since=5.0) == {}


def test_compaction_keeps_the_latest_row_of_each_delivery(tmp_path):
    with Store(tmp_path / "s", compact_fanin=2) as store:
        for i in range(6):
            store.add([_row("k|mail|a@x", "pending" if i < 5 else "sent", float(i), attempts=i)])
        assert store.part_counts()["notices"] < 6
        assert queries.pending_notices(store) == []
        (sent,) = queries.sent_notices(store)
        assert sent.attempts == 5


def test_a_store_written_before_the_notices_table_opens_and_takes_notices(tmp_path):
    path = tmp_path / "s"
    Store(path).close()
    manifest = orjson.loads((path / "manifest.json").read_bytes())
    del manifest["tables"]["notices"]  # as an older hpcwatch wrote it
    (path / "manifest.json").write_bytes(orjson.dumps(manifest))
    with Store(path) as store:
        assert queries.pending_notices(store) == []
        store.add([_row("k|mail|a@x", "pending", 1.0)])
        assert len(queries.pending_notices(store)) == 1


def test_a_notice_row_refuses_an_unknown_state():
    with pytest.raises(ValueError, match="unknown state 'lost'"):
        _row("k|mail|a@x", "lost", 1.0)
