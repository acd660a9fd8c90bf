"""Account coordinators on the real Slurm 22.05 (slurmdbd): ``sacctmgr add coordinator`` makes alice see
bob's job of proj-vision through the web app, as the roles policy says of ``jobs:account``; before it,
his job answers as unknown. The reader reads the sacctmgr that CI installs, not only our capture."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from hpcwatch.access.coordinators import Coordinators
from hpcwatch.access.principal import Principal
from hpcwatch.ingest import ingest_paths
from hpcwatch.model import reference_cluster
from hpcwatch.sources.sacctmgr import parse_coordinators
from hpcwatch.store import Store
from hpcwatch.web.access import current_principal
from hpcwatch.web.app import create_app

from .conftest import wait_until

pytestmark = pytest.mark.integration

ALICE = Principal(name="alice", roles=frozenset({"user"}), via="ldap")


def _coordinators(slurm) -> dict[str, frozenset[str]]:
    return parse_coordinators(slurm.run("sacctmgr", "show", "user", "withcoordinator", "--parsable2").stdout)


def test_a_coordinator_added_in_sacctmgr_sees_the_accounts_jobs(slurm, tmp_path):
    if slurm.accounting != "dbd":
        pytest.skip("coordinators live in slurmdbd (scripts/install-system installs it)")
    job = slurm.sbatch("bob", "-N1", "--gres=gpu:1", "--account=proj-vision")
    wait_until(lambda: slurm.job_states().get(job) == "RUNNING", timeout_s=30, what=f"job {job} running")
    squeue = tmp_path / "squeue.json"
    squeue.write_text(slurm.run("squeue", "--json").stdout)
    store = Store(":memory:")
    ingest_paths(store, [squeue])
    app = create_app(store, reference_cluster())
    app.dependency_overrides[current_principal] = lambda: ALICE
    access = app.state.hpcwatch.access
    try:
        assert "alice" not in _coordinators(slurm)
        with TestClient(app) as client:
            assert client.get(f"/api/job/{job}").status_code == 400  # not hers: as if unknown
            slurm.run("sacctmgr", "-i", "add", "coordinator", "account=proj-vision", "names=alice")
            table = _coordinators(slurm)
            assert table["alice"] == {"proj-vision"}
            access.coordinators = Coordinators(None, table=table)
            opened = client.get(f"/api/job/{job}")
            assert opened.status_code == 200 and "bob" in opened.text
    finally:
        slurm.run("sacctmgr", "-i", "remove", "coordinator", "account=proj-vision", "names=alice", check=False)
        slurm.run("scancel", job, check=False)
        store.close()
