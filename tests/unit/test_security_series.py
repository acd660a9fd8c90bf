"""The detectors' series kept between live scans (``security.series``) against the flat window they replace.

Before, ``LiveScan`` kept its window as one list of samples, dropped those before the window's start, and each
detector grouped the whole list again every scan. Here that reading is the reference, written out in the test:
after every call the kept groupings are exactly a fresh grouping of the flat window, and the detectors find
over them what they find over the flat window.
"""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import orjson
import pyarrow as pa
import pytest

from hpcwatch.records import Job, Sample
from hpcwatch.security import rdma, scan
from hpcwatch.security.rdma import RdmaSeries, _peer_medians, _Timelines
from hpcwatch.security.remanence import GpuSeries
from hpcwatch.security.series import PairIds, PointColumns, WindowSeries
from hpcwatch.store import Store
from hpcwatch.twin.live import LiveTwin
from hpcwatch.twin.run import sized_reference

START = 1_800_000_000.0


@pytest.mark.parametrize("in_order", [True, False])
def test_forgetting_drops_exactly_the_points_before_the_time(in_order: bool) -> None:
    rng = random.Random(7)
    times = [float(t) for t in range(60)] if in_order else [rng.uniform(0, 60) for _ in range(60)]
    kept, flat = PointColumns("series", "value"), []
    for lo in range(0, 60, 7):
        batch = [(t, i % 3, float(i)) for i, t in enumerate(times)][lo : lo + 7]
        kept.add(**{name: np.array(column) for name, column in zip(("t", "series", "value"), zip(*batch))})
        flat = [p for p in flat + batch if p[0] >= lo - 10.5]
        kept.forget_before(lo - 10.5)
        columns = kept.columns()
        assert list(zip(*(columns[name].tolist() for name in ("t", "series", "value")))) == flat
        assert len(kept) == len(flat)
    kept.forget_before(1e9)
    assert len(kept) == 0 and kept.columns()["t"].size == 0
    with pytest.raises(ValueError):
        kept.add(t=np.zeros(2), series=np.zeros(1), value=np.zeros(2))


def test_a_nodes_peers_are_their_rates_over_the_interval_that_holds_its_time() -> None:
    """``rdma._peer_medians`` against the rule said in words, peer by peer: nodes scraped at their own instants,
    with jitter, gaps, and a node listed twice."""
    rng = random.Random(5)
    rates: dict[str, dict[float, tuple[float, float]]] = {}
    for n in range(7):
        t, by_t = rng.uniform(0, 30), {}
        for _ in range(rng.randint(1, 12)):
            dt = rng.uniform(5, 40)
            t += dt
            by_t[t] = (rng.choice([1e9, 2e9, rng.uniform(0, 1e10)]), dt)
        rates[f"n{n}"] = by_t
    job = Job(id="1", nodes=("n0", "n1", "n2", "n3", "n4", "n1", "gone"), start=0.0)
    cells = [(host, t, r) for host in ("n0", "n1", "n4", "n6") for t, (r, _) in rates[host].items()]
    got = _peer_medians(job, cells, _Timelines.of_dicts(rates)).tolist()
    for (host, t, _), median in zip(cells, got):
        peers = [
            r
            for peer in ("n0", "n1", "n2", "n3", "n4")
            if peer != host
            for end, (r, dt) in rates[peer].items()
            if end - dt < t <= end
        ]
        assert median == statistics.median(peers) if peers else math.isnan(median), (host, t)


def _grouped(make, samples: list[Sample]) -> WindowSeries:
    return make.of(samples)


def test_a_live_scan_keeps_the_grouping_of_its_flat_window_and_finds_what_it_finds() -> None:
    """The twin's RDMA and remanence threats on 3 nodes, a 12 s window over 40 ticks: it forgets once the window
    moved on by a tenth of its length (1.2 s: every other tick), as the flat window below does."""
    store = Store(":memory:")
    live = LiveTwin(store, sized_reference(3), seed=0, start=START, scenarios=("threat_rdma", "threat_remanence"))
    window_s, live_scan = 12.0, scan.LiveScan(window_s=12.0)
    flat: list[Sample] = []
    mark, newest, found, rated, forgot_to, forgets = 0, float("-inf"), set(), False, float("-inf"), 0
    for _ in range(40):
        live.step()
        live_scan._read_new(store)
        mark, rows = scan._read_samples(store, mark)
        flat += rows
        newest = max([newest, *(s.t for s in rows)])
        if newest - window_s - forgot_to >= window_s * scan.FORGET_STEP:
            flat, forgot_to, forgets = [s for s in flat if s.t >= newest - window_s], newest - window_s, forgets + 1
        assert len(flat) == live_scan.held > 0
        for vector, kept in live_scan._series.items():
            make = next(d.series for d in scan.DETECTORS if d.vector == vector)
            assert kept.groups == _grouped(make, flat).groups, vector
        rdma_kept, rdma_fresh = live_scan._series["rdma_blind_spot"], _grouped(RdmaSeries, flat)
        assert isinstance(rdma_kept, RdmaSeries) and isinstance(rdma_fresh, RdmaSeries)
        assert rdma_kept.in_time_order and rdma_kept.host_rates() == rdma_fresh.host_rates()
        rated |= bool(rdma_kept.host_rates())
        events, jobs = live_scan._events, store.jobs()
        fresh = scan._scan(
            live_scan._samples, live_scan._series, events, jobs, config=live_scan.config, extras=live_scan.extras
        )
        assert fresh == scan.scan_records(flat, events, jobs)
        found |= {f.rule for f in fresh}
    assert {"rdma.traffic_disproportion", "remanence.busy_no_job"} <= found and rated  # the threats were seen
    assert 10 < forgets < 40  # it forgot, and not at every call


def test_the_detectors_group_only_what_they_read() -> None:
    samples = [
        Sample(metric="DCGM_FI_DEV_FB_USED", t=1.0, value=5.0, labels={"Hostname": "n1", "gpu": "0"}),
        Sample(metric="ib_PortXmitData_bytes", t=1.0, value=5.0, labels={"host": "n1", "port": "1"}),
        Sample(metric="DCGM_FI_DEV_POWER_USAGE", t=1.0, value=5.0, labels={"Hostname": "n1", "gpu": "0"}),
    ]
    assert len(_grouped(RdmaSeries, samples)) == 1 and len(_grouped(GpuSeries, samples)) == 1


def _counter_samples(rng: random.Random, *, in_order: bool) -> list[Sample]:
    """Two nodes' IB data and error counters, scraped by perfquery and node-exporter at their own instants:
    counters that rise, stall, reset, and are now and then read twice; shuffled a little when not
    ``in_order``."""
    samples = []
    for host, offset in (("n1", 0.0), ("n2", 0.4)):
        for metric, port in [
            ("ib_PortXmitData_bytes", "1"),
            ("ib_PortRcvData_bytes", "1"),
            ("node_infiniband_port_data_transmitted_bytes_total", "2"),
            ("ib_PortRcvConstraintErrors", "1"),
        ]:
            if host == "n2" and metric.startswith("node_"):
                continue  # n2: perfquery only; n1: both (node-exporter counts)
            labels, value = {"host": host, "port": port}, 0.0
            for tick in range(40):
                value = 0.0 if rng.random() < 0.05 else value + rng.choice([0.0, 0.0, 1.0, 5e8])
                samples.append(Sample(metric=metric, labels=labels, t=tick + offset, value=value))
                if rng.random() < 0.1:  # the same scrape read twice
                    samples.append(Sample(metric=metric, labels=labels, t=tick + offset, value=value))
    samples.sort(key=lambda s: s.t)
    if not in_order:  # now and then a series' sample comes after its next one
        by_series: dict[tuple, list[int]] = {}
        for i, sample in enumerate(samples):
            by_series.setdefault((sample.metric, sample.labels["host"]), []).append(i)
        for places in by_series.values():
            for a, b in list(zip(places, places[1:]))[::9]:
                samples[a], samples[b] = samples[b], samples[a]
    return samples


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("in_order", [True, False])
def test_the_rates_and_rises_kept_pair_by_pair_are_those_of_the_window(seed: int, in_order: bool) -> None:
    """``RdmaSeries`` keeps each data pair's rate as points arrive and leave: after every batch, its node rates
    and rising series are those of the window's points taken at once."""
    rng = random.Random(seed)
    samples = _counter_samples(rng, in_order=in_order)
    kept, flat, lo = RdmaSeries(), [], 0
    while lo < len(samples):
        batch = samples[lo : lo + rng.randint(1, 30)]
        lo += len(batch)
        kept.add(batch)
        start = max(s.t for s in flat + batch) - rng.uniform(3, 12)
        kept.forget_before(start)
        flat = [s for s in flat + batch if s.t >= start]
        fresh = _grouped(RdmaSeries, sorted(flat, key=lambda s: s.t))
        assert isinstance(fresh, RdmaSeries)
        assert kept.host_rates() == fresh.host_rates()
        in_words = _rates_in_words(flat)
        assert kept.host_rates().keys() == in_words.keys()
        for host, by_t in kept.host_rates().items():
            assert by_t.keys() == in_words[host].keys()
            assert all(by_t[t] == pytest.approx(in_words[host][t], rel=1e-12) for t in by_t), host
        assert kept.rises() == fresh.rises()
        rising = {key for key, points in fresh.groups["errors"].items() if _rises(points)}
        assert set(kept.rising()) == rising  # every series that rises, and only those
    assert kept.in_time_order is in_order


def _rates_in_words(samples: list[Sample]) -> dict[str, dict[float, tuple[float, float]]]:
    """Per node and scrape time: the rates of each data series' consecutive points (sorted) where the counter
    did not go down, summed over the node's series, with the longest interval; node-exporter's where a node has
    both collectors."""
    series: dict[tuple, list[tuple[float, float]]] = {}
    for s in samples:
        family = {"ib_PortXmitData_bytes": "perfquery", "ib_PortRcvData_bytes": "perfquery"}.get(s.metric)
        family = family or ("node_exporter" if s.metric.startswith("node_infiniband_port_data") else None)
        if family:
            series.setdefault((family, s.labels["host"], s.metric, s.labels["port"]), []).append((s.t, s.value))
    cells: dict[tuple[str, str], dict[float, list[tuple[float, float]]]] = {}
    for (family, host, *_), points in series.items():
        points.sort()
        for (t0, v0), (t1, v1) in zip(points, points[1:]):
            if t1 > t0 and v1 >= v0:
                cells.setdefault((family, host), {}).setdefault(t1, []).append(((v1 - v0) / (t1 - t0), t1 - t0))
    exported = {host for family, host, *_ in series if family == "node_exporter"}
    return {
        host: {t: (math.fsum(r for r, _ in rates), max(dt for _, dt in rates)) for t, rates in by_t.items()}
        for (family, host), by_t in cells.items()
        if family == "node_exporter" or host not in exported
    }


def _rises(points: list[tuple]) -> bool:
    return any(v1 > v0 for (_, v0), (_, v1) in zip(sorted(points), sorted(points)[1:]))


def test_pair_ids_learn_each_pair_once_and_again_after_forgetting() -> None:
    """Each (metric, labels text) pair is learnt the first time it comes, recognised after (in any read, any
    order), and learnt again once more than ``most`` were learnt."""
    learnt: list[tuple[str, dict]] = []

    def learn(metric: str, labels) -> tuple[int, ...]:
        learnt.append((metric, dict(labels)))
        return len(learnt), int(labels["k"])

    def table(rows: list[tuple[str, int]]):
        return pa.table({"metric": [m for m, _ in rows], "labels": [f'{{"k":"{k}"}}' for _, k in rows]})

    ids = PairIds(2, learn, most=6)
    first = ids.of_table(table([("a", 1), ("b", 1), ("a", 1), ("a", 2)])).tolist()
    assert first[0] == first[2] and len({tuple(row) for row in first}) == 3 and [k for _, k in first] == [1, 1, 1, 2]
    assert sorted(learnt, key=str) == [("a", {"k": "1"}), ("a", {"k": "2"}), ("b", {"k": "1"})]
    again = ids.of_table(table([("a", 2), ("c", 5), ("a", 1)])).tolist()
    assert again[0] == first[3] and again[2] == first[0] and len(learnt) == 4 and learnt[-1] == ("c", {"k": "5"})
    assert again[1] == [4, 5]
    assert ids.of_table(table([])).shape == (0, 2)
    ids.of_table(table([("d", 1), ("d", 2), ("d", 3)]))  # 7 pairs: all forgotten, these learnt
    assert len(learnt) == 7 and ids.of_table(table([("a", 1)])).tolist() == [[8, 1]]


def _rows(samples: list[Sample]) -> pa.Table:
    return pa.table(
        {
            "metric": [s.metric for s in samples],
            "labels": [orjson.dumps(s.labels).decode() for s in samples],
            "t": [s.t for s in samples],
            "value": [s.value for s in samples],
        }
    )


def test_series_that_left_the_window_are_forgotten_not_kept_forever() -> None:
    """Jobs come and go: each its Lustre counters and its GPUs' ``hpc_job`` label. A live scan's series ids and
    job labels stay about those of its window, and what it holds stays what a fresh read of the window holds."""
    rdma_kept, gpus_kept, flat = RdmaSeries(), GpuSeries(), []
    for step in range(40):
        batch = [
            Sample(metric=metric, t=step + dt, value=1e6 * (step + dt), labels=labels)
            for job in range(100 * step, 100 * step + 100)
            for metric, labels in [
                ("lustre_job_read_bytes_total", {"jobid": str(job), "target": "fs-OST0000"}),
                ("DCGM_FI_DEV_FB_USED", {"Hostname": "n1", "gpu": str(job % 8), "hpc_job": str(job)}),
            ]
            for dt in (0.0, 0.5)
        ]
        for kept in (rdma_kept, gpus_kept):
            kept.add_table(_rows(batch))
            kept.forget_before(step - 2.0)
        flat = [s for s in flat + batch if s.t >= step - 2.0]
    assert len(rdma_kept.keys["lustre"]) <= 2 * 300 + 1024 and len(gpus_kept.jobs) <= 2 * 300 + 1025
    assert rdma_kept.groups == RdmaSeries.of(flat).groups and gpus_kept.groups == GpuSeries.of(flat).groups
    assert (
        rdma._lustre_rates(rdma_kept) == rdma._lustre_rates(RdmaSeries.of(flat))
        and len(rdma._lustre_rates(rdma_kept)) == 300
    )
