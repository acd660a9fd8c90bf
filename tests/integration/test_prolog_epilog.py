"""deploy/slurm/prolog and epilog run by a real slurmd: the mapping files follow the allocations."""

from __future__ import annotations

import pytest

from .conftest import wait_until

pytestmark = pytest.mark.integration


def _running(slurm, *job_ids: str) -> bool:
    states = slurm.job_states()
    return all(states.get(j) == "RUNNING" for j in job_ids)


def test_mapping_files_follow_jobs_on_a_shared_node_and_across_nodes(slurm):
    a = slurm.sbatch("alice", "--gres=gpu:2", "-w", "node1", "-J", "map-a")
    b = slurm.sbatch("bob", "--gres=gpu:3", "-w", "node1", "-J", "map-b")
    c = slurm.sbatch("alice", "-N", "2", "--gres=gpu:1", "-J", "map-c")
    wait_until(lambda: _running(slurm, a, b, c), timeout_s=30, what="three jobs RUNNING")

    def all_mapped() -> dict[str, list[str]] | None:
        # Only these three jobs' entries: an earlier test's job may still be in its epilog.
        m = {where: [i for i in ids if i in (a, b, c)] for where, ids in slurm.mapping().items()}
        m = {where: ids for where, ids in m.items() if ids}
        return m if sum(len(v) for v in m.values()) == 2 + 3 + 2 else None

    mapping = wait_until(all_mapped, timeout_s=15, what="7 mapping entries")

    by_job: dict[str, list[str]] = {}
    for where, ids in mapping.items():
        assert len(ids) == 1, f"{where} holds {ids}: GPUs are not shared in this test"
        by_job.setdefault(ids[0], []).append(where)
    assert sorted(g.split("/")[0] for g in by_job[a]) == ["node1", "node1"]
    assert sorted(g.split("/")[0] for g in by_job[b]) == ["node1"] * 3
    assert sorted(g.split("/")[0] for g in by_job[c]) == ["node1", "node2"]
    # Slurm's own record of the allocation (squeue gres_detail) agrees with the files.
    squeue = {str(j["job_id"]): j for j in slurm.squeue_json()["jobs"]}
    assert squeue[b]["gres_detail"] and "gpu:3" in squeue[b]["gres_detail"][0]

    slurm.run("scancel", b)
    wait_until(
        lambda: not any(b in ids for ids in slurm.mapping().values()),
        timeout_s=20,
        what=f"job {b}'s files to be removed by the epilog",
    )
    left = slurm.mapping()
    assert sorted(w for w, ids in left.items() if ids == [a]) == sorted(by_job[a])  # a's files untouched
    slurm.run("scancel", a, c)
    wait_until(lambda: slurm.mapping() == {}, timeout_s=20, what="an empty mapping directory")
    assert not list(slurm.mapping_dir.glob("*/.*")), "temporary files left behind"
