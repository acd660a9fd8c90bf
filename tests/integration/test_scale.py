"""128 twin nodes scraped by a real Prometheus and a real VictoriaMetrics (``promql_backend``): the per-job
report read through PromQL equals the same report over the store holding exactly the scrapes served.

The twin serves with its clock as the samples' timestamps (``honor_timestamps``), and a recording source
saves the scrapes it answered as files; ``hpcwatch ingest`` reads those files (the real
Prometheus text reader) into a store. So the two sides hold the same points, parsed by two different
parsers (Go's, ours), and ``hpcwatch jobs --prometheus URL`` must print the report ``hpcwatch jobs`` prints.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from .conftest import PROMQL_BACKENDS, wait_until

pytestmark = pytest.mark.integration

NODES = 128
TWIN_PORT = 30200
"""Two ranges of NODES ports, one per backend, clear of every other test's: modules run side by side, and a
server scraping a port in these ranges (test_prometheus's exporter, 29977) would be answered by a twin node,
whose scrape logs then hold points this test's server never scraped."""
PROMETHEUS_PORT = 29098
SCRAPE_INTERVAL_S = 2.0
TICK_S = 0.5
"""Four ticks a scrape interval: two scrapes of one target never see the same twin time (VictoriaMetrics
would keep both copies of such points, Prometheus one)."""
SCRAPES = 4
"""Scrapes of every target both sides hold at least (~8 s): counter deltas on every GPU, jobs seen on each."""


class RecordingTwin:
    """The twin, plus two logs of the scrapes it answered, one file per node and exporter, the scrapes one
    after the other (the text reader takes repeated families; each line carries its timestamp).

    ``every/`` holds every scrape answered. ``first/`` holds one scrape per node, exporter and twin time:
    two scrapes that find the twin at one time (its tick lagged on a loaded core) serve the same points,
    which Prometheus keeps once and VictoriaMetrics twice (it has ``-dedup.minScrapeInterval`` for that,
    but 1.79 with it set to 1ms also dropped the first point of some series here)."""

    def __init__(self, twin, out: Path) -> None:
        self.twin, self.out = twin, out
        for log in ("every", "first"):
            (out / log).mkdir()
        self._seen: set[tuple[str, str, float]] = set()
        self._spans: dict[Path, list[tuple[str, str, int, int, int]]] = {}
        """Each log's scrapes: (node, exporter, twin time in ms, start, end in the file), for ``keep_stored``."""
        self.cut = False
        """Once set, scrapes fail (HTTP 500): what is served ends at the same point in storage and logs."""
        self._guard = threading.Lock()
        self._answered: dict[tuple[str, str], int] = {}
        """Per (node, exporter), the scrapes answered (at a twin time not answered before)."""
        self._refused: set[tuple[str, str]] = set()
        """The (node, exporter) refused since the cut: their last answered scrape was over before."""

    def advance(self, dt_s: float) -> None:
        self.twin.advance(dt_s)

    def dcgm_text(self, node, *, jobs_by_gpu=None, timestamp=False):
        return self._keep(node, "dcgm", lambda: self.twin.dcgm_text(node, jobs_by_gpu=jobs_by_gpu, timestamp=timestamp))

    def node_exporter_text(self, node, *, timestamp=False):
        # The logs get the node label the scrape config attaches to the target (prometheus_config), as
        # the servers store it: node-exporter's text names no node.
        stored = lambda: self.twin.node_exporter_text(node, timestamp=timestamp, target_labels=True)  # noqa: E731
        return self._keep(node, "node", lambda: self.twin.node_exporter_text(node, timestamp=timestamp), stored)

    def _keep(self, node: str, exporter: str, render, stored=None) -> str:
        if self.cut:
            with self._guard:
                self._refused.add((node, exporter))
            raise RuntimeError("the test stopped serving")
        text = render()
        kept = stored() if stored else text
        key = (node, exporter, self.twin.now)
        stamp_ms = int(round(self.twin.now * 1000))  # as the exposition writes it
        with self._guard:
            logs = ["every"] if key in self._seen else ["every", "first"]
            if key not in self._seen:
                self._answered[node, exporter] = self._answered.get((node, exporter), 0) + 1
            self._seen.add(key)
            for log in logs:
                path = self.out / log / f"{node}.{exporter}.prom"
                with open(path, "ab") as file:
                    start = file.tell()
                    file.write(kept.encode())
                    self._spans.setdefault(path, []).append((node, exporter, stamp_ms, start, file.tell()))
        return text

    def answered_each(self, targets: int) -> int:
        """The fewest scrapes answered of any of ``targets`` targets (0 while one was never scraped)."""
        with self._guard:
            counts = list(self._answered.values())
        return min(counts) if len(counts) >= targets else 0

    def refused_each(self, targets: int) -> bool:
        """Whether every one of ``targets`` targets was refused a scrape since the cut."""
        with self._guard:
            return len(self._refused) >= targets

    def logged(self) -> set[tuple[str, str, int]]:
        """(node, exporter, twin time in ms) of every scrape answered."""
        with self._guard:
            return {span[:3] for log_spans in self._spans.values() for span in log_spans}

    def keep_stored(self, stored: set[tuple[str, str, int]]) -> int:
        """Take out of the logs each scrape the server did not store (node, exporter, twin time in ms): one
        the server gave up on (its scrape timeout, on a loaded machine) was answered and logged all the same.
        Returns how many scrapes the logs lost."""
        dropped = 0
        for path, spans in self._spans.items():
            logged = path.read_bytes()
            kept = [logged[start:end] for node, exporter, ms, start, end in spans if (node, exporter, ms) in stored]
            dropped += len(spans) - len(kept)
            path.write_bytes(b"".join(kept))
        return dropped


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def assert_same_report(got, want, *, rel: float, where: str = "") -> None:
    """Equal documents, floats within ``rel``: VictoriaMetrics keeps about 12 significant digits of a
    float (it stores decimal mantissas, https://docs.victoriametrics.com/#rounding), Prometheus all 17."""
    # Counters summed from VictoriaMetrics come back as whole numbers off by a few units at 1e13 bytes.
    if _is_number(want) and _is_number(got) and (isinstance(want, float) or rel > 0):
        assert got == pytest.approx(want, rel=rel), where
    elif isinstance(want, dict) and isinstance(got, dict):
        assert got.keys() == want.keys(), where
        for key in want:
            assert_same_report(got[key], want[key], rel=rel, where=f"{where}.{key}")
    elif isinstance(want, list) and isinstance(got, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same_report(g, w, rel=rel, where=f"{where}[{i}]")
    else:
        assert got == want, where


def _hpcwatch(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "hpcwatch", *args, "--json"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def scraped(start_promql, promql_backend, tmp_path_factory):
    """A PromQL server that scraped 128 nodes (SCRAPES of each target at least); the scrapes it was served, as files."""
    from hpcwatch.cli.twinserve import sized_cluster
    from hpcwatch.twin import Twin
    from hpcwatch.twin.serve import ServeConfig, TwinEndpoints, prometheus_config

    scrapes = tmp_path_factory.mktemp("scrapes")
    twin = Twin(sized_cluster(NODES), seed=16, start=float(int(time.time())))
    source = RecordingTwin(twin, scrapes)
    # Ports of their own per backend: the module keeps the other backend running, still scraping its targets.
    port = TWIN_PORT + NODES * PROMQL_BACKENDS.index(promql_backend)
    config = ServeConfig(nodes=tuple(twin.node_names), port=port, tick_s=TICK_S, timestamps=True)
    served_from_s = time.time()
    with TwinEndpoints(source, config) as endpoints:
        server = start_promql(
            prometheus_config(endpoints.targets, scrape_interval_s=SCRAPE_INTERVAL_S), port=PROMETHEUS_PORT
        )
        # A loaded 2-core machine, with other 128-node tests beside this one, was seen to need more than 60 s.
        wait_until(lambda: _count(server, "up == 1") == 2 * NODES, timeout_s=180, what=f"{2 * NODES} targets up")
        up_at = source.answered_each(2 * NODES)
        wait_until(
            lambda: source.answered_each(2 * NODES) >= up_at + SCRAPES,
            timeout_s=120,
            what=f"{SCRAPES} more scrapes of every target",
        )
        # Closing the endpoints mid-scrape would log a scrape the server never stored: scrapes fail first,
        # until each target was refused once (its answered scrapes were over by then); the answered ones reach
        # storage meanwhile (VictoriaMetrics: ~1 s, more when loaded: wait until readable).
        last_s = time.time()
        source.cut = True
        wait_until(lambda: source.refused_each(2 * NODES), timeout_s=60, what="every target refused once")
        wait_until(
            lambda: _count(server, "last_over_time(DCGM_FI_DEV_GPU_UTIL[10s])", t=last_s) == 8 * NODES,
            timeout_s=60,
            what="the last scrapes before the cut readable",
        )
    stored = _stored_scrapes(server, since_s=served_from_s, t=last_s + 2 * SCRAPE_INTERVAL_S, logged=source.logged())
    dropped = source.keep_stored(stored)
    print(f"{promql_backend}: {dropped} scrapes answered but not stored")
    for log in ("every", "first"):
        (scrapes / log / "squeue.json").write_text(twin.squeue_json())
    return server, scrapes, twin, last_s


def _stored_scrapes(
    server, *, since_s: float, t: float, logged: set[tuple[str, str, int]]
) -> set[tuple[str, str, int]]:
    """(node, exporter, sample time in ms) of every scrape the server holds, read again until each logged
    scrape is readable (VictoriaMetrics makes what it stored searchable about a second later); past
    ``STORED_WITHIN_S``, what it holds then: a scrape it gave up on never comes."""
    deadline = time.monotonic() + STORED_WITHIN_S
    while not logged <= (stored := _stored_once(server, since_s=since_s, t=t)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return stored


STORED_WITHIN_S = 20.0


def _stored_once(server, *, since_s: float, t: float) -> set[tuple[str, str, int]]:
    """One read of the scrapes the server holds, from one series family of each exporter (a scrape is stored
    whole or not at all)."""
    from hpcwatch.promql import PrometheusBackend

    window = f"[{int(t - since_s) + 10}s]"
    stored = set()
    with PrometheusBackend(server.url) as prom:
        for exporter, selector, node_label in (
            ("dcgm", 'DCGM_FI_DEV_GPU_UTIL{gpu="0"}', "Hostname"),
            ("node", "node_infiniband_port_data_received_bytes_total", "node"),
        ):
            for series in prom.api("query", {"query": selector + window, "time": t})["result"]:
                node = series["metric"][node_label]
                stored.update((node, exporter, int(round(float(at) * 1000))) for at, _ in series["values"])
    return stored


def _count(server, promql: str, t: float | None = None) -> int:
    from hpcwatch.promql import PrometheusBackend

    with PrometheusBackend(server.url) as prom:
        values = prom.query(f"count({promql})", t=t)["value"].to_pylist()
    return int(values[0]) if values else 0


def test_every_node_is_a_target_with_8_gpus_and_its_ib_ports(scraped):
    server, _, twin, last_s = scraped
    # max over [10s], five scrape intervals: a target counts if a scrape of it succeeded in the window. The
    # last one may have failed at the cut, and is stamped with its start, before last_s.
    for job in ("dcgm", "node"):
        assert _count(server, f'max_over_time(up{{job="{job}"}}[10s]) == 1', t=last_s) == NODES, job
    assert _count(server, "last_over_time(DCGM_FI_DEV_GPU_UTIL[10s])", t=last_s) == 8 * NODES
    ib = "last_over_time(node_infiniband_port_data_received_bytes_total[10s])"
    assert _count(server, ib, t=last_s) == len(twin.ports)
    assert _count(server, "count by (Hostname) (last_over_time(DCGM_FI_DEV_GPU_UTIL[10s]))", t=last_s) == NODES


def test_jobs_report_through_promql_equals_the_report_over_the_store(scraped, promql_backend, tmp_path):
    server, scrapes, twin, _ = scraped
    db = str(tmp_path / "store")
    # Our store, like VictoriaMetrics, keeps a point stored twice; Prometheus keeps it once.
    ingested = _hpcwatch("ingest", "--db", db, str(scrapes / ("first" if promql_backend == "prometheus" else "every")))
    assert ingested["formats"]["prometheus"] == 2 * NODES  # a scrape log per node and exporter
    from_store = _hpcwatch("jobs", "--db", db)["jobs"]
    t0 = time.monotonic()
    from_promql = _hpcwatch("jobs", "--db", db, "--prometheus", server.url)["jobs"]
    print(f"jobs --prometheus ({promql_backend}, {NODES} nodes): {time.monotonic() - t0:.2f}s, whole process")
    seen = [r for r in from_store if r["gpu_hours_observed"] > 0]
    assert len(seen) >= 20, "the twin should run many jobs on 128 nodes"
    assert {r["id"] for r in seen} <= {j.id for j in twin.jobs}
    # Prometheus keeps every float bit; VictoriaMetrics about 12 digits.
    assert_same_report(from_promql, from_store, rel=0.0 if promql_backend == "prometheus" else 1e-9)
