"""Precision and recall of ``hpcwatch scan`` over the threat scenario set, plus two sweeps.

1. Scenarios (twin/threats.py): each attack and its look-alike written in real formats
   and scanned. A finding is a true positive when its rule is one the scenario planted;
   recall counts planted rules that were found.
2. Gradient detector: false alarms over honest synthetic runs (8 ranks, 20 steps, data
   noise), and detection rate against one rank scaling its gradient by k.
3. Typosquat check over the distributions installed in this environment (real names
   that must not be flagged).
4. The same scenarios played by the twin (``write_run``: its own Slurm, dcgm-exporter,
   node-exporter, perfquery, Lustre files plus what the scenario plants), read back
   with ``hpcwatch.ingest`` and scanned: the twin's own jobs and traffic are the noise.
5. The demo's periodic scan on a growing store: a 16-node, 10-minute twin run (threat_rdma)
   replayed into a store minute by minute; after each minute, the time of ``rescan`` (reads
   and scans the whole store) and of ``LiveScan`` (reads what arrived, scans the last 5 min).

    .venv/bin/python benchmarks/bench_security_scenarios.py
    .venv/bin/python benchmarks/bench_security_scenarios.py live [STORE.duckdb]   # only 5, on an ingested run
"""

from __future__ import annotations

import importlib.metadata
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from hpcwatch.ingest import ingest_paths
from hpcwatch.model import reference_cluster
from hpcwatch.security.gradients import detect_gradient_anomalies, gradient_samples
from hpcwatch.security.scan import ScanConfig, scan_store
from hpcwatch.security.supply_chain import typosquat_of
from hpcwatch.sources.pip import normalize_name
from hpcwatch.store import Store
from hpcwatch.twin.threats import THREAT_SCENARIOS, write_threat_fixtures


def scenarios() -> None:
    cluster = reference_cluster()
    tp = fp = found = planted = 0
    per_vector: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # tp, fp, found, planted
    print(f"{'scenario':28s} {'findings':>8s} {'tp':>3s} {'fp':>3s} {'recall':>7s} {'scan_s':>7s}")
    for name in THREAT_SCENARIOS:
        with tempfile.TemporaryDirectory() as tmp:
            fixture = write_threat_fixtures(tmp, name)
            t = time.perf_counter()
            with Store(":memory:") as store:  # `hpcwatch scan DIR`: ingest, then every detector
                ingest_paths(store, [Path(tmp)], hosts=[n.name for n in cluster.nodes])
                findings = scan_store(store, config=ScanConfig.for_cluster(cluster))
            elapsed = time.perf_counter() - t
        good = sum(f.rule in fixture.expected for f in findings)
        hit = len({f.rule for f in findings} & fixture.expected)
        vector = name.split("_", 1)[1]
        for i, v in enumerate((good, len(findings) - good, hit, len(fixture.expected))):
            per_vector[vector][i] += v
        tp, fp, found, planted = tp + good, fp + len(findings) - good, found + hit, planted + len(fixture.expected)
        recall = f"{hit}/{len(fixture.expected)}" if fixture.expected else "-"
        print(f"{name:28s} {len(findings):8d} {good:3d} {len(findings) - good:3d} {recall:>7s} {elapsed:7.2f}")
    print(
        f"\nall scenarios: precision {tp / max(tp + fp, 1):.3f} ({tp}/{tp + fp} findings), "
        f"recall {found / max(planted, 1):.3f} ({found}/{planted} planted rules)"
    )
    for vector, (vtp, vfp, vfound, vplanted) in sorted(per_vector.items()):
        print(f"  {vector:18s} precision {vtp / max(vtp + vfp, 1):.2f}  recall {vfound / max(vplanted, 1):.2f}")


def _run(rng: np.random.Generator, *, scale: float = 1.0, ranks: int = 8, steps: int = 20) -> list:
    truth = rng.standard_normal(2048)
    out = []
    for step in range(steps):
        for rank in range(ranks):
            g = truth + rng.standard_normal(2048) * rng.uniform(0.5, 1.5)
            if rank == 3 and step >= 5:
                g = g * scale
            out += gradient_samples(job="b", rank=rank, step=step, t=float(step), norm=float(np.linalg.norm(g)))
    return out


def gradient_sweep(runs: int = 100) -> None:
    rng = np.random.default_rng(0)
    false_alarms = sum(bool(detect_gradient_anomalies(_run(rng))) for _ in range(runs))
    print(f"\ngradient norm detector, {runs} honest runs (8 ranks x 20 steps): {false_alarms} with a finding")
    for scale in (1.5, 2.0, 3.0, 5.0, 10.0):
        caught = sum(
            any(f.evidence["rank"] == 3 for f in detect_gradient_anomalies(_run(rng, scale=scale)))
            for _ in range(runs // 2)
        )
        print(f"  rank 3 scales its gradient x{scale:<4}: caught in {caught}/{runs // 2} runs")


def typosquat_real_names() -> None:
    names = sorted({normalize_name(d.metadata["Name"]) for d in importlib.metadata.distributions()})
    flagged = [(n, typosquat_of(n)) for n in names if typosquat_of(n)]
    print(f"\ntyposquat check over {len(names)} distributions installed here: {len(flagged)} flagged {flagged}")


def twin_runs(nodes: int = 8, duration_s: float = 300.0) -> None:
    from hpcwatch.twin import Twin
    from hpcwatch.twin.run import sized_reference, write_run
    from hpcwatch.twin.threats import EXPECTED_RULES

    cluster = sized_reference(nodes)
    tp = fp = found = planted = 0
    print(f"\ntwin runs ({nodes} nodes, {duration_s:.0f} s simulated), findings by rule:")
    for name in THREAT_SCENARIOS:
        with tempfile.TemporaryDirectory() as tmp:
            write_run(Twin(cluster, seed=3, scenarios=[name]), tmp, duration_s=duration_s)
            with Store(":memory:") as store:  # `hpcwatch scan DIR`: ingest, then every detector
                ingest_paths(store, [Path(tmp)], hosts=[n.name for n in cluster.nodes])
                findings = scan_store(store, config=ScanConfig.for_cluster(cluster))
        expected = EXPECTED_RULES[name]
        rules = sorted({f.rule for f in findings})
        good = sum(f.rule in expected or (name == "threat_rdma" and f.rule.startswith("rdma.")) for f in findings)
        tp, fp = tp + good, fp + len(findings) - good
        found, planted = found + len(set(rules) & expected), planted + len(expected)
        print(f"  {name:26s} {len(findings):3d} findings {rules}")
    print(
        f"  twin: precision {tp / max(tp + fp, 1):.3f} ({tp}/{tp + fp}); recall of the fixture rules "
        f"{found / max(planted, 1):.3f} ({found}/{planted}) (the live twin plants fewer rules than the fixtures)"
    )


def live_rescan(
    store_path: str | None = None, *, nodes: int = 16, duration_s: float = 600.0, slice_s: float = 60.0
) -> None:
    """Seconds per periodic scan as the demo's store grows: full ``rescan`` against ``LiveScan``."""
    from hpcwatch.security.scan import LiveScan, rescan

    with tempfile.TemporaryDirectory() as tmp:
        if store_path is None:
            from hpcwatch.twin import Twin
            from hpcwatch.twin.run import sized_reference, write_run

            write_run(Twin(sized_reference(nodes), seed=0, scenarios=["threat_rdma"]), tmp, duration_s=duration_s)
            store_path = str(Path(tmp) / "run-store")
            with Store(store_path) as source:
                ingest_paths(source, [Path(tmp)])
        with Store(store_path) as source, Store(":memory:") as full, Store(":memory:") as live:
            ((t0, t1),) = source.query("SELECT min(t), max(t) FROM samples WHERE metric LIKE 'DCGM%'")
            for target in (full, live):
                target.add(source.jobs())
                target.add(source.events())
            scan = LiveScan()
            print(f"\nperiodic scan of a growing store ({store_path}), one call per {slice_s:.0f} s of data:")
            print(f"{'data_s':>7s} {'rows':>9s} {'rescan_s':>9s} {'live_s':>7s} {'rescan rules'}")
            lo, rows = float("-inf"), 0
            for hi in np.arange(t0 + slice_s, t1 + slice_s, slice_s):
                batch = source.query_arrow("SELECT * FROM samples WHERE t >= ? AND t < ?", [lo, float(hi)])
                lo, rows = float(hi), rows + batch.num_rows
                full.add_sample_table(batch)
                live.add_sample_table(batch)
                t = time.perf_counter()
                found = rescan(full)
                mid = time.perf_counter()
                kept = scan(live)
                end = time.perf_counter()
                rules = sorted({f.rule for f in found})
                same = "" if rules == sorted({f.rule for f in kept}) else f" live: {sorted({f.rule for f in kept})}"
                print(f"{hi - t0:7.0f} {rows:9d} {mid - t:9.2f} {end - mid:7.2f} {rules}{same}")


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["live"]:
        live_rescan(sys.argv[2] if len(sys.argv) > 2 else None)
        raise SystemExit(0)
    scenarios()
    gradient_sweep()
    typosquat_real_names()
    twin_runs()
    live_rescan()
