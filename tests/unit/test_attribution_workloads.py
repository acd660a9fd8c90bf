"""Workloads from every attribution source, on real dcgm-exporter scrapes: the hpc_job label alone (no Slurm
file), MIG instances as GPUs of their own, Kubernetes pods, Slurm-on-Kubernetes; and one observed window."""

from __future__ import annotations

import json
import re

import orjson
import pyarrow as pa
import pytest

from hpcwatch.analysis.attribution import job_reports
from hpcwatch.records import Job
from hpcwatch.store import SAMPLE_SCHEMA
from tests.conftest import DATA

L40S = DATA / "prometheus/dcgm_exporter_l40s_kubernetes_dcgm226.prom"
H100_MIG = DATA / "prometheus/dcgm_exporter_h100_mig_kubernetes_issue512.prom"
GPU_PODS = DATA / "kubernetes/kubectl_get_pods_gpu_mig_made_by_us.json"


def _scrapes(path, tmp_path, *, times=(1_000.0, 1_030.0, 1_060.0), label=None, strip_pods=False) -> list:
    """The real scrape saved once per time with a timestamp, as a scraper would have stored it. ``label`` maps a
    GPU index to the hpc_job value dcgm-exporter's mapping directory would add; ``strip_pods`` drops the
    Kubernetes labels (a scrape without --kubernetes). Both are changes made here, in memory; the file is not."""
    out = []
    for k, t in enumerate(times):
        lines = []
        for line in path.read_text().splitlines():
            if line.startswith("#") or not line:
                lines.append(line)
                continue
            head, value = line.rsplit(" ", 1)
            if strip_pods:
                for name in ("container", "namespace", "pod"):
                    head = re.sub(rf',{name}="[^"]*"', "", head)
            gpu = head.split('gpu="', 1)[1].split('"', 1)[0]
            if label and gpu in label:
                head = head[:-1] + f',hpc_job="{label[gpu]}"}}'
            lines.append(f"{head} {value} {int(t * 1000)}")
        file = tmp_path / f"{path.stem}-{k}.prom"
        file.write_text("\n".join(lines) + "\n")
        out.append(file)
    return out


def _ingest(run_cli, tmp_path, files) -> str:
    db = str(tmp_path / "store")
    code, _, err = run_cli(["ingest", "--db", db, *map(str, files)])
    assert code == 0, err
    return db


def _jobs(run_cli, db) -> dict[str, dict]:
    code, out, err = run_cli(["jobs", "--db", db, "--json"])
    assert code == 0, err
    return {j["id"]: j for j in json.loads(out)["jobs"]}


def test_label_only_scrape_lists_each_job_with_its_gpu_count(run_cli, tmp_path) -> None:
    files = _scrapes(L40S, tmp_path, label={"0": "4101", "1": "4101", "2": "4102"}, strip_pods=True)
    jobs = _jobs(run_cli, _ingest(run_cli, tmp_path, files))
    assert set(jobs) == {"4101", "4102"}
    assert jobs["4101"]["gpus"] == 2 and jobs["4102"]["gpus"] == 1
    assert jobs["4101"]["attributed_by"] == ["hpc_job"] and jobs["4101"]["allocation"] is None
    assert jobs["4101"]["user"] is None and jobs["4101"]["gpu_hours_allocated"] is None
    # 3 scrapes 30 s apart per GPU: 2 GPUs x 90 s observed
    assert jobs["4101"]["gpu_hours_observed"] == pytest.approx(2 * 90 / 3600)
    assert jobs["4101"]["observed_window"] == {"start": 970.0, "end": 1060.0}
    code, out, _ = run_cli(["job", "4102", "--db", str(tmp_path / "store"), "--json"])
    assert code == 0 and [g["gpu"] for g in json.loads(out)["per_gpu"]] == ["2"]


def test_mig_instances_stay_apart_and_their_pods_are_workloads(run_cli, tmp_path) -> None:
    jobs = _jobs(run_cli, _ingest(run_cli, tmp_path, _scrapes(H100_MIG, tmp_path)))
    embed = "model-playground-stg/text-embedding-predictor-00008-deployment-57946f6c67-vdtjl"
    tts = "model-playground-stg/tts-predictor-00011-deployment-5554f75554-8j8pl"
    assert set(jobs) == {embed, tts}  # instance 8 holds no pod: no workload
    assert jobs[embed]["gpus"] == jobs[tts]["gpus"] == 1
    assert jobs[embed]["attributed_by"] == ["kubernetes"] and jobs[embed]["account"] == "model-playground-stg"
    _code, out, _ = run_cli(["job", tts, "--db", str(tmp_path / "store"), "--json"])
    (gpu,) = json.loads(out)["per_gpu"]
    assert (gpu["host"], gpu["gpu"], gpu["instance"], gpu["profile"], gpu["device"]) == (
        "gsrh100-074",
        "0",
        "9",
        "1g.10gb",
        "0.9",
    )
    assert gpu["mean_util_pct"] == 0.0 and gpu["idle"]  # engine activity stands in for MIG's missing GPU_UTIL


def test_kubectl_pods_give_the_pod_its_gpu_request_node_and_owner(run_cli, tmp_path) -> None:
    db = _ingest(run_cli, tmp_path, [*_scrapes(H100_MIG, tmp_path, times=(1_755_565_000.0, 1_755_565_030.0)), GPU_PODS])
    jobs = _jobs(run_cli, db)
    embed = jobs["model-playground-stg/text-embedding-predictor-00008-deployment-57946f6c67-vdtjl"]
    assert embed["allocation"] == "kubernetes" and embed["gpus"] == 1 and embed["nodes"] == ["gsrh100-074"]
    assert embed["name"] == "ReplicaSet/text-embedding-predictor-00008-deployment-57946f6c67"
    assert embed["attributed_by"] == ["kubernetes"] and embed["gpus_observed"] == 1
    # research/train-0 ran the day before: a workload with its allocation and no samples
    train = jobs["research/train-0"]
    assert train["gpu_hours_allocated"] == pytest.approx(16.0) and train["gpu_hours_observed"] == 0.0


def test_a_kubernetes_scrape_of_a_whole_gpu_pod_counts_its_gpus(run_cli, tmp_path) -> None:
    jobs = _jobs(run_cli, _ingest(run_cli, tmp_path, _scrapes(L40S, tmp_path)))
    assert {k: v["gpus"] for k, v in jobs.items()} == {"redacted/tensorflow-0": 2}


def _table(rows) -> pa.Table:
    cols = list(zip(*rows))
    return pa.table(
        {
            "metric": cols[0],
            "t": cols[1],
            "value": cols[2],
            "host": cols[3],
            "gpu": cols[4],
            "job": cols[5],
            "labels": [orjson.dumps(c).decode() for c in cols[6]],
        },
        schema=SAMPLE_SCHEMA,
    )


def test_slurm_on_kubernetes_the_pod_is_the_slurm_node() -> None:
    # SUNK: slurmd runs in pod slurm-compute-a1, registered as that Slurm node; dcgm-exporter labels the pod.
    job = Job(
        id="77",
        user="erin",
        gpus=2,
        gpus_by_node={"slurm-compute-a1": (0, 1)},
        start=0.0,
        end=None,
        nodes=("slurm-compute-a1",),
    )
    rows = [
        (
            "DCGM_FI_DEV_GPU_UTIL",
            t,
            80.0,
            "k8s-node-9",
            str(g),
            None,
            {"Hostname": "k8s-node-9", "gpu": str(g), "pod": "slurm-compute-a1", "namespace": "slurm"},
        )
        for t in (10.0, 20.0)
        for g in (0, 1, 2)
    ]
    reports = {r.id: r for r in job_reports(_table(rows), [job])}
    assert reports["77"].attributed_by == ("slurm-on-kubernetes",) and reports["77"].gpus_observed == 2
    # GPU 2 of the pod is not in the Slurm allocation: the pod label still names its workload
    assert reports["slurm/slurm-compute-a1"].gpus_observed == 1


def test_one_observed_window_allocated_vs_observed_gpu_hours_and_coverage() -> None:
    # The case: 12 GPUs allocated for 7,800 s, samples only over the last 600 s (every 10 s).
    job = Job(
        id="9",
        user="u",
        gpus=12,
        gpus_by_node={"n1": tuple(range(8)), "n2": tuple(range(4))},
        start=0.0,
        end=7800.0,
        nodes=("n1", "n2"),
        state="COMPLETED",
    )
    rows = [
        ("DCGM_FI_DEV_GPU_UTIL", t, 90.0, host, str(g), None, {})
        for t in range(7210, 7801, 10)
        for host, n in (("n1", 8), ("n2", 4))
        for g in range(n)
    ]
    (r,) = job_reports(_table(rows), [job])
    assert r.gpu_hours_allocated == pytest.approx(26.0) and r.gpu_hours == pytest.approx(26.0)
    assert r.gpu_hours_observed == pytest.approx(2.0)  # 12 GPUs x 60 samples x 10 s
    assert (r.observed_start, r.observed_end) == (7200.0, 7800.0)
    assert r.coverage == pytest.approx(2.0 / 26.0)
    assert any("cover 8 % of the allocation" in a for a in r.advice)


T4_FB_FREE = DATA / "prometheus/dcgm_exporter_t4_fb_free_pod_gpu_operator340.prom"


def test_a_pod_seen_only_on_fb_free_is_listed_with_utilisation_unknown(run_cli, tmp_path) -> None:
    """gpu-operator#340's scrape line: pod default/dcgmproftester on a T4, here its only series (FB_FREE)."""
    db = _ingest(run_cli, tmp_path, _scrapes(T4_FB_FREE, tmp_path))
    jobs = _jobs(run_cli, db)
    assert set(jobs) == {"default/dcgmproftester"}
    pod = jobs["default/dcgmproftester"]
    assert pod["gpus"] == 1 and pod["attributed_by"] == ["kubernetes"]
    assert pod["mean_gpu_util"] is None  # no utilisation series: unknown, not 0 %
    code, out, err = run_cli(["jobs", "--db", db])
    assert code == 0 and "1 jobs" in out, err
