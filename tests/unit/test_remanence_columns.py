"""The remanence rules over columns (``security.remanence.GpuSeries``) against the rules read point by point.

The reference below is the rule as its docstring says it, one point at a time, in Python: the baseline of a node
is the median FB used while no job held the GPU, away from ended jobs' watch if any such read is left, a finding needs a point over its GPU's baseline with no job on
the GPU in the ended job's watch, a busy GPU needs a point over the limit with no job within ``after_s``. Random nodes, GPUs, jobs
(ended or running, holding every GPU of a node or some) and points (labelled or not, in order or not) must give
the same findings, in the same order, with the same evidence.
"""

from __future__ import annotations

import random
import statistics
from collections import defaultdict

import orjson
import pyarrow as pa
import pytest

from hpcwatch.records import Finding, Job, Sample
from hpcwatch.security.context import JobIndex
from hpcwatch.security.remanence import (
    FB_USED,
    GPU_UTIL,
    GpuSeries,
    RemanenceConfig,
    detect_remanence,
    detect_remanence_series,
)

CONFIG = RemanenceConfig(after_s=5.0, window_s=60.0, margin_mib=100.0, busy_util_pct=5.0)


def _free(index: JobIndex, host: str, gpu: str, t: float, label: str, grace_s: float = 0.0) -> bool:
    return not label and not index.on_gpu(host, gpu, t, grace_s=grace_s)


def _watched(index: JobIndex, host: str, t: float, config: RemanenceConfig) -> bool:
    """Whether ``t`` is in the watch of a job that ended on ``host`` (its idle reads are not the baseline)."""
    return any(host in j.nodes and j.end <= t <= j.end + config.window_s for j in index.ended())


def _reference(samples: list[Sample], jobs: list[Job], config: RemanenceConfig) -> list[Finding]:
    index = JobIndex.of(jobs)
    series: dict[str, dict[tuple[str, str], list[tuple[float, float, str]]]] = {"fb": {}, "util": {}}
    for s in samples:
        group = {FB_USED: "fb", GPU_UTIL: "util"}.get(s.metric)
        if group and "gpu" in s.labels:
            key = (s.labels["host"], s.labels["gpu"])
            series[group].setdefault(key, []).append((s.t, s.value, s.labels.get("hpc_job", "")))
    idle: defaultdict[str, list[float]] = defaultdict(list)
    quiet: defaultdict[str, list[float]] = defaultdict(list)
    for (host, gpu), points in series["fb"].items():
        idle[host] += [v for t, v, label in points if _free(index, host, gpu, t, label)]
        quiet[host] += [
            v for t, v, label in points if _free(index, host, gpu, t, label) and not _watched(index, host, t, config)
        ]
    base = {h: statistics.median(quiet[h] or v) for h, v in idle.items() if v}
    findings = []
    for (host, gpu), points in sorted(series["fb"].items()):
        floor = min(v for _, v, _ in points)
        baseline = min(base.get(host, floor), floor + config.margin_mib)
        first, last = min(t for t, _, _ in points), max(t for t, _, _ in points)
        for job in index.ended():
            end = index.end_of(job)
            if host not in job.nodes or end + config.window_s < first or end + config.after_s > last:
                continue
            if job.gpus_by_node.get(host) and int(gpu) not in job.gpus_by_node[host]:
                continue
            left = [
                (t, v)
                for t, v, label in points
                if end + config.after_s <= t <= end + config.window_s
                and _free(index, host, gpu, t, label)
                and v > baseline + config.margin_mib
            ]
            if left:
                t, v = left[0]
                title = f"{host}/{gpu} still holds {v - baseline:.0f} MiB {t - end:.0f} s after job {job.id} ended"
                evidence = {
                    "host": host,
                    "gpu": gpu,
                    "job": job.id,
                    "user": job.user,
                    "job_end": job.end,
                    "fb_used_mib": v,
                    "baseline_mib": baseline,
                    "samples_over": len(left),
                }
                findings.append(_finding("high", f"{host}/{gpu}", title, evidence, t, "remanence.fb_after_job"))
    for (host, gpu), points in sorted(series["util"].items()):
        busy = [
            (t, v)
            for t, v, label in points
            if v > config.busy_util_pct and _free(index, host, gpu, t, label, config.after_s)
        ]
        if busy:
            peak = max(v for _, v in busy)
            evidence = {"host": host, "gpu": gpu, "peak_util_pct": peak, "first_t": busy[0][0], "samples": len(busy)}
            title = f"{host}/{gpu} is {peak:.0f} % busy with no job on it"
            findings.append(_finding("medium", f"{host}/{gpu}", title, evidence, busy[0][0], "remanence.busy_no_job"))
    return findings


def _finding(severity, target: str, title: str, evidence: dict, t: float, rule: str) -> Finding:
    return Finding(
        vector="gpu_memory_remanence", severity=severity, target=target, title=title, evidence=evidence, t=t, rule=rule
    )


def _cluster(rng: random.Random) -> tuple[list[Sample], list[Job]]:
    hosts = [f"n{i}" for i in range(rng.randint(1, 3))]
    jobs = []
    for k in range(rng.randint(0, 6)):
        nodes = tuple(rng.sample(hosts, rng.randint(1, len(hosts))))
        start = rng.uniform(0, 80)
        gpus = {n: tuple(sorted(rng.sample(range(4), rng.randint(1, 3)))) for n in nodes} if rng.random() < 0.5 else {}
        running = rng.random() < 0.3
        jobs.append(
            Job(
                id=str(100 + k),
                user=f"u{k}",
                nodes=nodes,
                gpus=4,
                gpus_by_node=gpus,
                start=start,
                end=None if running else start + rng.uniform(1, 40),
                state="RUNNING" if running else "COMPLETED",
            )
        )
    samples = []
    for host in hosts:
        for gpu in map(str, range(4)):
            for t in sorted(rng.uniform(0, 150) for _ in range(rng.randint(0, 25))):
                label = rng.choice(["", "", str(100 + rng.randint(0, 5))])
                labels = {"host": host, "gpu": gpu, **({"hpc_job": label} if label else {})}
                fb = rng.choice([500.0, 510.0, rng.uniform(400, 4000)])
                samples.append(Sample(metric=FB_USED, t=t, value=fb, labels=labels))
                samples.append(
                    Sample(metric=GPU_UTIL, t=t, value=rng.choice([0.0, 3.0, rng.uniform(0, 100)]), labels=labels)
                )
    samples.append(Sample(metric=FB_USED, t=1.0, value=9e9, labels={"host": "n0"}))  # no GPU: not a GPU's point
    if rng.random() < 0.3:
        rng.shuffle(samples)
    return samples, jobs


@pytest.mark.parametrize("seed", range(60))
def test_the_columns_find_what_the_rules_find_point_by_point(seed: int) -> None:
    samples, jobs = _cluster(random.Random(seed))
    assert detect_remanence(samples, jobs, config=CONFIG) == _reference(samples, jobs, CONFIG)


def test_a_table_read_and_a_sample_list_make_the_same_columns() -> None:
    """``add_table`` (a live scan's read: JSON labels texts) and ``add`` (records) hold the same points, and
    forgetting keeps the rows at and after the time."""
    samples, jobs = _cluster(random.Random(3))
    table = pa.table(
        {
            "metric": [s.metric for s in samples],
            "labels": [orjson.dumps(s.labels).decode() for s in samples],
            "t": [s.t for s in samples],
            "value": [s.value for s in samples],
        }
    )
    read, listed = GpuSeries(), GpuSeries.of(samples)
    read.add_table(table.slice(0, 40))
    read.add_table(table.slice(40))
    assert read.groups == listed.groups and len(read) == len(listed) == len(samples) - 1
    assert detect_remanence_series(read, jobs, config=CONFIG) == detect_remanence_series(listed, jobs, config=CONFIG)
    read.forget_before(75.0)
    kept = [s for s in samples if s.t >= 75.0]
    assert read.groups == GpuSeries.of(kept).groups
