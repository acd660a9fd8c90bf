"""``hpcwatch demo``'s remediation loop, as the demo runs it: the live twin in its thread, the health rules and the
actor on the twin's Slurm in theirs (cli/demoact.py). Each test waits on what the store holds (the audit trail),
with a deadline, never on a sleep of fixed length.

The twin runs 200 simulated seconds a real second (a tick of 20 s every 0.1 s): the loop (the XID 30 s in, a
verdict, the warning, DEMO_WARN_MINUTES, the check job, its result) is about 500 simulated seconds.
"""

from __future__ import annotations

import time

import pytest

from hpcwatch.act import remediate
from hpcwatch.cli.demoact import DemoRemediation
from hpcwatch.model.cluster import reference_cluster
from hpcwatch.reports.acting import notices_sent, remediation_states
from hpcwatch.store import Store
from hpcwatch.twin.live import LiveTwin
from hpcwatch.twin.slurmctl import FIRST_CHECK_JOB_ID
from hpcwatch.vocab import EventKind

#: How long a loop may take on a loaded 2-core machine (it takes a few seconds on an idle one).
DEADLINE_S = 120.0


def _trail(store: Store) -> list[dict]:
    """The remediation's audit of node2, in the order its steps were taken (a result and what follows it share
    their time: the store gives events of one time in no set order)."""
    order = ("warn", "reserve", "resume", "check", "result", "drain", "release")
    steps = [{**e.attrs, "t": e.t} for e in store.events(EventKind.ACT_ACTION) if e.attrs["target"] == "node node2"]
    return sorted(steps, key=lambda a: (a["t"], order.index(a["step"])))


def _play(scenario: str) -> tuple[Store, DemoRemediation, list[dict]]:
    """Run the demo's loop on ``scenario`` until node2's episode is over (released), at most DEADLINE_S."""
    store = Store(":memory:")
    live = LiveTwin(store, reference_cluster(), seed=0, scenarios=(scenario,), speed=200.0, tick_s=0.1)
    live.start()
    loop = DemoRemediation(store, live).start()
    deadline = time.monotonic() + DEADLINE_S
    try:
        while not any(a["step"] == "release" for a in _trail(store)):
            assert time.monotonic() < deadline, (
                f"no release within {DEADLINE_S} s: {[a['step'] for a in _trail(store)]}"
            )
            assert loop.acting.error is None and loop.health.error is None and live.error is None
            time.sleep(0.2)  # a poll of the store, not a wait for the loop
    finally:
        loop.acting.stop()
        loop.health.stop()
        live.stop()
    return store, loop, _trail(store)


@pytest.fixture(scope="module")
def cleared():
    """xid79: node2's GPU falls off the bus, the node reboots and comes back before its checks run."""
    store, loop, trail = _play("xid79")
    yield store, loop, trail
    loop.stop()


@pytest.fixture(scope="module")
def persists():
    """diag_failed: node2's GPU 4 has a double-bit ECC error (XID 48), and keeps it."""
    store, loop, trail = _play("diag_failed")
    yield store, loop, trail
    loop.stop()


def test_a_fault_that_cleared_passes_its_checks_and_the_node_is_given_back(cleared):
    store, loop, trail = cleared
    assert [a["step"] for a in trail] == ["warn", "reserve", "resume", "check", "result", "release"]
    warn, reserve, check, result = trail[0], trail[1], trail[3], trail[4]
    assert "xid: XID 79 on GPU 3" in warn["why"]
    assert reserve["t"] - warn["t"] >= loop.actor.config.remediate.warn_minutes * 60.0  # on the twin's clock
    assert int(check["details"]["job"]) >= FIRST_CHECK_JOB_ID and all(a["rc"] in (None, 0) for a in trail)
    # the three outputs, read by the real readers and judged by the health rules
    assert result["evidence"]["passed"] is True and result["evidence"]["verdict"] == "ok"
    judged = {c["rule"]: c["verdict"] for c in result["evidence"]["checks"]}
    assert judged == {"dcgm_diag": "ok", "nccl_tests": "ok", "ib_write_bw": "ok"}
    assert {e.attrs["node"] for e in store.events(EventKind.DCGM_DIAG)} == {"node2"}
    node2 = remediate.node_state(loop.slurm.answer(["scontrol", "-o", "show", "node", "node2"]).stdout, "node2")
    assert "DRAIN" not in node2.state and "MAINT" not in node2.state  # resumed, reservation gone
    assert remediation_states(store, now=trail[-1]["t"])["node2"]["stage"] == "passed"  # the node tile's word
    said = [n.subject for n in notices_sent(store, node="node2")]
    assert any("checks start in" in s for s in said) and any("resume by hpcwatch act" in s for s in said), said


def test_a_fault_that_persists_fails_its_checks_and_the_node_stays_drained_with_a_notice(persists):
    store, loop, trail = persists
    assert [a["step"] for a in trail] == ["warn", "reserve", "resume", "check", "result", "drain", "release"]
    assert "xid: XID 48 on GPU 4" in trail[0]["why"]
    result = trail[4]
    assert result["evidence"]["passed"] is False and result["evidence"]["verdict"] == "drain"
    assert "dcgmi diag memory fail on GPU 4" in result["why"]
    node2 = remediate.node_state(loop.slurm.answer(["scontrol", "-o", "show", "node", "node2"]).stdout, "node2")
    assert "DRAIN" in node2.state.split("+") and node2.reason.startswith("hpcwatch: checks failed")
    assert remediation_states(store, now=trail[-1]["t"])["node2"]["stage"] == "failed"
    notices = notices_sent(store, node="node2")
    assert any("failed its checks" in n.subject for n in notices), [n.subject for n in notices]
    assert {n.state for n in notices} == {"unrouted"}  # the demo has no channel: recorded, sent to no one


def test_node1_is_left_alone(cleared, persists):
    for store, _, _ in (cleared, persists):
        assert not [e for e in store.events(EventKind.ACT_ACTION) if e.attrs.get("target") != "node node2"]
