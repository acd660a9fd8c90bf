"""``[active]``: active tests on idle nodes at a cadence, with stand-in Slurm commands (tests/standins/slurm: they
record their argv; ``scontrol -o show node`` prints ``$HPCWATCH_STANDIN_NODES``; ``sbatch`` runs the script at once) and the check
stand-ins (tests/standins/checks: real output formats of tests/data/health)."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from hpcwatch.collect.active import ActiveChecks, idle_nodes
from hpcwatch.collect.config import ActiveSection, parse_config
from hpcwatch.collect.schedule import ScheduledTask
from hpcwatch.errors import ConfigError
from hpcwatch.store import Store
from hpcwatch.vocab import EventKind

STANDINS = Path(__file__).resolve().parents[1] / "standins"
SLURM_DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
T0 = 1_796_000_000.0
#: node -> (State, CPUAlloc): node1 runs a job, node4 is drained, node5 does not respond, node6 is exempt.
STATES = {
    "node1": ("MIXED", "1"),
    "node2": ("IDLE", "0"),
    "node3": ("IDLE", "0"),
    "node4": ("IDLE+DRAIN", "0"),
    "node5": ("IDLE*", "0"),
    "node6": ("IDLE", "0"),
}


def _show_node(states: dict[str, tuple[str, str]]) -> str:
    """``scontrol -o show node`` of these nodes: the real idle line of tests/data/slurm, renamed and restated."""
    real = (SLURM_DATA / "scontrol_o_show_node_idle.txt").read_text().strip()
    return "".join(
        real.replace("NodeName=node1", f"NodeName={n}")
        .replace("State=IDLE", f"State={st}")
        .replace("CPUAlloc=0", f"CPUAlloc={alloc}")
        + "\n"
        for n, (st, alloc) in states.items()
    )


def _toml(tmp_path: Path, extra: str = "", checks: str = "") -> str:
    slurm, prog = STANDINS / "slurm", STANDINS / "checks"
    return f"""
[active]
enabled = true
max_nodes = 2
exempt_nodes = ["node6"]
work_dir = "{tmp_path / "work"}"
scontrol = "{slurm / "scontrol"}"
sbatch = "{slurm / "sbatch"}"
scancel = "{slurm / "scancel"}"
squeue = "{slurm / "squeue"}"
{extra}
[[active.check]]
kind = "dcgmi_diag"
every_minutes = 60
program = "{prog / "dcgmi"}"

[[active.check]]
kind = "ib_write_bw"
every_minutes = 600
program = "{prog / "ib_write_bw"}"
{checks}
"""


class Bench:
    def __init__(self, tmp_path: Path, text: str = "", **env: str) -> None:
        cfg = parse_config(text or _toml(tmp_path), path="cfg.toml")
        assert cfg.active is not None
        self.section: ActiveSection = cfg.active
        self.log = tmp_path / "argv.jsonl"
        self.store = Store(tmp_path / "store")
        self.now = [T0]
        nodes = tmp_path / "show_node.txt"
        nodes.write_text(env.pop("nodes", None) or _show_node(STATES))
        defaults = {"HPCWATCH_STANDIN_NODES": str(nodes), "HPCWATCH_STANDIN_RUN_JOBS": "1"}
        self.env = {**os.environ, "HPCWATCH_STANDIN_LOG": str(self.log), **defaults, **env}
        self.active = ActiveChecks(self.store, self.section, clock=lambda: self.now[0], env=self.env)

    def argv(self) -> list[list[str]]:
        return [orjson.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def runs(self, step: str = "submit") -> list[dict]:
        return [e.attrs for e in self.store.events(EventKind.ACTIVE_RUN) if e.attrs.get("step") == step]

    def results(self) -> list[dict]:
        return [e.attrs for e in self.store.events(EventKind.ACTIVE_RESULT)]


@pytest.fixture
def bench(tmp_path):
    b = Bench(tmp_path)
    yield b
    b.store.close()


def test_off_by_default_and_not_a_collector_until_enabled(tmp_path):
    cfg = parse_config('[active]\n[[active.check]]\nkind = "dcgmi_diag"\n')
    assert cfg.active is not None and not cfg.active.enabled and cfg.collectors == ()
    on = parse_config(_toml(tmp_path))
    assert [type(c).__name__ for c in on.collectors] == ["ActiveSection"] and on.collectors[0].name == "active"
    assert [c.kind for c in on.active.checks] == ["dcgmi_diag", "ib_write_bw"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("[active]\nenabled = true\n", r"cfg\.toml:2: \[active\] is enabled but has no \[\[active\.check\]\]"),
        ("[active]\nmax_nodes = 0\n", r"cfg\.toml:2: \[active\] max_nodes must be > 0"),
        ("[active]\nsinfo = 1\n", r"cfg\.toml:2: unknown key 'sinfo' in \[active\]"),
        ('[active]\n[[active.check]]\nkind = "rvs"\n', r"cfg\.toml:3: kind must be one of 'dcgmi_diag'"),
        ("[active]\n[[active.check]]\nlevel = 5\n", r"cfg\.toml:3: \[active\.check\] level must be 1, 2, 3 or 4"),
        (
            '[active]\n[[active.check]]\nprogram = "dcgmi; rm -rf /"\n',
            r"cfg\.toml:3: \[active\.check\] program must be a plain name",
        ),
        ('[active]\nnodes = ["node[1-4]"]\n', r"cfg\.toml:2: \[active\] nodes must be plain names"),
        (
            '[active]\n[[active.check]]\nkind = "dcgmi_diag"\n[[active.check]]\nkind = "dcgmi_diag"\n',
            r"cfg\.toml:5: two checks of kind 'dcgmi_diag'",
        ),
    ],
)
def test_bad_active_config_is_one_line_naming_the_line(text, message):
    with pytest.raises(ConfigError, match=message) as err:
        parse_config(text, path="cfg.toml")
    assert "\n" not in str(err.value)


def test_idle_is_exactly_idle_with_no_cpu_allocated_in_real_scontrol_output():
    busy = (SLURM_DATA / "scontrol_o_show_node_mixed_and_drained.txt").read_text()
    # node1 MIXED (alice's job), node2 IDLE+DRAIN whose reason says "State=IDLE": neither is idle
    assert idle_nodes(busy) == []
    idle = (SLURM_DATA / "scontrol_o_show_node_idle.txt").read_text()
    assert idle_nodes(idle) == ["node1"] and idle_nodes(idle, ("gpu", "debug")) == ["node1"]
    assert idle_nodes(idle, ("debug",)) == []


def test_idle_nodes_get_the_due_checks_as_exclusive_jobs_inside_a_reservation(bench):
    bench.active.run()
    submitted = bench.runs()
    # node1 runs a job, node4 is drained, node5 does not respond, node6 is exempt; max_nodes = 2
    assert sorted(r["node"] for r in submitted) == ["node2", "node3"]
    assert all(r["checks"] == ["dcgmi_diag", "ib_write_bw"] for r in submitted)
    argv = bench.argv()
    reserve = [a for a in argv if a[:3] == ["scontrol", "create", "reservation"]]
    assert len(reserve) == 2 and not any("ignore_jobs" in " ".join(a) for a in reserve)  # the busy-node guard
    assert all("duration=20" in a and "users=root" in a for a in reserve)  # time limit 15 + 5
    sbatch = [a for a in argv if a[0] == "sbatch"]
    assert all("--exclusive" in a and "--time=15" in a and "--nodes=1" in a for a in sbatch)
    assert {next(x for x in a if x.startswith("--nodelist=")) for a in sbatch} == {
        "--nodelist=node2",
        "--nodelist=node3",
    }
    script = (Path(submitted[0]["dir"]) / "check.sh").read_text()
    assert "diag -r 1 -j > dcgmi_diag.json" in script and "--report_gbits localhost" in script
    assert "all_reduce_perf" not in script  # not configured

    bench.active.run()  # the jobs ended: their results are read, judged, their reservations deleted
    results = bench.results()
    assert sorted(r["node"] for r in results) == ["node2", "node3"]
    assert all(r["passed"] and r["verdict"] == "ok" for r in results), results
    deleted = [a for a in bench.argv() if a[:2] == ["scontrol", "delete"]]
    assert sorted(deleted) == sorted(["scontrol", "delete", f"reservationname={r['reservation']}"] for r in submitted)
    kinds = {e.kind for e in bench.store.events() if e.attrs.get("node") == "node2"}
    assert {EventKind.DCGM_DIAG, EventKind.IB_WRITE_BW} <= kinds

    # node2 and node3 are not due again before their cadence; node1 still runs its job
    bench.now[0] = T0 + 30 * 60
    before = len(bench.argv())
    bench.active.run()
    assert bench.argv()[before:] == [["scontrol", "-o", "show", "node"]]
    # an hour later dcgmi diag is due again (ib_write_bw, every 10 h, is not)
    bench.now[0] = T0 + 61 * 60
    bench.active.run()
    again = [r for r in bench.runs() if r["run"] not in {s["run"] for s in submitted}]
    assert sorted(r["node"] for r in again) == ["node2", "node3"] and all(r["checks"] == ["dcgmi_diag"] for r in again)


def test_a_node_that_got_busy_is_refused_by_the_reservation_and_nothing_is_submitted(tmp_path):
    bench = Bench(tmp_path, HPCWATCH_STANDIN_BUSY="node2")
    try:
        bench.active.run()
        refused = bench.runs("refused")
        assert [r["node"] for r in refused] == ["node2"] and "Requested nodes are busy" in refused[0]["output"]
        assert [r["node"] for r in bench.runs()] == ["node3"]
        assert not any(a[0] == "sbatch" and "--nodelist=node2" in a for a in bench.argv())
        # refused is not a run: node2 is looked at again next interval
        assert any(c.node == "node2" for c in bench.active.choose())
    finally:
        bench.store.close()


def test_a_failing_dcgmi_diag_is_a_drain_verdict_of_the_health_rules(tmp_path):
    bench = Bench(tmp_path, HPCWATCH_STANDIN_CHECKS="fail")
    try:
        bench.active.run()
        bench.active.run()
        results = {r["node"]: r for r in bench.results()}
        assert not results["node2"]["passed"] and results["node2"]["verdict"] == "drain"
        assert "dcgm_diag" in results["node2"]["reason"]
        # collect's health task judges the stored results: node2 and node3 are drained there
        from hpcwatch.collect.config import ScheduleSection

        ScheduledTask(bench.store, ScheduleSection(task="health", window_s=0)).run()
        verdicts = {e.attrs["node"]: e.attrs for e in bench.store.events(EventKind.HEALTH_VERDICT)}
        assert verdicts["node2"]["verdict"] == "drain" and verdicts["node2"]["rules"]["dcgm_diag"] == "drain"
    finally:
        bench.store.close()


def test_a_job_still_queued_when_its_reservation_ends_is_cancelled(tmp_path):
    bench = Bench(tmp_path, HPCWATCH_STANDIN_RUN_JOBS="0", HPCWATCH_STANDIN_SQUEUE="PENDING")
    try:
        bench.active.run()
        bench.now[0] = T0 + 10 * 60
        bench.active.run()
        assert bench.results() == [] and not any(a[0] == "scancel" for a in bench.argv())
        assert len(bench.active.in_flight()) == 2 and bench.active.choose() == []  # max_nodes under test
        bench.now[0] = T0 + 21 * 60
        bench.active.run()
        results = bench.results()
        assert len(results) == 2 and all(not r["passed"] for r in results)
        assert all("cancelled" in r["problems"][0] for r in results)
        assert sum(a[0] == "scancel" for a in bench.argv()) == 2
    finally:
        bench.store.close()


def test_sbatch_that_fails_deletes_its_reservation(tmp_path):
    bench = Bench(tmp_path, HPCWATCH_STANDIN_FAIL="sbatch")
    try:
        bench.active.run()
        failed = bench.runs("failed")
        assert len(failed) == 2 and bench.runs() == [] and failed[0]["rc"] == 1
        assert sum(a[:2] == ["scontrol", "delete"] for a in bench.argv()) == 2
    finally:
        bench.store.close()


def test_hostile_node_names_and_a_failing_scontrol(tmp_path):
    names = {"node[1-2]": ("IDLE", "0"), "a,b": ("IDLE", "0"), "-x": ("IDLE", "0"), "n" * 200: ("IDLE", "0")}
    text = _show_node(names | {"node2": ("IDLE", "0")}) + "garbage\nState=IDLE\n\x1b[31mNodeName=\n"
    bench = Bench(tmp_path, nodes=text)
    try:
        assert [c.node for c in bench.active.choose()] == ["node2"]
    finally:
        bench.store.close()
    bench = Bench(tmp_path, HPCWATCH_STANDIN_FAIL="scontrol")
    try:
        with pytest.raises(ConfigError, match=r"scontrol -o show node failed \(rc 1\)"):
            bench.active.run()
    finally:
        bench.store.close()


def test_the_daemon_builds_it_and_names_its_kind(tmp_path):
    from hpcwatch.collect.daemon import _kind, build_collector

    section = parse_config(_toml(tmp_path)).active
    store = Store(tmp_path / "store")
    try:
        assert isinstance(build_collector(store, section), ActiveChecks) and _kind(section) == "active"
    finally:
        store.close()


def test_rccl_tests_output_is_read_by_the_nccl_tests_check(tmp_path):
    """AMD nodes run rccl-tests' all_reduce_perf as the nccl_tests check: a real 8 x MI300X run reads the same."""
    from hpcwatch.act.checkjob import CheckSpec, read_results

    real = (
        Path(__file__).resolve().parents[1]
        / "data"
        / "health"
        / "rccl_tests_all_reduce_perf_8xmi300x_hpc_ai_envs_30.out"
    )
    (tmp_path / "all_reduce_perf.out").write_bytes(real.read_bytes())  # where the check job writes it
    (event,), problems = read_results(tmp_path, "g100n126", [CheckSpec(kind="nccl_tests", program="x")])
    assert problems == [] and event.kind == EventKind.NCCL_TEST
    a = event.attrs
    assert (a["nranks"], a["gpu_model"], a["hosts"]) == (8, "AMD Instinct MI300X", ["g100n126"])
    assert [(r["size_bytes"], r["oop_busbw_gbs"], r["busbw_mismatch"]) for r in a["rows"]] == [(8388608, 161.14, False)]


def test_a_check_job_still_completing_is_judged_once_it_has_left_the_queue(tmp_path):
    """Its script wrote "done", but slurmctld still holds the job (COMPLETING), and with it the reservation, which
    cannot be deleted yet: judged then, the delete failed and the reservation outlived the check (a loaded CI run)."""
    bench = Bench(tmp_path, HPCWATCH_STANDIN_SQUEUE="COMPLETING")
    try:
        bench.active.run()  # submitted; the stand-in runs each job at once: its done file is written
        bench.active.run()
        assert bench.results() == [] and not any(a[:2] == ["scontrol", "delete"] for a in bench.argv())
        del bench.active.runner.env["HPCWATCH_STANDIN_SQUEUE"]  # the jobs have left the queue
        bench.active.run()
        assert len(bench.results()) == 2
        assert sum(a[:2] == ["scontrol", "delete"] for a in bench.argv()) == 2
    finally:
        bench.store.close()
