"""The roles policy file (access/policy.py), the coordinators reader on real sacctmgr 22.05 output
(sources/sacctmgr.py), the scope's visibility and pseudonyms (access/scope.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcwatch.access.policy import DEFAULT_POLICY, PERMISSIONS, load_policy, parse_policy
from hpcwatch.access.principal import LOCAL, Principal
from hpcwatch.access.scope import pseudonym_key, scope_for
from hpcwatch.errors import ConfigError, ParseError
from hpcwatch.sources.sacctmgr import parse_coordinators, read_coordinators

DATA = Path(__file__).resolve().parents[1] / "data" / "sacctmgr"


def test_default_policy_gives_the_four_roles_of_the_issue():
    assert DEFAULT_POLICY.permissions(LOCAL) == frozenset(PERMISSIONS)
    user = Principal(name="bob", roles=frozenset({"user"}), via="proxy")
    assert DEFAULT_POLICY.permissions(user) == {"jobs:own", "jobs:account"}


def test_a_policy_file_replaces_the_roles_it_lists():
    policy = parse_policy('[roles]\nuser = ["jobs:own"]\ndecider = []\n', path="p.toml")
    assert policy.roles == {"user": frozenset({"jobs:own"}), "decider": frozenset()}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[roles]\nuser = ["jobs:own"]\nwizard = ["health"]\n', "p.toml:3: unknown role 'wizard'"),
        ('[roles]\n\nuser = ["jobs:own", "jobs:everyone"]\n', "p.toml:3: unknown permission 'jobs:everyone'"),
        ('[roles]\nuser = "jobs:own"\n', "p.toml:2: roles.user must be a list"),
        ("[roles]\nuser = [1]\n", "p.toml:2: roles.user must be a list"),
        ("roles = 3\n", "p.toml:1: roles must be a table"),
        ("[roles]\n[pseudonyms]\nkey_file = 5\n", "p.toml:3: pseudonyms.key_file must be a path"),
        ('[roles]\n[coordinators]\nfiles = "x"\n', "p.toml:3: unknown key 'files' in [coordinators]"),
        ("[rolez]\n", "p.toml:1: unknown table 'rolez'"),
        ("[roles\n", "p.toml: "),
    ],
)
def test_bad_policy_is_one_line_naming_file_and_key(text, message):
    with pytest.raises(ConfigError) as err:
        parse_policy(text, path="p.toml")
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_serve_with_a_bad_policy_exits_2_with_one_line(tmp_path):
    bad = tmp_path / "policy.toml"
    bad.write_text('[roles]\noperator = ["health", "root"]\n')
    done = subprocess.run(
        [sys.executable, "-m", "hpcwatch", "serve", "--policy", str(bad), "--db", str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")},
    )
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"hpcwatch: {bad}:2: unknown permission 'root' in roles.operator")


def test_missing_policy_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the policy file"):
        load_policy(tmp_path / "none.toml")


def test_coordinators_from_real_sacctmgr_22_05_both_listings_agree():
    by_user = read_coordinators(DATA / "user-withcoordinator-22.05.txt")
    by_account = read_coordinators(DATA / "account-withcoordinator-22.05.txt")
    assert by_user == by_account == {"alice": {"proj-vision"}, "carol": {"proj-llm", "proj-vision"}}


def test_coordinators_parsable_with_trailing_bar_and_bad_rows():
    text = (DATA / "user-withcoordinator-22.05.txt").read_text()
    trailing = "\n".join(line + "|" for line in text.splitlines())
    assert parse_coordinators(trailing)["carol"] == {"proj-llm", "proj-vision"}
    with pytest.raises(ParseError, match=r"x.txt:1: want a header"):
        parse_coordinators("Cluster|Account\n", path="x.txt")
    with pytest.raises(ParseError, match=r"x.txt:3: want 4"):
        parse_coordinators(text.splitlines()[0] + "\nalice|a|None|b\nbob|c\n", path="x.txt")


def test_scope_sees_own_and_coordinated_jobs_only():
    table = read_coordinators(DATA / "user-withcoordinator-22.05.txt")
    alice = scope_for(
        Principal(name="alice", roles=frozenset({"user"}), via="ldap"), DEFAULT_POLICY, coordinators=table
    )
    assert alice.sees_job("alice", "proj-llm") and alice.sees_job("bob", "proj-vision")
    assert not alice.sees_job("carol", "proj-llm") and not alice.sees_job(None, None)


def test_pseudonyms_are_keyed_stable_and_kept_beside_the_store(tmp_path):
    key = pseudonym_key(DEFAULT_POLICY, tmp_path)
    assert pseudonym_key(DEFAULT_POLICY, tmp_path) == key and (tmp_path / "access.key").stat().st_mode & 0o077 == 0
    decider = Principal(name="dora", roles=frozenset({"decider"}), via="token")
    one = scope_for(decider, DEFAULT_POLICY, key=key)
    other = scope_for(decider, DEFAULT_POLICY, key=b"k" * 32)
    assert one.shown("bob") == one.shown("bob") != other.shown("bob") and "bob" not in one.shown("bob")


def test_exporter_labels_by_scope_decider_pseudonymised_user_own_only_operator_all():
    from prometheus_client import generate_latest

    from hpcwatch.exporter import registry_for
    from hpcwatch.records import Job
    from hpcwatch.store import Store

    jobs = [
        Job(id="71", user="alice", account="proj-llm", gpus=8, start=1.0, state="RUNNING"),
        Job(id="72", user="bob", account="proj-vision", gpus=1, start=1.0, state="RUNNING"),
    ]
    with Store(":memory:") as store:
        store.add(jobs)

        def text(role: str, name: str = "x") -> str:
            scope = scope_for(Principal(name=name, roles=frozenset({role}), via="token"), DEFAULT_POLICY, key=b"k" * 32)
            return generate_latest(registry_for(store, scope=scope)).decode()

        decider, bob, operator = text("decider"), text("user", "bob"), text("operator")
    info = [line for line in decider.splitlines() if line.startswith("hpcwatch_job_info{")]
    assert len(info) == 2 and all('user="u-' in line and 'account="u-' in line for line in info)
    assert "alice" not in decider and "bob" not in decider and "proj-" not in decider
    assert 'user="bob"' in bob and "alice" not in bob and 'hpc_job="71"' not in bob
    assert 'user="alice"' in operator and 'user="bob"' in operator


def test_a_site_policy_reaches_the_routes_and_a_bad_coordinators_file_stops_the_app(tmp_path):
    from fastapi.testclient import TestClient

    from hpcwatch.model import reference_cluster
    from hpcwatch.store import Store
    from hpcwatch.web.access import current_principal
    from hpcwatch.web.app import create_app

    policy = parse_policy('[roles]\noperator = ["jobs:all", "health", "findings"]\n', path="site.toml")
    with Store(":memory:") as store:
        app = create_app(store, reference_cluster(), policy=policy)
        app.dependency_overrides[current_principal] = lambda: Principal(
            name="olga", roles=frozenset({"operator"}), via="ldap"
        )
        with TestClient(app) as client:
            assert client.get("/api/findings").status_code == 200  # this site's operators read findings
            assert client.get("/api/audit").status_code == 403
        bad = tmp_path / "coordinators.txt"
        bad.write_text("Cluster|Account\n")
        broken = parse_policy(f'[roles]\n[coordinators]\nfile = "{bad}"\n', path="site.toml")
        with pytest.raises(ConfigError, match=rf"coordinators file: {bad}:1: want a header"):
            create_app(store, reference_cluster(), policy=broken)


def test_free_text_names_are_hidden_from_a_user_and_pseudonymised_for_a_decider():
    from hpcwatch.reports.scoped import scoped_text

    owners = {"4101": ("alice", "proj-llm"), "4102": ("bob", "proj-vision")}
    doc = {"evidence": "jobs 4101, 4102 of alice have no record; 4101.5 GPU-hours", "figures": {"n": 2}}
    bob = scope_for(Principal(name="bob", roles=frozenset({"user"}), via="ldap"), DEFAULT_POLICY)
    decider = scope_for(Principal(name="d", roles=frozenset({"decider"}), via="ldap"), DEFAULT_POLICY, key=b"k" * 32)
    assert scoped_text(doc, bob, owners)["evidence"] == "jobs …, … of … have no record; 4101.5 GPU-hours"
    shown = scoped_text(doc, decider, owners)["evidence"]
    assert "alice" not in shown and "4102" not in shown and shown.count("u-") == 3 and "4101.5" in shown
