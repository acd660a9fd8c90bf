"""The twin: real formats, physically plausible and consistent values, determinism, scenario hooks, live."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hpcwatch.model import reference_cluster
from hpcwatch.records import Event
from hpcwatch.sources.infiniband import parse_perfquery
from hpcwatch.sources.lustre import parse_job_stats
from hpcwatch.sources.slurm import parse_squeue_json
from hpcwatch.store import Store
from hpcwatch.twin import Twin
from hpcwatch.twin.core import DCGM_FIELDS, IB_COUNTERS
from hpcwatch.twin.live import LiveTwin
from hpcwatch.twin.run import sized_reference
from hpcwatch.twin.scenarios import Scenario, register

DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}
F = {name: i for i, name in enumerate(DCGM_FIELDS)}


@pytest.fixture(scope="module")
def hour_run() -> dict[str, np.ndarray]:
    """One simulated hour of the reference cluster at 10 s: the fields and IB counters at every tick."""
    twin = Twin(reference_cluster(), seed=11)
    fields, ib, busy = [twin.fields.copy()], [twin.ib.copy()], [twin.busy()]
    for _ in range(360):
        twin.advance(10.0)
        fields.append(twin.fields.copy())
        ib.append(twin.ib.copy())
        busy.append(twin.busy())
    return {"fields": np.array(fields), "ib": np.array(ib), "busy": np.array(busy), "twin": twin}


def test_dcgm_scrape_parses_with_the_reference_parser_and_carries_dcgm_exporter_labels() -> None:
    twin = Twin(reference_cluster(), seed=1)
    twin.advance(10.0)
    families = {f.name: f for f in text_string_to_metric_families(twin.dcgm_text("node1"))}
    # prometheus_client strips the _total-less counter name as is; every field is there with dcgm-exporter's type.
    assert {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_DEV_XID_ERRORS",
    } <= set(families)
    assert families["DCGM_FI_DEV_GPU_UTIL"].documentation == "GPU utilization (in %)."
    assert families["DCGM_FI_DEV_POWER_USAGE"].documentation == "Power draw (in W)."
    energy = next(f for name, f in families.items() if name.startswith("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"))
    assert energy.type == "counter"
    samples = families["DCGM_FI_DEV_GPU_UTIL"].samples
    assert len(samples) == 8
    for s in samples:
        assert DCGM_LABELS <= set(s.labels) <= DCGM_LABELS | {"hpc_job"}
        assert s.labels["modelName"] == "NVIDIA H100 80GB HBM3" and s.labels["Hostname"] == "node1"
    assert samples[2].labels["hpc_job"] == twin.job_of("node1", 2) == twin.training_job.id


def test_jobs_by_gpu_overrides_the_hpc_job_label_like_a_mapping_dir() -> None:
    twin = Twin(reference_cluster(), seed=1)
    text = twin.dcgm_text("node2", jobs_by_gpu={0: "77", 3: "78,79"})
    util = [s for f in text_string_to_metric_families(text) if f.name == "DCGM_FI_DEV_GPU_UTIL" for s in f.samples]
    # GPU 3 is shared: dcgm-exporter repeats its series once per job (pkg/dcgmexporter/hpc.go)
    assert [s.labels.get("hpc_job") for s in util] == ["77", None, None, "78", "79", None, None, None, None]
    assert util[3].value == util[4].value


def test_values_stay_within_h100_sxm_physics_for_an_hour(hour_run) -> None:
    f, busy, twin = hour_run["fields"], hour_run["busy"], hour_run["twin"]
    spec = twin.cluster.gpus[0].spec
    power = f[..., F["DCGM_FI_DEV_POWER_USAGE"]]
    util = f[..., F["DCGM_FI_DEV_GPU_UTIL"]]
    assert power.max() <= spec.tdp_w and power.min() >= 0.9 * spec.idle_power_w
    assert (util >= 0).all() and (util <= 100).all()
    hbm_mib = spec.hbm_bytes / 1024**2
    fb = f[..., F["DCGM_FI_DEV_FB_USED"]]
    assert fb.max() <= hbm_mib and np.allclose(fb + f[..., F["DCGM_FI_DEV_FB_FREE"]], hbm_mib, atol=1)
    # A free GPU sits at idle power with nothing in memory; a busy one draws several times more.
    free = ~busy
    assert free.any() and np.all(np.abs(power[free] - spec.idle_power_w) < 10) and np.all(fb[free] == 0)
    hot = util > 90
    assert np.all(power[hot] > 4 * spec.idle_power_w)
    # Temperature follows power (it lags by a time constant, so correlation, not identity).
    temp = f[..., F["DCGM_FI_DEV_GPU_TEMP"]]
    assert temp.min() >= 25 and temp.max() <= 90
    assert np.corrcoef(power.ravel(), temp.ravel())[0, 1] > 0.9
    clock = f[..., F["DCGM_FI_DEV_SM_CLOCK"]]
    assert clock.max() <= 1980 and np.all(clock[free] == 345)
    assert (f[..., F["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]] <= 1).all()


def test_energy_counter_integrates_power(hour_run) -> None:
    f = hour_run["fields"]
    energy = f[..., F["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]]
    power = f[..., F["DCGM_FI_DEV_POWER_USAGE"]]
    # mJ added over each 10 s tick = the power reported at its end x 10 s (rounded to the mJ).
    assert np.array_equal(np.diff(energy, axis=0), np.round(power[1:] * 10.0 * 1000))


def test_ib_bytes_follow_the_ring_allreduce_and_idle_nodes_move_none() -> None:
    twin = Twin(sized_reference(8), seed=2)  # 8 nodes: the training job takes 2, the rest run 1-node jobs
    job = twin.training_job
    data = IB_COUNTERS.index("PortXmitData")
    before = twin.ib[:, data].copy()
    twin.advance(10.0)
    delta_bytes = (twin.ib[:, data] - before) * 4
    train_ports = {twin.port_row(n, g) for n, gs in job.gpus_by_node.items() for g in gs}
    for p in range(len(twin.ports)):
        if p not in train_ports:
            assert delta_bytes[p] == 0, twin.ports[p]
    _, table = twin.step_phases(job, twin.steps_done(job.id) - 1)
    p = job.gpus
    expected = 10.0 / table[0].sum() * 2 * (p - 1) / p * job.kind.gradient_bytes
    for port in train_ports:
        assert delta_bytes[port] == pytest.approx(expected, rel=0.02)
        # NDR moves at most 50 GB/s a direction: the twin never exceeds the link.
        assert delta_bytes[port] / 10.0 < twin.link_bytes_s


def test_same_seed_writes_the_same_bytes_and_another_seed_does_not() -> None:
    def texts(seed: int) -> tuple[str, ...]:
        twin = Twin(reference_cluster(), seed=seed, scenarios=["straggler"])
        for _ in range(30):
            twin.advance(10.0)
        return (
            twin.dcgm_text("node1"),
            twin.node_exporter_text("node2"),
            twin.squeue_json(),
            twin.sacct_json(),
            twin.lustre_job_stats_text(),
            twin.perfquery_text("node1", 3),
        )

    assert texts(5) == texts(5)
    assert texts(5)[0] != texts(6)[0]


def test_squeue_json_has_the_keys_of_real_slurm_22_05_and_reads_back(data_dir) -> None:
    real = json.loads((data_dir / "slurm" / "squeue.json").read_text())
    twin = Twin(reference_cluster(), seed=4)
    twin.advance(10.0)
    doc = json.loads(twin.squeue_json())
    assert doc.keys() == real.keys() and doc["meta"] == real["meta"]
    real_running = next(j for j in real["jobs"] if j["job_state"] == "RUNNING")
    real_pending = next(j for j in real["jobs"] if j["job_state"] == "PENDING")
    ours = {j["job_state"]: j for j in doc["jobs"]}
    assert list(ours["RUNNING"]) == list(real_running)  # same keys, same order
    assert list(ours["PENDING"]) == list(real_pending)
    jobs = {j.id: j for j in parse_squeue_json(twin.squeue_json())}
    for job in twin.jobs:
        if job.state == "RUNNING":
            assert jobs[job.id].gpus_by_node == job.gpus_by_node and jobs[job.id].user == job.user


def test_sacct_json_has_the_keys_of_real_slurm_22_05(data_dir) -> None:
    real = json.loads((data_dir / "slurm" / "sacct.json").read_text())
    doc = json.loads(Twin(reference_cluster(), seed=4).sacct_json())
    assert doc["meta"] == real["meta"]
    real_job = next(j for j in real["jobs"] if j["state"]["current"] == "RUNNING")
    ours = next(j for j in doc["jobs"] if j["state"]["current"] == "RUNNING")
    assert set(ours) == set(real_job) and set(ours["time"]) == set(real_job["time"])
    assert set(ours["steps"][0]) == set(real_job["steps"][0])
    accounts = {(j["user"], j["account"]) for j in doc["jobs"]}
    assert {("alice", "proj-llm"), ("bob", "proj-vision"), ("carol", "proj-rl")} <= accounts


def test_lustre_job_stats_and_perfquery_read_back_to_the_twins_counters() -> None:
    twin = Twin(reference_cluster(), seed=4)
    for _ in range(6):
        twin.advance(10.0)
    read = {}
    for s in parse_job_stats(twin.lustre_job_stats_text()):
        if s.metric == "lustre_job_write_bytes_total":
            read[s.labels["jobid"]] = read.get(s.labels["jobid"], 0) + s.value
    counters = twin.lustre_counters()
    assert read == {jid: c[:, 2].sum() for jid, c in counters.items()}
    assert read[twin.training_job.id] > 0  # it has written checkpoints
    got = {s.metric: s.value for s in parse_perfquery(twin.perfquery_text("node1", 0), node="node1")}
    assert got["ib_PortXmitData_bytes"] == twin.ib[0, IB_COUNTERS.index("PortXmitData")] * 4


@register
class _Probe(Scenario):
    """Plants one XID, one symbol error and one event, to show hooks run before writing."""

    name = "test_probe"

    def adjust_gpu(self, *, node, gpu, t, fields):
        if node == "node1" and gpu == 3:
            fields["DCGM_FI_DEV_XID_ERRORS"] = 79.0

    def adjust_ib(self, *, node, port, t, counters):
        if node == "node2" and port == 1:
            counters["SymbolErrorCounter"] += 1
            counters["PortRcvErrors"] += 1

    def events(self, *, twin, t0, t1):
        return [Event(kind="probe", t=t1, source="test", attrs={})]


def test_scenario_hooks_bend_what_is_written() -> None:
    twin = Twin(reference_cluster(), seed=1, scenarios=["test_probe"])
    twin.advance(10.0)
    twin.advance(10.0)
    assert 'gpu="3",' in twin.dcgm_text("node1") and any(
        s.value == 79 and s.labels["gpu"] == "3"
        for f in text_string_to_metric_families(twin.dcgm_text("node1"))
        if f.name == "DCGM_FI_DEV_XID_ERRORS"
        for s in f.samples
    )
    assert "SymbolErrorCounter:..............3" in twin.perfquery_text("node2", 1)  # t0 and two ticks
    # A counter that rarely moves is baked into node-exporter's template: a change must still show.
    assert 'node_infiniband_port_errors_received_total{device="mlx5_1",port="1"} 3' in twin.node_exporter_text("node2")
    assert [e.kind for e in twin.events()].count("probe") == 1


def test_live_twin_writes_ticks_into_the_store() -> None:
    store = Store(":memory:")
    live = LiveTwin(store, reference_cluster(), seed=0, speed=10.0, tick_s=0.05, start=1_800_000_000.0)
    with live:
        deadline = time.monotonic() + 10
        while live.ticks < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert live.ticks >= 2 and not live.running
    ((n_t,),) = store.query("SELECT count(DISTINCT t) FROM samples WHERE metric = 'DCGM_FI_DEV_GPU_UTIL'")
    assert n_t >= 3  # the starting state and two ticks
    assert {j.user for j in store.jobs()} >= {"alice", "bob"}
    assert store.spans(live.twin.training_job.id)


def test_twin_run_writes_the_documented_layout(tmp_path, run_cli) -> None:
    code, out, _ = run_cli(
        ["twin", "run", "--out", str(tmp_path), "--duration", "60", "--step", "10", "--scenario", "straggler", "--json"]
    )
    summary = json.loads(out)
    assert code == 0 and summary["ticks"] == 6 and summary["scenarios"] == ["straggler"]
    for rel in (
        "dcgm/node1.prom",
        "dcgm/node2.prom",
        "node-exporter/node1.prom",
        "slurm/squeue.json",
        "slurm/sacct.json",
        "perfquery/node2/mlx5_7.1.txt",
    ):
        assert (tmp_path / rel).is_file(), rel
    # Seven scrapes (t0 and six ticks), each sample line carrying its ms timestamp.
    stamps = {
        line.rsplit(" ", 1)[1]
        for line in (tmp_path / "dcgm" / "node1.prom").read_text().splitlines()
        if line.startswith("DCGM_FI_DEV_GPU_UTIL{")
    }
    assert len(stamps) == 7
    snapshots = sorted((tmp_path / "lustre").iterdir())
    assert snapshots
    # Untimed formats are dated by their file's write time: it is the simulated moment, not the wall clock.
    for path in (*snapshots, tmp_path / "perfquery/node2/mlx5_7.1.txt"):
        simulated_s = int(path.stem) / 1000 if path.parent.name == "lustre" else max(int(s) for s in stamps) / 1000
        assert path.stat().st_mtime == pytest.approx(simulated_s, abs=1e-3), path


def test_twin_run_rejects_a_bad_step_in_one_line(tmp_path, run_cli) -> None:
    code, out, err = run_cli(["twin", "run", "--out", str(tmp_path), "--duration", "60", "--step", "0"])
    assert code == 2 and out == "" and err.startswith("hpcwatch: ") and err.count("\n") == 1


def test_top_json_lists_every_gpu_with_its_job_and_user(run_cli) -> None:
    code, out, _ = run_cli(["top", "--duration", "1.5", "--speed", "10", "--json"])
    doc = json.loads(out)
    assert code == 0 and len(doc["gpus"]) == 16
    busy = [g for g in doc["gpus"] if g["job"]]
    assert busy and all(g["user"] for g in busy) and all(0 <= g["util_pct"] <= 100 for g in doc["gpus"])


def test_parallel_writers_write_the_same_files_as_one_process(tmp_path) -> None:
    from hpcwatch.twin.run import write_run

    for workers in (1, 2):
        write_run(Twin(sized_reference(6), seed=9), tmp_path / str(workers), duration_s=120.0, workers=workers)
    for sub in ("dcgm", "node-exporter"):
        one = sorted((tmp_path / "1" / sub).iterdir())
        assert len(one) == 6
        for path in one:
            assert path.read_bytes() == (tmp_path / "2" / sub / path.name).read_bytes(), path


class _LoseGpu(Scenario):
    """dcgm-exporter loses GPU 5 of node 4 from the third tick on (the ``absent_gpus`` hook)."""

    name = "test_lose_gpu"

    def __init__(self, from_t: float) -> None:
        self.from_t = from_t

    def absent_gpus(self, *, t: float) -> list[tuple[str, int]]:
        return [("node4", 5)] if t >= self.from_t else []


def test_a_gpu_the_exporter_lost_is_left_out_of_every_writer(tmp_path) -> None:
    from hpcwatch.twin.exposition import scrape_all
    from hpcwatch.twin.run import write_run

    start = 1_796_000_000.0
    twin = Twin(sized_reference(6), seed=3, start=start, scenarios=[_LoseGpu(start + 30.0)])
    for k in range(4):
        twin.advance(10.0)
        gone = k >= 2
        assert bool(twin.absent[twin.gpu_row("node4", 5)]) is gone and int(twin.absent.sum()) == int(gone)
        by_node = {node: dcgm for node, dcgm, _ in scrape_all(twin, timestamp=False, target_labels=False)}
        for node in twin.node_names:
            assert by_node[node] == twin.dcgm_text(node)
        gpus = {
            (f.samples[0].labels["Hostname"], s.labels["gpu"])
            for f in text_string_to_metric_families(by_node["node4"])
            for s in f.samples
        }
        assert len(gpus) == (7 if gone else 8) and (("node4", "5") in gpus) is not gone
        listed = {(s.labels["Hostname"], s.labels["gpu"]) for s in twin.samples() if s.metric == "DCGM_FI_DEV_GPU_UTIL"}
        assert len(listed) == 48 - gone and (("node4", "5") in listed) is not gone
        assert twin.sample_table().num_rows == sum(1 for _ in twin.samples())
    # The forked writers learn which GPUs are gone too.
    for workers in (1, 2):
        write_run(
            Twin(sized_reference(6), seed=3, start=start, scenarios=[_LoseGpu(start + 30.0)]),
            tmp_path / str(workers),
            duration_s=60.0,
            workers=workers,
        )
    one = (tmp_path / "1" / "dcgm" / "node4.prom").read_text()
    assert one == (tmp_path / "2" / "dcgm" / "node4.prom").read_text()
    # The scrape at t0, then ticks at +10 ... +60 s: GPU 5 is in the first three only.
    assert one.count('DCGM_FI_DEV_GPU_UTIL{gpu="5"') == 3 and one.count('DCGM_FI_DEV_GPU_UTIL{gpu="4"') == 7


def test_checkpoints_carry_step_and_duration_and_the_last_one_before_t0_is_known() -> None:
    twin = Twin(reference_cluster(), seed=11)
    job = twin.training_job
    every = job.kind.checkpoint_interval_s
    found = []
    for _ in range(int(every / 10.0) + 1):
        twin.advance(10.0)
        found += [e for e in twin.events() if e.kind == "checkpoint" and e.attrs["job"] == job.id]
    before, during = found[0], found[1:]
    assert before.t <= twin.t0 and (before.t - job.start) % every == 0 and twin.t0 - before.t < every
    assert len(during) == 1 and during[0].t - before.t == pytest.approx(every, abs=10.0)
    for e in found:
        assert e.attrs["path"].endswith(f"/step_{e.attrs['step']}.pt") and e.attrs["duration_s"] > 0
    # Steps are counted as the twin counts them: about one per seed step time since the job began.
    assert during[0].attrs["step"] > before.attrs["step"] > 0
    assert twin.steps_done(job.id) >= during[0].attrs["step"]


def test_waiting_for_the_live_twin_returns_once_its_first_tick_is_in_the_store() -> None:
    store = Store(":memory:")
    live = LiveTwin(store, reference_cluster(), seed=0, start=1_800_000_000.0)
    try:
        assert live.start().wait_started(timeout_s=60)
        assert store.query("SELECT count(*) FROM samples")[0][0] > 0  # written before the wait returned
    finally:
        live.stop()


def test_waiting_for_a_live_twin_whose_first_tick_failed_raises_what_failed() -> None:
    class Failing(Store):
        def transaction(self):  # type: ignore[override]
            raise OSError("disk gone")

    live = LiveTwin(Failing(":memory:"), reference_cluster(), seed=0, start=1_800_000_000.0)
    with pytest.raises(OSError, match="disk gone"):
        live.start().wait_started(timeout_s=60)
    assert not live.running
