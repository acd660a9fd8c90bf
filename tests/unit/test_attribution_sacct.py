"""jobstats parity: CPUs, CPU time, memory requested, MaxRSS per node and time limit from ``sacct --json``
(the real Slurm 22.05 capture tests/data/slurm/sacct.json, and the 23.11 shapes of the synthetic file), shown
by ``hpcwatch job`` with the advice lines they call for.

Every expected number below is read by hand from the file (jq-style paths in the comments)."""

from __future__ import annotations

import json

import pytest

from hpcwatch import vocab
from hpcwatch.errors import ParseError
from hpcwatch.records import Job, Sample
from hpcwatch.sources.slurm import MIB, parse_sacct_records, read_sacct_records
from tests.conftest import DATA

SACCT = DATA / "slurm/sacct.json"
SACCT_V40 = DATA / "slurm/sacct_v0040_synthetic.json"


def _usage(path) -> dict[str, dict]:
    """job id -> {metric: value} and {"rss": {node: bytes}} of the reader's samples."""
    out: dict[str, dict] = {}
    for r in read_sacct_records(path):
        if isinstance(r, Job):
            out.setdefault(r.id, {"rss": {}})
            continue
        assert isinstance(r, Sample)
        slot = out[r.labels["job_id"]]
        if r.metric == vocab.SLURM_JOB_MAX_RSS_BYTES:
            slot["rss"][r.labels["node"]] = r.value
        else:
            slot[r.metric] = r.value
    return out


def test_real_22_05_sacct_cpus_memory_rss_and_limit() -> None:
    u = _usage(SACCT)
    two, three, nine = u["2"], u["3"], u["9"]
    # jobs[1] (job 2): tres.allocated cpu count 1; tres.requested mem count 8000 (MiB, --mem=8000)
    assert two[vocab.SLURM_JOB_CPUS] == 1
    assert two[vocab.SLURM_JOB_MEMORY_REQUESTED_BYTES] == 8000 * MIB == 8_388_608_000
    # steps[0] (batch) time.total = 0 s + 4753 us
    assert two[vocab.SLURM_JOB_CPU_SECONDS] == pytest.approx(0.004753)
    # steps[0].tres.requested.max mem count 3178496 (bytes: the 3104K sacct prints as MaxRSS) on node1
    assert two["rss"] == {"node1": 3_178_496}
    assert vocab.SLURM_JOB_TIME_LIMIT_SECONDS not in two  # time.limit null
    # jobs[2] (job 3): time.limit 525600 minutes; MaxRSS 3223552 on node2
    assert three[vocab.SLURM_JOB_TIME_LIMIT_SECONDS] == 525_600 * 60
    assert three["rss"] == {"node2": 3_223_552}
    # jobs[8] (job 9, two nodes): cpu 2, mem 16000 MiB (total over both nodes); running: no step has MaxRSS yet
    assert nine[vocab.SLURM_JOB_CPUS] == 2 and nine[vocab.SLURM_JOB_MEMORY_REQUESTED_BYTES] == 16000 * MIB
    assert nine["rss"] == {} and u["7"][vocab.SLURM_JOB_TIME_LIMIT_SECONDS] == 3600  # limit 60 min
    assert u["10"] == {"rss": {}}  # pending: used nothing, no samples


def test_sample_times_are_when_sacct_measured() -> None:
    samples = [r for r in read_sacct_records(SACCT) if isinstance(r, Sample)]
    at = {s.labels["job_id"]: s.t for s in samples}
    assert at["2"] == 1795991691  # finished: time.end
    assert at["7"] == 1795991704 + 10  # running: time.start + time.elapsed


def test_v0040_wrapped_shapes() -> None:
    u = _usage(SACCT_V40)["4100_3"]
    assert u[vocab.SLURM_JOB_CPUS] == 64
    assert u[vocab.SLURM_JOB_TIME_LIMIT_SECONDS] == 1440 * 60  # {"set": true, "number": 1440}
    assert u[vocab.SLURM_JOB_MEMORY_REQUESTED_BYTES] == 512000 * MIB
    assert u[vocab.SLURM_JOB_CPU_SECONDS] == pytest.approx(160000.5 + 40.25)  # the two steps' time.total
    assert u["rss"] == {"gpu08": 68_719_476_736, "gpu07": 2_147_483_648}


@pytest.mark.parametrize(
    "job",
    [
        {"job_id": 1, "steps": 5, "time": {"start": 10, "end": 20}, "state": {"current": "COMPLETED"}},  # steps: 5
        {
            "job_id": 1,
            "steps": [{"tres": {"requested": {"max": "mem=1"}}}],
            "time": {"start": 10, "end": 20},
            "state": {"current": "COMPLETED"},
        },  # TRES usage not a list
        {"job_id": 1, "time": {"start": 10, "end": 20, "limit": "60"}, "state": {"current": "COMPLETED"}},  # limit text
    ],
)
def test_bad_usage_shapes_are_one_line_parse_errors(job) -> None:
    with pytest.raises(ParseError, match=r"jobs\[0\]"):
        list(parse_sacct_records(json.dumps({"jobs": [job]})))


def test_job_report_shows_cpu_memory_time_limit_and_advice(run_cli, tmp_path) -> None:
    db = str(tmp_path / "store")
    assert run_cli(["ingest", "--db", db, str(SACCT)])[0] == 0
    code, out, err = run_cli(["job", "3", "--db", db, "--json"])
    assert code == 0, err
    r = json.loads(out)
    # job 3: 0.004461 CPU-s over 1 core x 20 s elapsed (time.end - time.start)
    assert r["cpus"] == 1 and r["cpu_util_pct"] == pytest.approx(100 * 0.004461 / 20)
    assert r["memory_requested_bytes"] == 8000 * MIB and r["max_rss_bytes_by_node"] == {"node2": 3_223_552}
    assert r["time_limit_s"] == 31_536_000 and r["time_limit_used"] == pytest.approx(20 / 31_536_000)
    advice = " ".join(r["advice"])
    assert "8.4 GB requested per node, at most 3.2 MB used" in advice  # MaxRSS 3.2 MB of 8.39 GB
    assert "0 % of its time limit" in advice
    assert "cores would have done" not in advice  # one core: nothing fewer to ask for
    code, out, _ = run_cli(["job", "3", "--db", db])
    assert code == 0 and "CPU: 1 cores" in out and "node2 3.2 MB" in out and "of 8760.00 h" in out
    # job 7 is running: sacct's CPU time and MaxRSS are not the job's yet, so no CPU/memory advice
    r7 = json.loads(run_cli(["job", "7", "--db", db, "--json"])[1])
    assert r7["time_limit_s"] == 3600 and not any("memory" in a for a in r7["advice"])


def test_gpu_advice_beside_sacct_usage(run_cli, tmp_path) -> None:
    """GPUs requested vs used: the real job 2 (3 GPUs on node1, 20 s) with dcgm-exporter samples written
    here (ours, not real) for two of its GPUs, one busy and one idle."""
    db = str(tmp_path / "store")
    scrape = tmp_path / "dcgm.prom"
    ms = [1795991681_000, 1795991691_000]
    scrape.write_text(
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        + "".join(
            f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",Hostname="node1",hpc_job="2"}} {u} {t}\n'
            for t in ms
            for g, u in (("0", 95), ("1", 0))
        )
    )
    assert run_cli(["ingest", "--db", db, str(SACCT), str(scrape)])[0] == 0
    r = json.loads(run_cli(["job", "2", "--db", db, "--json"])[1])
    assert r["gpus"] == 3 and r["gpus_observed"] == 2 and r["idle_gpus"] == 1
    advice = " ".join(r["advice"])
    assert "1 of 2 GPUs stayed below 1 %" in advice and "3 GPUs allocated, samples from 2" in advice
    assert "memory: 8.4 GB requested per node" in advice
