"""Twin physics (issue 15, item 8): what happens after a lost GPU, where RDMA bytes go, when Lustre moves,
what the cooling does to temperatures, and which collectors the live twin feeds.

Every check reads the twin through the formats it writes (squeue/sacct JSON, perfquery, job_stats,
dcgm-exporter text) and hpcwatch's own readers, as a real cluster would be read.
"""

from __future__ import annotations

import orjson
import pytest

from hpcwatch.ingest import ingest_paths
from hpcwatch.model import reference_cluster
from hpcwatch.records import Event
from hpcwatch.reports.goodput import goodput_report
from hpcwatch.security.scan import scan_store
from hpcwatch.sources.slurm import parse_sacct_json, parse_sacct_records, parse_squeue_json
from hpcwatch.store import Store, queries
from hpcwatch.twin import Twin
from hpcwatch.twin.failures import SCENARIO_ONSET_S, Xid79
from hpcwatch.twin.live import LiveTwin
from hpcwatch.twin.run import sized_reference, write_run
from hpcwatch.vocab import EventKind

T0 = 1_796_000_000.0


def _run(twin: Twin, seconds: int, dt: float = 1.0) -> list:
    events = []
    for _ in range(int(seconds / dt)):
        twin.advance(dt)
        events += twin.events()
    return events


@pytest.fixture(scope="module")
def xid_twin():
    """The xid79 twin followed tick by tick until its job runs again: (twin, events, per-tick states)."""
    twin = Twin(reference_cluster(), seed=0, scenarios=["xid79"], start=T0)
    job = twin.training_job
    events, seen = [], []
    restart_at = SCENARIO_ONSET_S + Xid79.TEARDOWN_S + Xid79.REBOOT_S
    for _ in range(int(restart_at) + 60):
        twin.advance(1.0)
        events += twin.events()
        squeue = {j.id: j for j in parse_squeue_json(twin.squeue_json())}
        doc = orjson.loads(twin.squeue_json())
        raw = next(j for j in doc["jobs"] if str(j["job_id"]) == job.id)
        seen.append(
            (twin.now - T0, squeue[job.id].state, raw["restart_cnt"], raw["state_reason"], twin.steps_done(job.id))
        )
    return twin, events, seen


def test_xid79_stops_the_job_at_the_xid(xid_twin):
    twin, events, seen = xid_twin
    (failure,) = [e for e in events if e.kind == EventKind.FAILURE]
    (xid,) = [e for e in events if e.kind == EventKind.XID]
    assert failure.t == xid.t and failure.attrs["job"] == twin.training_job.id
    # From the XID until Slurm requeues it, the job makes no step (a synchronous job cannot lose a rank).
    steps_while_dying = {s for t, state, _, _, s in seen if xid.t - T0 <= t < xid.t - T0 + Xid79.TEARDOWN_S}
    assert steps_while_dying == {failure.attrs["step"]}


def test_xid79_job_is_requeued_while_its_node_reboots_then_runs_again(xid_twin):
    _, events, seen = xid_twin
    states = [(state, cnt, reason) for _, state, cnt, reason, _ in seen]
    assert states[0] == ("RUNNING", 0, "None")
    # Requeued: same id, restart_cnt 1, waiting for the drained node (squeue's reason as Slurm words it).
    assert ("PENDING", 1, "ReqNodeNotAvail, UnavailableNodes:node2") in states
    assert states[-1] == ("RUNNING", 1, "None")
    (requeued,) = [e for e in events if e.kind == EventKind.JOB_END and e.attrs.get("state") == "REQUEUED"]
    assert requeued.attrs["start"] == pytest.approx(T0 - 7200.0)  # the lost attempt's start, as sacct -D keeps it
    pending_s = sum(1 for _, state, *_ in seen if state == "PENDING")
    assert pending_s == pytest.approx(Xid79.REBOOT_S, abs=2)


def test_xid79_job_restarts_from_its_last_checkpoint(xid_twin):
    _twin, events, seen = xid_twin
    (failure,) = [e for e in events if e.kind == EventKind.FAILURE]
    (restore,) = [e for e in events if e.kind == EventKind.CHECKPOINT_RESTORE]
    saves = [e for e in events if e.kind == EventKind.CHECKPOINT and e.t <= failure.t]
    assert restore.attrs["step"] == saves[-1].attrs["step"] < failure.attrs["step"]
    assert restore.attrs["path"] == saves[-1].attrs["path"] and restore.attrs["duration_s"] > 0
    # After the restart the step counter went back to the checkpoint and climbs again.
    after = [s for t, state, cnt, _, s in seen if cnt == 1 and state == "RUNNING"]
    assert after[0] == restore.attrs["step"] and after[-1] > after[0]


def test_sacct_of_the_twin_reads_back_the_requeued_job(xid_twin):
    twin, _, _ = xid_twin
    lost, job = [j for j in parse_sacct_json(twin.sacct_json()) if j.id == twin.training_job.id]
    assert lost.state == "REQUEUED" and job.state == "RUNNING"  # one record an attempt, as real Slurm lists them
    assert job.start > T0 + SCENARIO_ONSET_S  # Slurm resets the start of a requeued job


def test_sacct_of_the_twin_keeps_the_lost_attempt_as_real_sacct_does(xid_twin):
    twin, _, _ = xid_twin
    records = list(parse_sacct_records(twin.sacct_json()))
    (attempt,) = [r for r in records if isinstance(r, Event) and r.kind == EventKind.JOB_END]
    assert attempt.attrs["job"] == twin.training_job.id and attempt.attrs["nodes"] == ["node1", "node2"]
    assert attempt.attrs["start"] < T0  # it began before the twin's clock did
    # Slurm requeues it once torchrun has torn it down, at the first 1 s tick after
    assert attempt.attrs["end"] == pytest.approx(T0 + SCENARIO_ONSET_S + Xid79.TEARDOWN_S, abs=1.0)


def test_a_requeued_jobs_lost_attempt_explains_its_infiniband_traffic(tmp_path):
    """twin run --scenario xid79, ingested and scanned as a user would: the multi-node job's first attempt
    carried the InfiniBand traffic before the XID; sacct's REQUEUED record says it held both nodes, so the
    RDMA detector finds nothing unexplained (it raised two false findings when only the last attempt was read)."""
    out, store_dir = tmp_path / "out", tmp_path / "store"
    write_run(Twin(sized_reference(), seed=0, scenarios=["xid79"]), out, duration_s=600.0, step_s=10.0)
    polled_again = tmp_path / "sacct-later.json"  # a later poll: other bytes, the same lost attempt
    polled_again.write_text((out / "slurm" / "sacct.json").read_text() + "\n")
    with Store(store_dir) as store:
        ingest_paths(store, [out, polled_again])
        findings = scan_store(store)
        assert queries.requeue_counts(store) == {"4101": 1}
    assert [f.rule for f in findings if f.vector == "rdma_blind_spot"] == []


def test_goodput_from_files_counts_the_requeue_and_the_steps_run_again(tmp_path):
    """Read back from files only (sacct, spans): no failure or checkpoint event exists, yet sacct's REQUEUED
    record is the interruption, and the step the restart resumed at says what the lost attempt had saved."""
    out = tmp_path / "out"
    write_run(Twin(sized_reference(), seed=0, scenarios=["xid79"]), out, duration_s=600.0, step_s=10.0, spans=True)
    with Store(tmp_path / "store") as store:
        ingest_paths(store, [out])
        report = goodput_report(store, "4101")
        (requeued_at,) = [e.attrs["end"] for e in store.events(EventKind.JOB_END) if e.attrs.get("job") == "4101"]
        steps = {(sp.step, sp.start < requeued_at) for sp in store.spans("4101")}
    resumed = min(step for step, before in steps if not before)
    run_again = {step for step, before in steps if before and step >= resumed}
    assert report.interruptions == 1 and report.interruptions_by_cause == {"requeued": 1}
    assert run_again and report.lost_steps == len(run_again)
    assert any(f"resumed at step {resumed}" in note for note in report.notes)


def test_goodput_counts_the_steps_redone_since_the_checkpoint_and_the_restart(tmp_path):
    store = Store(":memory:")
    live = LiveTwin(store, reference_cluster(), scenarios=["xid79"], start=T0)
    live.write_tick()
    for _ in range(int(SCENARIO_ONSET_S + Xid79.TEARDOWN_S + Xid79.REBOOT_S) + 60):
        live.step()
    events = store.events()
    (failure,) = [e for e in events if e.kind == EventKind.FAILURE]
    (save,) = [e for e in events if e.kind == EventKind.CHECKPOINT and e.t <= failure.t]
    report = goodput_report(store, "4101")
    assert report.interruptions == 1 and report.interruptions_by_cause == {"faulty_gpu": 1}
    # Lost: the steps since the save (they are done again after the restart); within 2 %, as the steps the
    # twin did not trace are credited at the ideal (mean) step time, not the slowest rank's.
    assert report.badput_s["lost_progress"] == pytest.approx(failure.t - save.t - save.attrs["duration_s"], rel=0.02)
    assert report.lost_steps >= 1
    # Recovery: teardown + the node's reboot + start-up; restore: the checkpoint read back.
    assert report.badput_s["recovery"] >= Xid79.TEARDOWN_S + Xid79.REBOOT_S
    assert report.badput_s["checkpoint_restore"] > 0
    # Judged from the job's first attempt (two hours before the twin started), not from its restart.
    assert report.t0 == pytest.approx(T0 - 7200.0)


# -- RDMA: what one node transmits another receives -------------------------------------------------------


def _fabric_bytes(twin: Twin) -> tuple[float, float]:
    """Σ PortXmitData and Σ PortRcvData (bytes) over every HCA of the cluster, read from perfquery -x."""
    from hpcwatch.sources.infiniband import parse_perfquery

    tx = rx = 0.0
    for node in twin.node_names:
        for hca in range(len(twin.ports_of_node(node))):
            for s in parse_perfquery(twin.perfquery_text(node, hca), node=node):
                tx += s.value if s.metric == "ib_PortXmitData_bytes" else 0.0
                rx += s.value if s.metric == "ib_PortRcvData_bytes" else 0.0
    return tx, rx


@pytest.mark.parametrize("scenarios", [(), ("straggler",)])
def test_every_byte_a_node_transmits_another_receives(scenarios):
    twin = Twin(reference_cluster(), seed=3, scenarios=scenarios, start=T0)
    tx0, rx0 = _fabric_bytes(twin)
    _run(twin, 60)
    tx1, rx1 = _fabric_bytes(twin)
    assert tx1 - tx0 > 1e9  # the ring moved gigabytes...
    assert tx1 - tx0 == pytest.approx(rx1 - rx0, rel=1e-9)  # ...and every one of them arrived somewhere


def test_threat_rdma_sends_bytes_no_cluster_port_receives():
    twin = Twin(reference_cluster(), seed=3, scenarios=["threat_rdma"], start=T0)
    (scenario,) = twin.scenarios
    tx0, rx0 = _fabric_bytes(twin)
    _run(twin, 60)
    tx1, rx1 = _fabric_bytes(twin)
    exfiltrated = scenario.exfiltrated_bytes()
    assert exfiltrated > 1e9
    # The imbalance of the fabric is the exfiltration: it left for a port outside the cluster.
    assert (tx1 - tx0) - (rx1 - rx0) == pytest.approx(exfiltrated, rel=1e-6)


# -- Lustre: reads follow the loader and the step rate, writes are the checkpoints --------------------------


def _lustre_bytes(twin: Twin, job: str) -> tuple[float, float]:
    """(read, write) bytes of ``job`` summed over the OSTs of ``lctl get_param obdfilter.*.job_stats``."""
    from hpcwatch import vocab
    from hpcwatch.sources.lustre import parse_job_stats

    read = write = 0.0
    for s in parse_job_stats(twin.lustre_job_stats_text()):
        if s.labels.get("jobid") != job:
            continue
        read += s.value if s.metric == vocab.LUSTRE_JOB_READ_BYTES_TOTAL else 0.0
        write += s.value if s.metric == vocab.LUSTRE_JOB_WRITE_BYTES_TOTAL else 0.0
    return read, write


def _lustre_deltas(twin: Twin, job: str, seconds: int, dt: float = 1.0) -> list[tuple[float, float, float]]:
    """Per tick: (t - T0, bytes read, bytes written) by ``job``."""
    out, last = [], _lustre_bytes(twin, job)
    for _ in range(int(seconds / dt)):
        twin.advance(dt)
        now = _lustre_bytes(twin, job)
        out.append((twin.now - T0, now[0] - last[0], now[1] - last[1]))
        last = now
    return out


def test_lustre_writes_only_at_checkpoints_one_burst_of_the_job_state():
    from hpcwatch.twin.workload import KINDS

    twin = Twin(reference_cluster(), seed=0, start=T0)
    job = twin.training_job
    deltas = _lustre_deltas(twin, job.id, 960, dt=5.0)
    bursts = [(t, w) for t, _, w in deltas if w > 0]
    # The job started 7200 s before T0 and saves every 900 s: its next save is at T0 + 900, nothing between.
    assert [t for t, _ in bursts] == [900.0]
    assert bursts[0][1] == pytest.approx(KINDS["pretrain"].checkpoint_bytes_per_gpu * job.gpus, rel=1e-6)


def test_lustre_reads_follow_the_step_rate():
    plain, slow = (Twin(reference_cluster(), seed=0, scenarios=s, start=T0) for s in ((), ("straggler",)))
    _run(plain, 60), _run(slow, 60)  # past the straggler's onset
    read_plain = sum(r for _, r, _ in _lustre_deltas(plain, "4101", 30))
    read_slow = sum(r for _, r, _ in _lustre_deltas(slow, "4101", 30))
    assert read_slow < read_plain
    # Bytes per step are the same: the loader reads one batch a step, however long the step takes.
    assert read_slow / read_plain == pytest.approx(_rate(slow) / _rate(plain), rel=0.05)


def _rate(twin: Twin) -> float:
    before = twin.steps_done("4101")
    _run(twin, 10)
    return twin.steps_done("4101") - before


def test_lustre_reads_stop_with_the_failed_job_and_restart_with_its_checkpoint():
    twin = Twin(reference_cluster(), seed=0, scenarios=["xid79"], start=T0)
    deltas = _lustre_deltas(twin, "4101", int(SCENARIO_ONSET_S + Xid79.TEARDOWN_S + Xid79.REBOOT_S) + 40)
    before = [r for t, r, _ in deltas if t < SCENARIO_ONSET_S]
    dead = [r for t, r, _ in deltas if SCENARIO_ONSET_S + 1 < t <= SCENARIO_ONSET_S + Xid79.TEARDOWN_S]
    pending = [
        r
        for t, r, _ in deltas
        if SCENARIO_ONSET_S + Xid79.TEARDOWN_S + 1 < t < SCENARIO_ONSET_S + Xid79.TEARDOWN_S + Xid79.REBOOT_S
    ]
    restarted = [r for t, r, _ in deltas if t > SCENARIO_ONSET_S + Xid79.TEARDOWN_S + Xid79.REBOOT_S + 1]
    assert min(before) > 0 and max(dead) == 0 and max(pending) == 0
    # After the restart the job reads its checkpoint back (2 GiB a GPU in under a second): one burst.
    from hpcwatch.twin.workload import KINDS

    assert max(restarted) > KINDS["pretrain"].checkpoint_bytes_per_gpu * 12 > 20 * max(before)
    assert all(w == 0 for _, _, w in deltas)


# -- cooling: what sets the temperatures -----------------------------------------------------------------


def _cluster_cooled(cooling: str) -> Cluster:  # noqa: F821 -- imported inside, the annotation is a string
    from importlib import resources

    from hpcwatch.model.cluster import parse_cluster

    text = resources.files("hpcwatch.model").joinpath("reference.yaml").read_text()
    head, _, _ = text.partition("cooling:")
    return parse_cluster(head + cooling, path="cooled.yaml")


def _busy_temps(cluster) -> tuple[list[float], list[float]]:
    """(temperatures, SM clocks) of the busy GPUs after five minutes, read from the dcgm-exporter text."""
    from hpcwatch import vocab
    from hpcwatch.sources.prometheus_text import parse_prometheus_text

    twin = Twin(cluster, seed=0, start=T0)
    _run(twin, 300)
    temps, clocks = [], []
    for node in twin.node_names:
        for s in parse_prometheus_text(twin.dcgm_text(node)):
            if "hpc_job" not in s.labels:
                continue
            (
                temps
                if s.metric == vocab.DCGM_FI_DEV_GPU_TEMP
                else clocks
                if s.metric == vocab.DCGM_FI_DEV_SM_CLOCK
                else []
            ).append(s.value)
    return temps, clocks


def test_the_reference_cluster_is_liquid_cooled_and_stays_below_60_c():
    from hpcwatch.model import reference_cluster as ref

    assert ref().cooling.kind == "liquid" and ref().cooling.inlet_c == 28.0
    temps, _ = _busy_temps(ref())
    # The fit of the real H200 capture: 56 °C at 680 W; never near the 89 °C slowdown.
    assert min(temps) >= 30 and max(temps) <= 60


def test_air_cooling_runs_the_same_load_hotter():
    liquid, _ = _busy_temps(_cluster_cooled("cooling:\n  kind: liquid\n"))
    air, clocks = _busy_temps(_cluster_cooled("cooling:\n  kind: air\n"))
    assert max(air) > max(liquid) + 15
    assert 70 <= max(air) < 89 and min(clocks) > 1500  # hot but not thermally throttled at a 25 °C inlet


def test_a_hot_air_inlet_brings_the_gpus_to_their_slowdown_and_halves_their_clocks():
    temps, clocks = _busy_temps(_cluster_cooled("cooling:\n  kind: air\n  inlet_c: 40\n"))
    assert max(temps) >= 89
    assert min(clocks) <= 1980 * 0.5 + 1


@pytest.mark.parametrize(
    "cooling, message",
    [
        ("cooling:\n  kind: water\n", "cooling.kind: unknown cooling 'water'"),  # not a kind we model
        ("cooling:\n  kind: air\n  inlet_c: 90\n", "cooling.inlet_c: expected degrees C"),  # no data centre is that hot
        ("cooling:\n  kind: air\n  inlet_c: warm\n", "cooling.inlet_c"),  # not a number
        ("cooling:\n  kind: air\n  fans: 6\n", "cooling.fans: unknown key"),  # a key the model does not read
    ],
)
def test_bad_cooling_is_one_line_naming_file_line_and_key(cooling, message):
    from hpcwatch.errors import ConfigError

    with pytest.raises(ConfigError, match=r"cooled\.yaml:") as err:
        _cluster_cooled(cooling)
    assert message in str(err.value) and "\n" not in str(err.value)


# -- the live twin feeds every collector of the Observer view -----------------------------------------------


def test_perfquery_samples_are_what_the_reader_makes_of_the_perfquery_text():
    from hpcwatch.sources.infiniband import parse_perfquery
    from hpcwatch.twin.exposition import hca_device, perfquery_samples

    twin = Twin(reference_cluster(), seed=0, start=T0)
    _run(twin, 5)
    read = []
    for node in twin.node_names:
        for hca in range(len(twin.ports_of_node(node))):
            read += parse_perfquery(twin.perfquery_text(node, hca), node=node, device=hca_device(hca), t=twin.now)
    assert list(perfquery_samples(twin)) == read


def test_checkpoint_tetragon_events_are_what_the_reader_makes_of_their_json():
    from hpcwatch.records import Event
    from hpcwatch.sources import tetragon
    from hpcwatch.twin import ebpf

    assert (ebpf.MAY_READ, ebpf.MAY_WRITE) == (tetragon.MAY_READ, tetragon.MAY_WRITE)
    saved = Event(kind=EventKind.CHECKPOINT, t=T0, source="twin", attrs={"job": "4101", "path": "/lustre/c/s.pt"})
    docs = ebpf.checkpoint_access_docs(saved, nodes=("node1", "node2"), user="alice", uid=1001)
    lines = [orjson.dumps(d) for d in docs]
    read = list(tetragon.parse_tetragon_json(lines))
    mine = ebpf.events_of(docs, EventKind.TETRAGON)
    assert [(e.t, e.attrs) for e in mine] == [(e.t, {k: e.attrs.get(k) for k in mine[0].attrs}) for e in read]
    assert {e.attrs["host"] for e in read} == {"node1", "node2"} and {e.attrs["mask"] for e in read} == {2}


@pytest.mark.parametrize("scenario", [None, "straggler", "xid79", "threat_rdma"])
def test_the_live_twin_feeds_all_seven_collectors(scenario):
    from hpcwatch.reports.live import COLLECTORS, latest_t, live_snapshot

    store = Store(":memory:")
    live = LiveTwin(store, reference_cluster(), scenarios=[scenario] if scenario else [], start=T0)
    live.write_tick()
    for _ in range(15):
        live.step()
    snap = live_snapshot(store, weights_path=reference_cluster().weights.path, now=latest_t(store))
    assert len(COLLECTORS) == 7
    silent = [c for c, state in snap["collectors"].items() if not state["arriving"]]
    assert silent == []
    # perfquery's counters reached the store under the reader's names, every 10 s of simulated time.
    assert len({s.t for s in store.iter_samples("ib_PortXmitData_bytes")}) == 2
    tetragon = [e for e in store.events(EventKind.TETRAGON) if e.attrs.get("function_name")]
    assert tetragon and all(e.attrs["path"].startswith("/lustre/checkpoints/4101/") for e in tetragon)


def test_the_page_header_says_how_the_cluster_is_cooled():
    from fastapi.testclient import TestClient

    from hpcwatch.web.app import create_app

    for cluster, lang, text in (
        (reference_cluster(), "en", "liquid-cooled, 28 °C inlet"),
        (_cluster_cooled("cooling:\n  kind: air\n  inlet_c: 22.5\n"), "fr", "refroidi par air, entrée à 22.5 °C"),
    ):
        with TestClient(create_app(Store(":memory:"), cluster)) as client:
            html = client.get("/", params={"lang": lang}).text
        assert f'data-cooling="{cluster.cooling.kind}">{text}</span>' in html


def test_the_live_queue_counts_a_requeued_jobs_restarts():
    from hpcwatch.reports.live import latest_t, live_snapshot

    store = Store(":memory:")
    live = LiveTwin(store, reference_cluster(), scenarios=["xid79"], start=T0, tick_s=1.0, speed=5.0)
    live.write_tick()
    for _ in range(int((SCENARIO_ONSET_S + Xid79.TEARDOWN_S) / 5) + 2):
        live.step()
    snap = live_snapshot(store, weights_path="/lustre/checkpoints", now=latest_t(store))
    (row,) = [j for j in snap["queue"]["jobs"] if j["id"] == "4101"]
    assert row["state"] == "PENDING" and row["restarts"] == 1
    assert {j["restarts"] for j in snap["queue"]["jobs"] if j["id"] != "4101"} == {0}


def test_perfquery_table_holds_the_perfquery_samples():
    from hpcwatch.schemas import sample_keys
    from hpcwatch.twin.exposition import perfquery_samples, perfquery_table

    twin = Twin(reference_cluster(), seed=0, start=T0)
    _run(twin, 3)
    rows = perfquery_table(twin).to_pylist()
    samples = list(perfquery_samples(twin))
    assert len(rows) == len(samples) == 16 * 22
    for row, s in zip(rows, samples):
        assert (row["metric"], row["t"], row["value"], orjson.loads(row["labels"])) == (
            s.metric,
            s.t,
            s.value,
            s.labels,
        )
        assert (row["host"], row["gpu"], row["job"]) == sample_keys(s.labels, s.metric)


def test_slowdown_temperature_is_the_one_the_real_h200_reports():
    """nvidia-smi -q -x of a real H200 (tests/data/nvidia_smi): the current temperature, its distance to
    T.Limit and the slowdown threshold past T.Limit give the temperature the catalog slows the clocks at."""
    from pathlib import Path
    from xml.etree import ElementTree

    from hpcwatch.model.catalog import GPU_SLOWDOWN_TEMP_C

    xml = Path(__file__).parents[1] / "data" / "nvidia_smi" / "nvidia_smi_q.xml"
    temp = ElementTree.parse(xml).getroot().find("gpu/temperature")

    def celsius(tag: str) -> float:
        return float(temp.findtext(tag).removesuffix(" C"))

    t_limit = celsius("gpu_temp") + celsius("gpu_temp_tlimit")
    assert t_limit - celsius("gpu_temp_slow_tlimit_threshold") == GPU_SLOWDOWN_TEMP_C["h200"] == 89.0


def test_a_restarted_job_raises_no_finding_of_its_own():
    """The requeued job's earlier attempt still explains its traffic and checkpoint writes (the twin's store keeps
    one record per job, started at its first attempt), so the detectors stay quiet through the restart."""
    from hpcwatch.security.scan import rescan

    store = Store(":memory:")
    live = LiveTwin(store, reference_cluster(), scenarios=["xid79"], start=T0)
    live.write_tick()
    for _ in range(int(SCENARIO_ONSET_S + Xid79.TEARDOWN_S + Xid79.REBOOT_S) + 60):
        live.step()
    rescan(store)
    assert store.job("4101").start == pytest.approx(T0 - 7200.0) and store.job("4101").state == "RUNNING"
    assert [f.rule for f in store.findings()] == []
    # The Tetragon reads of the checkpoint at the restart are the owner's, on its nodes.
    reads = [e for e in store.events(EventKind.TETRAGON) if e.attrs.get("mask") == 4]
    assert {e.attrs["host"] for e in reads} == {"node1", "node2"}


def test_the_per_job_arrays_grow_when_a_job_joins_between_starts_and_ends():
    """16 nodes with an XID requeue: a 69th job reached the scheduler while the per-job arrays held 68 rows,
    and tick 6 stopped with an IndexError (found while splitting the Twin)."""
    from hpcwatch.twin import Twin
    from hpcwatch.twin.run import sized_reference

    twin = Twin(sized_reference(16), seed=5, scenarios=("xid79", "ib_flap", "gpu_straggler"))
    for _ in range(30):
        twin.advance(20.0)
    assert len(twin.scheduler.jobs) > 68 and twin.sample_table().num_rows > 0
