"""The health window kept between judgements (``reports.healthwindow``) against the window read at once.

A kept window reads only the rows committed since its last read; these tests hold what it returns, and the
verdicts judged on it, to a fresh read of the same store: while the twin writes (rows leave the window,
compaction merges parts), when rows land late, when label sets come and go (the dictionary is pruned), and
when two label sets share a hash (it gives up and the caller reads at once).
"""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest

from hpcwatch import vocab
from hpcwatch.analysis.health import PASSIVE_METRICS
from hpcwatch.records import Sample
from hpcwatch.reports import healthwindow
from hpcwatch.reports.health import node_health
from hpcwatch.reports.healthwindow import KeptWindow
from hpcwatch.store import Store, queries
from hpcwatch.twin.live import LiveTwin
from hpcwatch.web.demo import cluster_with_nodes


def _rows(table: pa.Table) -> list[tuple]:
    """The table's rows as plain values, in one order (the kept window holds them in another)."""
    columns = ["metric", "t", "value", "host", "gpu", "job", "labels"]
    plain = {name: table[name].to_pylist() for name in columns}
    return sorted(zip(*(plain[name] for name in columns)), key=repr)


def _same_verdicts(store: Store, kept: KeptWindow, window_s: float) -> bool:
    def text(report):
        return orjson.dumps(report.to_dict(), option=orjson.OPT_SORT_KEYS)

    kept_report = node_health(store, kept=kept, window_s=window_s, fleet_every_s=0.0)
    return text(kept_report) == text(node_health(store, window_s=window_s))


def test_a_kept_window_judges_as_a_fresh_read_while_the_twin_writes(tmp_path):
    """Over 60 ticks of a 4-node twin with an XID 79 and a flapping IB link, a 20 s window (rows leave it), in a
    store that compacts at every other commit: the same verdicts, every tick, and the same rows."""
    with Store(tmp_path / "s", compact_fanin=2, retire_grace_s=0) as store:
        live = LiveTwin(store, cluster_with_nodes(4), seed=0, scenarios=["xid79", "ib_flap"])
        live.write_tick()
        kept = KeptWindow()
        fired = set()
        for _ in range(60):
            live.step()
            assert _same_verdicts(store, kept, 20.0)
            report = node_health(store, kept=kept, window_s=20.0)
            fired |= {c.rule for n in report.nodes for c in n.checks if c.verdict != "ok"}
        _, newest = store.time_range()
        t0 = newest - 20.0
        assert _rows(kept.samples(store, PASSIVE_METRICS, t0=t0)) == _rows(
            queries.window_samples(store, PASSIVE_METRICS, t0=t0)
        )
        assert {"xid", "ib_link"} <= fired  # the scenarios' faults were judged, not only quiet nodes


def _util(host: str, gpu: str, t: float, value: float, job: str = "") -> Sample:
    labels = {"Hostname": host, "gpu": gpu, "modelName": "NVIDIA H100 80GB HBM3"}
    return Sample(
        metric=vocab.DCGM_FI_DEV_GPU_UTIL, labels=labels | ({"hpc_job": job} if job else {}), t=t, value=value
    )


def test_rows_that_land_late_are_read_whatever_their_time(tmp_path):
    """A node scraped late: its rows, older than what the window last read, land in the next read; those older
    than the window's start do not, as in a fresh read."""
    with Store(tmp_path / "s", compact_fanin=2, retire_grace_s=0) as store:
        store.add([_util("node1", "0", float(t), 90.0, "41") for t in range(100, 200)])
        kept = KeptWindow()
        assert kept.samples(store, [vocab.DCGM_FI_DEV_GPU_UTIL], t0=150.0).num_rows == 50
        store.add([_util("node2", "0", float(t), 0.0, "41") for t in range(100, 200)])  # late: 100-199 again
        store.add([_util("node1", "0", 200.0, 90.0, "41")])
        got = kept.samples(store, [vocab.DCGM_FI_DEV_GPU_UTIL], t0=160.0)
        want = queries.window_samples(store, [vocab.DCGM_FI_DEV_GPU_UTIL], t0=160.0)
        assert got.num_rows == want.num_rows == 40 + 40 + 1
        assert _rows(got) == _rows(want)
        assert _same_verdicts(store, kept, 40.0)


def test_label_sets_that_leave_the_window_leave_the_dictionary(tmp_path, monkeypatch):
    """Each job brings label sets of its own: once the dictionary doubled, it keeps only those in use."""
    monkeypatch.setattr(healthwindow, "LABELS_PRUNED_FROM", 0)
    with Store(tmp_path / "s") as store:
        kept = KeptWindow()
        metric = [vocab.DCGM_FI_DEV_GPU_UTIL]
        for job in range(40):
            store.add([_util("node1", str(g), 10.0 * job, 50.0, str(job)) for g in range(64)])
            got = kept.samples(store, metric, t0=10.0 * job - 15.0)
            assert _rows(got) == _rows(queries.window_samples(store, metric, t0=10.0 * job - 15.0))
        assert len(kept._labels.texts) <= 2 * 2 * 64 + 64  # of 40 jobs × 64 seen: twice the two jobs' in use, + 1


def test_two_label_sets_with_one_hash_make_the_caller_read_at_once(tmp_path, monkeypatch):
    with Store(tmp_path / "s") as store:
        store.add([_util("node1", "0", 1.0, 50.0, "41"), _util("node1", "1", 1.0, 50.0, "42")])
        real = queries.window_samples_after

        def one_hash(store, metrics, *, t0, version):
            rows, sets = real(store, metrics, t0=t0, version=version)
            same = pa.array([7] * rows.num_rows, rows["labels_hash"].type)
            sets = sets.set_column(0, "labels_hash", pa.array([7] * sets.num_rows, sets["labels_hash"].type))
            return rows.set_column(rows.schema.get_field_index("labels_hash"), "labels_hash", same), sets

        monkeypatch.setattr(healthwindow.queries, "window_samples_after", one_hash)
        kept = KeptWindow()
        assert kept.samples(store, [vocab.DCGM_FI_DEV_GPU_UTIL], t0=0.0) is None
        assert kept.samples(store, [vocab.DCGM_FI_DEV_GPU_UTIL], t0=0.0) is None  # for good
        assert _same_verdicts(store, kept, 60.0)  # node_health reads at once instead


def test_a_label_set_whose_hash_was_another_text_is_refused():
    sets = healthwindow._LabelSets()
    first = pa.table({"labels_hash": pa.array([5], pa.uint64()), "labels": ['{"gpu":"0"}']})
    assert sets.encode(pa.array([5, 5], pa.uint64()).to_numpy(), first).to_pylist() == [0, 0]
    other = pa.table({"labels_hash": pa.array([5], pa.uint64()), "labels": ['{"gpu":"1"}']})
    with pytest.raises(healthwindow._Collision):
        sets.encode(pa.array([5], pa.uint64()).to_numpy(), other)


def test_another_store_or_other_metrics_start_the_window_anew(tmp_path):
    with Store(tmp_path / "a") as a, Store(tmp_path / "b") as b:
        a.add([_util("node1", "0", float(t), 90.0) for t in range(10)])
        a.add([_util("node1", "0", float(t), 90.0) for t in range(10, 20)])
        b.add([_util("node9", "0", 5.0, 10.0)])
        kept = KeptWindow()
        metric = [vocab.DCGM_FI_DEV_GPU_UTIL]
        assert kept.samples(a, metric, t0=0.0).num_rows == 20
        assert _rows(kept.samples(b, metric, t0=0.0)) == _rows(queries.window_samples(b, metric, t0=0.0))
        assert kept.samples(a, [vocab.DCGM_FI_DEV_POWER_USAGE], t0=0.0).num_rows == 0


def test_collects_health_task_keeps_its_window_and_stores_what_a_fresh_run_gives(tmp_path):
    from hpcwatch.collect.config import ScheduleSection
    from hpcwatch.collect.schedule import ScheduledTask
    from hpcwatch.reports.health import verdict_events
    from hpcwatch.vocab import EventKind

    with Store(tmp_path / "s", compact_fanin=2, retire_grace_s=0) as store:
        live = LiveTwin(store, cluster_with_nodes(4), seed=0, scenarios=["xid79"])
        live.write_tick()
        task = ScheduledTask(store, ScheduleSection(name="health", task="health", interval_s=60.0, window_s=30.0))
        assert task._health_window is not None
        for _ in range(4):
            for _ in range(15):
                live.step()
            task.run()
            stored = store.events(EventKind.HEALTH_VERDICT)
            newest = max(e.t for e in stored)
            fresh = verdict_events(store, t=0.0, source="", window_s=30.0)
            assert sorted(
                orjson.dumps(e.attrs, option=orjson.OPT_SORT_KEYS) for e in stored if e.t == newest
            ) == sorted(orjson.dumps(e.attrs, option=orjson.OPT_SORT_KEYS) for e in fresh)
        assert any(e.attrs["verdict"] != "ok" for e in fresh)  # the XID's node was judged, not only quiet ones


def test_real_captures_committed_one_by_one_give_a_fresh_reads_window(tmp_path):
    """Real captures of every passive tool the store reads (tests/data/SOURCES.md: nvidia-smi, dcgm-exporter,
    node-exporter, ibstat, perfquery, smartctl, chrony, df, EDAC, ipmitool, systemd, AMD), each committed on its
    own as an agent would: after each commit the kept window holds a fresh read's rows and gives its verdicts."""
    from pathlib import Path

    from hpcwatch.ingest import ingest_paths

    data = Path(__file__).parent.parent / "data"
    folders = (
        "nvidia_smi",
        "prometheus",
        "infiniband",
        "smartctl",
        "chrony",
        "df",
        "edac",
        "ipmitool",
        "systemd",
        "amd",
    )
    files = sorted(p for folder in folders for p in (data / folder).rglob("*") if p.is_file())
    with Store(tmp_path / "s", compact_fanin=2, retire_grace_s=0) as store:
        kept = KeptWindow()
        for i, path in enumerate(files):
            ingest_paths(store, [path], host=f"node{i % 3}", keep_going=True)
            assert _same_verdicts(store, kept, 300.0), path
        t0 = store.time_range()[1] - 300.0
        got = kept.samples(store, PASSIVE_METRICS, t0=t0)
        assert _rows(got) == _rows(queries.window_samples(store, PASSIVE_METRICS, t0=t0))
        assert len(set(got["metric"].to_pylist())) > 20  # the captures gave many of the rules' metrics
        report = node_health(store, kept=kept, window_s=300.0, fleet_every_s=0.0)
        fired = {c.rule for n in report.nodes for c in n.checks if c.verdict != "ok"}
        assert {"xid", "ib_port", "driver_mismatch", "disk_space"} <= fired


def test_a_read_that_fails_half_held_starts_the_window_anew(tmp_path, monkeypatch):
    """Out of memory while a read's chunks are merged, one metric's new rows held already: the next read counts
    no row twice."""
    metrics = [vocab.DCGM_FI_DEV_GPU_UTIL, vocab.DCGM_FI_DEV_POWER_USAGE]

    def power(t: float) -> Sample:
        return Sample(metric=vocab.DCGM_FI_DEV_POWER_USAGE, labels={"Hostname": "node1", "gpu": "0"}, t=t, value=1.0)

    with Store(tmp_path / "s") as store:
        kept = KeptWindow()
        store.add([power(float(t)) for t in range(10)])
        kept.samples(store, metrics, t0=0.0)
        store.add(
            [_util("node1", "0", float(t), 90.0) for t in range(10, 20)] + [power(float(t)) for t in range(10, 20)]
        )

        def out_of_memory(self, newer):
            raise MemoryError

        with (
            monkeypatch.context() as patched
        ):  # the utilisation's rows come first and are held; the power's merge fails
            patched.setattr(healthwindow._Chunk, "then", out_of_memory)
            with pytest.raises(MemoryError):
                kept.samples(store, metrics, t0=0.0)
        assert _rows(kept.samples(store, metrics, t0=0.0)) == _rows(queries.window_samples(store, metrics, t0=0.0))


def test_kept_events_are_the_stores_kind_by_kind_while_they_come(tmp_path, monkeypatch):
    """``KeptWindow.events`` reads only what was committed since, and gives what ``store.events`` gives kind by
    kind: an event committed late goes at its time, those before the window's start leave it (and are read again
    when asked further back), the events of all time (t0 None) stay; two sets of kinds are kept apart."""
    from hpcwatch.records import Event

    def event(kind: str, t: float, node: str) -> Event:
        return Event(kind=kind, t=t, source="test", attrs={"node": node})

    def fresh(store: Store, kinds: tuple[str, ...], t0: float | None) -> list[Event]:
        return [e for kind in kinds for e in store.events(kind, t0=t0)]

    window, active = ("xid", "kernel_log"), ("dcgm_diag",)
    with Store(tmp_path / "s", compact_fanin=2, retire_grace_s=0) as store:
        kept = KeptWindow()
        for step in range(12):
            store.add([event("xid", 10.0 * step, "node1"), event("kernel_log", 10.0 * step + 5, "node2")])
            if step % 3 == 0:
                store.add([event("dcgm_diag", 10.0 * step, "node1"), event("xid", 10.0 * step - 25, "node3")])  # late
            t0 = 10.0 * step - 40
            assert kept.events(store, window, t0=t0) == fresh(store, window, t0)
            assert kept.events(store, active) == fresh(store, active, None)
        reads: list[int] = []
        original = queries.events_of_kinds
        monkeypatch.setattr(
            queries,
            "events_of_kinds",
            lambda s, k, since_version: reads.append(since_version) or original(s, k, since_version=since_version),
        )
        assert kept.events(store, window, t0=t0) == fresh(store, window, t0)
        assert reads == [store.version]  # only what came since its last read: nothing
        assert kept.events(store, window, t0=0.0) == fresh(store, window, 0.0)  # further back: all read again
        assert reads[-1] == 0


def test_a_kept_part_is_made_again_once_the_data_moved_on_by_its_period():
    kept, made = KeptWindow(), []

    def make():
        made.append(1)
        return len(made)

    assert [kept.every("x", at, 60.0, make) for at in (100.0, 130.0, 159.9, 160.0, 200.0)] == [1, 1, 1, 2, 2]
    assert kept.every("x", 150.0, 60.0, make) == 3  # the data went back (another store's): made again
    assert kept.every("x", None, 60.0, make) == 4 and kept.every("x", None, 60.0, make) == 5  # no clock: each time
    assert kept.every("y", 150.0, 60.0, make) == 6  # each part on its own


def test_the_fleets_versions_are_judged_once_a_minute_of_data_in_a_live_judgement(tmp_path, monkeypatch):
    """A live judgement (a kept window) judges the fleet's versions when its data moved on by a minute, not at
    every call; a one-off judgement (no kept window) at every call."""
    import hpcwatch.reports.health as health

    calls = []
    real = health.version_checks
    monkeypatch.setattr(health, "version_checks", lambda *a, **k: calls.append(1) or real(*a, **k))
    with Store(tmp_path / "s") as store:
        live = LiveTwin(store, cluster_with_nodes(2), seed=0)
        live.write_tick()
        kept = KeptWindow()
        for _ in range(90):
            live.step()
            node_health(store, kept=kept, window_s=30.0)
        assert len(calls) == 2  # at the first judgement and a minute of data later
        node_health(store, window_s=30.0)
        assert len(calls) == 3
