"""Twin -> files -> readers -> store -> report gives back the twin's own truth, number for number.

Two paths: the twin's records straight into a store (always), and the real-format files that
``hpcwatch twin run`` writes, read back by ``hpcwatch ingest``. GPU-hours come from the
allocation, energy and IB bytes from counter deltas, Lustre bytes from the cumulative job_stats.
"""

from __future__ import annotations

import sys

import pytest

from hpcwatch.analysis.attribution import REPORT_METRICS, job_reports
from hpcwatch.model import reference_cluster
from hpcwatch.store import Store
from hpcwatch.twin import Twin
from hpcwatch.twin.live import LiveTwin
from hpcwatch.twin.run import write_run


def _check(store: Store, twin: Twin) -> None:
    reports = {r.id: r for r in job_reports(store.samples(list(REPORT_METRICS)), store.jobs())}
    truth = twin.truth()
    ran = [j for j in twin.jobs if j.start is not None]
    assert set(reports) == {j.id for j in ran}
    for job in ran:
        got, want = reports[job.id], truth[job.id]
        assert got.gpu_hours == pytest.approx(twin.gpu_hours(job.id), rel=1e-12), job.id
        assert got.energy_kwh == pytest.approx(want.energy_kwh, rel=1e-12), job.id
        assert got.ib_tx_bytes == want.ib_tx_bytes and got.ib_rx_bytes == want.ib_rx_bytes, job.id
        assert got.lustre_read_bytes == want.lustre_read_bytes, job.id
        assert got.lustre_write_bytes == want.lustre_write_bytes, job.id
        assert got.xid_errors == want.xid_errors, job.id
        if want.mean_gpu_util is not None:
            assert got.mean_gpu_util == pytest.approx(want.mean_gpu_util, rel=1e-12), job.id
    assert any(r.ib_bytes > 0 for r in reports.values())
    assert any(r.energy_kwh > 0 for r in reports.values())


def test_records_to_store_to_report_equals_truth() -> None:
    store = Store(":memory:")
    # LiveTwin.write_tick is twin.records() in the store's fast form (one sample table per tick).
    live = LiveTwin(store, reference_cluster(), seed=5, scenarios=["straggler"], tick_s=10.0, start=1_796_000_000.0)
    live.write_tick()
    for _ in range(60):
        live.step()
    _check(store, live.twin)


def test_twin_records_are_the_sample_table() -> None:
    twin = Twin(reference_cluster(), seed=5)
    twin.advance(10.0)
    a = Store(":memory:")
    a.add(twin.samples())
    b = Store(":memory:")
    b.add_sample_table(twin.sample_table())
    query = "SELECT metric, t, value, host, gpu, job, labels FROM samples ORDER BY ALL"
    assert a.query(query) == b.query(query)


def test_files_to_ingest_to_report_equals_truth(tmp_path, capsys) -> None:
    from hpcwatch.cli import main

    twin = Twin(reference_cluster(), seed=6)
    write_run(twin, tmp_path / "run", duration_s=900.0, step_s=10.0)
    db = tmp_path / "twin.duckdb"
    old = sys.argv
    sys.argv = ["hpcwatch", "ingest", str(tmp_path / "run"), "--db", str(db), "--json"]
    try:
        main()
    except SystemExit as exit_:
        assert not exit_.code, capsys.readouterr().err
    finally:
        sys.argv = old
    with Store(db) as store:
        _check(store, twin)
