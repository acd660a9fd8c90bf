"""A digest's jobs (``reports.digest``): those that ended in the period, with the figures ``hpcwatch jobs`` gives
them, read from the first start of the earliest of them on, not from the store's first sample."""

from __future__ import annotations

from hpcwatch import vocab
from hpcwatch.analysis.attribution import report_dict
from hpcwatch.records import Job, Sample
from hpcwatch.reports.digest import digests
from hpcwatch.reports.jobs import jobs_report
from hpcwatch.store import Store
from tests.unit.stretch_fixtures import store_reads  # noqa: F401  (fixture)

DAY = 86400.0


def test_a_days_digest_reads_that_days_jobs_from_their_first_start_and_reports_what_hpcwatch_jobs_does(
    store_reads,
) -> None:
    """A store with a job a week before the day: the digest of the day reads from its jobs' first start (the one
    before it started the day before and ended in it), and its jobs' figures are ``hpcwatch jobs``'."""
    store = Store(":memory:")
    gpu = {"n1": (0,)}
    day0 = 20 * DAY
    jobs = [
        Job(
            id="old",
            user="ann",
            gpus=1,
            nodes=("n1",),
            gpus_by_node=gpu,
            start=day0 - 7 * DAY,
            end=day0 - 7 * DAY + 600,
        ),
        Job(id="eve", user="ann", gpus=1, nodes=("n1",), gpus_by_node=gpu, start=day0 - 885, end=day0 + 600),
        Job(id="noon", user="bob", gpus=1, nodes=("n1",), gpus_by_node=gpu, start=day0 + 900, end=day0 + 1500),
    ]
    store.add(jobs)
    labels = {"Hostname": "n1", "gpu": "0"}
    times = [*range(int(day0 - 7 * DAY), int(day0 - 7 * DAY + 700), 30), *range(int(day0 - 1200), int(day0 + 1800), 30)]
    store.add(
        Sample(metric=metric, labels=labels, t=float(t), value=value)
        for k, t in enumerate(times)
        for metric, value in ((vocab.DCGM_FI_DEV_GPU_UTIL, 40.0), (vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, 5e5 * k))
    )
    every = {r.id: report_dict(r) for r in jobs_report(store)}
    store_reads.clear()
    by_user, _ = digests(store, period="daily", t0=day0, t1=day0 + DAY)
    assert min(store_reads) == day0 - 885  # "eve"'s first start, not the store's first sample a week before
    assert {d.user: [report_dict(r) for r in d.jobs] for d in by_user} == {
        "ann": [every["eve"]],
        "bob": [every["noon"]],
    }
    store.close()
