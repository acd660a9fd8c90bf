"""The remanence and RDMA detectors on real sequences of reads that neither we nor our twin wrote.

GPU: ``tests/data/h200/nvml_timeseries.csv``, NVML read every ~100 ms on one real H200 (driver 580.159.04) by
``recipes/h200_capture.py`` while it ran: 2 s idle, a 407M-parameter GPT trained for 37 steps, ``del model;
empty_cache()``, 2 s idle. Times are the capture host's wall clock (``time.time()``, UTC seconds); FB in MiB
(``memory.used // 2**20``, the unit of ``DCGM_FI_DEV_FB_USED``); utilisation in % (``DCGM_FI_DEV_GPU_UTIL``'s).
The CSV's rows become the dcgm-exporter samples the detector reads, with dcgm-exporter's labels.

InfiniBand: two captures of Chester Gillon's ibv_message_passing (MIT), ConnectX-2 (``mlx4_0``) HCAs at QDR,
read every 10 s on ``CLOCK_MONOTONIC`` (``clock_nanosleep`` to absolute times, ``Statistics after N seconds``):
``sysfs_counters_cx2_qdr_loopback_10s_ibv_message_passing.txt`` (the kernel's sysfs counters, what node-exporter
reads; ports 1 and 2 joined by a loopback cable; only non-zero counters are printed) and
``pma_counters_cx2_qdr_switch_10s_ibv_message_passing.txt`` (the ports' PMA counters over MADs, what ``perfquery
[-x]`` reads; an ``ibv_message_bw`` run to another PC through an Infiniscale-IV switch). Data counters are in
4-byte words in both (perfquery(8): "components that represent Data (e.g. PortXmitData and PortRcvData) indicate
octets divided by 4"; the kernel's sysfs-class-infiniband ABI says the same of ``port_xmit_data``); the rates
below are worked out by hand from two values and two times.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import orjson
import pyarrow as pa
import pytest

from hpcwatch import vocab
from hpcwatch.records import Finding, Job, Sample
from hpcwatch.security import rdma
from hpcwatch.security.rdma import RdmaSeries, detect_rdma, detect_rdma_series
from hpcwatch.security.remanence import (
    FB_USED,
    GPU_UTIL,
    GpuSeries,
    RemanenceConfig,
    detect_remanence,
    detect_remanence_series,
)
from hpcwatch.sources.infiniband import parse_perfquery

DATA = Path(__file__).resolve().parents[1] / "data"

# -- the H200 series ------------------------------------------------------------------------------------------

NVML = DATA / "h200" / "nvml_timeseries.csv"
HOST = "h200-capture"  # the capture names no host: ours
JOB = "4242"


def _rows() -> list[tuple[float, float, float]]:
    """(t, gpu_util %, fb_used MiB) of each NVML read, in file order (time order)."""
    with NVML.open() as f:
        return [(float(r["t_unix"]), float(r["gpu_util"]), float(r["fb_used_mib"])) for r in csv.DictReader(f)]


ROWS = _rows()
UUID = "GPU-75d41c9c-c88d-f13f-2c5b-d3c423e9d7cc"  # the CSV's uuid column

# Where the job starts and ends, read from the data (and pinned, so that a changed file is noticed):
#  - start: the first read whose FB leaves the idle level of the first read (2701 MiB -> 3165 MiB at
#    1795990499.948: the training process's CUDA context appears, +464 MiB). Slurm starts a job before its
#    process touches the GPU; any start at or before this read holds the whole training.
#  - release: the read where FB falls below that idle level (31853 -> 1491 MiB at 1795990507.186): ``del model;
#    empty_cache()``, the process gives its memory back.
#  - end: the read after the last non-zero utilisation (59 % at 1795990507.286 and .386, after the release:
#    NVML's utilisation is the share of its last sample period with work on the GPU, here the teardown of the
#    freed memory). From 1795990507.487 on, utilisation stays 0 to the end of the file.
IDLE_BEFORE_MIB = ROWS[0][2]
START = next(t for t, _, fb in ROWS if fb != IDLE_BEFORE_MIB)
PEAK_AT = max(range(len(ROWS)), key=lambda i: ROWS[i][2])
RELEASE = next(t for t, _, fb in ROWS[PEAK_AT:] if fb < IDLE_BEFORE_MIB)
LAST_BUSY = max(i for i, (_, util, _) in enumerate(ROWS) if util > 0)
END = ROWS[LAST_BUSY + 1][0]
HELD_MIB = next(fb for t, _, fb in reversed(ROWS) if t < RELEASE)  # the training's FB just before the release

# A 100 ms capture holds 1.6 s after the job's end: the watch starts 0.5 s after the end (default 10 s, for
# dcgm-exporter's 1-30 s scrapes); the other thresholds are the defaults (256 MiB margin, 5 % busy).
CONFIG = RemanenceConfig(after_s=0.5)


def test_the_job_is_read_from_the_data() -> None:
    assert (IDLE_BEFORE_MIB, START, RELEASE, END, HELD_MIB) == (
        2701.0,
        1795990499.948,
        1795990507.186,
        1795990507.487,
        31853.0,
    )
    # Utilisation: 0 before the context, 98-100 % through the timed steps, 0 after END.
    assert all(u == 0 for t, u, _ in ROWS if t < START) and all(u == 0 for t, u, _ in ROWS if t >= END)
    assert sum(1 for t, u, _ in ROWS if START <= t < END and u >= 98) == 36


def _job(end: float = END) -> Job:
    return Job(
        id=JOB,
        user="alice",
        nodes=(HOST,),
        gpus=1,
        gpus_by_node={HOST: (0,)},
        start=START,
        end=end,
        state="COMPLETED",
    )


def _labels(job: str = "") -> dict[str, str]:
    """dcgm-exporter's labels (tests/data/prometheus/dcgm_exporter_node1.prom), ``hpc_job`` while the Slurm
    prolog's mapping file names the job."""
    labels = {"gpu": "0", "UUID": UUID, "device": "nvidia0", "modelName": "NVIDIA H200", "Hostname": HOST}
    return {**labels, "hpc_job": job} if job else labels


def _samples(*, labelled_until: float | None = END, fb_from_release: float | None = None) -> list[Sample]:
    """The CSV's reads as dcgm-exporter samples: each read's FB and utilisation. ``labelled_until``: the reads
    from START to that time carry ``hpc_job`` (None: no read does). ``fb_from_release``: the FB of every read
    from RELEASE on, as if the process had not freed its memory."""
    with_job, without = _labels(JOB), _labels()  # one labels mapping per series, as the store's readers give
    out = []
    for t, util, fb in ROWS:
        labels = with_job if labelled_until is not None and START <= t <= labelled_until else without
        if fb_from_release is not None and t >= RELEASE:
            fb = fb_from_release
        out += [
            Sample(metric=FB_USED, labels=labels, t=t, value=fb),
            Sample(metric=GPU_UTIL, labels=labels, t=t, value=util),
        ]
    return out


def _kept(samples: list[Sample], *, table: bool) -> GpuSeries:
    """The samples fed to a live scan's ``GpuSeries`` in four reads (records, or a store's table of JSON labels)."""
    series = GpuSeries()
    cut = [0, len(samples) // 5, len(samples) // 2, 3 * len(samples) // 4, len(samples)]
    for lo, hi in zip(cut, cut[1:]):
        part = samples[lo:hi]
        if table:
            series.add_table(
                pa.table(
                    {
                        "metric": [s.metric for s in part],
                        "labels": [orjson.dumps(dict(s.labels)).decode() for s in part],
                        "t": [s.t for s in part],
                        "value": [s.value for s in part],
                    }
                )
            )
        else:
            series.add(part)
    return series


def _both_paths(samples: list[Sample], jobs: list[Job], config: RemanenceConfig = CONFIG) -> list[Finding]:
    """The batch path's findings, after checking that the kept-window path fed in reads finds the same."""
    batch = detect_remanence(samples, jobs, config=config)
    for table in (False, True):
        assert detect_remanence_series(_kept(samples, table=table), jobs, config=config) == batch
    return batch


def test_training_under_its_labelled_job_is_no_finding() -> None:
    assert _both_paths(_samples(), [_job()]) == []


def test_the_same_busy_reads_with_no_job_are_work_nobody_scheduled() -> None:
    """No job record, no ``hpc_job`` label: every read over 5 % is work on a GPU nobody holds."""
    (finding,) = _both_paths(_samples(labelled_until=None), [])
    busy = [(t, u) for t, u, _ in ROWS if u > 5]
    assert finding.rule == "remanence.busy_no_job" and finding.target == f"{HOST}/0"
    # First busy read: 16 % at 1795990501.151 (the first forward); peak 100 %; 46 reads over 5 % (4 warm-up,
    # 38 training, 2 at 10 % after the profiler, 2 at 59 % during the teardown).
    assert finding.t == finding.evidence["first_t"] == busy[0][0] == 1795990501.151
    assert finding.evidence["peak_util_pct"] == 100.0
    assert finding.evidence["samples"] == len(busy) == 46


def test_labels_alone_claim_the_reads() -> None:
    """dcgm-exporter's ``hpc_job`` label without the job's record (sacct not read yet): the reads are claimed."""
    assert _both_paths(_samples(), []) == []


def test_the_real_idle_after_the_job_is_no_memory_left() -> None:
    """After the release the GPU sits at 1491 MiB, 1210 MiB *below* the 2701 MiB idle before the job (NVML's
    ``used`` moves with the driver's own reservations: the idle level is not a constant). Nothing the job held is
    left: no finding, whether the reads are labelled or not."""
    after = {fb for t, _, fb in ROWS if t >= RELEASE}
    assert after == {1491.0} and IDLE_BEFORE_MIB - 1491.0 == 1210.0
    assert _both_paths(_samples(), [_job()]) == []
    assert _both_paths(_samples(labelled_until=None), [_job()]) == []


def test_the_training_memory_kept_after_the_end_is_memory_left() -> None:
    """The same reads with the FB of the last read before the release (31853 MiB) kept from the release on, as
    a process of the job left alive (a zombie after ``scancel``) would hold it."""
    samples = _samples(fb_from_release=HELD_MIB)
    (finding,) = _both_paths(samples, [_job()])
    watched = [t for t, _, _ in ROWS if END + CONFIG.after_s <= t <= END + CONFIG.window_s]
    assert finding.rule == "remanence.fb_after_job" and finding.target == f"{HOST}/0"
    # The first read in the watch: END + 0.5 s = 1795990507.987 -> the read at 1795990507.988, 0.501 s after END.
    assert finding.t == watched[0] == 1795990507.988
    # Baseline: the median FB of the reads no job held (21 idle reads at 2701 before START, 16 at 31853 after END:
    # the 19th of 37 is 2701), capped at the GPU's lowest read + 256 MiB (2701 + 256): 2701 MiB.
    assert finding.evidence["baseline_mib"] == IDLE_BEFORE_MIB == 2701.0
    assert finding.evidence["fb_used_mib"] == HELD_MIB == 31853.0
    assert finding.evidence["samples_over"] == len(watched) == 12
    assert finding.evidence["job"] == JOB and finding.evidence["job_end"] == END
    assert finding.title == f"{HOST}/0 still holds 29152 MiB 1 s after job {JOB} ended"  # 31853 - 2701 MiB


def test_memory_kept_is_not_seen_before_the_watch_starts() -> None:
    """With the default 10 s wait after the end, the 1.6 s this capture holds after the job are not watched."""
    assert _both_paths(_samples(fb_from_release=HELD_MIB), [_job()], RemanenceConfig()) == []


def test_the_teardown_after_a_whole_second_slurm_end_is_not_work_nobody_scheduled() -> None:
    """sacct gives End in whole seconds (1795990507 for a job whose GPU read busy until .386, then 59 % once more
    as the driver tore the process down): reads within ``after_s`` of a job's end are not yet work nobody
    scheduled. The same reads past a job that ended a second earlier are."""
    slurm_end = math.floor(END)  # 1795990507: sacct's End of a job that ended at .487
    assert _both_paths(_samples(labelled_until=slurm_end), [_job(slurm_end)]) == []
    early = _both_paths(_samples(labelled_until=slurm_end - 1), [_job(slurm_end - 1)])
    assert "remanence.busy_no_job" in [f.rule for f in early]  # and the 31,853 MiB then held: fb_after_job


def test_memory_kept_after_a_job_longer_than_the_window_is_memory_left() -> None:
    """A live scan reads every few seconds and forgets what left its window. Once the idle reads before the job
    have left it, the reads it holds are the training's and the zombie's: the node's idle baseline is the one
    its earlier scan measured (2,701 MiB), not the memory the zombie keeps."""
    samples = _samples(fb_from_release=HELD_MIB)
    series = GpuSeries()
    series.add([s for s in samples if s.t < 1795990502.0])  # the first scan: idle, then the training's start
    assert detect_remanence_series(series, [_job()], config=CONFIG) == []
    assert series.idle_mib == {HOST: IDLE_BEFORE_MIB}
    series.add([s for s in samples if s.t >= 1795990502.0])
    series.forget_before(1795990502.0)  # the window now starts during the training
    (finding,) = detect_remanence_series(series, [_job()], config=CONFIG)
    assert finding.rule == "remanence.fb_after_job"
    assert finding.evidence["baseline_mib"] == IDLE_BEFORE_MIB and finding.evidence["fb_used_mib"] == HELD_MIB
    # A scan that never saw the node idle (started during the job) has only the zombie's reads to compare with.
    started_late = GpuSeries.of([s for s in samples if s.t >= 1795990502.0])
    assert detect_remanence_series(started_late, [_job()], config=CONFIG) == []


# -- InfiniBand counters -----------------------------------------------------------------------------------------

T0 = 1_800_000_000.0  # the captures give seconds since their start (CLOCK_MONOTONIC): placed at T0
IB = DATA / "infiniband"
_STATS_RE = re.compile(r"Statistics after (\d+) seconds")
_SYSFS_RE = re.compile(r"(\w+)\s+(mlx4_\d+)\s+(\d+)\s+(\d+)(?:\(\+\d+\))?\s*\Z")
_PMA_RE = re.compile(r"(\w+)\s+\d+\s+(\d+)\s+(\d+)\s+(\d*)\s+(\d+)\s+(\d+)\s+(\d*)\s*\Z")


def _sysfs_reads() -> dict[int, dict[tuple[str, str], int]]:
    """The InfiniBand link-layer part of the sysfs capture: seconds -> (counter, port) -> value (words for data)."""
    text = (IB / "sysfs_counters_cx2_qdr_loopback_10s_ibv_message_passing.txt").read_text()
    text = text.split("with 10Gb Ethernet link-layer")[0]
    reads: dict[int, dict[tuple[str, str], int]] = {}
    for line in text.splitlines():
        if m := _STATS_RE.match(line):
            current = reads.setdefault(int(m.group(1)), {})
        elif m := _SYSFS_RE.match(line):
            current[(m.group(1), m.group(3))] = int(m.group(4))
    return reads


def _pma_reads(first: int, last: int) -> dict[int, dict[tuple[str, str, str], int | None]]:
    """Reads ``first`` and ``last`` of part 3 of the PMA capture: seconds -> (side, counter, port) -> value, side
    ``local`` (the HCA's ports, LIDs 2 and 3) or ``switch`` (LID 5's ports 1 and 2); None: not supported."""
    text = (IB / "pma_counters_cx2_qdr_switch_10s_ibv_message_passing.txt").read_text()
    reads: dict[int, dict[tuple[str, str, str], int | None]] = {}
    current: dict[tuple[str, str, str], int | None] | None = None
    for line in text.split("\n3. ")[1].split("\n4. ")[0].splitlines():
        if m := _STATS_RE.match(line):
            current = reads.setdefault(int(m.group(1)), {}) if int(m.group(1)) in (first, last) else None
        elif current is not None and (m := _PMA_RE.match(line)):
            name, port, _, local, rport, _, remote = m.groups()
            current[("local", name, port)] = int(local) if local else None
            current[("switch", name, rport)] = int(remote) if remote else None
    return reads


def _node_exporter(reads: dict[int, dict[tuple[str, str], int]], host: str) -> list[Sample]:
    """node-exporter's infiniband collector over these sysfs files: the data counters x 4 (bytes, since
    node_exporter PR #579), the constraint counters as read (not printed by the capture: 0)."""
    names = {
        "port_xmit_data": (vocab.NODE_INFINIBAND_PORT_DATA_TRANSMITTED_BYTES_TOTAL, 4),
        "port_rcv_data": (vocab.NODE_INFINIBAND_PORT_DATA_RECEIVED_BYTES_TOTAL, 4),
        "port_rcv_constraint_errors": (vocab.NODE_INFINIBAND_PORT_CONSTRAINT_ERRORS_RECEIVED_TOTAL, 1),
    }
    samples = []
    for seconds, counters in sorted(reads.items()):
        for port in ("1", "2"):
            labels = {"instance": f"{host}:9100", "device": "mlx4_0", "port": port}
            for counter, (metric, scale) in names.items():
                value = counters.get((counter, port), 0)
                samples.append(Sample(metric=metric, labels=labels, t=T0 + seconds, value=float(value * scale)))
    return samples


def _perfquery_text(counters: dict[tuple[str, str, str], int | None], side: str, lid: str, port: str) -> str:
    """One port's PMA read written as ``perfquery`` prints it (a PortCounters block, then PortCountersExtended
    for the 64-bit data counters: the data counters here pass 2^32), for the reader under test."""
    errors = ("PortRcvRemotePhysicalErrors", "PortXmitConstraintErrors", "PortRcvConstraintErrors")
    data = ("PortXmitData", "PortRcvData", "PortXmitPkts", "PortRcvPkts")
    lines = [f"# Port counters: Lid {lid} port {port}"]
    lines += [f"{name}:{'.' * (33 - len(name))}{counters[(side, name, port)]}" for name in errors]
    lines += [f"# Port extended counters: Lid {lid} port {port} (CapMask: 0x0000)"]
    lines += [f"{name}:{'.' * (33 - len(name))}{counters[(side, name, port)]}" for name in data]
    return "\n".join(lines) + "\n"


def _perfquery_samples(first: int = 1970, last: int = 1980) -> list[Sample]:
    """Part 3's two reads through ``sources.infiniband.parse_perfquery``: the HCA's ports (``cx2-host``, LIDs 2
    and 3) and the switch's ports facing them (``infiniscale-iv``, LID 5)."""
    samples = []
    for seconds, counters in sorted(_pma_reads(first, last).items()):
        for side, node, lids in (("local", "cx2-host", ("2", "3")), ("switch", "infiniscale-iv", ("5", "5"))):
            for port, lid in zip(("1", "2"), lids):
                text = _perfquery_text(counters, side, lid, port)
                samples += parse_perfquery(text, node=node, device="mlx4_0", t=T0 + seconds)
    return samples


def test_the_captures_are_sequences_of_the_same_ports() -> None:
    sysfs = _sysfs_reads()
    assert sorted(sysfs) == [80, 90, 100]  # one port pair, three reads 10 s apart
    pma = _pma_reads(1970, 1980)
    assert sorted(pma) == [1970, 1980]
    # The capture's own deltas agree with the values: port_xmit_data of port 1, 80 -> 90 s: "+4118992475".
    assert sysfs[90][("port_xmit_data", "1")] - sysfs[80][("port_xmit_data", "1")] == 4118992475


def test_sysfs_rates_are_the_words_times_4_over_the_10_s() -> None:
    """By hand, from the capture's values (words): 80 -> 90 s, port 1 xmit 4118992475 + rcv 4159806221, port 2
    xmit 4159808376 + rcv 4119007695 = 16557614767 words, x 4 / 10 s = 6623045906.8 B/s; 90 -> 100 s:
    4205842292 + 4205843417 + 4205842292 + 4205823989 = 16823351990 words -> 6729340796.0 B/s (QDR 4x carries
    32 Gb/s of data: 4 GB/s a direction; these are ~1.7 GB/s a port and direction)."""
    samples = _node_exporter(_sysfs_reads(), "cx2-loopback")
    rates = RdmaSeries.of(samples).host_rates()
    assert rates == {
        "cx2-loopback": {T0 + 90: (pytest.approx(6623045906.8), 10.0), T0 + 100: (pytest.approx(6729340796.0), 10.0)}
    }
    kept = RdmaSeries()
    for seconds in (80, 90, 100):  # a live scan reads each scrape as it comes
        kept.add([s for s in samples if s.t == T0 + seconds])
    assert kept.host_rates() == rates
    assert detect_rdma_series(kept) == detect_rdma(samples)


def test_sysfs_traffic_with_no_job_is_flagged_and_a_single_node_job_is_asked_for_its_reason() -> None:
    samples = _node_exporter(_sysfs_reads(), "cx2-loopback")
    (no_job,) = detect_rdma(samples)
    assert no_job.rule == "rdma.traffic_no_job" and no_job.target == "cx2-loopback"
    assert no_job.evidence["peak_bytes_per_s"] == pytest.approx(6729340796.0)  # 90 -> 100 s, above
    assert no_job.evidence["first_t"] == T0 + 90 and no_job.evidence["intervals"] == 2
    assert no_job.evidence["bytes"] == pytest.approx(4 * (16557614767 + 16823351990))
    # Under a job holding the node (the loopback test ran on one host: a one-node job), the traffic is the job's:
    # no traffic_no_job. A one-node job's collectives stay inside the node, and no Lustre I/O explains 6.7 GB/s
    # over InfiniBand: traffic_unexplained, as its rule says.
    job = Job(id="7", user="chester", nodes=("cx2-loopback",), gpus=0, start=T0, end=T0 + 200, state="COMPLETED")
    (unexplained,) = detect_rdma(samples, [job])
    assert unexplained.rule == "rdma.traffic_unexplained" and unexplained.evidence["jobs"] == ["7"]
    assert unexplained.evidence["peak_bytes_per_s"] == pytest.approx(6729340796.0)


def test_perfquery_reads_give_the_rate_a_human_computes() -> None:
    """Part 3, local HCA, 1970 -> 1980 s (words): port 1 xmit 1605205345808 - 1597197454784 = 8007891024, rcv
    152271973 - 151510921 = 761052; port 2 xmit 2465274 - 2464914 = 360, rcv 25395430363 - 25395430003 = 360.
    8008652796 words x 4 / 10 s = 3203461118.4 B/s: 25.6 Gb/s on a QDR link, 4088 bytes a packet over port 1's
    7834653 packets (4096-byte MTU). Read as bytes (not words), it would be 6.4 Gb/s and 1022 bytes a packet."""
    samples = _perfquery_samples()
    xmit = [s for s in samples if s.metric == vocab.IB_PORTXMITDATA_BYTES and s.labels["node"] == "cx2-host"]
    assert [s.value for s in xmit if s.labels["port"] == "1"] == [4 * 1597197454784, 4 * 1605205345808]
    rates = RdmaSeries.of(samples).host_rates()
    assert rates["cx2-host"] == {T0 + 1980: (pytest.approx(3203461118.4), 10.0)}
    packets = 1570480231 - 1562645578  # port 1's PortXmitPkts, same reads
    assert 4 * 8007891024 / packets == pytest.approx(4088.4, abs=0.1)


def test_perfquery_traffic_with_no_job_is_flagged_and_under_the_job_is_not() -> None:
    samples = _perfquery_samples()
    # The switch's ports carry the same 3.2 GB/s and are flagged too (``infiniscale-iv``): a switch is no compute
    # node, but RdmaConfig has no way to say so (storage_hosts aside). Only the HCA's findings are looked at here.
    no_job = [f for f in detect_rdma(samples) if f.target == "cx2-host"]
    assert [f.rule for f in no_job] == ["rdma.traffic_no_job"]
    assert no_job[0].evidence["peak_bytes_per_s"] == pytest.approx(3203461118.4)
    # ibv_message_bw ran between this PC and another one (part 2 of the capture): a two-node job. Its other node's
    # counters were not captured: no peer to compare with, no finding.
    job = Job(id="8", user="chester", nodes=("cx2-host", "peer-pc"), gpus=0, start=T0, end=T0 + 2000)
    assert [f for f in detect_rdma(samples, [job]) if f.target.startswith("cx2-host")] == []
    # The job's window is widened by job_grace_s (30 s) at both ends: a job that ended 31 s before the first read
    # no longer covers it.
    gone = Job(id="9", user="chester", nodes=("cx2-host", "peer-pc"), gpus=0, start=T0, end=T0 + 1970 - 31)
    assert [f.rule for f in detect_rdma(samples, [gone]) if f.target == "cx2-host"] == ["rdma.traffic_no_job"]


def test_a_real_error_rise_is_told_from_counters_that_stayed() -> None:
    """Between 1970 and 1980 s the switch port facing the HCA's port 1 counted one PortRcvRemotePhysicalErrors
    (0 -> 1: the packet ``pckt_drop`` corrupted); the constraint counters (P_Key enforcement) of every port
    stayed 0. A corrupted packet is a link fault, not a partition violation: no P_Key finding, and the constraint
    counters are held and seen not to rise."""
    samples = _perfquery_samples()
    physical = [
        (s.labels["node"], s.labels["port"], s.value) for s in samples if s.metric == "ib_PortRcvRemotePhysicalErrors"
    ]
    assert ("infiniscale-iv", "1", 0.0) in physical and ("infiniscale-iv", "1", 1.0) in physical
    assert not rdma.reads_metric("ib_PortRcvRemotePhysicalErrors")
    series = RdmaSeries.of(samples)
    held = {(host, metric) for host, metric, _ in series.keys["errors"]}
    assert held == {
        (node, metric)
        for node in ("cx2-host", "infiniscale-iv")
        for metric in ("ib_PortRcvConstraintErrors", "ib_PortXmitConstraintErrors")
    }
    assert series.rises() == {}
    assert not [f for f in detect_rdma(samples) if f.rule in ("rdma.pkey_violation", "rdma.remote_access_error")]
