"""What the page shows of hpcwatch's acting: notices, actions and undos, remediation stages, alerts (the
store's verdicts and Alertmanager's v2 API), and a job's Slurm mail-user kept by the store."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hpcwatch.act.audit import Action, Undo
from hpcwatch.alertmanager import AlertmanagerClient, AlertWatch
from hpcwatch.errors import BackendError, ParseError
from hpcwatch.notify.config import NotifyConfig
from hpcwatch.notify.recipients import user_address
from hpcwatch.records import Event, Job
from hpcwatch.reports.acting import acting_timeline, actions_taken, job_acting, notices_sent, remediation_states
from hpcwatch.reports.alerting import alert_history, job_alerts, node_of_labels
from hpcwatch.sources.alertmanager import MAX_LABELS, parse_alertmanager_alerts
from hpcwatch.sources.slurm import parse_squeue_json
from hpcwatch.store import NoticeRow, Store
from hpcwatch.vocab import EventKind

DATA = Path(__file__).parent.parent / "data"
AMP = DATA / "alertmanager" / "amp_v2_alerts_one_active.json"
T0 = 1_700_000_000.0


def _action(step: str, t: float, *, node: str = "node2", ok: bool = True, **kw) -> Action:
    return Action(
        id=f"act-{step}-{int(t)}",
        policy=kw.pop("policy", "remediate"),
        step=step,
        episode=kw.pop("episode", f"remediate/{node}/{T0}"),
        target=kw.pop("target", f"node {node}"),
        t=t,
        who="hpcwatch-act@ops1",
        why=f"{step} because",
        rc=0 if ok else 1,
        undo=("scontrol", "delete", "reservationname=r") if step == "reserve" else (),
        **kw,
    )


def _notice(key: str, state: str, t: float, *, attempts: int = 0, document: dict | None = None) -> NoticeRow:
    payload = {"subject": f"about {key}", "document": document or {}}
    return NoticeRow(
        key=f"{key}|mail|ops@example.org",
        notice=key,
        kind=key.split("/")[0].replace("job-end", "job_end").replace("act", "action"),
        channel="mail",
        recipient="ops@example.org",
        state=state,
        t=t,
        attempts=attempts,
        payload=orjson.dumps(payload).decode(),
    )


@pytest.fixture
def store():
    with Store(":memory:") as s:
        yield s


# -- Alertmanager's answer ---------------------------------------------------------------------------


def test_a_real_alertmanager_answer_reads_as_one_active_alert():
    (alert,) = parse_alertmanager_alerts(AMP.read_bytes(), path=str(AMP))
    assert alert.fingerprint == "114212a24ca97549"
    assert alert.name == "metric:alerting_rule"
    assert alert.state == "active" and not alert.silenced and not alert.inhibited
    assert alert.starts_at == pytest.approx(1631798435.966)  # 2021-09-16T13:20:35.966Z
    assert alert.ends_at is not None and alert.updated_at is not None


@pytest.mark.parametrize(
    ("text", "found"),
    [
        (b"{not json", "not JSON"),  # a proxy's error page, cut
        (b'{"alerts": []}', "expected a JSON list"),  # the v1 API's shape, or an alert group
        (b"[1]", "alert 0: an alert is not an object"),
        (b'[{"fingerprint": "a", "status": {"state": "firing"}}]', "unknown status.state"),  # a webhook's word
        (b'[{"fingerprint": "", "labels": {}}]', "bad fingerprint"),
        (b'[{"fingerprint": "a", "startsAt": "yesterday"}]', "startsAt is not a time"),
        (b'[{"fingerprint": "a", "startsAt": "2021-09-16T13:20:35"}]', "no time zone"),
        (b'[{"fingerprint": "a", "labels": "x"}]', "labels is not an object"),
        (
            orjson.dumps([{"fingerprint": "a", "labels": {f"l{i}": "v" for i in range(MAX_LABELS + 1)}}]),
            "more than 64",
        ),  # memory bound on one alert
    ],
)
def test_a_bad_answer_is_one_line_naming_the_url(text, found):
    with pytest.raises(ParseError) as err:
        parse_alertmanager_alerts(text, path="http://am:9093/api/v2/alerts")
    message = str(err.value)
    assert found in message and message.startswith("http://am:9093/api/v2/alerts") and "\n" not in message


def test_label_values_are_cut_and_go_zero_times_are_unset():
    raw = [{"fingerprint": "f", "labels": {"alertname": "x" * 5000}, "endsAt": "0001-01-01T00:00:00Z"}]
    (alert,) = parse_alertmanager_alerts(orjson.dumps(raw))
    assert len(alert.name) == 500 and alert.ends_at is None


def _client(handler) -> AlertmanagerClient:
    return AlertmanagerClient("http://user:secret@am:9093", client=httpx.Client(transport=httpx.MockTransport(handler)))


def test_the_client_reads_the_real_answer_and_says_failures_in_one_line_without_credentials():
    assert _client(lambda r: httpx.Response(200, content=AMP.read_bytes())).alerts()[0].fingerprint

    with pytest.raises(BackendError, match="HTTP 503") as err:
        _client(lambda r: httpx.Response(503, text="down")).alerts()
    assert "secret" not in str(err.value)

    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(BackendError, match="ConnectError"):
        _client(refuse).alerts()
    with pytest.raises(BackendError, match="not JSON"):
        _client(lambda r: httpx.Response(200, text="<html>")).alerts()
    with pytest.raises(BackendError, match="not an http"):
        AlertmanagerClient("am:9093")


def test_the_watch_keeps_what_resolved_and_says_since_when_alertmanager_is_down():
    answers = [AMP.read_bytes(), b"[]", None]
    now = [T0]

    def handler(request):
        body = answers.pop(0)
        if body is None:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, content=body)

    watch = AlertWatch(_client(handler), clock=lambda: now[0])
    watch.poll()
    assert [a["name"] for a in watch.snapshot()["firing"]] == ["metric:alerting_rule"]
    now[0] += 15
    watch.poll()
    snap = watch.snapshot()
    assert snap["firing"] == [] and snap["resolved"][0]["resolved_at"] == T0 + 15
    now[0] += 15
    watch.poll()  # down: never raised, the lists stay
    snap = watch.snapshot()
    assert snap["down_since"] == T0 + 30 and "refused" in snap["error"] and len(snap["resolved"]) == 1
    assert "secret" not in orjson.dumps(snap).decode()


# -- alerts on the page ------------------------------------------------------------------------------


def _verdict(node: str, verdict: str, t: float) -> Event:
    return Event(
        kind=EventKind.HEALTH_VERDICT, t=t, source="hpcwatch collect", attrs={"node": node, "verdict": verdict}
    )


def test_store_verdicts_give_alerts_firing_and_resolved(store):
    store.add(
        [
            _verdict("node1", "ok", T0),
            _verdict("node1", "drain", T0 + 60),
            _verdict("node1", "drain", T0 + 120),
            _verdict("node1", "ok", T0 + 180),
            _verdict("node2", "warn", T0 + 60),
        ]
    )
    doc = alert_history(store)
    assert doc["source"] is None
    assert [(a["node"], a["name"], a["starts_at"]) for a in doc["firing"]] == [("node2", "health_warn", T0 + 60)]
    assert [(a["node"], a["starts_at"], a["resolved_at"]) for a in doc["resolved"]] == [("node1", T0 + 60, T0 + 180)]
    # a job on node1 from T0+100 to T0+150 saw its drain; one that ended before it did not
    assert [a["node"] for a in job_alerts(doc, ["node1"], t0=T0 + 100, t1=T0 + 150)] == ["node1"]
    assert job_alerts(doc, ["node1"], t0=T0, t1=T0 + 30) == []
    # read from T0 + 100 on: node1's first verdict then (drain) starts the window, its ok resolves it
    late = alert_history(store, since=T0 + 100)
    assert [(a["node"], a["starts_at"], a["resolved_at"]) for a in late["resolved"]] == [("node1", T0 + 120, T0 + 180)]


def test_with_alertmanager_its_firing_alerts_are_shown_and_its_outage_said(store):
    watch = {
        "source": "Alertmanager http://am:9093",
        "down_since": T0,
        "error": "refused",
        "firing": [{"name": "GpuXid", "labels": {"instance": "node3:9400"}, "starts_at": T0, "first_seen": T0}],
        "resolved": [],
    }
    doc = alert_history(store, watch=watch)
    assert doc["down_since"] == T0 and doc["firing"][0]["node"] == "node3"
    assert node_of_labels({"Hostname": "node4", "instance": "x:1"}) == "node4"


# -- notices and actions -----------------------------------------------------------------------------


def test_notices_say_whom_when_and_how_they_fared_and_what_they_concern(store):
    store.add(
        [
            _notice("job-end/4101", "sent", T0 + 10),
            _notice("health/node2/drain/1.000", "pending", T0 + 20, attempts=2),
            _notice("act/remediate/act-x", "sent", T0 + 30, document={"target": "node node2"}),
            _notice("digest/daily/user/alice/2023-11-14", "unrouted", T0 + 40),
        ]
    )
    found = notices_sent(store)
    assert [n.state for n in found] == ["unrouted", "sent", "failing", "sent"]
    assert {n.recipient for n in found} == {"ops@example.org"}
    assert [n.notice for n in notices_sent(store, node="node2")] == ["act/remediate/act-x", "health/node2/drain/1.000"]
    assert [n.job for n in notices_sent(store, job="4101")] == ["4101"]
    strip = acting_timeline(store, limit=10)
    assert {e["detail"]["state"] for e in strip if e["what"] == "notice"} == {"sent", "failing"}  # not unrouted


def test_actions_carry_who_why_evidence_and_their_undo(store):
    reserve = _action("reserve", T0, evidence={"verdict": "drain", "reason": "xid 79"})
    store.add([reserve.to_event(), _action("resume", T0 + 1).to_event()])
    store.add([Undo(of=reserve.id, t=T0 + 50, who="alice", argv=("scontrol",), rc=0).to_event()])
    newest, oldest = actions_taken(store, node="node2")
    assert newest.step == "resume" and oldest.step == "reserve"
    assert oldest.undone_by == "alice" and oldest.undone_t == T0 + 50 and oldest.can_undo
    assert "reason=xid 79" in oldest.evidence and oldest.who == "hpcwatch-act@ops1"
    whats = [e["what"] for e in acting_timeline(store, limit=10)]
    assert whats.count("action") == 2 and whats.count("undone") == 1


@pytest.mark.parametrize(
    ("steps", "stage"),
    [
        ([("reserve", True), ("resume", True)], "reserved"),
        ([("reserve", True), ("resume", True), ("check", True)], "checking"),
        ([("reserve", True), ("resume", False)], "failed"),  # a command that failed ends the episode
    ],
)
def test_a_node_under_remediation_has_its_stage(store, steps, stage):
    store.add([_action(step, T0 + i, ok=ok).to_event() for i, (step, ok) in enumerate(steps)])
    assert remediation_states(store, now=T0 + 60)["node2"]["stage"] == stage


def test_a_node_only_warned_about_or_stood_down_has_no_stage_nothing_was_done_to_it(store):
    store.add([_action("warn", T0).to_event()])
    assert "node2" not in remediation_states(store, now=T0 + 60)
    store.add([_action("stand_down", T0 + 1).to_event()])
    assert "node2" not in remediation_states(store, now=T0 + 60)
    store.add([_action("reserve", T0 + 2, episode=f"remediate/node2/{T0 + 2}").to_event()])
    assert remediation_states(store, now=T0 + 60)["node2"]["stage"] == "reserved"  # a later episode, reserved


def test_a_checks_result_shows_passed_then_leaves_the_tile_an_hour_after_release(store):
    result = _action("result", T0 + 2, evidence={"passed": True, "verdict": "ok"})
    store.add([_action("reserve", T0).to_event(), _action("check", T0 + 1).to_event(), result.to_event()])
    assert remediation_states(store, now=T0 + 60)["node2"]["stage"] == "passed"
    store.add([_action("release", T0 + 3).to_event()])
    assert remediation_states(store, now=T0 + 600)["node2"]["stage"] == "passed"
    assert "node2" not in remediation_states(store, now=T0 + 3 + 3601)


def test_the_job_page_gets_the_jobs_notices_and_the_actions_on_its_nodes_while_it_ran(store):
    warn = _action("warn", T0 + 5, policy="idle_gpus", episode="idle/4101", target="job 4101")
    elsewhere = _action("reserve", T0 + 5, node="node9")
    late = _action("reserve", T0 + 500)
    store.add([warn.to_event(), elsewhere.to_event(), late.to_event(), _notice("job-end/4101", "sent", T0 + 110)])
    acting = job_acting(store, "4101", nodes=["node2"], t0=T0, t1=T0 + 100)
    assert [a["id"] for a in acting["actions"]] == [warn.id]
    assert [n["notice"] for n in acting["notices"]] == ["job-end/4101"]


# -- Slurm's mail-user -------------------------------------------------------------------------------


def test_squeue_json_mail_user_is_kept_with_the_job(store):
    path = DATA / "slurm" / "slurmweb_25.11_v0044_slurm_jobs.json"
    jobs = list(parse_squeue_json(path.read_text(), path=path))
    assert jobs[0].mail_user == "rcarson"  # Slurm's default: the user's name
    store.add(jobs[:1])
    assert store.job(jobs[0].id).mail_user == "rcarson"


def test_a_store_written_before_mail_user_reads_it_as_none(tmp_path):
    root = tmp_path / "store"
    with Store(str(root)) as s:
        s.add([Job(id="1", user="alice", mail_user="a@example.org")])
    manifest_path = root / "manifest.json"
    manifest = orjson.loads(manifest_path.read_bytes())
    (part,) = manifest["tables"]["jobs"]
    old = pq.read_table(root / "jobs" / part["file"]).drop_columns(["mail_user"])
    pq.write_table(old, root / "jobs" / part["file"])
    del part["columns"]  # as an older hpcwatch listed it
    manifest_path.write_bytes(orjson.dumps(manifest))
    with Store(str(root)) as s:
        assert s.job("1") == Job(id="1", user="alice")
        s.add([Job(id="2", user="bob", mail_user="b@example.org")])  # old and new parts side by side
        assert [j.mail_user for j in s.jobs()] == [None, "b@example.org"]
    assert isinstance(old, pa.Table)


def test_recipients_take_the_users_map_then_slurms_mail_user_address_then_the_template():
    config = NotifyConfig(users={"alice": "alice@lab.org"}, user_template="{user}@example.org")
    assert user_address(config, "alice", None, mail_user="a@else.org") == "alice@lab.org"
    assert user_address(config, "bob", None, mail_user="bob@home.org") == "bob@home.org"
    assert user_address(config, "bob", None, mail_user="bob") == "bob@example.org"  # Slurm's default: no address
    assert user_address(config, "bob", None, mail_user="x@y.org\nBcc: z@w.org") == "bob@example.org"


def test_api_alerts_answers_from_the_store_without_alertmanager(store):
    import time

    from fastapi.testclient import TestClient

    from hpcwatch.model.cluster import reference_cluster
    from hpcwatch.web.app import create_app

    store.add([_verdict("node1", "drain", time.time() - 60), _verdict("node2", "drain", time.time() - 2 * 86400)])
    with TestClient(create_app(store, reference_cluster())) as client:
        doc = client.get("/api/alerts").json()
    assert doc["source"] is None and doc["down_since"] is None
    assert [a["node"] for a in doc["firing"]] == ["node1"]  # node2's, two days old, is past the panel's day


def test_serve_refuses_an_alertmanager_that_is_no_url_in_one_line(tmp_path):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "hpcwatch", "serve", "--db", str(tmp_path / "s"), "--alertmanager", "am:9093"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "not an http" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_live_strip_and_node_states_carry_what_act_did(store):
    import time

    from hpcwatch.reports.live import node_states
    from hpcwatch.reports.timeline import timeline

    now = time.time()
    store.add([_action("reserve", now - 30).to_event(), _action("check", now - 20).to_event()])
    store.add([_notice("health/node2/drain/1.000", "sent", now - 10)])
    whats = [(e["what"], e["node"]) for e in timeline(store, now=now)]
    assert whats == [("notice", "node2"), ("action", "node2"), ("action", "node2")]
    assert node_states(store, [], now=now)["node2"]["remediation"]["stage"] == "checking"


def test_a_notice_whose_payload_is_not_json_is_still_listed(store):
    row = _notice("job-end/7", "sent", T0)
    store.add([NoticeRow(**{**{f: getattr(row, f) for f in row.__slots__}, "payload": "{cut"})])
    (entry,) = notices_sent(store)
    assert entry.job == "7" and entry.subject == ""
