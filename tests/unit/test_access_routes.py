"""Every route of the web app, for every role, over a twin-filled store of several users and accounts:
a role without the route's permission is refused, and what a role is answered (JSON, HTML, the SSE
stream's first frame) names no job, user or account it may not see. Routes come from the app itself,
so a new route without a line in web/access.py's ROUTE_NEEDS fails here (and at create_app)."""

from __future__ import annotations

import re
import time

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from hpcwatch.access.principal import Principal
from hpcwatch.errors import ConfigError
from hpcwatch.model import reference_cluster
from hpcwatch.records import Event, Finding, Span
from hpcwatch.sources.prometheus_text import parse_prometheus_columns
from hpcwatch.store import Store
from hpcwatch.twin.core import Twin
from hpcwatch.vocab import EventKind
from hpcwatch.web.access import ROUTE_NEEDS, check_routes, current_principal, routes_of
from hpcwatch.web.app import create_app


@pytest.fixture(scope="module")
def store():
    twin = Twin(reference_cluster(), seed=3)
    st = Store(":memory:")
    for _ in range(6):
        twin.advance(15.0)
        for node in ("node1", "node2"):
            st.add_sample_table(parse_prometheus_columns(twin.dcgm_text(node), path=f"{node}.dcgm", t=twin.now))
    st.add(twin.events())
    jobs = twin.jobs
    st.add(jobs)
    victim = next(j for j in jobs if j.user != "bob")
    st.add(
        [
            Finding(
                vector="rdma_blind_spot",
                severity="high",
                target=victim.id,
                title="IB bytes, no job",
                rule="ib_bytes_without_job",
                evidence={"job": victim.id},
                t=twin.now,
            ),
            *(
                Span(job=victim.id, rank=r, step=k, phase=phase, start=twin.now - 10 + k + i * 0.1, dur=0.05 + r * 0.01)
                for r in range(2)
                for k in range(3)
                for i, phase in enumerate(("forward", "backward", "optimizer"))
            ),
            Event(
                kind=EventKind.HEALTH_VERDICT,
                t=twin.now,
                source="test",
                attrs={"node": "node2", "verdict": "drain", "checks": []},
            ),
        ]
    )
    yield st
    st.close()


def _principal(name: str, role: str) -> Principal:
    return Principal(name=name, roles=frozenset({role}), via="proxy")  # type: ignore[arg-type]


def _app(store: Store, principal: Principal) -> FastAPI:
    app = create_app(store, reference_cluster(), stream_interval_s=0.05)
    app.dependency_overrides[current_principal] = lambda: principal
    app.state.hpcwatch.access.coordinators._table = {"alice": frozenset({"proj-vision"})}
    return app


def _others(store: Store, visible) -> tuple[set[str], set[str]]:
    """Job ids and user names the principal must not read anywhere."""
    hidden = [j for j in store.jobs() if not visible(j)]
    seen_users = {j.user for j in store.jobs() if visible(j)}
    return {j.id for j in hidden}, {j.user for j in hidden if j.user not in seen_users}


def _url(path: str, job: str) -> str:
    url = path.replace("{job_id:path}", job)
    if path == "/api/steps":
        url += f"?job={job}"
    if path == "/api/history":
        url += "?el=gpu:node1/0"
    if path == "/static":
        url += "/app.css"
    return url


def _body(client: TestClient, url: str) -> tuple[int, str]:
    if url != "/api/stream":
        r = client.get(url)
        return r.status_code, r.text
    with client.stream("GET", url) as r:
        if r.status_code != 200:
            return r.status_code, r.read().decode()
        for line in r.iter_lines():
            if line.startswith("data: "):
                client.app.state.hpcwatch.stopping.set()  # type: ignore[attr-defined]
                text = line
                break
    client.app.state.hpcwatch.stopping.clear()  # type: ignore[attr-defined]
    return 200, text


ROLES = {
    "bob (user)": (_principal("bob", "user"), lambda j: j.user == "bob"),
    "alice (user, coordinates proj-vision)": (
        _principal("alice", "user"),
        lambda j: j.user == "alice" or j.account == "proj-vision",
    ),
    "operator": (_principal("olga", "operator"), lambda j: True),
    "security": (_principal("sam", "security"), "findings"),  # the jobs its findings name, and no more
    "decider": (_principal("dora", "decider"), lambda j: False),
}


@pytest.mark.parametrize("role", ROLES)
def test_every_route_for_every_role_leaks_nothing_of_others(store, role):
    principal, visible = ROLES[role]
    if visible == "findings":
        named = {f.target for f in store.findings()}
        visible = lambda j: j.id in named  # noqa: E731
    app = _app(store, principal)
    hidden_jobs, hidden_users = _others(store, visible)
    assert hidden_jobs or role == "operator"
    victim = sorted(hidden_jobs)[0] if hidden_jobs else store.jobs()[0].id
    scope = app.state.hpcwatch.access.scope(principal)
    with TestClient(app) as client:
        for path, _route in routes_of(app):
            status, text = _body(client, _url(path, victim))
            needs = ROUTE_NEEDS[path]
            if needs and not needs & scope.permissions:
                assert status == 403, (role, path, status)
                continue
            assert status < 500, (role, path, status, text[:300])
            leaked_jobs = {j for j in hidden_jobs if re.search(rf'["/=]{re.escape(j)}["&<,\s]', text)}
            leaked_users = {u for u in hidden_users if u and re.search(rf"\b{re.escape(u)}\b", text)}
            assert not leaked_jobs and not leaked_users, (role, path, leaked_jobs, leaked_users)


def test_the_training_job_of_another_user_is_neither_played_nor_named(store):
    victim = store.spans()[0].job
    with TestClient(_app(store, _principal("bob", "user"))) as client:
        assert client.get("/api/steps", params={"job": victim}).status_code == 404
        assert victim not in {s["job"] for s in client.get("/api/steps/sources").json()}
        assert client.get("/api/live").json()["training"] is None
    with TestClient(_app(store, _principal("olga", "operator"))) as client:
        assert client.get("/api/steps", params={"job": victim}).status_code == 200


def test_user_sees_own_job_and_its_gpus(store):
    bob = next(j for j in store.jobs() if j.user == "bob" and j.end is None)
    with TestClient(_app(store, _principal("bob", "user"))) as client:
        assert client.get(f"/api/job/{bob.id}").status_code == 200
        live = client.get("/api/live").json()
        assert {q["id"] for q in live["queue"]["jobs"]} <= {j.id for j in store.jobs() if j.user == "bob"}
        assert bob.id in {q["id"] for q in live["queue"]["jobs"]}


def test_decider_reads_pseudonyms_stable_and_keyed(store):
    with TestClient(_app(store, _principal("dora", "decider"))) as client:
        users = {q["user"] for q in client.get("/api/live").json()["queue"]["jobs"]}
        again = {q["user"] for q in client.get("/api/live").json()["queue"]["jobs"]}
    assert users and users == again and all(u.startswith("u-") for u in users)


def test_audit_records_who_opened_which_job_once_per_minute_and_shows_it_to_security(store):
    bob = next(j for j in store.jobs() if j.user == "bob")
    since = time.time()
    with TestClient(_app(store, _principal("bob", "user"))) as client:
        for _ in range(5):  # a reload storm: one event
            client.get(f"/job/{bob.id}")
    with TestClient(_app(store, _principal("sam", "security"))) as client:
        client.get("/api/findings")
        entries = client.get("/api/audit").json()["entries"]
        assert "opened a job" in client.get("/audit").text
    opened = [e for e in entries if e["kind"] == EventKind.ACCESS_JOB and e["what"] == bob.id and e["t"] >= since]
    assert len(opened) == 1 and opened[0]["who"] == "bob"
    assert any(e["kind"] == EventKind.ACCESS_FINDING and e["who"] == "sam" for e in entries)


def test_local_principal_sees_everything_unchanged(store):
    with TestClient(create_app(store, reference_cluster())) as client:
        live = client.get("/api/live").json()
        assert client.get("/api/findings").status_code == 200 and client.get("/api/audit").status_code == 200
    running = {j.id for j in store.jobs() if j.end is None}
    assert {q["id"] for q in live["queue"]["jobs"]} == running and live["vectors"]["rdma_blind_spot"]["findings"]


def test_a_route_without_a_rule_refuses_the_app(store):
    app = create_app(store, reference_cluster())

    @app.get("/api/new-thing")
    async def new_thing() -> dict[str, str]:
        return {"secret": "x"}

    with pytest.raises(ConfigError, match="/api/new-thing"):
        check_routes(app)
    with TestClient(app) as client:
        assert client.get("/api/new-thing").status_code == 403  # fail closed until it has a rule


def test_stranger_is_asked_to_sign_in(store):
    app = _app(store, Principal(name="", roles=frozenset(), via="proxy", authenticated=False))
    with TestClient(app) as client:
        assert client.get("/api/live").status_code == 401 and client.get("/healthz").status_code == 200
