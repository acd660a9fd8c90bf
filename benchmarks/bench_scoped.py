"""What filtering by role costs the live view (issue 25): one viewer's frame of the live snapshot, per role.

    PYTHONPATH=src:. .venv/bin/python benchmarks/bench_scoped.py [--nodes 128 1024] [--ticks 3]

In process. Per size, the twin's cluster fills an in-memory store for ``--ticks`` simulated seconds, as
``hpcwatch demo`` does, and the live snapshot is computed once (``LiveView``). Then, for a ``user`` (the owner
of one running job), a ``decider`` (pseudonyms, aggregates) and an ``operator`` (everything: no filtering),
``scoped_frame``'s work is timed: ``scoped_live`` + orjson, median of ``--repeat``. That is what each
viewer's SSE tick costs the server once per snapshot and scope (web/api.py caches it per scope, so ten tabs of
one user cost one). The snapshot itself is computed once for all viewers and is not part of these figures.
"""

from __future__ import annotations

import argparse
import json
import os

import orjson
from benchmarks.bench_web import _median_ms

from hpcwatch.access.policy import DEFAULT_POLICY
from hpcwatch.access.principal import Principal
from hpcwatch.access.scope import scope_for
from hpcwatch.reports.scoped import job_owners, scoped_live
from hpcwatch.store import Store
from hpcwatch.twin import Twin
from hpcwatch.web.demo import cluster_with_nodes
from hpcwatch.web.live import LiveView


def measure(nodes: int, ticks: int, repeat: int) -> dict[str, object]:
    cluster = cluster_with_nodes(nodes)
    store = Store(":memory:")
    twin = Twin(cluster, seed=0)
    for _ in range(ticks):
        twin.advance(1.0)
        store.add_sample_table(twin.sample_table())
        store.add([*twin.jobs, *twin.finished_spans(), *twin.events()])
    doc = LiveView(store, cluster, min_interval_s=0).snapshot()
    jobs = store.jobs()
    owners = job_owners(jobs)
    owner = next(j.user for j in jobs if j.end is None and j.user)
    out: dict[str, object] = {"nodes": nodes, "gpus": len(doc.get("gpus", {})), "jobs": len(jobs)}
    full = orjson.dumps(doc, default=str)
    out["operator_frame_ms"] = round(_median_ms(lambda: orjson.dumps(doc, default=str), repeat), 2)
    out["operator_kib"] = round(len(full) / 1024, 1)
    for role in ("user", "decider"):
        roles = frozenset({"user"} if role == "user" else {"user", role})
        scope = scope_for(Principal(name=owner, roles=roles), DEFAULT_POLICY, key=b"k" * 32)  # type: ignore[arg-type]
        frame = orjson.dumps(scoped_live(doc, scope, owners), default=str)
        out[f"{role}_frame_ms"] = round(
            _median_ms(lambda scope=scope: orjson.dumps(scoped_live(doc, scope, owners), default=str), repeat), 2
        )
        out[f"{role}_kib"] = round(len(frame) / 1024, 1)
    out["load_average"] = round(os.getloadavg()[0], 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--ticks", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    for nodes in args.nodes:
        print(json.dumps(measure(nodes, args.ticks, args.repeat)), flush=True)


if __name__ == "__main__":
    main()
