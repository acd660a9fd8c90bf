"""The store: records in, the same records out; a kill -9 mid-ingest leaves a readable store."""

import gc
import os
import signal
import subprocess
import sys
import textwrap

import duckdb
import pytest

from hpcwatch.errors import StoreError
from hpcwatch.records import Event, Finding, Job, Sample, Span
from hpcwatch.store import Store


def _gpu_sample(t, value, gpu="0", job="7"):
    return Sample(
        metric="DCGM_FI_DEV_GPU_UTIL",
        t=t,
        value=value,
        labels={"gpu": gpu, "Hostname": "node1", "hpc_job": job, "modelName": "NVIDIA H100 80GB HBM3"},
    )


def test_every_record_kind_round_trips_through_the_store():
    job = Job(
        id="7",
        user="alice",
        account="proj-llm",
        partition="gpu",
        nodes=("node1", "node2"),
        gpus=4,
        gpus_by_node={"node1": (6, 7), "node2": (0, 1)},
        start=10.0,
        end=None,
        state="RUNNING",
        name="llm",
    )
    event = Event(kind="xid", t=12.5, source="dcgm-exporter", attrs={"xid": 79, "gpu": "2"})
    span = Span(job="7", rank=2, step=3, phase="backward", start=11.0, dur=0.021, attrs={"node": "node1"})
    finding = Finding(
        vector="rdma_blind_spot",
        severity="high",
        target="node2/mlx5_0",
        title="traffic without job",
        evidence={"bytes": 123},
        t=13.0,
        rule="rdma.traffic_without_job",
    )
    with Store() as store:
        counts = store.add([_gpu_sample(11.0, 93.0), job, event, span, finding])
        assert (counts.samples, counts.jobs, counts.events, counts.spans, counts.findings) == (1, 1, 1, 1, 1)
        assert store.jobs() == [job]
        assert store.events("xid") == [event]
        assert store.spans("7") == [span]
        assert store.findings("rdma_blind_spot") == [finding]
        assert list(store.iter_samples()) == [_gpu_sample(11.0, 93.0)]


def test_samples_are_keyed_by_host_gpu_and_job_from_their_labels():
    lowercase_host = Sample(metric="DCGM_FI_DEV_GPU_UTIL", t=1.0, value=5.0, labels={"gpu": "1", "hostname": "node2"})
    lustre = Sample(metric="lustre_job_read_bytes_total", t=1.0, value=9.0, labels={"jobid": "42", "target": "OST0"})
    ib = Sample(
        metric="node_infiniband_port_data_received_bytes_total",
        t=1.0,
        value=4.0,
        labels={"device": "mlx5_0", "port": "1", "instance": "node3:9100"},
    )
    with Store() as store:
        store.add([_gpu_sample(1.0, 50.0), lowercase_host, lustre, ib])
        rows = {(r["metric"], r["host"], r["gpu"], r["job"]) for r in store.samples().to_pylist()}
    assert rows == {
        ("DCGM_FI_DEV_GPU_UTIL", "node1", "0", "7"),
        ("DCGM_FI_DEV_GPU_UTIL", "node2", "1", None),
        ("lustre_job_read_bytes_total", None, None, "42"),
        ("node_infiniband_port_data_received_bytes_total", "node3", None, None),
    }


def test_sample_queries_filter_by_metric_host_job_and_time():
    with Store() as store:
        store.add(_gpu_sample(float(t), float(t), job="7" if t < 5 else "8") for t in range(10))
        assert store.samples("DCGM_FI_DEV_GPU_UTIL", job="8").num_rows == 5
        assert store.samples("DCGM_FI_DEV_GPU_UTIL", t0=2, t1=4).column("value").to_pylist() == [2.0, 3.0, 4.0]
        assert store.samples("other").num_rows == 0
        assert store.samples(host="node9").num_rows == 0
        assert store.time_range() == (0.0, 9.0)


def test_a_job_seen_again_replaces_the_older_row():
    with Store() as store:
        store.add([Job(id="9", user="bob", state="PENDING")])
        store.add([Job(id="9", user="bob", state="COMPLETED", start=1.0, end=2.0)])
        assert [(j.id, j.state) for j in store.jobs()] == [("9", "COMPLETED")]


def test_jobs_read_again_keep_the_unchanged_ones_and_see_the_changed_ones():
    """``jobs()`` reads the table again after a commit to it, and reuses the Job of a row read before."""
    with Store() as store:
        store.add([Job(id="1", user="ann", state="RUNNING", start=1.0, nodes=("node1",)), Job(id="2", user="bob")])
        first = {j.id: j for j in store.jobs()}
        store.add([Job(id="2", user="bob", state="RUNNING", start=2.0, nodes=("node2",)), Job(id="3", user="cy")])
        again = {j.id: j for j in store.jobs()}
        assert again["1"] is first["1"]  # the same row: not parsed again
        assert (again["2"].state, again["2"].nodes) == ("RUNNING", ("node2",)) and set(again) == {"1", "2", "3"}
        assert store.jobs(on_nodes=["node2"]) == [again["2"]]


def test_reads_run_at_once_and_a_close_waits_for_the_running_one():
    """A read runs outside the store's lock (``Store._read``): another thread's query is answered while it
    runs, and ``close`` waits for it before closing the connection under it."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from hpcwatch.errors import StoreError

    store = Store()
    store.add(_gpu_sample(float(t), 1.0) for t in range(5))
    started, release = threading.Event(), threading.Event()

    def slow(cursor):
        started.set()
        assert release.wait(60)
        return cursor.execute("SELECT count(*) FROM samples").fetchall()

    with ThreadPoolExecutor(2) as pool:
        reading = pool.submit(store._read, slow)
        assert started.wait(60)
        assert store.query("SELECT count(*) FROM samples") == [(5,)]  # not queued behind the slow read
        closing = pool.submit(store.close)
        deadline = time.monotonic() + 60
        while not store._closed and time.monotonic() < deadline:  # close has begun: it now waits for the read
            time.sleep(0.01)
        assert store._closed and not closing.done()
        release.set()
        assert reading.result(timeout=60) == [(5,)] and closing.result(timeout=60) is None
    with pytest.raises(StoreError, match="closed"):
        store.query("SELECT 1")


def test_a_file_store_keeps_its_records_across_opens(tmp_path):
    path = tmp_path / "s.duckdb"
    with Store(path) as store:
        store.add([_gpu_sample(1.0, 1.0)])
    with Store(path) as store:
        assert store.samples().num_rows == 1


def _old_duckdb_file(path):
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE samples (metric VARCHAR)")
    con.close()


def _folder_of_notes(path):
    path.mkdir()
    (path / "notes.txt").write_text("mine")


def _file_under_a_file(path):
    path.parent.parent.mkdir()
    path.parent.write_text("x")


@pytest.mark.parametrize(
    "make, at, message",
    [
        # the store of the previous version: one DuckDB file
        (_old_duckdb_file, "old.duckdb", "the store is now a folder: re-ingest into a new --db path"),
        # someone's folder: never written into
        (_folder_of_notes, "docs", "a folder that is not a store"),
        # a text file where the folder should be
        (lambda p: p.write_text("x"), "text", "a file, not a store folder"),
        # a path below a file
        (_file_under_a_file, "d/file/s", "cannot open the store"),
    ],
)
def test_a_path_that_is_not_a_store_is_a_one_line_store_error(tmp_path, make, at, message):
    make(tmp_path / at)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(StoreError, match=message) as raised:
        Store(tmp_path / at)
    assert "\n" not in str(raised.value)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written there


def test_a_store_created_by_another_opener_between_the_check_and_the_listing_opens(tmp_path, monkeypatch):
    """Two collectors of one daemon open a new store at once: the first one's manifest may appear after
    the second looked for it and before it listed the folder (seen in CI: 'no manifest.json; holds
    manifest.json')."""
    Store(tmp_path / "s").close()
    real_exists = type(tmp_path).exists
    seen = []

    def exists_late(path, *args, **kwargs):
        if path.name == "manifest.json" and not seen:
            seen.append(path)
            return False  # not there yet when the opener looked
        return real_exists(path, *args, **kwargs)

    monkeypatch.setattr(type(tmp_path), "exists", exists_late)
    Store(tmp_path / "s").close()
    assert seen


def test_jobs_on_nodes_are_those_allocated_one_of_them_by_exact_name():
    with Store(":memory:") as store:
        store.add(
            [
                Job(id="1", nodes=("node1",), start=1.0),
                Job(id="2", nodes=("node10", "node11"), start=2.0),
                Job(id="3", nodes=("node2", "node1"), start=3.0),
                Job(id="4", nodes=(), start=4.0),
            ]
        )
        assert [j.id for j in store.jobs(on_nodes=["node1"])] == ["1", "3"]  # node10 is not node1
        assert [j.id for j in store.jobs(on_nodes=["node11", "node2"])] == ["2", "3"]
        assert store.jobs(on_nodes=[]) == [] and len(store.jobs()) == 4


def test_the_in_memory_store_leaves_no_folder_behind():
    store = Store(":memory:")
    store.add([_gpu_sample(1.0, 1.0)])
    folder = store.path
    assert folder.is_dir() and store.samples().num_rows == 1
    store.close()
    assert not folder.exists()


def test_an_in_memory_store_never_closed_leaves_no_folder_behind(tmp_path):
    """Dropped without a close (a test's store, a command that raised): its folder goes when it is collected,
    and when the interpreter exits while it is still held. Before, the unit tests alone left 138 folders."""
    store = Store(":memory:")
    store.add([_gpu_sample(1.0, 1.0)])
    folder = store.path
    del store
    gc.collect()
    assert not folder.exists()
    script = "import sys; from hpcwatch.store import Store; held = Store(':memory:'); print(held.path)"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip().startswith(str(tmp_path)) and not list(tmp_path.iterdir())


def test_a_bad_query_is_a_store_error():
    with Store() as store, pytest.raises(StoreError, match="query failed"):
        store.query("SELECT nope FROM samples")


_WRITER = textwrap.dedent("""
    import sys
    from hpcwatch.records import Sample
    from hpcwatch.store import Store
    store = Store(sys.argv[1], batch_size=1000)
    def forever():
        i = 0
        while True:
            yield Sample(metric="m", labels={"gpu": str(i % 8)}, t=float(i), value=float(i))
            i += 1
            if i in (5000, 12500):  # five batches committed; then the middle of the thirteenth
                print("ready" if i == 5000 else "inside a batch", flush=True)
    store.add(forever())
""")


def test_kill_9_during_ingest_leaves_a_readable_store_losing_at_most_the_batch_in_flight(tmp_path):
    path = tmp_path / "crash.duckdb"
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        assert writer.stdout.readline().strip() == "inside a batch"
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        writer.wait(timeout=10)
    with Store(path) as store:
        ((count,),) = [row for row in store.query("SELECT count(*) FROM samples")]
        values = store.samples("m").column("t").to_pylist()
    assert count >= 12_000  # every batch before the one in flight was committed
    assert count % 1000 == 0  # whole batches only: the one in flight is gone, nothing half-written
    assert sorted(values) == [float(i) for i in range(count)]
