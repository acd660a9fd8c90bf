"""Store transactions: a source is committed once, a failed one leaves nothing, compaction changes nothing."""

import threading
import time

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hpcwatch.records import Event, Finding, Job, Sample, Span
from hpcwatch.schemas import SAMPLE_SCHEMA
from hpcwatch.store import TABLES, IngestCounts, SourceMark, Store


def _samples(n, *, t0=0.0, metric="m"):
    return [
        Sample(metric=metric, labels={"gpu": str(i % 8), "Hostname": "node1"}, t=t0 + i, value=float(i))
        for i in range(n)
    ]


def _sample_table(n, *, t0=0.0):
    return pa.table(
        {
            "metric": ["m"] * n,
            "t": [t0 + i for i in range(n)],
            "value": [1.0] * n,
            "host": ["node1"] * n,
            "gpu": ["0"] * n,
            "job": [None] * n,
            "labels": ["{}"] * n,
        },
        schema=SAMPLE_SCHEMA,
    )


def _tables(store):
    return {table: store.query(f"SELECT * FROM {table} ORDER BY ALL") for table in TABLES}


def test_a_source_committed_twice_adds_its_rows_once(tmp_path):
    mark = SourceMark(key="sha256:abc", path="/spool/a.prom", format="prometheus")
    with Store(tmp_path / "s") as store:
        for _ in range(2):
            with store.transaction(source=mark) as tx:
                tx.add(_samples(10))
                tx.add_sample_table(_sample_table(5, t0=100))
        assert tx.skipped
        assert store.query("SELECT count(*) FROM samples") == [(15,)]
        assert store.has_source("sha256:abc") and not store.has_source("sha256:other")
        (source,) = store.sources()
    assert (source.key, source.path, source.format, source.counts) == (
        "sha256:abc",
        "/spool/a.prom",
        "prometheus",
        IngestCounts(samples=15),
    )
    assert source.committed_s > 0


def test_two_ingests_of_one_source_at_once_commit_it_once(tmp_path):
    mark = SourceMark(key="k")
    with Store(tmp_path / "s") as store:
        with store.transaction(source=mark) as first:
            first.add(_samples(3))
            with store.transaction(source=mark) as second:
                second.add(_samples(3))
        assert (second.skipped, first.skipped) == (False, True)
        assert store.query("SELECT count(*) FROM samples") == [(3,)]
        assert list((store.path / "staging").glob("*/*")) == []  # the skipped parts are gone


def test_a_transaction_that_raises_leaves_nothing_visible_and_no_staged_file(tmp_path):
    with Store(tmp_path / "s", batch_size=4) as store:
        with pytest.raises(RuntimeError), store.transaction(source=SourceMark(key="k")) as tx:
            tx.add(_samples(10))  # three row groups already on disk
            tx.add([Job(id="1")])
            raise RuntimeError("the reader found a bad line")
        assert store.query("SELECT (SELECT count(*) FROM samples), (SELECT count(*) FROM jobs)") == [(0, 0)]
        assert not store.has_source("k") and store.version == 0
        assert list((store.path / "staging").glob("*/*")) == []
        assert list((store.path / "samples").iterdir()) == []


def test_a_transaction_commits_every_kind_in_one_version(tmp_path):
    with Store(tmp_path / "s", batch_size=2) as store:
        with store.transaction() as tx:
            tx.add(_samples(5))
            tx.add(
                [Event(kind="xid", t=1.0, source="dcgm"), Job(id="1", state="PENDING"), Job(id="1", state="RUNNING")]
            )
        assert tx.version == store.version == 1
        assert tx.counts == IngestCounts(samples=5, events=1, jobs=2)
        assert [(j.id, j.state) for j in store.jobs()] == [("1", "RUNNING")]  # the last sighting in it wins
        assert store.part_counts() == {"samples": 1, "events": 1, "spans": 0, "jobs": 1, "findings": 0, "notices": 0}


def test_a_job_seen_again_in_a_later_commit_replaces_its_row_and_select_star_hides_the_version(tmp_path):
    with Store(tmp_path / "s") as store:
        store.add([Job(id="9", state="PENDING"), Job(id="8", state="RUNNING")])
        store.add([Job(id="9", state="COMPLETED", start=1.0, end=2.0)])
        assert sorted((j.id, j.state) for j in store.jobs()) == [("8", "RUNNING"), ("9", "COMPLETED")]
        assert store.job("9").end == 2.0
        assert store.query_arrow("SELECT * FROM jobs").schema.names == TABLES["jobs"].names


def test_clear_findings_drops_them_for_every_reader(tmp_path):
    finding = Finding(
        vector="rdma_blind_spot", severity="high", target="node2", title="x", evidence={"bytes": 1}, t=1.0, rule="r"
    )
    with Store(tmp_path / "s") as writer, Store(tmp_path / "s") as reader:
        writer.add([finding])
        assert reader.findings() == [finding]
        writer.clear_findings()
        assert reader.findings() == []
        with writer.transaction() as tx:  # a scan that replaces the findings in one commit
            tx.clear_findings()
            tx.add([finding])
        assert reader.findings() == [finding]


def test_a_dropped_part_stays_on_disk_for_the_grace_period_then_goes(tmp_path):
    finding = Finding(vector="supply_chain", severity="low", target="t", title="x", evidence={}, t=1.0, rule="r")
    with Store(tmp_path / "s", retire_grace_s=3600) as store:
        store.add([finding])
        (part,) = (store.path / "findings").iterdir()
        store.clear_findings()
        store.add(_samples(1))
        assert part.exists()  # a reader bound to the old manifest may still read it
    with Store(tmp_path / "s", retire_grace_s=0) as store:
        store.add(_samples(1))
        assert not part.exists()


def test_a_part_no_manifest_lists_is_invisible_and_collected_by_the_next_commit(tmp_path):
    with Store(tmp_path / "s") as store:
        store.add(_samples(2))
        (committed,) = (store.path / "samples").iterdir()
        stray = store.path / "samples" / "part-9999999999-deadbeef.parquet"
        stray.write_bytes(committed.read_bytes())  # a writer killed after its move, before its manifest
        assert store.query("SELECT count(*) FROM samples") == [(2,)]
        store.add(_samples(1))
        assert not stray.exists()


def _ingest_in_commits(store, commits):
    for i in range(commits):
        store.add(_samples(3 + i % 5, t0=i * 10.0, metric=f"m{i % 3}"))
        store.add([Job(id=str(i % 4), state=f"S{i}", start=float(i)), Event(kind="xid", t=float(i), source="s")])


def test_compaction_bounds_the_part_count_and_changes_no_result(tmp_path):
    with (
        Store(tmp_path / "plain", compact_fanin=1000) as plain,
        Store(tmp_path / "compacted", compact_fanin=2, retire_grace_s=0) as compacted,
    ):
        for store in (plain, compacted):
            _ingest_in_commits(store, 60)
        assert plain.part_counts()["samples"] == 60
        assert max(compacted.part_counts().values()) <= 2 * 8  # fan-in x tiers
        assert _tables(compacted) == _tables(plain)
        assert compacted.jobs() == plain.jobs()
        assert len(list((compacted.path / "samples").iterdir())) == compacted.part_counts()["samples"]


def test_query_since_reads_each_committed_row_once_across_compactions(tmp_path):
    with Store(tmp_path / "s", compact_fanin=2) as store:
        mark, seen = store.version, []
        for i in range(20):
            store.add(_samples(4, t0=i * 4.0))
            if i % 3 == 0:
                mark, rows = store.query_since(mark, "SELECT t FROM samples ORDER BY t")
                seen += [t for (t,) in rows]
        mark, rows = store.query_since(mark, "SELECT t FROM samples ORDER BY t")
        seen += [t for (t,) in rows]
        assert mark == store.version >= 20  # 20 commits, and the compactions' own swaps
        assert store.query_since(mark, "SELECT count(*) FROM samples") == (mark, [(0,)])
    assert seen == [float(t) for t in range(80)]


def test_asking_again_since_one_version_sees_what_was_committed_and_compacted_meanwhile(tmp_path):
    """A job page asks what landed since one version for each of its parts; the views bound for that version
    are reused only while the store is unchanged."""
    with Store(tmp_path / "s", compact_fanin=2, retire_grace_s=0) as store:
        store.add(_samples(4, t0=0.0))
        mark = store.version
        count = "SELECT count(*), min(t) FROM samples"
        assert store.query_since(mark, count) == (mark, [(0, None)])
        store.add(_samples(4, t0=100.0))
        assert store.query_since(mark, count) == (store.version, [(4, 100.0)])
        for i in range(6):  # enough commits for compactions to merge the parts
            store.add(_samples(4, t0=200.0 + 4 * i))
        assert store.query_since(mark, count) == (store.version, [(28, 100.0)])
        assert store.query_since(mark, count) == (store.version, [(28, 100.0)])


def test_each_table_read_since_a_version_holds_the_rows_committed_after_it(tmp_path):
    """The views of the tables a statement names are bound to the version it asks about, whatever the version
    other tables were last read since (and however the statement spells their names)."""
    span = Span(job="1", rank=0, step=1, phase="forward", start=1.0, dur=0.5)
    with Store(tmp_path / "s") as store:
        empty = store.version
        store.add(_samples(4, t0=0.0))
        first = store.version
        store.add([span])
        second = store.version
        store.add(_samples(2, t0=10.0))
        assert store.query_since(second, "SELECT count(*) FROM samples")[1] == [(2,)]
        assert store.query_since(first, "SELECT count(*) FROM Spans")[1] == [(1,)]
        assert store.query_since(second, "SELECT count(*) FROM SPANS")[1] == [(0,)]
        both = "SELECT (SELECT count(*) FROM samples), (SELECT count(*) FROM spans)"
        assert store.query_since(empty, both)[1] == [(6, 1)]  # the samples' view was bound since ``second``


def test_an_empty_store_answers_with_typed_empty_tables(tmp_path):
    with Store(tmp_path / "s") as store:
        assert store.samples().schema == SAMPLE_SCHEMA
        assert store.time_range() == (None, None)
        assert store.jobs() == [] and store.events() == [] and store.findings() == [] and store.spans() == []
        assert store.query('SELECT sum(gpus), max("end") FROM jobs') == [(None, None)]


def test_a_compaction_under_way_does_not_hold_other_writers_commits(tmp_path):
    with Store(tmp_path / "s", compact_fanin=2) as compactor, Store(tmp_path / "s") as other:
        merging, release = threading.Event(), threading.Event()
        merge = compactor._merge

        def slow_merge(table, group):
            merging.set()
            release.wait(10)
            return merge(table, group)

        compactor._merge = slow_merge
        compactor.add(_samples(4, t0=0.0))
        writer = threading.Thread(target=compactor.add, args=(_samples(4, t0=4.0),))
        writer.start()  # its commit fills a tier: it starts merging
        assert merging.wait(10)
        started = time.monotonic()
        other.add(_samples(4, t0=8.0))  # commits while the merge is blocked
        assert time.monotonic() - started < 2.0
        release.set()
        writer.join(10)
        assert [t for (t,) in other.query("SELECT t FROM samples ORDER BY t")] == [float(t) for t in range(12)]


@pytest.mark.parametrize("sorted_from", [0, 10**9])
def test_a_merge_of_samples_is_sorted_from_its_threshold_on_and_reads_the_same(tmp_path, monkeypatch, sorted_from):
    """At or above ``SORTED_MERGE_ROWS`` a merged part holds its rows by (metric, host, gpu, t), so that a metric
    filter skips row groups; below, as they came (sorting a group or two saved no read): the same rows either way."""
    import pyarrow.parquet as pq

    from hpcwatch.store import core

    monkeypatch.setattr(core, "SORTED_MERGE_ROWS", sorted_from)
    with (
        Store(tmp_path / "plain", compact_fanin=1000) as plain,
        Store(tmp_path / "merged", compact_fanin=2, retire_grace_s=0) as merged,
    ):
        for store in (plain, merged):
            for metric in ("m3", "m2", "m1", "m0"):  # each commit a metric, in reverse order
                store.add(_samples(5, t0=100.0 - 10 * int(metric[1]), metric=metric))
        (part,) = (merged.path / "samples").iterdir()  # 4 parts, merged twice over into one
        rows = pq.read_table(part, columns=["metric", "t"]).to_pylist()
        keys = [(r["metric"], r["t"]) for r in rows]
        assert (keys == sorted(keys)) is (sorted_from == 0)
        assert _tables(merged) == _tables(plain)


class _RecordingConnection:
    """A DuckDB connection that notes each statement it is given, and runs it."""

    def __init__(self, con):
        self.con, self.statements = con, []

    def execute(self, sql, *args):
        self.statements.append(sql)
        return self.con.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self.con, name)


def test_a_commit_rebinds_only_the_views_of_the_tables_it_changed(tmp_path):
    job = Job(id="7", user="u", nodes=("node1",), start=0.0)
    with Store(tmp_path / "s") as store:
        store.add([*_samples(3), job])
        assert store.query("SELECT count(*) FROM samples") == [(3,)]
        recording = store._con = _RecordingConnection(store._con)
        store.add(_samples(2, t0=10.0))
        assert store.query("SELECT count(*) FROM samples") == [(5,)]
        assert store.query("SELECT id FROM jobs") == [("7",)]
        rebound = [sql.split(" AS ")[0] for sql in recording.statements if "VIEW" in sql]
        assert rebound == ["CREATE OR REPLACE VIEW samples"]
        store.add([Job(id="8", user="u", nodes=("node2",), start=1.0)])
        assert store.query("SELECT id FROM jobs ORDER BY id") == [("7",), ("8",)]
        assert store.query("SELECT count(*) FROM samples") == [(5,)]


def test_the_view_with_each_rows_commit_is_bound_only_for_a_statement_that_reads_it(tmp_path):
    """``_all_samples`` (every part with each row's ``_v``) is read by the windows kept between reads only: the
    other statements do not pay for binding it, and a statement naming it sees the newest parts."""
    with Store(tmp_path / "s") as store:
        store.add(_samples(3))
        recording = store._con = _RecordingConnection(store._con)
        store.add(_samples(2, t0=10.0))
        assert store.query("SELECT count(*) FROM samples") == [(5,)]
        assert not [sql for sql in recording.statements if "VIEW _all_samples" in sql]
        assert store.query("SELECT count(*), count(DISTINCT _v) FROM _all_samples") == [(5, 2)]
        assert [sql for sql in recording.statements if "VIEW _all_samples" in sql]
        recording.statements.clear()
        assert store.query("SELECT count(*) FROM _all_samples") == [(5,)]
        assert not [sql for sql in recording.statements if "VIEW" in sql]  # bound to these parts already


def test_jobs_read_on_from_the_last_read_equal_every_row_read_at_once(tmp_path):
    """Jobs added, replaced (a job seen again running, then ended) and pending (no start) over several commits:
    the store that read along lists what one opened afterwards lists, in ``start NULLS LAST, id`` order."""
    commits = [
        [Job(id="10", user="a", nodes=("n1",), start=5.0), Job(id="9", user="b", nodes=("n2",), start=5.0)],
        [Job(id="11", user="a", nodes=(), start=None, state="PENDING")],
        [Job(id="10", user="a", nodes=("n1",), start=5.0, end=9.0, state="COMPLETED"), Job(id="12", start=1.0)],
        [],
        [Job(id="11", user="a", nodes=("n3",), start=7.0, state="RUNNING"), Job(id="13", start=None)],
    ]
    with Store(tmp_path / "s") as store:
        for jobs in commits:
            store.add(jobs)
            listed = store.jobs()
            with Store(tmp_path / "s") as fresh:
                assert listed == fresh.jobs()
            ordered = store.query("SELECT id FROM jobs ORDER BY start NULLS LAST, id")
            assert [j.id for j in listed] == [i for (i,) in ordered]
            assert store.jobs_by_id() == {j.id: j for j in listed}
        assert store.job("10").end == 9.0 and store.job("11").nodes == ("n3",) and store.job("99") is None
        assert [j.id for j in store.jobs(on_nodes=["n1", "n3"])] == ["10", "11"]


def test_a_part_written_before_a_column_was_appended_reads_it_as_null_beside_newer_parts(tmp_path):
    """A table's public view is one multi-file scan of its parts, unless a part lacks a column appended after it
    was written: then each part is read as it was written, the column NULL in the old part (here the events'
    ``attrs``, taken out as a future column would be missing)."""
    root = tmp_path / "s"
    with Store(root) as store:
        store.add([Event(kind="xid", t=1.0, source="a", attrs={"x": 1})])
    manifest = orjson.loads((root / "manifest.json").read_bytes())
    (part,) = manifest["tables"]["events"]
    old = pq.read_table(root / "events" / part["file"]).drop_columns(["attrs"])
    pq.write_table(old, root / "events" / part["file"])
    part["columns"] = len(TABLES["events"]) - 1
    (root / "manifest.json").write_bytes(orjson.dumps(manifest))
    with Store(root) as store:
        assert store.query("SELECT kind, attrs FROM events") == [("xid", None)]
        store.add([Event(kind="xid", t=2.0, source="b", attrs={"y": 2})])
        assert store.query("SELECT source, attrs FROM events ORDER BY t") == [("a", None), ("b", '{"y":2}')]
