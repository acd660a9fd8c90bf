"""The demo's background loops (web/demo.py ``Periodic``): a run that lasts ``d`` seconds is
followed by a wait of at least ``d`` x (1 / share - 1), so a slow run (a security scan of a 1,024-node twin)
takes at most its share of the time. A fake clock and a fake stop event: nothing here sleeps."""

from __future__ import annotations

import pytest

from hpcwatch.errors import ConfigError
from hpcwatch.web import demo
from hpcwatch.web.demo import Periodic


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class _Stop:
    """Records each wait the loop asks for and says "stop" after ``runs`` of them."""

    def __init__(self, runs: int) -> None:
        self.waits: list[float] = []
        self.runs = runs

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        return len(self.waits) > self.runs

    def set(self) -> None:
        pass


def _waits(monkeypatch, durations: list[float], *, every_s: float, share: float | None) -> list[float]:
    clock = _Clock()
    monkeypatch.setattr(demo.time, "monotonic", clock.monotonic)
    lasting = iter(durations)

    def work() -> None:
        clock.now += next(lasting)

    loop = Periodic("test loop", work, every_s=every_s, busy_share=share)
    stop = _Stop(len(durations))
    loop._stop = stop  # type: ignore[assignment]
    loop._run()
    assert loop.runs == len(durations)
    return stop.waits


def test_a_slow_run_waits_so_that_the_loop_takes_its_share_of_the_time(monkeypatch):
    waits = _waits(monkeypatch, [4.0, 0.5, 12.0], every_s=10.0, share=0.25)
    # first the period; after 4 s of work 12 s (a quarter of 16 s); after a short run the period again
    assert waits == [10.0, 12.0, 10.0, 36.0]


def test_without_a_share_the_loop_keeps_its_period_whatever_a_run_took(monkeypatch):
    assert _waits(monkeypatch, [4.0, 30.0], every_s=10.0, share=None) == [10.0, 10.0, 10.0]


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5])
def test_a_share_outside_zero_to_one_is_refused(share):
    with pytest.raises(ConfigError, match="busy_share"):
        Periodic("test loop", lambda: None, every_s=1.0, busy_share=share)
