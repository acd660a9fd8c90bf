"""The live twin feeds its scenarios' host captures (twin/livefiles.py) through the readers: the demo's health
rules fire on the planted node, and its schematic marks it, as after ``twin run`` + ``ingest --host``."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import pytest

from hpcwatch.ingest import ingest_folder
from hpcwatch.reports.health import node_health
from hpcwatch.reports.live import problems
from hpcwatch.store import Store
from hpcwatch.twin.host_faults import HOST_FAULT_RULES
from hpcwatch.twin.live import LiveTwin
from hpcwatch.twin.livefiles import HOST_FILES_PERIOD_S, LIVE_FILE_SCENARIOS
from hpcwatch.twin.scenarios import get_scenario
from hpcwatch.web.demo import cluster_with_nodes

START = 1_796_000_000.0
#: One tick = one simulated minute: the tests reach the next feed (HOST_FILES_PERIOD_S) in a few ticks.
SPEED = 60.0


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with Store(tmp_path / "store") as st:
        yield st


def _live(store: Any, scenarios: list[Any], *, nodes: int = 2, ingest: Any = None) -> LiveTwin:
    return LiveTwin(
        store,
        cluster_with_nodes(nodes),
        seed=1,
        scenarios=scenarios,
        speed=SPEED,
        start=START,
        host_files=ingest or functools.partial(ingest_folder, store),
    )


def _fired(store: Any) -> dict[str, dict[str, dict]]:
    """node -> rule -> evidence, of every check that is not ok."""
    return {n.node: {c.rule: c.evidence for c in n.checks if c.verdict != "ok"} for n in node_health(store).nodes}


def _marked(store: Any) -> set[tuple[str, str]]:
    return {(p["node"], p["rule"]) for p in problems(store, training_job=None) if p["kind"] == "health"}


def test_the_planted_nodes_are_marked_from_the_first_tick_and_stay_so_past_the_health_window(store):
    live = _live(store, ["nvme_failing", "ofed_drift"], nodes=3)
    live.write_tick()
    fired = _fired(store)
    assert {node for node, rules in fired.items() if rules} == {"node2", "node3"}, fired
    assert {"nvme_critical_warning", "nvme_media_errors"} <= set(fired["node2"])
    assert set(fired["node3"]) == {"ofed_mismatch"}
    assert {("node2", "nvme_critical_warning"), ("node3", "ofed_mismatch")} <= _marked(store)
    for _ in range(20):  # 20 simulated minutes: past the 15 of the health window, the drive read again since
        live.step()
    fired = _fired(store)
    assert fired["node2"]["nvme_critical_warning"]["t_last"] >= live.twin.now - HOST_FILES_PERIOD_S
    assert "ofed_mismatch" in fired["node3"] and not {"nvme_critical_warning", "ofed_mismatch"} & set(fired["node1"])
    assert ("node2", "nvme_critical_warning") in _marked(store)


def test_a_logged_event_is_fed_once_while_the_state_beside_it_is_read_again(store):
    """dmesg's OOM kill happened once: the next feed (the drive's state read again) must not count it twice."""
    live = _live(store, ["oom_killed", "nvme_failing"])
    live.write_tick()
    first = _fired(store)["node2"]
    assert first["oom_kill"]["count"] == 1
    for _ in range(int(HOST_FILES_PERIOD_S / SPEED) + 1):
        live.step()
    second = _fired(store)["node2"]
    assert second["nvme_critical_warning"]["t_last"] > first["nvme_critical_warning"]["t_last"]  # a second feed ran
    assert second["oom_kill"]["count"] == 1


class _Broken(type(get_scenario("nvme_failing"))):  # type: ignore[misc]
    """nvme_failing whose capture fails: a bug in a scenario's extra_files."""

    def extra_files(self, **_: Any) -> None:
        raise OSError("no space left on device")


def _failing_ingest(folder: Path, host: str | None) -> list[Any]:
    raise RuntimeError("the store is closed")


@pytest.mark.parametrize(
    ("scenarios", "ingest", "logged"),
    [
        # a scenario's bug: the others are still fed
        ([_Broken(), "disk_full"], None, "scenario nvme_failing not fed"),
        # the ingest failing on every folder: the twin goes on without them
        (["disk_full"], _failing_ingest, "ingest host/node2 not fed"),
    ],
)
def test_a_failing_capture_is_logged_once_and_the_twin_keeps_ticking(store, caplog, scenarios, ingest, logged):
    live = _live(store, scenarios, ingest=ingest)
    with caplog.at_level(logging.WARNING, logger="hpcwatch.twin.livefiles"):
        live.write_tick()
        for _ in range(3 * int(HOST_FILES_PERIOD_S / SPEED)):  # three feeds more
            live.step()
    warnings = [r.getMessage() for r in caplog.records if r.name == "hpcwatch.twin.livefiles"]
    assert len(warnings) == 1 and logged in warnings[0], warnings
    assert live.ticks == 15 and live.twin.now == START + 15 * SPEED
    disk_space = "disk_space" in _fired(store).get("node2", {})
    assert disk_space == (ingest is None)


def test_only_host_captures_are_fed_live():
    """Every fed scenario writes under host/<node>/ only: what an agent of that node ships (the docstring of
    LIVE_FILE_SCENARIOS says why the others are left out)."""
    assert set(HOST_FAULT_RULES) <= LIVE_FILE_SCENARIOS
    assert not {"kubernetes", "neglected", "well_kept", "nccl_hang", "threat_supply_chain"} & LIVE_FILE_SCENARIOS
