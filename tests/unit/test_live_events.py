"""The live page's event tallies, followed commit by commit, equal the queries that read every event."""

from __future__ import annotations

from hpcwatch.records import Event
from hpcwatch.reports.liveevents import FollowedEventTallies
from hpcwatch.store import Store, queries
from hpcwatch.vocab import EventKind


def _job_end(job: str | None, start: float | None, state: str = "REQUEUED", t: float = 0.0) -> Event:
    attrs = (
        {"state": state} | ({"job": job} if job is not None else {}) | ({"start": start} if start is not None else {})
    )
    return Event(kind=EventKind.JOB_END, t=t, source="sacct", attrs=attrs)


def test_followed_tallies_equal_the_full_queries_after_each_commit(tmp_path):
    commits = [
        [],
        [_job_end("41", 100.0), _job_end("41", 100.0), _job_end("42", 50.0, state="COMPLETED")],
        [_job_end("41", 200.0, t=5.0), Event(kind="checkpoint_save", t=7.0, source="hook", attrs={"step": 10})],
        [_job_end(None, 3.0), _job_end("43", None), Event(kind="checkpoint", t=4.0, source="hook", attrs={})],
        [_job_end("41", 100.0, t=9.0), _job_end("43", 8.0)],  # an attempt seen again by a later sacct poll
    ]
    with Store(tmp_path / "s") as store:
        followed = FollowedEventTallies(store)
        for events in commits:
            store.add(events)
            assert followed.requeue_counts() == queries.requeue_counts(store)
            assert followed.checkpoint_activity() == queries.checkpoint_activity(store)
        assert followed.requeue_counts() == {"41": 2, "None": 1, "43": 1}
        assert followed.checkpoint_activity() == (2, 7.0)
