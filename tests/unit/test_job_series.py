"""Issue 27: the job page's charts over the job's life (``reports.jobseries``, ``web.charts``).

Job 701 is built sample by sample (as test_web_job.py adds its findings) so every bucket's value is known:
two GPUs of node1 at 80 % / 300 W and 60 % / 200 W, scraped every 15 s from 08:00:00 UTC; GPU 1 logs XID 79
and falls silent at 08:30, GPU 0 at 08:45 (the node went down); Slurm ends the job at 09:00. Port mlx5_0 of
node1 sends 1 GB/s and receives 0.5 GB/s (its counter reset once, at 08:20), Lustre reads 100 MB/s for the
job on one OST, and a GPU of another job beside it is busy at 100 %. Steps: one every 30 s, 2 s long.
The real inputs of test_web_job.py (the hook files of a 4-rank gloo job, a Slurm 22.05 sacct) give the
cases with no samples at all.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from hpcwatch import vocab
from hpcwatch.analysis.goodput import StepTable
from hpcwatch.ingest import ingest_paths
from hpcwatch.model import reference_cluster
from hpcwatch.records import Job, Sample, Span
from hpcwatch.reports.jobpage import job_overview
from hpcwatch.reports.jobseries import MAX_BUCKETS, job_series
from hpcwatch.store import Store
from hpcwatch.web.app import create_app

DATA = Path(__file__).resolve().parents[1] / "data"
T0 = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
SCRAPE_S = 15.0
GPU1_STOP, GPU0_STOP, END = T0 + 1800, T0 + 2700, T0 + 3600


def _gpu(gpu: str, t: float, util: float, power: float, job: str | None = None) -> list[Sample]:
    labels = {"Hostname": "node1", "gpu": gpu, **({"hpc_job": job} if job else {})}
    return [
        Sample(metric=vocab.DCGM_FI_DEV_GPU_UTIL, labels=labels, t=t, value=util),
        Sample(metric=vocab.DCGM_FI_DEV_POWER_USAGE, labels=labels, t=t, value=power),
    ]


def _records() -> list[object]:
    job = Job(id="701", user="ann", nodes=("node1",), gpus=2, gpus_by_node={"node1": (0, 1)}, start=T0, end=END)
    other = Job(id="702", user="bob", nodes=("node1",), gpus=1, gpus_by_node={"node1": (2,)}, start=T0, end=END)
    out: list[object] = [job, other]
    port = {"node": "node1", "device": "mlx5_0", "port": "1"}
    for k in range(int(3600 / SCRAPE_S) + 1):
        t = T0 + k * SCRAPE_S
        if t <= GPU0_STOP:
            out += _gpu("0", t, 80.0, 300.0)
        if t <= GPU1_STOP:
            out += _gpu("1", t, 60.0, 200.0)
        out += _gpu("2", t, 100.0, 700.0, job="702")  # another job's GPU on the same node: not 701's
        since_reset = k * SCRAPE_S if t < T0 + 1200 else (t - T0 - 1200)  # the counters restart at 08:20
        out.append(Sample(metric=vocab.NODE_INFINIBAND_PORT_DATA_TRANSMITTED_BYTES_TOTAL, labels=port, t=t,
                          value=1e9 * since_reset))  # fmt: skip
        out.append(Sample(metric=vocab.NODE_INFINIBAND_PORT_DATA_RECEIVED_BYTES_TOTAL, labels=port, t=t,
                          value=5e8 * since_reset))  # fmt: skip
        out.append(Sample(metric=vocab.LUSTRE_JOB_READ_BYTES_TOTAL, labels={"jobid": "701", "target": "fs-OST0000"},
                          t=t, value=1e8 * k * SCRAPE_S))  # fmt: skip
    out.append(Sample(metric=vocab.DCGM_FI_DEV_XID_ERRORS, labels={"Hostname": "node1", "gpu": "1"}, t=GPU1_STOP,
                      value=79.0))  # fmt: skip
    for step in range(100):  # a step every 30 s, 2 s long, ending 12 s into its 30 s bucket
        out += [Span(job="701", rank=r, step=step, phase="forward", start=T0 + 10 + 30 * step, dur=2.0, attrs={})
                for r in (0, 1)]  # fmt: skip
    return out


@pytest.fixture(scope="module")
def store():
    st = Store(":memory:")
    st.add(_records())
    ingest_paths(st, [DATA / "kineto" / "gloo_straggler" / "hook", DATA / "slurm" / "sacct.json"])
    yield st
    st.close()


@pytest.fixture(scope="module")
def series(store):
    found = job_overview(store, "701").series
    assert found is not None
    return {s.key: s for s in found.series}, found


def _at(found, values, t):
    return values[int((t - found.t0) // found.bucket_s)]


def test_the_window_is_the_jobs_life_in_at_most_max_buckets(series):
    by_key, found = series
    assert (found.t0, found.t1) == (T0, END)
    # The shortest power of two of seconds that fits the hour in MAX_BUCKETS: 32 s (30.25 s would; ≥ the 15 s scrape)
    assert found.bucket_s == 32.0 and found.buckets == 3600 // 32 + 1 <= MAX_BUCKETS
    assert all(len(s.values) == found.buckets for s in by_key.values())
    assert found.clock == "sample time, UTC s"


def test_each_series_has_its_unit_and_its_aggregation(series):
    by_key, found = series
    assert {k: (s.unit, s.aggregation) for k, s in by_key.items()} == {
        "gpu_util": ("%", "mean_over_gpus"),
        "power": ("W", "sum_over_gpus"),
        "step_time": ("s", "mean_over_steps"),
        "ib_tx": ("B/s", "sum_over_ports"),
        "ib_rx": ("B/s", "sum_over_ports"),
        "lustre_read": ("B/s", "sum_over_targets"),
    }  # no Lustre write sample: no series, not a line of zeros
    early = T0 + 600
    assert _at(found, by_key["gpu_util"].values, early) == pytest.approx(70.0)  # (80 + 60) / 2, GPU 2 left out
    assert _at(found, by_key["power"].values, early) == pytest.approx(500.0)  # 300 + 200
    assert _at(found, by_key["step_time"].values, early) == pytest.approx(2.0)
    assert _at(found, by_key["ib_tx"].values, early) == pytest.approx(1e9)
    assert _at(found, by_key["ib_rx"].values, early) == pytest.approx(5e8)
    assert _at(found, by_key["lustre_read"].values, early) == pytest.approx(1e8)


def test_a_counter_reset_is_skipped_not_read_as_traffic(series):
    by_key, _ = series
    tx = [v for v in by_key["ib_tx"].values if v is not None]
    assert min(tx) == pytest.approx(1e9) and max(tx) == pytest.approx(1e9)  # no negative dip, no spike


def test_after_an_xid_the_gpus_series_ends_there_not_flat_filled(series):
    by_key, found = series
    util, power = by_key["gpu_util"].values, by_key["power"].values
    assert _at(found, util, GPU1_STOP + 300) == pytest.approx(80.0)  # GPU 0 alone
    assert _at(found, power, GPU1_STOP + 300) == pytest.approx(300.0)  # GPU 1's 200 W gone, not carried on
    last = max(i for i, v in enumerate(util) if v is not None)
    assert found.bucket_start(last) <= GPU0_STOP < found.bucket_start(last + 1)
    assert util[last + 1 :] == (None,) * (found.buckets - last - 1)  # 08:45 to 09:00: nothing reported
    assert power[last + 1 :] == (None,) * (found.buckets - last - 1)
    assert by_key["ib_tx"].values[-1] is not None  # the node's port still counted: only the GPUs stopped


def test_prometheus_samples_of_every_host_give_the_same_series(store, series):
    """Under ``serve --prometheus`` the page passes every sample since the job's start: the series keep the
    job's GPUs, nodes and window all the same."""
    found = job_overview(store, "701", samples=store.samples()).series
    assert found == series[1]


@pytest.mark.parametrize("stretch_s", [14.0, 60.0])
def test_stretches_of_the_window_draw_what_one_read_draws(store, series, monkeypatch, stretch_s):
    """Read a stretch at a time (``reports.jobstretches.stretches``), here 14 s (some hold no scrape) and 60 s of the hour, edges
    between two scrapes: every bucket as one read of the window gives it, the IB and Lustre rates across the
    edges and the counter reset included."""
    from hpcwatch.reports import jobstretches

    monkeypatch.setattr(jobstretches, "STRETCH_ROWS", 1)
    monkeypatch.setattr(jobstretches, "STRETCH_S", stretch_s)
    read: list[float] = []
    window_samples = jobstretches.queries.job_window_samples

    def counting(st, metrics, **window):
        read.append(window["t0"])
        return window_samples(st, metrics, **window)

    monkeypatch.setattr(jobstretches.queries, "job_window_samples", counting)
    found = job_overview(store, "701").series
    assert found is not None and len(read) >= 3600 / stretch_s
    whole = series[1]
    assert (found.t0, found.t1, found.bucket_s, found.buckets) == (whole.t0, whole.t1, whole.bucket_s, whole.buckets)
    assert [s.key for s in found.series] == [s.key for s in whole.series]
    for mine, one_read in zip(found.series, whole.series):
        assert [v is None for v in mine.values] == [v is None for v in one_read.values]
        assert [v for v in mine.values if v is not None] == pytest.approx([v for v in one_read.values if v is not None])


def test_a_job_of_ten_days_is_still_at_most_max_buckets():
    st = Store(":memory:")
    days = 10 * 86400.0
    st.add([Job(id="801", nodes=("node1",), gpus=1, gpus_by_node={"node1": (0,)}, start=T0, end=T0 + days)])
    st.add([s for k in range(0, 241) for s in _gpu("0", T0 + k * 3600, 50.0 + k % 2, 400.0)])  # hourly
    found = job_overview(st, "801").series
    st.close()
    assert found is not None and found.bucket_s == 8192.0 and found.buckets == days // 8192 + 1 <= MAX_BUCKETS
    (util, power) = found.series
    assert util.points == found.buckets and 50.0 <= util.low <= util.high <= 51.0 and power.high == pytest.approx(400.0)


def test_a_job_without_samples_or_steps_has_no_series(store):
    """Real sacct job 3 (20 s on node2, no GPU sample): a window, nothing drawn on it; a job never started
    has no window at all."""
    o = job_overview(store, "3")
    assert o.series is not None and o.series.series == ()
    nothing = job_series(store, "900", report=None, samples=None, steps=StepTable.empty(), first_start=None)
    assert nothing is None  # no start, no sample, no step: no window to draw on


def test_a_job_known_from_its_spans_draws_its_step_times(store):
    o = job_overview(store, "gloo-test")  # real hook files, no Slurm record, no samples
    assert o.series is not None and [s.key for s in o.series.series] == ["step_time"]
    assert o.series.series[0].points >= 1 and 0.0 < o.series.series[0].high < 1.0


def test_a_workload_known_from_its_label_only_draws_its_own_gpu():
    """No Slurm record: a pod's GPU labelled ``hpc_job`` by dcgm-exporter; the unlabelled GPU beside it at
    99 % is not the pod's, and the window is the samples' own."""
    st = Store(":memory:")
    st.add([s for k in range(20) for s in _gpu("0", T0 + k * SCRAPE_S, 40.0, 250.0, job="pod-9")])
    st.add([s for k in range(20) for s in _gpu("1", T0 + k * SCRAPE_S, 99.0, 650.0)])
    found = job_overview(st, "pod-9").series
    st.close()
    assert found is not None and found.t1 == T0 + 19 * SCRAPE_S and found.bucket_s == 16.0  # ≥ the 15 s scrape
    util, power = found.series
    assert (util.low, util.high, power.high) == (40.0, 40.0, 250.0)


# -- the page and the API ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(store):
    with TestClient(create_app(store, reference_cluster())) as c:
        yield c


def test_the_page_draws_one_svg_chart_per_series_with_its_labels_in_english(client):
    html = client.get("/job/701", params={"lang": "en"}).text
    panel = html[html.index('id="job-series"') : html.index('id="job-gpus"')]
    assert "Over the job&#39;s life" in panel and "<script" not in panel
    charts = re.findall(r'<svg class="chart" role="img" aria-label="([^"]*)"', panel)
    assert len(charts) == 6 and panel.count("<title>") == 6
    util = next(c for c in charts if c.startswith("GPU utilisation"))
    assert util == (
        "GPU utilisation, mean over the job&#x27;s GPUs: 85 of 113 points from 01-15 08:00 to 01-15 09:00 UTC; "
        "min 70 %, max 80 %, last 80 %"
    )
    assert "Time (UTC)" in panel and ">%</text>" in panel and ">B/s</text>" in panel
    assert "min 1.0 GB/s · max 1.0 GB/s" in panel and "min 2,000.0 ms" not in panel and "2.00 s" in panel
    assert "One point per 32.0 s bucket, 113 buckets from" in panel
    assert 'text-anchor="end">100 %</text>' in panel  # utilisation reads against full, not its own maximum


def test_each_chart_is_well_formed_svg_whose_line_stops_where_the_gpus_did(client):
    import xml.etree.ElementTree as ET

    html = client.get("/job/701", params={"lang": "en"}).text
    svgs = {
        el.get("data-series"): el
        for el in (ET.fromstring(m) for m in re.findall(r"<svg .*?</svg>", html, flags=re.S))
        if el.get("class") == "chart"
    }
    assert set(svgs) == {"gpu_util", "power", "step_time", "ib_tx", "ib_rx", "lustre_read"}
    (line,) = svgs["gpu_util"].findall("polyline")  # one run: 08:00 to 08:45, then nothing drawn
    assert len(line.get("points").split()) == 85
    assert svgs["gpu_util"].find("title").text.startswith("GPU utilisation")


def test_the_page_draws_the_charts_in_french(client):
    html = client.get("/job/701", params={"lang": "fr"}).text
    panel = html[html.index('id="job-series"') : html.index('id="job-gpus"')]
    assert "Sur la vie du job" in panel and "Heure (UTC)" in panel
    assert 'aria-label="Puissance des GPU, somme sur les GPU du job : 85 points sur 113' in panel
    assert "min 500,0 MB/s · max 500,0 MB/s" in panel  # InfiniBand received, French decimal comma
    assert "Un point par tranche de 32,0 s" in panel


def test_a_job_without_samples_says_so_instead_of_empty_charts(client):
    html = client.get("/job/3", params={"lang": "en"}).text
    assert 'data-missing="series"' in html and "<svg" not in html.split('id="job-series"')[1].split("</section>")[0]


def test_the_api_carries_the_same_numbers(client, series):
    by_key, found = series
    doc = client.get("/api/job/701").json()["series"]
    assert doc["t0"] == T0 and doc["t1"] == END and doc["clock"] == "sample time, UTC s"
    assert len(doc["t"]) == found.buckets and doc["t"][1] - doc["t"][0] == pytest.approx(found.bucket_s)
    util = next(s for s in doc["series"] if s["key"] == "gpu_util")
    assert util["unit"] == "%" and util["source"] == vocab.DCGM_FI_DEV_GPU_UTIL
    assert util["values"] == list(by_key["gpu_util"].values) and util["values"][-1] is None  # JSON null, a gap
