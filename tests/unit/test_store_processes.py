"""The store across processes: a writer killed at any commit point, readers beside writers, two writers."""

import json
import subprocess
import sys
import textwrap

import pytest

from hpcwatch.store import TABLES, Store

# Three sources of every kind, each ingested once in one transaction; argv: store, crash point, which hit.
_INGEST = textwrap.dedent("""
    import os, signal, sys
    import pyarrow as pa
    from hpcwatch.records import Event, Job, Sample, Span
    from hpcwatch.schemas import SAMPLE_SCHEMA
    from hpcwatch.store import SourceMark, Store, core

    point, kill_at, hits = sys.argv[2], int(sys.argv[3]), []
    def crash(name):
        if name == point:
            hits.append(name)
            if len(hits) == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
    core._crash_hook = crash

    store = Store(sys.argv[1], batch_size=50)
    for n in range(3):
        mark = SourceMark(key=f"sha256:{n}", path=f"/spool/{n}.prom", format="prometheus")
        if store.has_source(mark.key):
            continue
        with store.transaction(source=mark) as tx:
            tx.add(Sample(metric=f"m{n}", labels={"gpu": str(i % 8)}, t=float(i), value=float(n)) for i in range(120))
            tx.add([Event(kind="xid", t=float(n), source="dcgm", attrs={"n": n}),
                    Span(job=str(n), rank=0, step=1, phase="forward", start=0.0, dur=1.0),
                    Job(id="1", state=f"S{n}"), Job(id=str(10 + n), state="RUNNING")])
            table = pa.table({"metric": ["fast"] * 64, "t": [float(n * 64 + i) for i in range(64)],
                              "value": [1.0] * 64, "host": ["h"] * 64, "gpu": ["0"] * 64, "job": [None] * 64,
                              "labels": ["{}"] * 64}, schema=SAMPLE_SCHEMA)
            tx.add_sample_table(table)
    store.close()
""")


def _ingest(path, point="none", kill_at=0):
    return subprocess.run([sys.executable, "-c", _INGEST, str(path), point, str(kill_at)], timeout=60).returncode


def _contents(path):
    with Store(path) as store:
        tables = {t: store.query(f"SELECT * FROM {t} ORDER BY ALL") for t in TABLES}
        return tables, [s.key for s in store.sources()]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    path = tmp_path_factory.mktemp("clean") / "store"
    assert _ingest(path) == 0
    return _contents(path)


@pytest.mark.parametrize(
    "point, kill_at",
    [
        ("staged", 2),  # mid-transaction of the first source: row groups on disk, nothing committed
        ("staged", 9),  # mid-transaction of the second source, the first one committed
        ("moved", 2),  # second source's parts in the table folders, the manifest not yet replaced
        ("committed", 1),  # first source's manifest replaced, before the transaction returned
        ("committed", 3),  # every source committed, killed before close
    ],
)
def test_kill_9_at_a_commit_point_then_the_same_ingest_gives_the_clean_store(tmp_path, clean, point, kill_at):
    path = tmp_path / "store"
    assert _ingest(path, point, kill_at) == -9
    assert _ingest(path) == 0
    assert _contents(path) == clean
    assert list((path / "staging").iterdir()) == []  # the dead writer's staging folder is collected
    with open(path / "manifest.json", "rb") as f:
        listed = {p["file"] for parts in json.load(f)["tables"].values() for p in parts}
    on_disk = {p.name for t in TABLES for p in (path / t).iterdir()}
    assert on_disk == listed  # no part left over from the killed commit


_READER = textwrap.dedent("""
    import json, sys, time
    from hpcwatch.store import Store
    store, deadline, queries, bad = Store(sys.argv[1]), time.monotonic() + float(sys.argv[2]), 0, []
    while time.monotonic() < deadline:
        try:
            ts = store.samples("m").column("t").to_pylist()
            (jobs,), = store.query("SELECT count(*) FROM jobs")
            if len(ts) % 10 or sorted(ts) != [float(i) for i in range(len(ts))] or jobs not in (0, 1):
                bad.append(f"{len(ts)} samples, {jobs} jobs")  # a commit seen in part
        except Exception as err:
            bad.append(repr(err))
        queries += 1
    print(json.dumps({"queries": queries, "bad": bad[:5], "seen": len(ts)}))
""")

# Commits of 10 samples (and the same job again); argv: store, commits, metric. Compacts hard, and deletes a
# retired part half a second after it retires (the default waits a minute), so parts vanish during the run and a
# reader paused longer meets one and retries. Not 0 s: with no grace at all a reader starved by a loaded machine
# lost the race more times in a row than it retries, a failure the grace exists to prevent.
_WRITER = textwrap.dedent("""
    import sys, time
    from hpcwatch.records import Job, Sample
    from hpcwatch.store import Store
    store = Store(sys.argv[1], compact_fanin=3, retire_grace_s=0.5)
    for c in range(int(sys.argv[2])):
        store.add([Sample(metric=sys.argv[3], labels={}, t=float(c * 10 + i), value=1.0) for i in range(10)]
                  + [Job(id="1", state=f"S{c}")])
        time.sleep(0.005)
    store.close()
""")


def _python(script, *args):
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], stdout=subprocess.PIPE, text=True)


def test_readers_beside_a_writer_see_only_whole_commits_and_never_fail(tmp_path):
    path = tmp_path / "store"
    Store(path).close()
    readers = [_python(_READER, path, 2.0) for _ in range(2)]
    writer = _python(_WRITER, path, 80, "m")
    assert writer.wait(timeout=60) == 0
    reports = [json.loads(r.communicate(timeout=60)[0]) for r in readers]
    for report in reports:
        assert report["bad"] == []
        assert report["queries"] > 3  # a loaded CI core still gets a few in; the point is "bad" stays empty
    assert max(r["seen"] for r in reports) > 0  # they read while it wrote, not only before


def test_two_writers_at_once_lose_nothing(tmp_path):
    path = tmp_path / "store"
    writers = [_python(_WRITER, path, 40, metric) for metric in ("a", "b")]
    assert [w.wait(timeout=60) for w in writers] == [0, 0]
    with Store(path) as store:
        for metric in ("a", "b"):
            assert store.samples(metric).column("t").to_pylist() == [float(i) for i in range(400)]
        assert len(store.jobs()) == 1
        assert store.version >= 80  # 80 commits, and the compactions' own swaps
        assert max(store.part_counts().values()) < 20
