"""reports/live.py GpuTable: the snapshot's GPU entries kept between snapshots.

After every commit its entries must be the ones made afresh from the store (``StoreSamples``), before and after
``apply_states`` gave them their states; an entry whose GPU got no new value is the very entry of the last
snapshot. Inputs: a real DGX A100 dcgm-exporter scrape (four GPUs' power; tests/data/SOURCES.md) replayed at later
times with the job label that Slurm's prolog writes added, then taken away, and the twin's cluster, whose ticks
scrape a group of nodes at a time while jobs start and end.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hpcwatch.records import Job, Sample
from hpcwatch.reports.live import GpuTable, _gpus, _job_gpus, apply_states, followed_samples
from hpcwatch.reports.livesamples import StoreSamples
from hpcwatch.sources.prometheus_text import read_prometheus_text
from hpcwatch.store import Store
from hpcwatch.twin.live import LiveTwin
from hpcwatch.web.demo import cluster_with_nodes

DATA = Path(__file__).resolve().parents[1] / "data"
T0 = 1_796_000_000.0
HOST = "NvidiaDGXA100"


def _scrape(t: float, gpus: str = "0124", job: dict[str, str] | None = None) -> list[Sample]:
    return [
        dataclasses.replace(s, labels={**s.labels, **(job or {})}, t=t, value=s.value + t - T0)
        for s in read_prometheus_text(DATA / "prometheus" / "dcgm_exporter_dgx_a100_470_power_tubai.prom", t=t)
        if s.labels["gpu"] in gpus
    ]


def _states(gpus: dict, *, lost: str | None = None, drained: str | None = None) -> dict:
    """``gpus`` as ``apply_states`` leaves them, with ``lost`` named by the rule and ``drained`` drained."""
    doc = {"gpus": gpus, "queue": {"jobs": []}}
    found = [{"el": f"gpu:{lost}", "rule": "gpu_missing", "node": HOST, "evidence": {"last_seen": T0}}] if lost else []
    nodes = {drained: {"state": "drained"}} if drained else {}
    apply_states(doc, found, {"node_states": nodes, "events": [], "node_events": {}})
    return doc["gpus"]


class _Check:
    """A kept table and the store's answer, snapshot after snapshot."""

    def __init__(self, store: Store) -> None:
        self.store, self.table, self.samples = store, GpuTable(), followed_samples(store)
        self.last: dict = {}

    def snapshot(self, **states) -> dict:
        now = StoreSamples(self.store).latest_t()
        jobs = {j.id: j for j in self.store.jobs()}
        kept = _states(self.table(self.samples, now, jobs), **states)
        fresh_gpus = _gpus(StoreSamples(self.store), now, jobs)
        assert self.table.job_gpus() == _job_gpus(fresh_gpus, jobs)
        fresh = _states(fresh_gpus, **states)
        assert kept == fresh
        reused = {gid for gid, entry in kept.items() if self.last.get(gid) is entry}
        self.last = dict(kept)
        return reused


def test_real_scrapes_kept_entries_are_the_stores_and_unscraped_gpus_keep_theirs():
    with Store(":memory:") as store:
        check = _Check(store)
        store.add(_scrape(T0))
        assert check.snapshot() == set()
        store.add(_scrape(T0 + 5, gpus="01"))  # half the GPUs scraped: the others keep their entries
        assert check.snapshot() == {f"{HOST}/2", f"{HOST}/4"}
        store.add(_scrape(T0 + 10, gpus="24", job={"hpc_job": "77"}))  # the prolog wrote the job's GPUs
        assert check.snapshot() == {f"{HOST}/0", f"{HOST}/1"}
        store.add([Job(id="77", user="ana", account="ml", nodes=(HOST,), start=T0)])  # its owner comes later
        assert check.snapshot() == {f"{HOST}/0", f"{HOST}/1"}
        store.add(_scrape(T0 + 12, gpus="0"))
        assert check.snapshot(drained=HOST) == set()  # every state changed: every entry replaced
        assert check.snapshot(drained=HOST) == {f"{HOST}/{g}" for g in "0124"}  # nothing new: all kept
        assert check.snapshot(lost=f"{HOST}/1", drained=HOST) == {f"{HOST}/0", f"{HOST}/2", f"{HOST}/4"}
        assert check.snapshot(drained=HOST) == {f"{HOST}/0", f"{HOST}/2", f"{HOST}/4"}  # a lost one is made again
        assert check.snapshot() == set()
        store.add(_scrape(T0 + 38, gpus="2"))  # GPU 1 (last at 5 s) leaves the 30 s window; 0 and 4 stay
        assert check.snapshot() == {f"{HOST}/0", f"{HOST}/4"}
        store.add(_scrape(T0 + 41, gpus="2"))  # GPU 0 (at 12 s) stays; 4 (at 10 s) leaves too
        assert check.snapshot() == {f"{HOST}/0"}
        assert set(check.last) == {f"{HOST}/0", f"{HOST}/2"}


def test_the_twins_cluster_keeps_the_entries_of_the_nodes_not_scraped_this_tick():
    with Store(":memory:") as store:
        live = LiveTwin(store, cluster_with_nodes(16), seed=0, start=T0, scrape_s=4.0)  # 4 nodes a tick
        check, reused = _Check(store), []
        for tick in range(40):
            live.step()
            reused.append(len(check.snapshot(drained="node3" if 10 <= tick < 20 else None)))
        assert min(reused[-10:]) >= 8 * 8 and max(reused) < 16 * 8  # kept: at least the nodes not scraped
