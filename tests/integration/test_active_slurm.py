"""collect's ``[active]`` against a real slurmctld: idle nodes get the checks, a busy node gets none.

alice's job runs on node1; the collector runs the real ``sinfo`` / ``scontrol`` / ``sbatch`` / ``squeue``: node2,
idle, is reserved and gets the check job (the stand-ins of tests/standins/checks, which print real dcgmi diag
and all_reduce_perf outputs); node1 gets none, and a reservation asked for it anyway is refused by the
controller (the guard against a node that got busy since sinfo). Once alice's job ends node1 is idle and gets
its checks; its dcgmi diag fails (the stand-in fails on the nodes of HPCWATCH_STANDIN_FAIL_NODES), and
collect's health task turns that stored result into a ``drain`` verdict for node1.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hpcwatch.collect.active import ActiveChecks, idle_nodes
from hpcwatch.collect.config import ScheduleSection, parse_config
from hpcwatch.collect.schedule import ScheduledTask
from hpcwatch.store import Store
from hpcwatch.vocab import EventKind

from .conftest import wait_until

pytestmark = pytest.mark.integration

CHECKS = Path(__file__).resolve().parents[1] / "standins" / "checks"


def _active(slurm, tmp_path: Path, store: Store) -> ActiveChecks:
    commands = "\n".join(f'{c} = "{shutil.which(c)}"' for c in ("scontrol", "sbatch", "scancel", "squeue"))
    text = f"""
[active]
enabled = true
max_nodes = 2
time_limit_minutes = 2
work_dir = "{tmp_path / "work"}"
{commands}

[[active.check]]
kind = "dcgmi_diag"
program = "{CHECKS / "dcgmi"}"

[[active.check]]
kind = "nccl_tests"
program = "{CHECKS / "all_reduce_perf"}"
"""
    section = parse_config(text, path="collect.toml").active
    assert section is not None
    env = {**slurm.env, "HPCWATCH_STANDIN_FAIL_NODES": "node1"}  # sbatch exports it to the job (--export=ALL)
    return ActiveChecks(store, section, env=env)


def _nodes(store: Store, kind: str, **match: str) -> list[str]:
    return [str(e.attrs["node"]) for e in store.events(kind) if all(e.attrs.get(k) == v for k, v in match.items())]


def _state(slurm, node: str) -> str:
    line = slurm.run("scontrol", "-o", "show", "node", node).stdout
    return next((f.split("=", 1)[1] for f in line.split() if f.startswith("State=")), "")


def _idle(slurm) -> list[str]:
    return sorted(idle_nodes(slurm.run("scontrol", "-o", "show", "node").stdout))


def test_idle_nodes_get_the_active_checks_and_a_busy_node_none(slurm, tmp_path):
    # the Slurm of this worker served other tests before: their jobs' ends and a resumed node take a moment
    # to read IDLE in scontrol (node2 was not yet, once, under load: nothing was started)
    wait_until(lambda: _idle(slurm) == ["node1", "node2"], timeout_s=60, what="both nodes idle before the test")
    store = Store(tmp_path / "store")
    busy = slurm.sbatch("alice", "--nodelist=node1", wrap="sleep 120")
    try:
        wait_until(lambda: slurm.job_states().get(busy) == "RUNNING", timeout_s=20, what="alice's job on node1")
        active = _active(slurm, tmp_path, store)
        active.run()
        assert _nodes(store, EventKind.ACTIVE_RUN, step="submit") == ["node2"], [e.attrs for e in store.events()]
        # the guard: a reservation of node1 (as if sinfo had said idle just before alice's job started) is refused
        refused = active.start("node1", active.section.checks)
        assert refused.attrs["step"] == "refused" and "busy" in refused.attrs["output"], refused.attrs

        def result(node: str) -> object:
            active.run()
            return _nodes(store, EventKind.ACTIVE_RESULT, node=node)

        wait_until(lambda: result("node2"), timeout_s=60, every_s=0.5, what="node2's check job to end")
        (node2,) = [e.attrs for e in store.events(EventKind.ACTIVE_RESULT)]
        assert node2["passed"] and node2["verdict"] == "ok", node2
        assert _nodes(store, EventKind.ACTIVE_RUN, step="submit") == ["node2"]  # node1 got none while busy

        slurm.run("scancel", busy)
        wait_until(lambda: _state(slurm, "node1") == "IDLE", timeout_s=30, what="node1 idle again")
        wait_until(lambda: result("node1"), timeout_s=60, every_s=0.5, what="node1's check job to end")
        node1 = next(e.attrs for e in store.events(EventKind.ACTIVE_RESULT) if e.attrs["node"] == "node1")
        assert not node1["passed"] and node1["verdict"] == "drain", node1
        assert sorted(_nodes(store, EventKind.ACTIVE_RUN, step="submit")) == ["node1", "node2"]  # node2 not due

        ScheduledTask(store, ScheduleSection(task="health", window_s=0)).run()
        verdicts = {e.attrs["node"]: e.attrs["verdict"] for e in store.events(EventKind.HEALTH_VERDICT)}
        assert verdicts.get("node1") == "drain" and verdicts.get("node2") == "ok", verdicts
        assert "hpcwatch-active" not in slurm.run("scontrol", "show", "reservation", check=False).stdout
    finally:
        store.close()
        slurm.run("scancel", busy, check=False)
        for line in slurm.run("scontrol", "show", "reservation", check=False).stdout.splitlines():
            if line.startswith("ReservationName=hpcwatch-active-"):
                name = line.split()[0].split("=", 1)[1]
                slurm.run("scontrol", "delete", f"reservationname={name}", check=False)
