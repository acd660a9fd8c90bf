"""Twin -> files -> readers -> store -> report gives back the twin's own truth, number for number.

Two paths: the twin's records straight into a store (always), and the real-format files that
``hpcwatch twin run`` writes, read back by ``hpcwatch ingest``. GPU-hours come from the
allocation, energy and IB bytes from counter deltas, Lustre bytes from the cumulative job_stats.
"""

from __future__ import annotations

import sys
from pathlib import Path

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


# -- every reader: its records, through the store and back, equal the direct read ----------------------------------

DATA = Path(__file__).resolve().parents[1] / "data"

#: Formats no store holds: ``ingest`` says "not stored" and their own commands read the file.
NOT_STORED = {"trace", "op-table"}

#: Readers with no real sample in tests/data yet (each is a gap, named so a new reader is not silently skipped).
NO_REAL_SAMPLE = {"nvidia-params", "opensm-partitions", "shard-manifest", "site-packages", "pip-list"}


def _samples_by_format() -> dict[str, list[Path]]:
    from hpcwatch.errors import ParseError
    from hpcwatch.sources.registry import detect

    found: dict[str, list[Path]] = {}
    for p in sorted(DATA.rglob("*")):
        if p.name.startswith(".") or p.suffix == ".md":
            continue
        try:
            fmt = detect(p, is_dir=p.is_dir())
        except ParseError:
            continue
        if fmt is not None:
            found.setdefault(fmt.name, []).append(p)
    return found


def _osv_zip(tmp_path: Path) -> Path:
    """The real OSV records of tests/data, zipped as osv.dev serves an ecosystem (``PyPI/all.zip``)."""
    import zipfile

    out = tmp_path / "all.zip"
    with zipfile.ZipFile(out, "w") as z:
        for p in sorted((DATA / "security").glob("osv*/*.json")):
            z.write(p, p.name)
    return out


def _direct_and_stored(fmt, path: Path) -> tuple[list[str], list[str]]:
    from hpcwatch.records import Job
    from hpcwatch.sources.registry import ReadContext
    from hpcwatch.sources.stored import advisory_events, manifest_event, manifests_from_events, osv_from_events

    doc = fmt.read(path, ReadContext(host="node-a"))
    store = Store(":memory:")
    if fmt.yields == "advisories":
        store.add(advisory_events(doc, t=1.0))
        entries = lambda db: [e for es in db.by_package.values() for e in es]  # noqa: E731
        return sorted(map(repr, entries(doc))), sorted(map(repr, entries(osv_from_events(store.events()))))
    if fmt.yields == "manifest":
        store.add([manifest_event(doc, t=1.0)])
        return [repr(doc)], list(map(repr, manifests_from_events(store.events())))
    records = list(doc)
    store.add(records)
    # A job seen again replaces its row (requeues): the direct read's last record of each id is what is kept.
    last_job = {r.id: r for r in records if isinstance(r, Job)}
    direct = [r for r in records if not isinstance(r, Job)] + list(last_job.values())
    back = [*store.iter_samples(), *store.events(), *store.spans(), *store.jobs(), *store.findings()]
    return sorted(map(repr, direct)), sorted(map(repr, back))


def test_every_reader_survives_the_store_round_trip(tmp_path) -> None:
    """Every field a matcher uses must come back: ``withdrawn`` did not, and a retracted MAL- advisory
    (MAL-2023-8651, osv.dev) was a critical "known malicious package" again on ``scan --db``."""
    from hpcwatch.sources.registry import formats

    found = _samples_by_format()
    found.setdefault("osv-zip", []).append(_osv_zip(tmp_path))
    checked = set()
    for fmt in formats():
        if fmt.yields in NOT_STORED or fmt.name in NO_REAL_SAMPLE:
            assert fmt.name not in found or fmt.yields in NOT_STORED, f"{fmt.name} has a sample now: test it"
            continue
        assert found.get(fmt.name), f"no real sample of {fmt.name} in tests/data"
        for path in found[fmt.name][:4]:
            direct, stored = _direct_and_stored(fmt, path)
            assert direct, (fmt.name, path)
            assert stored == direct, (fmt.name, path)
        checked.add(fmt.name)
    assert {"osv-record", "osv-dir", "osv-zip", "prometheus", "sacct-json"} <= checked


def test_withdrawn_advisory_stays_withdrawn_through_ingest_and_scan_db(tmp_path, capsys) -> None:
    """MAL-2023-8651 (osv.dev, withdrawn 2023-12-12) names lodestone 0.0.58: neither scan may call it malicious."""
    import json

    pip = tmp_path / "pip.json"  # ``pip list --format json`` of a host that has the package
    pip.write_text('[{"name": "lodestone", "version": "0.0.58"}]')
    advisory = DATA / "security" / "osv_withdrawn" / "MAL-2023-8651.json"
    db = tmp_path / "s.duckdb"
    _cli(["ingest", str(pip), str(advisory.parent), "--db", str(db), "--json"], capsys)
    for argv in (["scan", "--db", str(db), "--json"], ["scan", str(pip), str(advisory), "--json"]):
        report = json.loads(_cli(argv, capsys))
        assert report["inputs"]["events"] == 2, argv  # the package and the advisory were both read
        assert [f["title"] for f in report["findings"] if "MAL-2023-8651" in f["title"]] == [], argv


def _cli(argv: list[str], capsys) -> str:
    from hpcwatch.cli import main

    old = sys.argv
    sys.argv = ["hpcwatch", *argv]
    try:
        main()
    except SystemExit as exit_:
        assert not exit_.code, capsys.readouterr().err
    finally:
        sys.argv = old
    return capsys.readouterr().out
