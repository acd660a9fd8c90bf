"""reports/livesamples.py FollowedStoreSamples: the live view's sample answers kept as rows are committed.

Its answers must be the store's (``StoreSamples``, SQL over the window) after every commit, whatever the
order rows come in. The inputs: real scrapes (a DGX A100's dcgm-exporter power lines, node_exporter's own
infiniband fixture, a real Lustre OST's job_stats; tests/data/SOURCES.md) replayed at later times with
their counters raised, and the twin's ticks for many GPUs and jobs that start and end.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcwatch.records import Sample
from hpcwatch.reports.live import (
    _IB_RX,
    _IB_TX,
    _LUSTRE_READ,
    _LUSTRE_WRITE,
    GPU_FIELDS,
    LATEST_WINDOW_S,
    RATE_WINDOW_S,
    followed_samples,
    live_snapshot,
)
from hpcwatch.reports.livesamples import FollowedStoreSamples, StoreSamples
from hpcwatch.sources.lustre import read_job_stats
from hpcwatch.sources.prometheus_text import read_prometheus_text
from hpcwatch.store import Store
from hpcwatch.twin import Twin
from hpcwatch.web.demo import cluster_with_nodes

DATA = Path(__file__).resolve().parents[1] / "data"
T0 = 1_796_000_000.0
COUNTERS = (*_IB_TX, *_IB_RX, _LUSTRE_READ, _LUSTRE_WRITE)


@pytest.fixture
def store():
    s = Store(":memory:")
    yield s
    s.close()


def _answers(samples, now: float) -> dict:
    """Every answer the snapshot asks, in an order that does not depend on the backend."""
    if now is None:
        return {"latest_t": samples.latest_t()}
    return {
        "latest_t": samples.latest_t(),
        "gpus": sorted(samples.latest_gpu_values(list(GPU_FIELDS), since=now - LATEST_WINDOW_S)),
        "ib": sorted(
            (m, h, round(v, 6))
            for m, h, v in samples.counter_rates((*_IB_TX, *_IB_RX), since=now - RATE_WINDOW_S, group="host")
        ),
        "lustre": sorted(
            (m, j, round(v, 6))
            for m, j, v in samples.counter_rates((_LUSTRE_READ, _LUSTRE_WRITE), since=now - RATE_WINDOW_S, group="job")
        ),
    }


def _agree(store: Store, followed: FollowedStoreSamples) -> dict:
    asked = StoreSamples(store)
    now = asked.latest_t()
    kept, truth = _answers(followed, now), _answers(asked, now)
    assert kept == truth
    return truth


def _real_scrape(t: float, step: float) -> list[Sample]:
    """The real files' samples at ``t``: counters raised by ``step`` × a constant rate, power varied."""
    power = [
        dataclasses.replace(s, t=t, value=s.value + step)
        for s in read_prometheus_text(DATA / "prometheus" / "dcgm_exporter_dgx_a100_470_power_tubai.prom", t=t)
    ]
    ib = [
        dataclasses.replace(s, labels={**s.labels, "instance": "ibnode:9100"}, t=t, value=s.value + step * 5e8)
        for s in read_prometheus_text(DATA / "prometheus" / "node_exporter_e2e_numa_drbd_infiniband.prom", t=t)
        if s.metric.startswith("node_infiniband_port_data")
    ]
    lustre = [
        dataclasses.replace(s, t=t, value=s.value + step * 1e6)
        for s in read_job_stats(DATA / "lustre" / "obdfilter_OST0000_job_stats.txt", t=t)
        if s.metric in (_LUSTRE_READ, _LUSTRE_WRITE)
    ]
    return power + ib + lustre


def test_real_scrapes_get_the_stores_answers_commit_after_commit(store):
    followed = followed_samples(store)
    assert _agree(store, followed)["latest_t"] is None  # an empty store
    for step in range(8):
        store.add(_real_scrape(T0 + 5 * step, step))
        truth = _agree(store, followed)
    # What the files hold is there: the A100's four GPUs, the IB host, the OST's jobs.
    assert {(h, g) for _, h, g, *_ in truth["gpus"]} == {("NvidiaDGXA100", g) for g in "0124"}
    assert truth["ib"] and truth["lustre"]
    assert {round(v) for _, _, v in truth["lustre"]} == {200_000}  # 1e6 a step of 5 s


def test_a_late_commit_of_older_rows_does_not_replace_the_newer_ones(store):
    followed = followed_samples(store)
    for step in (0, 1, 3):
        store.add(_real_scrape(T0 + 5 * step, step))
    _agree(store, followed)
    store.add(_real_scrape(T0 + 10, 2.5))  # an older scrape committed last: between the two newest
    truth = _agree(store, followed)
    # The rates are of the two newest samples by time: 0.5e6 bytes in the 5 s from 10 s to 15 s.
    assert {round(v) for _, _, v in truth["lustre"]} == {100_000}


def test_a_counter_reset_counts_zero_and_a_silent_series_leaves_the_window(store):
    followed = followed_samples(store)
    store.add(_real_scrape(T0, 10))
    store.add(_real_scrape(T0 + 5, 0))  # every counter went down: the exporters restarted
    truth = _agree(store, followed)
    assert truth["ib"] and all(v == 0 for _, _, v in truth["ib"] + truth["lustre"])
    # Only the power goes on; the counters stop: they leave the rate window, the GPUs stay.
    for step in range(1, 12):
        store.add([s for s in _real_scrape(T0 + 5 + 5 * step, step) if s.metric == "DCGM_FI_DEV_POWER_USAGE"])
        truth = _agree(store, followed)
    assert not truth["ib"] and not truth["lustre"] and len(truth["gpus"]) == 4


def test_a_freed_gpu_has_no_job_though_an_older_sample_in_the_window_had_one(store):
    followed = followed_samples(store)
    busy = Sample(metric="DCGM_FI_DEV_GPU_UTIL", labels={"gpu": "0", "Hostname": "n1", "hpc_job": "77"}, t=T0, value=99)
    store.add([busy])
    assert _agree(store, followed)["gpus"][0][4] == "77"
    store.add([dataclasses.replace(busy, labels={"gpu": "0", "Hostname": "n1"}, t=T0 + 5, value=0)])
    assert _agree(store, followed)["gpus"][0][4] is None  # the epilog removed the mapping: no job now


def test_the_twins_cluster_over_a_minute_and_what_is_kept_stays_bounded(store):
    cluster = cluster_with_nodes(4)
    twin = Twin(cluster, seed=0)
    followed = followed_samples(store)
    for tick in range(90):
        twin.advance(1.0)
        store.add_sample_table(twin.sample_table())
        store.add([*twin.jobs, *twin.events()])
        if tick % 7 == 0:
            _agree(store, followed)
    truth = _agree(store, followed)
    assert len(truth["gpus"]) == 4 * len(GPU_FIELDS) * 8 and truth["ib"]
    # The whole snapshot is the same with either backend.
    now = truth["latest_t"]
    kept = live_snapshot(store, weights_path="/w", now=now, with_problems=False, samples=followed)
    asked = live_snapshot(store, weights_path="/w", now=now, with_problems=False, samples=StoreSamples(store))
    for field in ("gpus", "nodes", "storage", "job_gpus", "collectors"):
        assert kept[field] == asked[field], field
    # Forgetting: a GPU silent for longer than what is kept is no longer kept (the twin's GPUs all report).
    keep_s = 2 * max(LATEST_WINDOW_S, RATE_WINDOW_S)
    assert all(t >= now - keep_s for *_, t in followed._latest.values())


def test_questions_beyond_what_is_kept_are_asked_of_the_store(store):
    for step in range(31):  # the counters stop after step 10, the power goes on to 150 s
        scrape = _real_scrape(T0 + 5 * step, step)
        store.add(scrape if step <= 10 else [s for s in scrape if s.metric == "DCGM_FI_DEV_POWER_USAGE"])
    followed = followed_samples(store)
    now = followed.latest_t()
    assert now == T0 + 150
    # 145 s back is before the first read's floor (60 s back): the store answers, the rates of steps 9 and 10.
    back = sorted(followed.counter_rates(COUNTERS, since=now - 145, group="job"))
    assert back and back == sorted(StoreSamples(store).counter_rates(COUNTERS, since=now - 145, group="job"))
    assert followed.counter_rates(COUNTERS, since=now - 20, group="job") == []
    # A metric it does not follow is asked too.
    temp = Sample(metric="DCGM_FI_DEV_GPU_TEMP", labels={"gpu": "0", "Hostname": "n1"}, t=now, value=41)
    store.add([temp])
    assert followed.latest_gpu_values(["DCGM_FI_DEV_GPU_TEMP"], since=now - 10) == [
        ("DCGM_FI_DEV_GPU_TEMP", "n1", "0", 41.0, None, now)
    ]


@pytest.mark.parametrize("seed", range(6))
def test_kept_rate_sums_follow_any_order_of_samples_and_windows(store, seed):
    """Counters on 3 hosts × 2 jobs, samples in any order (late ones, resets, series that stop), questions with
    windows that move forward and back: the sums kept per group are the store's. A series never has two
    samples at one time (an exporter's series has one value a scrape; of two, the store's SQL takes either)."""
    import random

    rng = random.Random(seed)
    followed = FollowedStoreSamples(store, latest=(), counters=(_LUSTRE_READ,), keep_s=120)
    value: dict[tuple, float] = {}
    taken: set[tuple] = set()
    for tick in range(40):
        batch = []
        for _ in range(rng.randint(1, 6)):
            host, job, port = rng.choice("abc"), rng.choice(["1", "2"]), rng.choice("xy")
            key = (host, job, port)
            value[key] = value.get(key, 0.0) + rng.choice([0.0, 1e6, 3e6, -5e6])  # a drop is a reset
            t = T0 + tick - rng.choice([0, 0, 0, 1, 3])  # some late
            if (key, t) in taken:
                continue
            taken.add((key, t))
            labels = {"instance": f"{host}:9100", "jobid": job, "port": port}
            batch.append(Sample(metric=_LUSTRE_READ, labels=labels, t=t, value=max(value[key], 0.0)))
        store.add(batch)
        now = StoreSamples(store).latest_t()
        for back in rng.sample([5.0, 10.0, 20.0, 3.0], 3):
            for group in ("host", "job"):
                kept = sorted(followed.counter_rates((_LUSTRE_READ,), since=now - back, group=group))
                asked = sorted(StoreSamples(store).counter_rates((_LUSTRE_READ,), since=now - back, group=group))
                assert [(m, g) for m, g, _ in kept] == [(m, g) for m, g, _ in asked]
                assert [v for *_, v in kept] == pytest.approx([v for *_, v in asked])


@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 6), st.floats(0, 1e9, allow_nan=False)),
        max_size=40,
    ),
    st.integers(1, 5),
)
@settings(max_examples=300, deadline=None)
def test_a_counters_samples_taken_in_one_call_keep_what_one_call_a_sample_keeps(samples, calls):
    """A call may hold several samples of a series (a snapshot after a pause, the first read of the window):
    taken in turns, they leave each series the two newest that taking them one by one leaves, ties included."""
    from hpcwatch.reports.livesamples import _Counter

    def columns(chunk):
        keys = [(f"h{k}", "j", k) for k, _, _ in chunk]
        return (
            [h for h, _, _ in keys],
            [j for _, j, _ in keys],
            [lab for _, _, lab in keys],
            np.array([float(t) for _, t, _ in chunk]),
            np.array([v for _, _, v in chunk]),
        )

    batched, one_by_one = _Counter(), _Counter()
    size = max(1, len(samples) // calls)
    for start in range(0, len(samples), size):
        batched.add(*columns(samples[start : start + size]))
    for sample in samples:
        one_by_one.add(*columns([sample]))
    assert batched._slot == one_by_one._slot
    n = len(batched._slot)
    assert np.array_equal(batched._top[:n], one_by_one._top[:n])
    for since in (0.0, 3.0):
        assert batched.rates("host", since) == one_by_one.rates("host", since)
