"""The criteria: one table, each row a ClusterMAX criterion and a pure rule over ``Evidence``.

Categories and ids follow ClusterMAX 2.0's public criteria (https://www.clustermax.ai/criteria) and the
ids of its audit CLI (SemiAnalysisAI/ClusterMAX ``cmax/scripts/1-audit/criteria-checks.json``, anchors from
``cmax/criteria_links.py``), read as facts. Where ClusterMAX publishes no threshold, the rule says the
threshold is ours and why.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from hpcwatch import vocab
from hpcwatch.analysis.goodputsim import (
    LLAMA3_DAYS,
    LLAMA3_GPUS,
    LLAMA3_INTERRUPTIONS,
    GoodputSimConfig,
    simulate_goodput,
)
from hpcwatch.analysis.health import HealthConfig, active_checks
from hpcwatch.analysis.mfu import compute_mfu
from hpcwatch.assess import versions
from hpcwatch.assess.evidence import PASSIVE_FIELDS, Evidence
from hpcwatch.assess.model import Criterion, NotAssessable, Verdict
from hpcwatch.model.catalog import gpu_spec

__all__ = [
    "CRITERIA",
    "CATEGORIES",
    "NOT_ASSESSABLE",
    "CRITERIA_URL",
    "STEADY_GAP_FACTOR",
    "ATTRIBUTION_MIN_SHARE",
    "PORT_RATE_TOLERANCE",
    "HOPPER_IDLE_POWER_W",
    "FORCED_NCCL_VARIABLES",
    "REFERENCE_MFU",
    "MFU_WARN_SHARE",
    "BUSBW_PASS_SHARE",
    "BusbwBounds",
    "busbw_bounds",
    "GOODPUT_WARN_POINTS",
]

CRITERIA_URL = "https://www.clustermax.ai/criteria"
_A = CRITERIA_URL + "#"
CATEGORIES = ("monitoring", "reliability", "performance", "networking", "security", "idle thermals")

#: A GPU's cadence is steady when its longest gap between samples is under this many times its median
#: gap (ours: 3 x tolerates one or two lost scrapes around a restart, not a silent hour).
STEADY_GAP_FACTOR = 3.0
#: Per-job attribution must cover this share of allocated GPU-seconds (issue 14's figure, ours: with
#: 10 s scrapes it leaves room for the first and last scrape of each job).
ATTRIBUTION_MIN_SHARE = 0.99
#: A port's ibstat rate may differ from the catalog's by this share (ours: ibstat prints the signalling
#: rate exactly, 400 for NDR; the tolerance only absorbs a float).
PORT_RATE_TOLERANCE = 0.01
#: Hopper idle power ceiling used by ClusterMAX's collectors (cmax parity test KNOWN_GAPS note:
#: "per-class idle power ceilings (Hopper 150 W, Blackwell SXM 250 W, Grace-Blackwell 300 W)").
HOPPER_IDLE_POWER_W = 150.0
_IDLE_POWER_W = {"h100-sxm": HOPPER_IDLE_POWER_W, "h200": HOPPER_IDLE_POWER_W, "b200": 250.0}
#: The variables ClusterMAX wants left to NCCL's own tuning (criterion "NCCL_MIN_NCHANNELS, NCCL_PROTO,
#: NCCL_ALGO not set: auto configuration").
FORCED_NCCL_VARIABLES = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS")
#: The one published MFU reference point (docs/reference.md, "MFU": measured on an H200): GPT 407M, d 1024, L 24, T 2048.
REFERENCE_MFU = {("h200", 24, 1024, 2048): 0.404}
#: Measured MFU under this share of the reference warns, under half fails (ours).
MFU_WARN_SHARE = 0.9
#: nccl-tests all-reduce busbw at or over this share of the catalog figure passes, over the health
#: check's warn share (analysis/health.py busbw_warn_fraction) warns, under it fails (pass share ours).
BUSBW_PASS_SHARE = 0.8
#: Goodput up to this many points under the simulator's prediction for the same size warns (ours).
GOODPUT_WARN_POINTS = 5.0


def _v(status, evidence, records=(), **figures) -> Verdict:
    return Verdict(status=status, evidence=evidence, figures=figures, records=tuple(records))


def _names(items, limit: int = 6) -> str:
    items = sorted(str(i) for i in items)
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


# -- monitoring ------------------------------------------------------------------------------------------------


def _slurm_gpu_nodes(ev: Evidence) -> set[str]:
    return {n for j in ev.jobs for n in (j.gpus_by_node or {})} | {n for j in ev.jobs if j.gpus for n in j.nodes}


def dcgm_steady(ev: Evidence) -> Verdict:
    rec = [f"samples {vocab.DCGM_FI_DEV_GPU_UTIL}", "jobs"]
    if not ev.cadence:
        return _v("unknown", "no DCGM samples in the store", rec)
    missing = _slurm_gpu_nodes(ev) - {c.host for c in ev.cadence}
    # one scrape has no interval: whether its gaps are long is not known, so it is neither gappy nor steady
    once = [c for c in ev.cadence if c.samples < 2 or c.median_gap_s is None or c.longest_gap_s is None]
    # (GPU, median gap, longest gap) of the others, both gaps known
    timed = [
        (c, c.median_gap_s, c.longest_gap_s)
        for c in ev.cadence
        if c.samples >= 2 and c.median_gap_s is not None and c.longest_gap_s is not None
    ]
    gappy = [c for c, median, longest in timed if longest > STEADY_GAP_FACTOR * (median or math.inf)]
    figures = dict(
        gpus=len(ev.cadence),
        median_interval_s=statistics.median(median for _, median, _ in timed) if timed else None,
        longest_gap_s=max((longest for _, _, longest in timed), default=None),
        nodes_without_dcgm=sorted(missing),
        gpus_with_gaps=[f"{c.host}/{c.gpu}" for c in gappy][:20],
        gpus_interval_unknown=[f"{c.host}/{c.gpu}" for c in once][:20],
    )
    what = [f"Slurm GPU nodes without DCGM samples: {_names(missing)}"] if missing else []
    if gappy:
        what.append(
            f"{len(gappy)} GPUs with a gap over {STEADY_GAP_FACTOR:g}x their interval "
            f"({_names(figures['gpus_with_gaps'])})"
        )
    unknown = (
        f"{len(once)} GPUs scraped once: interval unknown ({_names(figures['gpus_interval_unknown'])})" if once else ""
    )
    if what:
        return _v("fail", "; ".join(what + ([unknown] if unknown else [])), rec, **figures)
    if once:
        steady = f"; {len(timed)} GPUs steady every {figures['median_interval_s']:.0f} s" if timed else ""
        return _v("unknown", unknown + steady, rec, **figures)
    return _v(
        "pass",
        f"{len(ev.cadence)} GPUs every {figures['median_interval_s']:.0f} s, longest gap "
        f"{figures['longest_gap_s']:.0f} s",
        rec,
        **figures,
    )


def gpu_attribution(ev: Evidence) -> Verdict:
    rec = ["jobs (gpus_by_node)", f"samples {vocab.DCGM_FI_DEV_GPU_UTIL} hpc_job"]
    interval = statistics.median([c.median_gap_s for c in ev.cadence if c.median_gap_s] or [0.0])
    allocated = covered = 0.0
    for j in ev.jobs:
        if j.start is None or not j.gpus_by_node or ev.t0 is None or ev.t1 is None:  # t0, t1 None together
            continue
        start, end = max(j.start, ev.t0), min(j.end if j.end is not None else ev.t1, ev.t1)
        if end <= start:
            continue
        for node, gpus in j.gpus_by_node.items():
            for g in gpus:
                allocated += end - start
                n, _a, _b = ev.job_gpu_seconds.get((j.id, node, str(g)), (0, 0.0, 0.0))
                covered += min(end - start, n * interval)  # samples x interval: a silent hour counts 0
    if allocated <= 0 or interval <= 0:
        return _v("unknown", "no job with GPU indices (gpus_by_node) overlaps the DCGM samples", rec)
    share = covered / allocated
    status = "pass" if share >= ATTRIBUTION_MIN_SHARE else "fail"
    return _v(
        status,
        f"{share:.1%} of {allocated / 3600:.1f} allocated GPU-hours carry the job's hpc_job label "
        f"(want >= {ATTRIBUTION_MIN_SHARE:.0%})",
        rec,
        share=share,
        allocated_gpu_s=allocated,
    )


def xid_collected(ev: Evidence) -> Verdict:
    rec = [f"samples {vocab.DCGM_FI_DEV_XID_ERRORS}"]
    gpus = {(c.host, c.gpu) for c in ev.cadence}
    if not gpus:
        return _v("unknown", "no DCGM samples in the store", rec)
    without = sorted(f"{h}/{g}" for h, g in gpus if vocab.DCGM_FI_DEV_XID_ERRORS not in ev.presence.get((h, g), ()))
    if without:
        return _v(
            "fail",
            f"{len(without)} of {len(gpus)} GPUs export no XID field: {_names(without)}",
            rec,
            gpus_without_xid=without[:50],
        )
    return _v("pass", f"DCGM_FI_DEV_XID_ERRORS on all {len(gpus)} GPUs", rec)


def passive_fields(ev: Evidence) -> Verdict:
    rec = ["samples " + ", ".join(m for group in PASSIVE_FIELDS.values() for m in group)]
    gpus = {(c.host, c.gpu) for c in ev.cadence}
    if not gpus:
        return _v("unknown", "no DCGM samples in the store", rec)
    lacking: dict[str, list[str]] = defaultdict(list)
    for h, g in sorted(gpus):
        have = ev.presence.get((h, g), frozenset())
        for name, group in PASSIVE_FIELDS.items():
            if not have.intersection(group):
                lacking[name].append(f"{h}/{g}")
    if lacking:
        return _v(
            "fail",
            "missing " + "; ".join(f"{k} on {len(v)} GPUs" for k, v in lacking.items()),
            rec,
            missing={k: v[:20] for k, v in lacking.items()},
        )
    return _v("pass", f"ECC, row remap, PCIe replay and clock-event fields on all {len(gpus)} GPUs", rec)


def sacct_covers(ev: Evidence) -> Verdict:
    rec = ["jobs", f"samples {vocab.DCGM_FI_DEV_GPU_UTIL} hpc_job"]
    if not ev.sample_jobs:
        return _v("unknown", "no GPU samples carry a job label", rec)
    known = {j.id for j in ev.jobs}
    unknown = sorted(set(ev.sample_jobs) - known)
    if unknown:
        return _v(
            "fail",
            f"{len(unknown)} of {len(ev.sample_jobs)} jobs seen on GPUs have no accounting record: {_names(unknown)}",
            rec,
            jobs_without_record=unknown[:50],
        )
    return _v("pass", f"all {len(ev.sample_jobs)} jobs seen on GPUs have an accounting record", rec)


# -- reliability -----------------------------------------------------------------------------------------------


def _config(ev: Evidence, key: str) -> str | None:
    if ev.slurm_config is None:
        return None
    value = ev.slurm_config.attrs.get("params", {}).get(key)
    return None if value in (None, "", "(null)") else str(value)


def healthcheck_program(ev: Evidence) -> Verdict:
    rec = ["events slurm_config (scontrol show config)"]
    if ev.slurm_config is None:
        return _v("unknown", "no `scontrol show config` in the store", rec)
    program = _config(ev, "HealthCheckProgram")
    interval = _config(ev, "HealthCheckInterval")
    if program is None:
        return _v("fail", "HealthCheckProgram is not set", rec, HealthCheckProgram=None)
    dcgm = any(e.kind == vocab.EventKind.DCGM_DIAG for e in ev.active_events)
    status = "pass" if dcgm else "warn"
    why = "" if dcgm else "; no dcgmi diag result in the store shows it runs DCGM checks"
    return _v(
        status,
        f"HealthCheckProgram = {program} every {interval or '?'}{why}",
        rec,
        HealthCheckProgram=program,
        HealthCheckInterval=interval,
    )


def active_checks_recent(ev: Evidence) -> Verdict:
    rec = ["events dcgm_diag, nccl_test, ib_write_bw"]
    nodes = {c.host for c in ev.cadence} | _slurm_gpu_nodes(ev)
    if not ev.active_events or ev.t1 is None:
        return _v("unknown", "no dcgmi diag, nccl-tests or ib_write_bw result in the store", rec)
    since = ev.t1 - ev.config.active_check_days * 86_400.0
    recent = [e for e in ev.active_events if e.t >= since]
    checks = active_checks(recent, link=ev.cluster.fabric.link.key)
    failing = sorted({c.node for c in checks if c.verdict == "drain"})
    covered = {str(e.attrs.get("node")) for e in recent if e.kind == vocab.EventKind.DCGM_DIAG}
    uncovered = sorted(nodes - covered)
    figures = dict(days=ev.config.active_check_days, failing_nodes=failing, nodes_without_recent_diag=uncovered)
    if failing:
        return _v("fail", f"active checks fail on {_names(failing)}", rec, **figures)
    if uncovered:
        return _v(
            "fail", f"no dcgmi diag within {ev.config.active_check_days:g} days on {_names(uncovered)}", rec, **figures
        )
    return _v(
        "pass",
        f"dcgmi diag passed on all {len(nodes)} nodes within {ev.config.active_check_days:g} days",
        rec,
        **figures,
    )


def drained_return(ev: Evidence) -> Verdict:
    return _v(
        "unknown",
        "the store holds no node-state history (drain / resume times) to match against the "
        "checks that preceded each resume",
        ["(none: needs sinfo / scontrol show node history)"],
    )


_LLAMA3_PER_1000_GPU_DAYS = sum(LLAMA3_INTERRUPTIONS.values()) / (LLAMA3_GPUS * LLAMA3_DAYS) * 1000.0


def interruption_rate(ev: Evidence) -> Verdict:
    rec = ["events failure", f"samples {vocab.DCGM_FI_DEV_GPU_UTIL} (exposure)"]
    gpu_days = sum(c.last_t - c.first_t for c in ev.cadence) / 86_400.0
    n = len(ev.failures)
    figures = dict(interruptions=n, gpu_days=gpu_days, reference_per_1000_gpu_days=_LLAMA3_PER_1000_GPU_DAYS)
    # ours: below the exposure at which the Llama 3 rate expects one interruption, zero proves nothing.
    needed = 1000.0 / _LLAMA3_PER_1000_GPU_DAYS
    if gpu_days < needed:
        return _v(
            "unknown",
            f"{n} interruptions over {gpu_days:.2f} GPU-days: too little exposure to compare with "
            f"Llama 3's {_LLAMA3_PER_1000_GPU_DAYS:.2f} per 1,000 GPU-days (needs "
            f"{needed:,.0f} GPU-days)",
            rec,
            **figures,
        )
    rate = n / gpu_days * 1000.0
    status = "pass" if rate <= _LLAMA3_PER_1000_GPU_DAYS else "fail"
    return _v(
        status,
        f"{rate:.2f} interruptions per 1,000 GPU-days (Llama 3: {_LLAMA3_PER_1000_GPU_DAYS:.2f})",
        rec,
        rate_per_1000_gpu_days=rate,
        **figures,
    )


def goodput_vs_twin(ev: Evidence) -> Verdict:
    rec = ["spans", "events failure, checkpoint_save, checkpoint_restore"]
    report = ev.goodput
    if report is None or report.total_s <= 0:
        return _v("unknown", "no training job with steps in the store", rec)
    gpus = next((j.gpus for j in ev.jobs if j.id == report.job and j.gpus), None) or 8
    run = simulate_goodput(GoodputSimConfig(gpus=gpus, days=max(report.total_s / 86_400.0, 1e-3)))
    measured, predicted = report.goodput * 100.0, run.goodput * 100.0
    status = "pass" if measured >= predicted else "warn" if measured >= predicted - GOODPUT_WARN_POINTS else "fail"
    return _v(
        status,
        f"job {report.job}: goodput {measured:.1f} % vs {predicted:.1f} % the failure simulator "
        f"predicts for {gpus} GPUs over {report.total_s / 3600:.2f} h",
        rec,
        goodput_pct=measured,
        predicted_pct=predicted,
        job=report.job,
        gpus=gpus,
    )


# -- performance -----------------------------------------------------------------------------------------------


def _gpu_key(ev: Evidence) -> str | None:
    specs = {spec for m in ev.gpu_models if (spec := gpu_spec(m)) is not None}
    if len(specs) == 1:
        return next(iter(specs)).key
    nodes = ev.cluster.nodes
    return nodes[0].gpus[0].spec.key if nodes and nodes[0].gpus else None


def mfu_reference(ev: Evidence) -> Verdict:
    rec = ["spans (step walls)"]
    shape = ev.config.model
    if not ev.step_walls_s:
        return _v("unknown", "no training steps in the store", rec)
    step_s = statistics.median(ev.step_walls_s)
    if shape is None:
        return _v(
            "unknown",
            f"median step {step_s * 1000:.1f} ms, but MFU needs the model shape (--params, --layers, "
            "--d-model, --seq, --tokens-per-step)",
            rec,
            step_s=step_s,
        )
    key = _gpu_key(ev) or "h100-sxm"
    gpus = sum(len(n.gpus) for n in ev.cluster.nodes) or 1
    result = compute_mfu(
        params=shape.params,
        layers=shape.layers,
        d_model=shape.d_model,
        seq=shape.seq,
        tokens_per_step=shape.tokens_per_step,
        step_time_s=step_s,
        gpus=gpus,
        gpu=key,
    )
    ref = REFERENCE_MFU.get((key, shape.layers, shape.d_model, shape.seq))
    if ref is None:
        return _v(
            "unknown",
            f"MFU {result.mfu:.1%}; no published reference for this GPU and model size (docs/reference.md "
            "has one point: GPT 407M on H200, 40.4 %)",
            rec,
            mfu=result.mfu,
            step_s=step_s,
        )
    status = "pass" if result.mfu >= MFU_WARN_SHARE * ref else "warn" if result.mfu >= ref / 2 else "fail"
    return _v(status, f"MFU {result.mfu:.1%} vs the reference {ref:.1%}", rec, mfu=result.mfu, reference=ref)


def nccl_busbw(ev: Evidence) -> Verdict:
    rec = ["events nccl_test"]
    runs = [
        e
        for e in ev.nccl_tests
        if "all" in str(e.attrs.get("collective", "")).lower().replace("_", "")
        and "reduce" in str(e.attrs.get("collective", "")).lower()
    ]
    if not runs:
        return _v("unknown", "no nccl-tests all_reduce_perf result in the store", rec)
    worst = None
    for e in runs:
        rows = e.attrs.get("rows") or []
        bounds = busbw_bounds(e, ev)
        if not rows or bounds is None:
            continue
        top = max(rows, key=lambda r: r["size_bytes"])
        busbw = max(top.get("oop_busbw_gbs") or 0.0, top.get("ip_busbw_gbs") or 0.0)
        ratio = busbw / bounds.expected_gbs
        if worst is None or ratio < worst[0]:
            worst = (ratio, busbw, bounds, e)
    if worst is None:
        return _v("unknown", "nccl-tests results without a GPU model, a rail count or size rows to compare", rec)
    ratio, busbw, b, e = worst
    hosts = len(e.attrs.get("hosts") or [])
    figures = dict(
        busbw_gbs=busbw,
        expected_gbs=b.expected_gbs,
        ceiling_gbs=b.ceiling_gbs,
        basis=b.basis,
        share=min(ratio, 1.0),  # a share of the bound: never over 100 %; above it is said in words
        above_expected=ratio > 1.0,
        above_ceiling=busbw > b.ceiling_gbs,
    )
    where = f"{b.basis}, {hosts} host{'s' if hosts != 1 else ''}"
    if busbw > b.ceiling_gbs:
        return _v(
            "warn",
            f"all-reduce busbw {busbw:.0f} GB/s exceeds the {b.ceiling_gbs:.0f} GB/s no algorithm can beat on "
            f"{where}: the expectation is wrong (more rails or a faster link than the cluster model says)",
            rec,
            **figures,
        )
    if ratio > 1.0:
        return _v(
            "pass",
            f"all-reduce busbw {busbw:.0f} GB/s is above the {b.expected_gbs:.0f} GB/s a ring can reach on "
            f"{where} (in-switch reduction, NVLS / SHARP, at work); under the {b.ceiling_gbs:.0f} GB/s ceiling",
            rec,
            **figures,
        )
    warn_share = HealthConfig().busbw_warn_fraction
    status = "pass" if ratio >= BUSBW_PASS_SHARE else "warn" if ratio >= warn_share else "fail"
    return _v(
        status,
        f"all-reduce busbw {busbw:.0f} GB/s = {ratio:.0%} of {b.expected_gbs:.0f} GB/s ({where})",
        rec,
        **figures,
    )


@dataclass(frozen=True, slots=True)
class BusbwBounds:
    expected_gbs: float
    """What a ring all-reduce can reach: the bottleneck bandwidth (nccl-tests PERFORMANCE.md's busbw)."""
    ceiling_gbs: float
    """What no all-reduce can beat, even with the reduction done in the switch."""
    basis: str


def _rails(e, ev: Evidence) -> int:
    """The HCAs per node of the run's hosts in the cluster model (the fewest: a ring is as fast as its slowest
    node); every model node when the hosts are not in the model."""
    by_name = {n.name: n.hcas for n in ev.cluster.nodes}
    named = [by_name[h] for h in (e.attrs.get("hosts") or []) if h in by_name]
    return min(named or list(by_name.values()) or [0])


def busbw_bounds(e, ev: Evidence) -> BusbwBounds | None:
    """The busbw an nccl-tests all-reduce of ``e`` can reach on this cluster (None: GPU model or rails unknown).

    nccl-tests reports busbw = algbw x 2(n-1)/n for n ranks: the bytes each rank moves per second in a ring
    (doc/PERFORMANCE.md), so it is bounded by the ring's bottleneck link, whatever n. Inside one node that is
    NVLink, one direction. Across nodes each of NCCL's rings leaves a node through one NIC and enters through
    another, and the rings are spread over the node's R rails, so each NIC carries 2(n-1)/n x S / R bytes and
    busbw <= R x per-rail rate (8 x 400 Gb/s = 400 GB/s per node, not one 50 GB/s link). A reduction done in
    the switch (NVLS in the NVSwitch, SHARP in the IB switch) moves each byte once each way: algbw <= that same
    bandwidth, so busbw <= bandwidth x 2(n-1)/n, the ceiling nothing beats. NVIDIA's reading of real runs agrees
    ("With 8 400 Gbps NICs your peak would be at 400 GB/s"; 2-node runs above it are "an aberration", the tree's
    ideal case: https://github.com/NVIDIA/nccl-tests/issues/309).
    """
    spec = gpu_spec(str(e.attrs.get("gpu_model") or ""))
    if spec is None:
        return None
    n = int(e.attrs.get("nranks") or 0)
    factor = 2 * (n - 1) / n if n > 1 else 1.0
    if len(e.attrs.get("hosts") or []) <= 1:
        nvlink = spec.nvlink_bandwidth_bytes_s / 2 / 1e9
        return BusbwBounds(expected_gbs=nvlink, ceiling_gbs=nvlink * factor, basis="NVLink one direction")
    rails = _rails(e, ev)
    if rails <= 0:
        return None
    link = ev.cluster.fabric.link
    expected = rails * link.rate_bits_s / 8 / 1e9
    return BusbwBounds(
        expected_gbs=expected,
        ceiling_gbs=expected * factor,
        basis=f"{rails} rails x {link.rate_bits_s / 1e9:g} Gb/s {link.name}",
    )


# -- networking ------------------------------------------------------------------------------------------------


#: ibstat's "Link layer" per fabric kind of the cluster model: RoCE ports say Ethernet (their Rate is the
#: Ethernet speed, 200 / 400 GbE), InfiniBand ports InfiniBand (older ibstat prints no link layer: InfiniBand).
_ETHERNET_FABRICS = frozenset({"roce", "rocev2", "ethernet"})


def _layer(labels) -> str:
    return "Ethernet" if str(labels.get("link_layer") or "").lower() == "ethernet" else "InfiniBand"


def _fabric_layer(ev: Evidence) -> str:
    return "Ethernet" if ev.cluster.fabric.kind.strip().lower() in _ETHERNET_FABRICS else "InfiniBand"


def _fabric_ports(ev: Evidence):
    """The ibstat ports of the fabric the cluster model names, and the others (a RoCE NIC on an InfiniBand
    cluster, an IB HCA on a RoCE one): judged apart, never against the other fabric's expectation."""
    layer = _fabric_layer(ev)
    ours = [p for p in ev.port_rates if _layer(p[1]) == layer]
    others = [p for p in ev.port_rates if _layer(p[1]) != layer]
    return layer, ours, others


def _port_host(host, labels) -> str:
    return str(host or labels.get("node") or "(no host)")


def _port_name(host, labels) -> str:
    return f"{_port_host(host, labels)}/{labels.get('device')}"


def _others_note(others) -> str:
    """One clause naming the ports of the other link layer, reported and not judged."""
    if not others:
        return ""
    layer = "Ethernet (RoCE)" if _layer(others[0][1]) == "Ethernet" else "InfiniBand"
    ports = _names(f"{_port_name(h, lab)}: {v:g} Gb/s" for h, lab, v in others)
    return f"; {len(others)} {layer} port{'s' if len(others) != 1 else ''} reported apart, not judged: {ports}"


def _hcas_by_host(ports) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for host, labels, _ in ports:
        out[_port_host(host, labels)].add(str(labels.get("device")))
    return out


def hca_naming(ev: Evidence) -> Verdict:
    rec = [f"samples {vocab.IB_PORT_RATE_GBPS} (ibstat, link_layer label)"]
    if not ev.port_rates:
        return _v("unknown", "no ibstat in the store", rec)
    layer, ours, others = _fabric_ports(ev)
    note = _others_note(others)
    by_host = _hcas_by_host(ours)
    if not by_host:
        return _v("unknown", f"no {layer} port in ibstat{note}", rec)
    for host in _hcas_by_host(others):
        by_host.setdefault(host, set())  # a node with none of the fabric's HCAs fits no NCCL_IB_HCA list either
    names = {frozenset(v) for v in by_host.values()}
    if len(names) > 1:
        return _v(
            "fail",
            f"{layer} HCA names differ between nodes (an NCCL_IB_HCA list cannot fit all): "
            + "; ".join(f"{h}: {_names(v) or '(none)'}" for h, v in sorted(by_host.items())[:4])
            + note,
            rec,
        )
    return _v("pass", f"every node names its {layer} HCAs {_names(next(iter(names)))}{note}", rec)


def port_rate(ev: Evidence) -> Verdict:
    rec = [f"samples {vocab.IB_PORT_RATE_GBPS} (ibstat, link_layer label)"]
    if not ev.port_rates:
        return _v("unknown", "no ibstat in the store", rec)
    layer, ours, others = _fabric_ports(ev)
    note = _others_note(others)
    link = ev.cluster.fabric.link
    want = link.rate_bits_s / 1e9
    fabric = link.name if layer == "InfiniBand" else f"{ev.cluster.fabric.kind} at {want:g} GbE"
    figures = dict(want_gbps=want, link_layer=layer, fabric_ports=len(ours), other_ports=len(others))
    if not ours:
        return _v("unknown", f"no {layer} port in ibstat to compare with {fabric}{note}", rec, **figures)
    slow = sorted(
        f"{_port_name(h, lab)}: {v:g} Gb/s" for h, lab, v in ours if abs(v - want) > PORT_RATE_TOLERANCE * want
    )
    if slow:
        return _v(
            "fail",
            f"{len(slow)} of {len(ours)} {layer} ports not at {want:g} Gb/s ({fabric}): {_names(slow)}{note}",
            rec,
            slow_ports=slow,
            **figures,
        )
    return _v("pass", f"all {len(ours)} {layer} ports at {want:g} Gb/s ({fabric}){note}", rec, **figures)


def nccl_autoconfig(ev: Evidence) -> Verdict:
    rec = ["events of an NCCL_DEBUG log reader"]
    if ev.nccl_env is None:
        return _v("unknown", "unknown: no NCCL log in the store", rec)
    forced = sorted({f"{k}={v}" for _, env in ev.nccl_env for k, v in env.items() if k in FORCED_NCCL_VARIABLES})
    if forced:
        return _v("fail", f"forced: {_names(forced)}", rec, forced=forced)
    return _v("pass", f"none of {', '.join(FORCED_NCCL_VARIABLES)} set in {len(ev.nccl_env)} NCCL logs", rec)


def slurm_topology(ev: Evidence) -> Verdict:
    rec = ["events slurm_config (TopologyPlugin)"]
    if ev.slurm_config is None:
        return _v("unknown", "no `scontrol show config` in the store", rec)
    plugin = _config(ev, "TopologyPlugin")
    if plugin in (None, "topology/none", "topology/default", "topology/flat"):
        return _v(
            "fail",
            f"TopologyPlugin = {plugin or '(null)'}: the scheduler does not know the fabric",
            rec,
            TopologyPlugin=plugin,
        )
    return _v("pass", f"TopologyPlugin = {plugin}", rec, TopologyPlugin=plugin)


# -- security --------------------------------------------------------------------------------------------------


def pkey_default(ev: Evidence) -> Verdict:
    rec = ["events opensm_partitions"]
    if not ev.partitions:
        return _v("unknown", "no OpenSM partitions.conf in the store", rec)
    open_ = [
        p
        for e in ev.partitions
        for p in e.attrs.get("partitions", [])
        if str(p.get("pkey", "")).lower() in ("0x7fff", "32767")
        and any(m[0] in ("ALL", "ALL_CAS") and m[1] in ("full", "both", None) for m in p.get("members", []))
    ]
    if open_:
        return _v("fail", f"the default partition {open_[0].get('name')} gives every port full membership", rec)
    return _v("pass", "no default partition with full membership for all ports", rec)


def pkey_violations(ev: Evidence) -> Verdict:
    rec = ["samples node_infiniband_port_constraint_errors_*, ib_Port*ConstraintErrors"]
    if not ev.constraint_increase:
        return _v("unknown", "no IB constraint-error counters in the store", rec)
    bad = sorted({str(h) for _, h, inc in ev.constraint_increase if inc > 0})
    if bad:
        return _v("fail", f"P_Key constraint errors grew on {_names(bad)}", rec, hosts=bad)
    return _v("pass", f"constraint-error counters flat on {len(ev.constraint_increase)} series", rec)


def memory_scrub(ev: Evidence) -> Verdict:
    rec = ["events nvidia_params (/proc/driver/nvidia/params)"]
    if not ev.nvidia_params:
        return _v("unknown", "no /proc/driver/nvidia/params in the store", rec)
    off = sorted(
        {
            str(e.attrs.get("host"))
            for e in ev.nvidia_params
            if str(e.attrs.get("params", {}).get("RMDisableScrubOnFree", "0")).strip() not in ("0", "")
        }
    )
    if off:
        return _v(
            "fail", f"RMDisableScrubOnFree set on {_names(off)}: freed GPU memory is not scrubbed", rec, hosts=off
        )
    return _v("pass", f"scrub on free on all {len(ev.nvidia_params)} hosts read", rec)


def driver_minimum(ev: Evidence) -> Verdict:
    rec = [f"samples label {vocab.DCGM_FI_DRIVER_VERSION} (every metric: dcgm-exporter, nvidia-smi)"]
    if not ev.drivers:
        return _v("unknown", "no driver version in the store", rec)
    bad, unpatched, newer, unread = [], [], [], []
    newest_listed = max(int(b) for b in versions.DRIVER_BRANCH_MINIMUMS)
    for host, version in ev.drivers:
        name = f"{host or '(no host)'}: {version}"
        floor = versions.driver_floor(version)
        branch = version.strip().split(".", 1)[0]
        if floor is not None:
            ok = versions.at_least(version, floor)
            if ok is None:
                unread.append(name)
            elif not ok:
                bad.append(f"{name} < {floor}")
        elif not branch.isdigit():
            unread.append(name)
        elif int(branch) > newest_listed:
            newer.append(name)  # a branch released after the pinned table: its fixes are not known here
        else:
            unpatched.append(name)  # an older branch with no fixed release: NVIDIA no longer patches it
    src = versions.DRIVER_SOURCE
    branches = ", ".join(versions.DRIVER_BRANCH_MINIMUMS)
    what = []
    if bad:
        what.append(f"under their branch minimum: {_names(bad)}")
    if unpatched:
        what.append(f"unknown branch, older than the pinned table and without a fixed release: {_names(unpatched)}")
    if newer:
        what.append(f"unknown branch, newer than the pinned table: {_names(newer)}")
    if unread:
        what.append(f"not a version: {_names(unread)}")
    figures = dict(below=bad, unknown_branch=unpatched + newer, unreadable=unread, hosts=len(ev.drivers))
    if bad or unpatched:
        return _v("fail", f"drivers {'; '.join(what)} (branches {branches}; {src})", rec, **figures)
    if newer or unread:
        return _v("unknown", f"drivers {'; '.join(what)} (branches {branches}; {src})", rec, **figures)
    return _v("pass", f"{len(ev.drivers)} hosts at or above their branch minimum ({src})", rec, **figures)


def container_toolkit_minimum(ev: Evidence) -> Verdict:
    return _v(
        "unknown",
        f"no NVIDIA Container Toolkit version in the store (minimum "
        f"{versions.CONTAINER_TOOLKIT_MINIMUM}: {versions.CONTAINER_TOOLKIT_SOURCE})",
        ["(none: no reader of nvidia-ctk --version yet)"],
        minimum=versions.CONTAINER_TOOLKIT_MINIMUM,
    )


def detector_findings(ev: Evidence) -> Verdict:
    rec = ["findings (hpcwatch scan: six detectors)"]
    if ev.findings is None:
        return _v("unknown", "the detectors were not run", rec)
    if ev.t0 is None:  # "nothing found" over an empty store is not a clean bill of health
        return _v("unknown", "the store holds nothing for the detectors to read", rec)
    serious = [f for f in ev.findings if f.severity in ("critical", "high")]
    medium = [f for f in ev.findings if f.severity == "medium"]
    rules = sorted({f.rule for f in serious or medium})
    if serious:
        return _v("fail", f"{len(serious)} critical/high findings: {_names(rules)}", rec, rules=rules)
    if medium:
        return _v("warn", f"{len(medium)} medium findings: {_names(rules)}", rec, rules=rules)
    return _v("pass", f"no medium or worse finding ({len(ev.findings)} low/info)", rec)


# -- idle thermals ---------------------------------------------------------------------------------------------


def idle_power(ev: Evidence) -> Verdict:
    rec = [f"samples {vocab.DCGM_FI_DEV_POWER_USAGE} at scrapes with {vocab.DCGM_FI_DEV_GPU_UTIL} < 1 %"]
    rows = [r for r in ev.idle if r[2] == vocab.DCGM_FI_DEV_POWER_USAGE]
    if not rows:
        return _v("unknown", "no idle GPU scrapes in the store", rec)
    key = _gpu_key(ev)
    ceiling = _IDLE_POWER_W.get(key or "")
    worst = max(rows, key=lambda r: r[3])
    if ceiling is None:
        return _v(
            "unknown",
            f"highest idle power {worst[3]:.0f} W; no published idle ceiling for {key}",
            rec,
            max_idle_power_w=worst[3],
        )
    hot = sorted(f"{h}/{g}: {v:.0f} W" for h, g, _, v, _ in rows if v > ceiling)
    if hot:
        return _v("fail", f"{len(hot)} idle GPUs above {ceiling:.0f} W: {_names(hot)}", rec, ceiling_w=ceiling)
    return _v(
        "pass",
        f"{len(rows)} idle GPUs, highest {worst[3]:.0f} W (ceiling {ceiling:.0f} W)",
        rec,
        max_idle_power_w=worst[3],
        ceiling_w=ceiling,
    )


def idle_temperature(ev: Evidence) -> Verdict:
    rec = [f"samples {vocab.DCGM_FI_DEV_GPU_TEMP} at idle scrapes"]
    rows = [r for r in ev.idle if r[2] == vocab.DCGM_FI_DEV_GPU_TEMP]
    hottest = max((r[3] for r in rows), default=None)
    return _v(
        "unknown",
        "no published idle temperature figure to compare with (ClusterMAX's collectors record "
        "the idle maximum but grade none)" + (f"; highest idle {hottest:.0f} °C" if rows else ""),
        rec,
        max_idle_temp_c=hottest,
    )


# -- the table -------------------------------------------------------------------------------------------------

_HEALTH = _A + "monitoring-automated-active-and-passive-health-checks"


def _c(id_, category, title, reads, source, command, rule) -> Criterion:
    return Criterion(id=id_, category=category, title=title, reads=reads, source=source, command=command, rule=rule)


CRITERIA: tuple[Criterion, ...] = (
    _c(
        "monitoring-stack",
        "monitoring",
        "Every Slurm GPU node reports DCGM samples at a steady interval",
        "DCGM_FI_DEV_GPU_UTIL samples of every GPU, whole store; jobs' nodes",
        _A + "monitoring-out-of-the-box-detailed-managed-grafana",
        "hpcwatch top --db F",
        dcgm_steady,
    ),
    _c(
        "gpu-job-attribution",
        "monitoring",
        "Per-job GPU attribution covers >= 99 % of allocated GPU-seconds",
        "jobs' gpus_by_node and start/end; hpc_job label of DCGM samples",
        CRITERIA_URL + " (gpu-job-attribution)",
        "hpcwatch jobs --db F",
        gpu_attribution,
    ),
    _c(
        "xid-monitoring",
        "monitoring",
        "The XID field is collected on every GPU",
        "DCGM_FI_DEV_XID_ERRORS presence",
        CRITERIA_URL + " (xid-monitoring)",
        "hpcwatch top --db F",
        xid_collected,
    ),
    _c(
        "passive-health-fields",
        "monitoring",
        "Passive health fields present: ECC, row remap, PCIe replay, clock events",
        "DCGM field presence per GPU",
        _HEALTH,
        "hpcwatch health --db F",
        passive_fields,
    ),
    _c(
        "sacct-accounting",
        "monitoring",
        "sacct accounting covers every job seen in the GPU data",
        "jobs vs hpc_job labels",
        _A + "monitoring-sacct-integration-for-job-accounting-and-resource-utilization",
        "hpcwatch jobs --db F",
        sacct_covers,
    ),
    _c(
        "healthcheck-program",
        "reliability",
        "HealthCheckProgram set and running DCGM checks",
        "scontrol show config (newest); dcgmi diag results",
        _A + "monitoring-dcgm-health-checks-plugged-into-the-slurm-healthcheckprogram",
        "hpcwatch health --db F",
        healthcheck_program,
    ),
    _c(
        "dcgm-healthchecks",
        "reliability",
        "Active checks pass on every node within N days",
        "dcgmi diag, nccl-tests, ib_write_bw events within --active-check-days of the newest record",
        _HEALTH,
        "hpcwatch health --db F",
        active_checks_recent,
    ),
    _c(
        "auto-remediation",
        "reliability",
        "Drained nodes return only after passing",
        "node-state history and active checks",
        CRITERIA_URL + " (auto-remediation)",
        "hpcwatch health --db F",
        drained_return,
    ),
    _c(
        "interruption-rate",
        "reliability",
        "Interruptions per 1,000 GPU-days vs Llama 3's published rate",
        "failure events; GPU-days of DCGM samples",
        "Llama 3 (Dubey et al. 2024, §3.3.4): 419 interruptions, 16,384 GPUs, 54 days; the comparison is ours",
        "hpcwatch goodput --db F",
        interruption_rate,
    ),
    _c(
        "goodput",
        "reliability",
        "Goodput vs what the failure simulator predicts for this size",
        "the longest training job's spans and goodput events",
        "ClusterMAX 2.0 names goodput a deciding indicator; "
        "prediction: analysis/goodputsim.py (Llama 3 failure model); the 5-point warn band is ours",
        "hpcwatch goodput --db F JOB",
        goodput_vs_twin,
    ),
    _c(
        "mfu",
        "performance",
        "MFU from step data vs the reference for the model size",
        "the longest training job's step walls; --params/--layers/--d-model/--seq/--tokens-per-step",
        'PaLM appendix B formula (docs/reference.md, "MFU"); one measured point: H200 GPT-407M 40.4 %; shares ours',
        "hpcwatch steps --db F",
        mfu_reference,
    ),
    _c(
        "nccl-busbw",
        "performance",
        "NCCL all-reduce busbw vs what the node's rails (or NVLink) can carry",
        "nccl-tests all_reduce_perf events (largest size); the cluster model's HCAs per node and link rate",
        "nccl-tests doc/PERFORMANCE.md (busbw: rails x per-rail rate across nodes, NVLink inside one); catalog "
        "model/catalog.py; pass share 80 % ours, fail under analysis/health.py's 60 %",
        "hpcwatch health --db F",
        nccl_busbw,
    ),
    _c(
        "hca-naming",
        "networking",
        "HCA naming consistent for NCCL",
        "ibstat device names per node, ports of the cluster's fabric (link layer) only",
        CRITERIA_URL + " (hca-naming)",
        "hpcwatch ingest ibstat.txt --db F",
        hca_naming,
    ),
    _c(
        "port-rate",
        "networking",
        "Every fabric port at the catalog rate",
        "ibstat Rate per port (newest), InfiniBand and Ethernet (RoCE) ports apart by their link layer",
        "model/catalog.py LINKS (InfiniBand roadmap)",
        "hpcwatch health --db F",
        port_rate,
    ),
    _c(
        "nccl-autoconfig",
        "networking",
        "NCCL_ALGO / NCCL_PROTO / NCCL_MIN_NCHANNELS not forced",
        "NCCL_DEBUG log events",
        _A + "networking-nccl-min-nchannels-nccl-proto-nccl-algo-not-set-auto-configuration",
        "hpcwatch nccl LOG",
        nccl_autoconfig,
    ),
    _c(
        "topology-conf",
        "networking",
        "Slurm topology present",
        "scontrol show config TopologyPlugin",
        _A + "networking-out-of-the-box-slurm-topology-configuration",
        "scontrol show config",
        slurm_topology,
    ),
    _c(
        "ib-tenant-isolation",
        "security",
        "No full-membership default P_Key",
        "OpenSM partitions.conf events",
        _A + "security-infiniband-csps-enable-the-ufm-secured-bare-metal-cloud-profile-providing-a-comprehensive-"
        "set-of-security-features-required-for-secure-multi-tenant-cloud-environments",
        "hpcwatch scan --db F",
        pkey_default,
    ),
    _c(
        "pkey-violations",
        "security",
        "No P_Key violations",
        "IB constraint-error counters (increase)",
        "IBA spec vol. 1 PortRcvConstraintErrors; rule: any increase fails (ours)",
        "hpcwatch scan --db F",
        pkey_violations,
    ),
    _c(
        "hbm-memory-scrub",
        "security",
        "GPU memory scrubbing on",
        "/proc/driver/nvidia/params events",
        "cmax check hbm_memory_exposure (lifecycle); security/remanence.py",
        "hpcwatch scan --db F",
        memory_scrub,
    ),
    _c(
        "security-nvidia-driver",
        "security",
        "NVIDIA driver at or above the pinned minimum",
        "DCGM_FI_DRIVER_VERSION label per host, from every metric that carries it (dcgm-exporter, nvidia-smi)",
        versions.MINIMUMS_SOURCE,
        "hpcwatch top --db F",
        driver_minimum,
    ),
    _c(
        "security-nvidia-container-toolkit",
        "security",
        "NVIDIA Container Toolkit at or above the pinned minimum",
        "(no reader yet)",
        _A + "security-updated-nvidia-container-toolkit-preventing-cve-2024-0132-and-related-vulnerabilities",
        "nvidia-ctk --version",
        container_toolkit_minimum,
    ),
    _c(
        "detector-findings",
        "security",
        "No serious findings of the six detectors",
        "hpcwatch scan over the store",
        "hpcwatch security detectors; critical/high fail, medium warns (ours)",
        "hpcwatch scan --db F",
        detector_findings,
    ),
    _c(
        "idle-thermals-power",
        "idle thermals",
        "Idle GPUs' power under the published figure for their generation",
        "DCGM power at idle scrapes",
        "cmax parity note: Hopper 150 W, Blackwell SXM 250 W idle ceilings",
        "hpcwatch top --db F",
        idle_power,
    ),
    _c(
        "idle-thermals-temperature",
        "idle thermals",
        "Idle GPUs' temperature under a published figure",
        "DCGM temperature at idle scrapes",
        CRITERIA_URL + " (idle-thermals); no figure published",
        "hpcwatch top --db F",
        idle_temperature,
    ),
)

NOT_ASSESSABLE: tuple[NotAssessable, ...] = tuple(
    NotAssessable(category=c, title=t, why=w, source=CRITERIA_URL)
    for c, t, w in (
        ("pricing", "Price per GPU-hour and billing terms", "a contract fact, not in cluster data"),
        ("partnerships", "NVIDIA / AMD partnership tier", "a provider fact"),
        ("availability", "Capacity on demand, lead times", "a provider fact"),
        ("lifecycle", "Out-of-the-box drivers, GPUDirect RDMA setup at hand-over", "needs the delivery process"),
        ("orchestration", "User onboarding, RBAC / SSO, no SSH-key copying", "needs the provider's portal"),
        ("storage", "Shared filesystem performance and RWX volumes", "no storage benchmark reader yet"),
        ("support", "Support response times and SLAs", "a contract fact"),
    )
)


def criteria_of(category: str) -> Sequence[Criterion]:
    return [c for c in CRITERIA if c.category == category]
