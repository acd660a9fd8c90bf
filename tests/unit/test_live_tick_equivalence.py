"""The live demo's fast paths (issue 27) give what the per-row ways gave: the twin's sample table row for row
as its ``samples()``, the scanner's samples as the store's rows, and ``JobIndex.on`` as a scan of every job."""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest

from hpcwatch.records import Job
from hpcwatch.schemas import SAMPLE_SCHEMA, sample_keys
from hpcwatch.security.context import JobIndex
from hpcwatch.security.scan import SAMPLE_PREFIXES, SAMPLE_SUBSTRINGS, sample_metrics
from hpcwatch.store import Store
from hpcwatch.store.queries import samples_matching
from hpcwatch.twin import Twin
from hpcwatch.twin.live import LiveTwin
from hpcwatch.twin.run import sized_reference
from hpcwatch.twin.scenarios import Scenario

START = 1_800_000_000.0


class _LoseGpu(Scenario):
    """dcgm-exporter loses GPU 2 of node 1 after the first ticks: the table must leave its rows out."""

    name = "test_equivalence_lose_gpu"

    def absent_gpus(self, *, t: float) -> list[tuple[str, int]]:
        return [("node1", 2)] if t >= START + 3 else []


def _table_one_sample_at_a_time(twin: Twin) -> pa.Table:
    """The sample table as it was built before issue 27: one ``Sample`` a row, keys by ``sample_keys``."""
    rows = []
    for s in twin.samples():
        host, gpu, job = sample_keys(s.labels, s.metric)
        rows.append((s.metric, s.t, s.value, host, gpu, job, orjson.dumps(dict(s.labels)).decode()))
    return pa.table({name: [r[i] for r in rows] for i, name in enumerate(SAMPLE_SCHEMA.names)}, schema=SAMPLE_SCHEMA)


@pytest.mark.parametrize("scenarios", [(), ("xid79", "threat_rdma"), (_LoseGpu(),)])
def test_the_sample_table_holds_the_samples_row_for_row(scenarios) -> None:
    twin = Twin(sized_reference(3), seed=0, start=START, scenarios=scenarios)
    for _ in range(6):
        twin.advance(1.0)
        table = twin.sample_table()
        assert table.num_rows > 0 and table.column("labels").num_chunks == 1
        assert table.equals(_table_one_sample_at_a_time(twin))
    if scenarios and isinstance(scenarios[0], _LoseGpu):
        assert not any('"Hostname":"node1"' in lab and '"gpu":"2"' in lab for lab in table.column("labels").to_pylist())


def test_the_scanner_reads_each_stored_row_as_a_sample_with_its_labels() -> None:
    store = Store(":memory:")
    live = LiveTwin(store, sized_reference(2), seed=0, start=START, scenarios=("threat_rdma",))
    for _ in range(4):
        live.step()
    version, samples = samples_matching(store, sample_metrics(), prefixes=SAMPLE_PREFIXES, substrings=SAMPLE_SUBSTRINGS)
    marks = ", ".join("?" * len(sample_metrics()))
    _, rows = store.query_since(
        0,
        f"SELECT metric, labels, t, value FROM samples WHERE metric IN ({marks}) "
        "OR starts_with(metric, ?) OR contains(metric, ?) ORDER BY t",
        [*sample_metrics(), *SAMPLE_PREFIXES, *SAMPLE_SUBSTRINGS],
    )
    assert version == store.version and len(samples) == len(rows) > 400
    assert [s.t for s in samples] == sorted(s.t for s in samples)

    def key(row: tuple) -> tuple:
        return (row[2], row[0], orjson.dumps(row[1], option=orjson.OPT_SORT_KEYS), row[3])

    read = sorted(((s.metric, dict(s.labels), s.t, s.value) for s in samples), key=key)
    assert read == sorted(((m, orjson.loads(lab), t, v) for m, lab, t, v in rows), key=key)
    # One dict per distinct labels text, shared by the samples that carry it.
    assert len({id(s.labels) for s in samples}) == len({lab for _, lab, _, _ in rows})
    assert samples_matching(store, sample_metrics(), since_version=version) == (version, [])


def _jobs() -> list[Job]:
    return [
        Job(id="1", nodes=("a", "b"), start=0.0, end=10.0, state="COMPLETED"),
        Job(id="2", nodes=("b",), start=5.0, state="RUNNING"),
        Job(id="3", nodes=("c", "c"), start=2.0, end=4.0, state="FAILED"),
        Job(id="4", nodes=("a",), start=None),  # pending: never holds a node
        Job(id="5", nodes=("a", "c"), start=8.0, end=9.0, state="CANCELLED"),
    ]


@pytest.mark.parametrize("grace_s", [0.0, 1.5])
def test_jobs_on_a_host_by_the_index_are_those_a_scan_of_every_job_finds(grace_s: float) -> None:
    indexed = JobIndex.of(_jobs())
    scanned = JobIndex(indexed.jobs)  # made without ``of``: no per-host index, every job is looked at
    assert indexed == scanned and not scanned.by_host
    for host in ("a", "b", "c", "d", None):
        for t in (0.0, 3.0, 5.0, 8.5, 9.5, 11.0, 100.0):
            found = indexed.on(host, t, grace_s=grace_s)
            assert found == scanned.on(host, t, grace_s=grace_s)
    assert [j.id for j in indexed.on("c", 3.0)] == ["3"] and [j.id for j in indexed.on("a", 8.5)] == ["1", "5"]
    assert [j.id for j in indexed.on(None, 9.5)] == ["1", "2"]


def test_detectors_given_only_the_metrics_they_read_find_what_they_find_in_every_sample(monkeypatch) -> None:
    from dataclasses import replace

    from hpcwatch.security import scan

    store = Store(":memory:")
    threats = ("threat_rdma", "threat_remanence", "threat_gradient")
    live = LiveTwin(store, sized_reference(3), seed=0, start=START, scenarios=threats)
    for _ in range(25):
        live.step()
    _, samples = samples_matching(store, sample_metrics(), prefixes=SAMPLE_PREFIXES, substrings=SAMPLE_SUBSTRINGS)
    _, events = scan.queries.events_of_kinds(store, scan.EVENT_KINDS)
    jobs = store.jobs()
    filtered = scan.scan_records(samples, events, jobs)
    assert {f.vector for f in filtered} >= {"rdma_blind_spot", "gpu_memory_remanence"}
    assert sum(d.series is not None for d in scan.DETECTORS) == 2
    monkeypatch.setattr(scan, "DETECTORS", tuple(replace(d, reads=None) for d in scan.DETECTORS))
    assert scan.scan_records(samples, events, jobs) == filtered
