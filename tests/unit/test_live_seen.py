"""What the live page's collectors were ever fed (``reports.live.SeenSoFar``): read from the rows committed
since the previous call, it says after every commit what a full ``data_seen`` scan says."""

from __future__ import annotations

from hpcwatch.records import Event, Job, Sample, Span
from hpcwatch.reports import live
from hpcwatch.reports.live import SeenSoFar, data_seen
from hpcwatch.store import Store, queries

WEIGHTS = "/lustre/ckpt"

COMMITS = [
    [Sample(metric="DCGM_FI_DEV_GPU_UTIL", labels={"Hostname": "node1", "gpu": "0"}, t=1.0, value=90.0)],
    [Event(kind="nccl_log", t=2.0, source="node1", attrs={"line": "NCCL INFO"})],
    [Sample(metric="node_load1", labels={"instance": "node1:9100"}, t=3.0, value=1.0)],
    [Span(job="7", rank=0, step=1, phase="forward", start=3.0, dur=0.1, attrs={})],
    [Job(id="7", user="ana", nodes=("node1",), gpus=8, start=1.0, state="RUNNING")],
    [Event(kind="tetragon", t=4.0, source="node1", attrs={"function_name": "security_file_open", "path": "/tmp/x"})],
    [
        Event(
            kind="tetragon",
            t=5.0,
            source="node1",
            attrs={"function_name": "security_file_open", "path": f"{WEIGHTS}/step-100.pt"},
        )
    ],
]


def test_what_was_seen_so_far_is_the_full_scan_after_every_commit(tmp_path, monkeypatch):
    asked = []
    since = queries.data_seen_since

    def recording(store, since_version, **kw):
        asked.append(since_version)
        return since(store, since_version, **kw)

    with Store(tmp_path / "s") as store:
        seen = SeenSoFar(weights_path=WEIGHTS)
        assert seen(store) == data_seen(store, weights_path=WEIGHTS)
        for records in COMMITS:
            store.add(records)
            monkeypatch.setattr(live.queries, "data_seen_since", recording)
            kept = seen(store)
            monkeypatch.setattr(live.queries, "data_seen_since", since)
            assert kept == data_seen(store, weights_path=WEIGHTS)
        assert kept.prefixes == {"DCGM", "node"} and kept.event_kinds == {"nccl_log", "tetragon"}
        assert kept.spans and kept.jobs and kept.weights_reads
    assert asked == list(range(len(COMMITS)))  # each call read from the version where the previous one stopped
