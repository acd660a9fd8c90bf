"""The live problems folded for triage (reports/triage.py): one group per rule, worst first, natural order."""

from __future__ import annotations

from hpcwatch.reports.triage import MAX_GROUP_MEMBERS, alert_groups, mark_of, natural_key


def _health(node: str, gpu: int | None, rule: str, severity: str, **evidence) -> dict:
    el = f"gpu:{node}/{gpu}" if gpu is not None else f"node:{node}"
    return {
        "kind": "health",
        "severity": severity,
        "el": el,
        "node": node,
        "gpu": None if gpu is None else str(gpu),
        "job": evidence.get("job"),
        "rule": rule,
        "title": f"{rule} on {el}",
        "evidence": evidence,
    }


def test_natural_key_orders_numbers_by_value():
    names = ["node10", "node2", "node1", "node100", "gpu:node1/10", "gpu:node1/2"]
    assert sorted(names, key=natural_key) == ["gpu:node1/2", "gpu:node1/10", "node1", "node2", "node10", "node100"]
    assert natural_key(None) == ()


def test_many_idle_gpus_are_one_group_ranked_below_one_xid():
    idle = [_health(f"node{n}", g, "idle_allocated", "warn", job=str(4100 + n)) for n in (10, 2, 100) for g in (7, 0)]
    xid = _health("node2", 3, "xid", "drain", xid=79)
    groups = alert_groups([*idle, xid])
    assert [g["rule"] for g in groups] == ["xid", "idle_allocated"]  # severity before extent
    big = groups[1]
    assert (big["count"], big["gpus"], big["nodes"], big["mark"]) == (6, 6, 3, "idle")
    assert [m["el"] for m in big["members"]] == [
        "gpu:node2/0",
        "gpu:node2/7",
        "gpu:node10/0",
        "gpu:node10/7",
        "gpu:node100/0",
        "gpu:node100/7",
    ]
    assert big["jobs"] == ["4102", "4110", "4200"]
    assert groups[0]["first"]["evidence"]["xid"] == 79


def test_two_xid_codes_are_two_groups_and_a_wider_problem_ranks_first_at_one_severity():
    found = [
        _health("node1", 1, "xid", "drain", xid=79),
        _health("node3", 1, "xid", "drain", xid=48),
        _health("node4", 2, "xid", "drain", xid=48),
    ]
    groups = alert_groups(found)
    assert [(g["first"]["evidence"]["xid"], g["count"]) for g in groups] == [(48, 2), (79, 1)]


def test_a_group_lists_at_most_its_first_members_but_counts_them_all():
    found = [_health(f"node{n}", 0, "idle_allocated", "warn") for n in range(1, 200)]
    (group,) = alert_groups(found)
    assert group["count"] == 199 and len(group["members"]) == MAX_GROUP_MEMBERS
    assert group["members"][0]["el"] == "gpu:node1/0" and group["members"][1]["el"] == "gpu:node2/0"


def test_each_problem_kind_has_its_own_mark():
    marks = {
        mark_of(_health("n", 0, "xid", "drain")),
        mark_of(_health("n", 0, "gpu_missing", "drain")),
        mark_of(_health("n", None, "ib_port", "drain")),
        mark_of(_health("n", 0, "idle_allocated", "warn")),
        mark_of(_health("n", 0, "throttle", "warn")),
        mark_of({"kind": "straggler", "severity": "warn", "rule": "straggler"}),
        mark_of({"kind": "finding", "severity": "high", "rule": "x"}),
    }
    assert marks == {"xid", "lost", "drain", "idle", "warn", "straggler", "finding"}


def test_no_problem_no_group():
    assert alert_groups([]) == []


def test_the_live_snapshot_carries_the_groups_of_its_problems(tmp_path):
    from hpcwatch.model import reference_cluster
    from hpcwatch.reports.live import latest_t, live_snapshot
    from hpcwatch.store import Store
    from hpcwatch.twin.live import LiveTwin

    with Store(tmp_path / "store") as store:
        live = LiveTwin(store, reference_cluster(), seed=0, scenarios=("straggler", "xid79"), start=1.7e9)
        for _ in range(60):
            live.step()
        snap = live_snapshot(store, weights_path="/weights", now=latest_t(store))
    assert snap["alerts"] == alert_groups(snap["problems"])
    assert snap["alerts"][0]["mark"] == "xid" and snap["alerts"][0]["first"]["el"] == "gpu:node2/3"
    assert {p["mark"] for p in snap["problems"]} >= {"xid", "straggler"}
