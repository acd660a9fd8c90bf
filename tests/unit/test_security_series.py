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

import pytest

from hpcwatch.records import Job, Sample
from hpcwatch.security import scan
from hpcwatch.security.rdma import RdmaSeries, _peer_medians, _Timelines
from hpcwatch.security.remanence import GpuSeries
from hpcwatch.security.series import SeriesGroups
from hpcwatch.store import Store
from hpcwatch.twin.live import LiveTwin
from hpcwatch.twin.run import sized_reference

START = 1_800_000_000.0


class _Points(SeriesGroups):
    """One group, a series per label ``k``: the smallest grouping."""

    def __init__(self) -> None:
        super().__init__("points")

    def add_runs(self, runs) -> None:
        for run in runs:
            self.extend("points", (run.labels["k"],), zip(run.t, run.values))


def _samples(times: list[float]) -> list[Sample]:
    return [Sample(metric="m", t=t, value=float(i), labels={"k": str(i % 3)}) for i, t in enumerate(times)]


@pytest.mark.parametrize("in_order", [True, False])
def test_forgetting_drops_exactly_the_points_before_the_time(in_order: bool) -> None:
    rng = random.Random(7)
    times = [float(t) for t in range(60)] if in_order else [rng.uniform(0, 60) for _ in range(60)]
    kept, flat = _Points(), []
    for lo in range(0, 60, 7):
        batch = _samples(times)[lo : lo + 7]
        kept.add(batch)
        flat = [s for s in flat + batch if s.t >= lo - 10.5]
        kept.forget_before(lo - 10.5)
        assert kept.in_time_order is in_order or lo == 0
        reference = _Points()
        reference.add(flat)
        assert kept.groups == reference.groups and len(kept) == len(flat)
    kept.forget_before(1e9)
    assert kept.groups["points"] == {} and len(kept) == 0  # emptied series are dropped


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
    got = _peer_medians(job, cells, _Timelines(rates)).tolist()
    for (host, t, _), median in zip(cells, got):
        peers = [
            r
            for peer in ("n0", "n1", "n2", "n3", "n4")
            if peer != host
            for end, (r, dt) in rates[peer].items()
            if end - dt < t <= end
        ]
        assert median == statistics.median(peers) if peers else math.isnan(median), (host, t)


def _grouped(make, samples: list[Sample]) -> SeriesGroups:
    series = make()
    series.add(samples)
    return series


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
    """``RdmaSeries`` keeps each data pair's rate and counts each error pair's rise as points arrive and leave:
    after every batch, its node rates and rising series are those of a grouping of the window made afresh."""
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
        assert sorted(kept.rising()) == sorted(fresh.rising()) or not kept.in_time_order
        rising = {key for key in fresh.rising() if _rises(fresh.groups["errors"][key])}
        assert rising <= set(kept.rising())  # never a rise missed
    assert kept.in_time_order is in_order


def _rises(points: list[tuple]) -> bool:
    return any(v1 > v0 for (_, v0), (_, v1) in zip(sorted(points), sorted(points)[1:]))
