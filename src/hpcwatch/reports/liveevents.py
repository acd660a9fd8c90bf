"""What the live page counts of the events, followed as they are committed: each job's requeued attempts (the
queue's "requeued 2×") and the checkpoint events (the weights card).

``queries.requeue_counts`` and ``queries.checkpoint_activity`` read every event of the store's history, JSON
attributes included, each time they are asked. The live view asks every second, and the events only grow: at
1,024 nodes the twin adds thousands an hour. ``FollowedEventTallies`` reads only the events committed since its
last question (``queries.event_tallies_since``) and adds them to what it holds. Events are never replaced or
removed, so the tallies are those of every event, as the queries count them.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from hpcwatch.store import queries

if TYPE_CHECKING:
    from hpcwatch.store import Store

__all__ = ["FollowedEventTallies"]


class FollowedEventTallies:
    """``queries.requeue_counts`` and ``queries.checkpoint_activity`` of ``store``, from the events committed
    since the last question. Safe to share between threads."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._version = 0
        """The store version read up to (0: nothing read yet)."""
        self._attempts: dict[str, set[str]] = {}
        """Job -> the starts of its requeued attempts."""
        self._checkpoints: tuple[int, float | None] = (0, None)

    def requeue_counts(self) -> dict[str, int]:
        with self._lock:
            self._follow()
            return {job: len(starts) for job, starts in self._attempts.items()}

    def checkpoint_activity(self) -> tuple[int, float | None]:
        with self._lock:
            self._follow()
            return self._checkpoints

    def _follow(self) -> None:
        if self.store.version == self._version:
            return
        self._version, requeued, (n, newest) = queries.event_tallies_since(self.store, self._version)
        for job, start in requeued:
            starts = self._attempts.setdefault(str(job), set())  # the query's key: str(None) for no job
            if start is not None:
                starts.add(start)
        count, last = self._checkpoints
        self._checkpoints = (count + n, last if newest is None else newest if last is None else max(last, newest))
