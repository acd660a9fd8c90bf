"""deploy/prometheus/hpcwatch-rules.yml on a real Prometheus 2.42: dcgm-exporter series *without* the hpc_job
label, joined to the exporter's ``hpcwatch_gpu_allocation_info``, give the same per-job GPU count and
GPU-hours as ``hpcwatch jobs`` (the attribution analysis over the same Prometheus' raw samples)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from hpcwatch.analysis.attribution import DCGM_METRICS, job_reports
from hpcwatch.exporter import serve_metrics
from hpcwatch.promql import PrometheusBackend
from hpcwatch.records import Job
from hpcwatch.store import Store

from .conftest import Prometheus, wait_until

pytestmark = pytest.mark.integration

RULES = Path(__file__).resolve().parents[2] / "deploy/prometheus/hpcwatch-rules.yml"
PORT_PROMETHEUS, PORT_EXPORTER, PORT_DCGM = 29095, 29096, 29097
INTERVAL_MS = {"prometheus": 250, "victoriametrics": 1000}
"""Scrape and rule evaluation, in ms, so the window fills in seconds (a scrape or an evaluation here takes a few ms).
Prometheus 2.42 takes sub-second intervals; vmalert 1.79 reads a query's timestamp as whole seconds and stamps
its results so (several evaluations a second would share one timestamp), hence 1 s there."""
EVALUATIONS = 30
"""Rule evaluations (and scrapes of each GPU) in the compared window: the tolerance below is two of them a GPU."""


def _dcgm_text() -> bytes:
    """A dcgm-exporter scrape of node1 (8 GPUs), label set of dcgm-exporter 3.x, no hpc_job: the label is off."""
    lines = ["# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).", "# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    lines += [
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",UUID="GPU-0000000{g}-0000-0000-0000-000000000000",device="nvidia{g}",'
        f'modelName="NVIDIA H100 80GB HBM3",Hostname="node1"}} {90 if g < 6 else 0}'
        for g in range(8)
    ]
    return ("\n".join(lines) + "\n").encode()


class _Dcgm(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = _dcgm_text()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def dcgm_endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", PORT_DCGM), _Dcgm)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{PORT_DCGM}"
    server.shutdown()
    server.server_close()


def _jobs(now: float) -> list[Job]:
    return [
        Job(
            id="501",
            user="alice",
            account="proj-llm",
            gpus=4,
            gpus_by_node={"node1": (0, 1, 2, 3)},
            nodes=("node1",),
            start=now - 600,
            state="RUNNING",
        ),
        Job(
            id="502",
            user="bob",
            account="proj-vision",
            gpus=2,
            gpus_by_node={"node1": (4, 5)},
            nodes=("node1",),
            start=now - 600,
            state="RUNNING",
        ),
    ]


def _whole_window_end(prom: Prometheus, interval_ms: int) -> float | None:
    """The end t of the newest window (t - W, t] of EVALUATIONS intervals the backend holds whole: each job's every
    rule evaluation and each GPU's every scrape, else None. t is half an interval before the newest evaluation read
    back: off the evaluations' grid, so Prometheus' closed [t - W, t] and VictoriaMetrics' (t - W, t] hold the same
    ones. Reading the newest evaluation, not the clock, waits out vmalert's remote-write flush (1 s) and what
    VictoriaMetrics has not made searchable yet, however long a loaded machine makes them."""
    newest = prom.query("min(timestamp(hpcwatch:job_gpus))")
    if not newest:
        return None
    t = float(newest[0]["value"][1]) - interval_ms / 2000
    window = f"[{EVALUATIONS * interval_ms}ms] @ {t:.3f}"
    evaluations = prom.query(f"count_over_time(hpcwatch:job_gpus{window})")
    scrapes = prom.query(f"count_over_time(DCGM_FI_DEV_GPU_UTIL{window})")
    counts = [float(r["value"][1]) for r in evaluations + scrapes]
    whole = len(evaluations) == 2 and len(scrapes) == 8 and min(counts) >= EVALUATIONS
    return t if whole else None


def test_recording_rules_give_the_per_job_gpu_hours_of_hpcwatch_jobs(
    start_promql, promql_backend, dcgm_endpoint, tmp_path
):
    interval_ms = INTERVAL_MS[promql_backend]
    interval_s, window_s = interval_ms / 1000, EVALUATIONS * interval_ms / 1000
    store = Store(tmp_path / "store")
    jobs = _jobs(time.time())
    store.add(jobs)
    server, _ = serve_metrics(store, port=PORT_EXPORTER)
    try:
        rules = tmp_path / "rules.yml"
        rules.write_text(RULES.read_text().replace("interval: 30s", f"interval: {interval_ms}ms"))
        prom = start_promql(
            f"global: {{scrape_interval: {interval_ms}ms}}\n"  # the rule group has its own interval
            f"rule_files: [{rules}]\n"
            "scrape_configs:\n"
            f"  - {{job_name: dcgm, static_configs: [{{targets: ['{dcgm_endpoint}']}}]}}\n"
            f"  - {{job_name: hpcwatch, static_configs: [{{targets: ['127.0.0.1:{PORT_EXPORTER}']}}]}}\n",
            port=PORT_PROMETHEUS,
        )

        def whole_window() -> float | None:
            if promql_backend == "victoriametrics":
                # VictoriaMetrics 1.79 makes a new series searchable up to 10 s after its first sample (its
                # current-hour index is refreshed every 10 s), and the rules chain three new series: 30 s.
                # /internal/force_flush, there for tests, makes what it has taken searchable now.
                httpx.get(f"{prom.url}/internal/force_flush", timeout=10).raise_for_status()
            return _whole_window_end(prom, interval_ms)

        # A loaded machine may drop an evaluation or a scrape: the window then slides past it.
        t = float(wait_until(whole_window, timeout_s=window_s + 45, what=f"{EVALUATIONS} evaluations read back"))
        at = f"@ {t:.3f}"
        counts = {r["metric"]["hpc_job"]: float(r["value"][1]) for r in prom.query(f"hpcwatch:job_gpus {at}")}
        assert counts == {"501": 4.0, "502": 2.0}  # the label is off: only the join attributes the GPUs
        rule_hours = {
            r["metric"]["hpc_job"]: float(r["value"][1])
            for r in prom.query(
                f"sum by (hpc_job) (sum_over_time(hpcwatch:job_gpus[{EVALUATIONS * interval_ms}ms] {at}))"
                f" * {interval_s} / 3600"
            )
        }
        # EVALUATIONS evaluations, each of which counted every GPU of the job.
        assert rule_hours == pytest.approx({"501": 4 * window_s / 3600, "502": 2 * window_s / 3600})
        with PrometheusBackend(prom.url) as backend:
            table = backend.samples(list(DCGM_METRICS), t0=t - window_s, t1=t)
        reports = {r.id: r for r in job_reports(table, jobs, now=t)}
        for job_id, hours in rule_hours.items():
            # hpcwatch counts a GPU's scrapes x their median gap, the rules EVALUATIONS x the interval. A GPU's
            # scrapes in the window are EVALUATIONS, or one more when jitter puts one just inside each end: one
            # interval; the other lets their median gap be off the interval by interval / EVALUATIONS (both
            # servers stamp a scrape with its scheduled time: it was the interval exactly in every run).
            tolerance = 2 * interval_s * reports[job_id].gpus / 3600
            assert reports[job_id].gpu_hours_observed == pytest.approx(hours, abs=tolerance), job_id
            assert reports[job_id].gpus_observed == counts[job_id]
            assert reports[job_id].attributed_by == ("slurm",)
    finally:
        server.shutdown()
        store.close()
