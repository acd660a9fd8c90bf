"""deploy/prometheus/hpcwatch-rules.yml on a real Prometheus 2.42: dcgm-exporter series *without* the hpc_job
label, joined to the exporter's ``hpcwatch_gpu_allocation_info``, give the same per-job GPU count and
GPU-hours as ``hpcwatch jobs`` (the attribution analysis over the same Prometheus' raw samples)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hpcwatch.analysis.attribution import DCGM_METRICS, job_reports
from hpcwatch.exporter import serve_metrics
from hpcwatch.promql import PrometheusBackend
from hpcwatch.records import Job
from hpcwatch.store import Store

from .conftest import wait_until

pytestmark = pytest.mark.integration

RULES = Path(__file__).resolve().parents[2] / "deploy/prometheus/hpcwatch-rules.yml"
PORT_PROMETHEUS, PORT_EXPORTER, PORT_DCGM = 29095, 29096, 29097
INTERVAL_S = 1  # scrape and rule evaluation, so the test takes seconds, not minutes
WINDOW_S = 30
SETTLE_S = 5


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


def test_recording_rules_give_the_per_job_gpu_hours_of_hpcwatch_jobs(start_promql, dcgm_endpoint, tmp_path):
    store = Store(tmp_path / "store")
    jobs = _jobs(time.time())
    store.add(jobs)
    server, _ = serve_metrics(store, port=PORT_EXPORTER)
    try:
        rules = tmp_path / "rules.yml"
        rules.write_text(RULES.read_text().replace("interval: 30s", f"interval: {INTERVAL_S}s"))
        prom = start_promql(
            f"global: {{scrape_interval: {INTERVAL_S}s, evaluation_interval: {INTERVAL_S}s}}\n"
            f"rule_files: [{rules}]\n"
            "scrape_configs:\n"
            f"  - {{job_name: dcgm, static_configs: [{{targets: ['{dcgm_endpoint}']}}]}}\n"
            f"  - {{job_name: hpcwatch, static_configs: [{{targets: ['127.0.0.1:{PORT_EXPORTER}']}}]}}\n",
            port=PORT_PROMETHEUS,
        )
        wait_until(lambda: prom.query("hpcwatch:job_gpus"), timeout_s=30, what="the first rule evaluation")
        time.sleep(WINDOW_S + 2 + SETTLE_S)
        # The window ends SETTLE_S in the past: vmalert remote-writes its results (flushed each second) and
        # VictoriaMetrics hides the newest second (-search.latencyOffset), so the last evaluations of "now"
        # are not yet readable there; both sides are compared over the same settled window.
        t = float(int(time.time())) - SETTLE_S
        counts = {r["metric"]["hpc_job"]: float(r["value"][1]) for r in prom.query("hpcwatch:job_gpus")}
        assert counts == {"501": 4.0, "502": 2.0}  # the label is off: only the join attributes the GPUs
        rule_hours = {
            r["metric"]["hpc_job"]: float(r["value"][1])
            for r in prom.query(
                f"sum by (hpc_job) (sum_over_time(hpcwatch:job_gpus[{WINDOW_S}s] @ {t})) * {INTERVAL_S} / 3600"
            )
        }
        with PrometheusBackend(prom.url) as backend:
            table = backend.samples(list(DCGM_METRICS), t0=t - WINDOW_S, t1=t)
        reports = {r.id: r for r in job_reports(table, jobs, now=t)}
        for job_id, hours in rule_hours.items():
            # Scrapes and rule evaluations are not aligned: one interval per GPU apart at most, each end.
            tolerance = 2 * INTERVAL_S * reports[job_id].gpus / 3600
            assert reports[job_id].gpu_hours_observed == pytest.approx(hours, abs=tolerance), job_id
            assert reports[job_id].gpus_observed == counts[job_id]
            assert reports[job_id].attributed_by == ("slurm",)
        assert rule_hours["501"] == pytest.approx(4 * WINDOW_S / 3600, rel=0.15)
    finally:
        server.shutdown()
        store.close()
