"""hpcwatch notify against a real SMTP server (aiosmtpd, STARTTLS + AUTH) and a real HTTP receiver, on the
real Slurm 22.05 capture tests/data/slurm/sacct.json (jobs 1-10 of alice and bob)."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from hpcwatch.cli import app
from hpcwatch.errors import ConfigError
from hpcwatch.notify.config import parse_notify_text
from hpcwatch.notify.loop import Notifier
from hpcwatch.records import Event, Job
from hpcwatch.reports.digest import last_period
from hpcwatch.store import Store, queries
from tests.conftest import DATA
from tests.unit.notify_servers import SMTP_PASSWORD, SMTP_USER, HttpReceiver, SmtpServer, self_signed_cert

SACCT = DATA / "slurm/sacct.json"
#: sacct.json's jobs 2, 3, 4 end at 1795991691 (2026-11-29 UTC); "now" is the next day, noon.
NOW = 1795991691.0 + 86400.0
SECRET = b"webhook-shared-secret"


@pytest.fixture(scope="module")
def cert(tmp_path_factory) -> tuple[Path, Path]:
    return self_signed_cert(tmp_path_factory.mktemp("cert"))


@pytest.fixture
def smtp(cert):
    server = SmtpServer(*cert).start()
    yield server
    server.stop()


@pytest.fixture
def receiver():
    server = HttpReceiver(secret=SECRET).start()
    yield server
    server.stop()


@pytest.fixture
def store(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["ingest", "--db", str(tmp_path / "store"), str(SACCT)])
    assert result.exit_code == 0, result.output
    with Store(tmp_path / "store") as s:
        yield s


def _config(tmp_path: Path, cert, smtp_port: int | None, *, extra: str = "", webhook: int | None = None) -> str:
    (tmp_path / "password").write_text(SMTP_PASSWORD + "\n")
    (tmp_path / "secret").write_bytes(SECRET + b"\n")
    text = f"""
[notify]
lookback_s = 1e9
user_template = "{{user}}@example.org"
operators = ["ops@example.org"]
security = ["cert@example.org"]
retry_base_s = 60.0
{extra}
[notify.languages]
bob = "fr"

[notify.coordinators]
proj-llm = ["pi-llm@example.org"]
"""
    if smtp_port is not None:
        text += f"""
[[notify.channel]]
type = "smtp"
name = "mail"
host = "127.0.0.1"
port = {smtp_port}
security = "starttls"
ca_file = "{cert[0]}"
username = "{SMTP_USER}"
password_file = "{tmp_path / "password"}"
sender = "hpcwatch@example.org"
"""
    if webhook is not None:
        text += f"""
[[notify.channel]]
type = "webhook"
name = "hook"
url = "http://127.0.0.1:{webhook}/hpcwatch"
secret_file = "{tmp_path / "secret"}"
audiences = ["user", "coordinators", "operators", "security"]
"""
    return text


def _notifier(store, text: str, now: list[float]) -> Notifier:
    return Notifier(store, parse_notify_text(text, path="notify.toml"), clock=lambda: now[0])


def _jobs_json(store_path: Path) -> list[dict]:
    result = CliRunner().invoke(app, ["jobs", "--db", str(store_path), "--json"])
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.output)
    return doc if isinstance(doc, list) else doc["jobs"]


# -- SMTP: STARTTLS, AUTH, the job-end report in the user's language -----------------------------------------


def test_job_end_reports_go_through_starttls_and_auth_in_the_users_language(tmp_path, store, smtp, cert):
    notifier = _notifier(store, _config(tmp_path, cert, smtp.port, extra='kinds = ["job_end"]'), [NOW])
    notifier.check()  # connects, STARTTLS, AUTH
    summary = notifier.run_once()
    ended = {j.id for j in store.jobs() if j.end is not None}
    assert summary.sent == len(ended) == 6 and summary.pending == 0
    assert all(r.tls and r.authenticated for r in smtp.received)
    by_job = {r.message["X-Hpcwatch-Notice"]: r for r in smtp.received}
    assert set(by_job) == {f"job-end/{j}" for j in ended}
    three = by_job["job-end/3"]  # bob's: French
    assert three.rcpt_tos == ["bob@example.org"] and three.message["Content-Language"] == "fr"
    assert three.message["Subject"] == "[hpcwatch] job 3 (b1) terminé : COMPLETED"
    text = three.message.get_body(("plain",)).get_content()
    html = three.message.get_body(("html",)).get_content()
    assert "Votre job 3 est terminé" in text and "<th" in html and "Heures-GPU" in html
    gpu_hours = next(j for j in _jobs_json(Path(store.path)) if j["id"] == "3")["gpu_hours"]
    assert f"{gpu_hours:.2f}".replace(".", ",") in text  # the figure hpcwatch jobs --json gives
    two = by_job["job-end/2"]  # alice's: English, with the report's advice
    assert "Your job 2 has ended" in two.message.get_body(("plain",)).get_content()
    assert "memory: " in two.message.get_body(("plain",)).get_content()


def test_a_server_refusing_the_password_stops_the_start_with_one_line(tmp_path, store, smtp, cert, run_cli):
    (tmp_path / "n.toml").write_text(_config(tmp_path, cert, smtp.port))
    (tmp_path / "password").write_text("wrong\n")
    code, _out, err = run_cli(["notify", "--db", str(store.path), "--config", str(tmp_path / "n.toml"), "--once"])
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("hpcwatch: smtp channel mail: 127.0.0.1:") and "SMTPAuthenticationError" in err


def test_an_unreachable_smtp_host_at_start_exits_2_with_one_line(tmp_path, store, cert, run_cli):
    dead = SmtpServer(*cert).start()
    port = dead.port
    dead.stop()
    (tmp_path / "n.toml").write_text(_config(tmp_path, cert, port))
    code, _out, err = run_cli(["notify", "--db", str(store.path), "--config", str(tmp_path / "n.toml"), "--once"])
    assert code == 2 and err.count("\n") == 1 and "Connection refused" in err
    assert queries.pending_notices(store) == []  # nothing composed before the check failed


# -- each notice once -------------------------------------------------------------------------------------


def test_a_restart_sends_nothing_twice(tmp_path, store, smtp, cert):
    text = _config(tmp_path, cert, smtp.port)
    first = _notifier(store, text, [NOW]).run_once()
    assert first.sent == len(smtp.received) > 0 and first.pending == 0
    with Store(store.path) as reopened:  # another process, later: a restart
        again = _notifier(reopened, text, [NOW + 60]).run_once()
    assert (again.composed, again.sent) == (0, 0)
    keys = [(r.message["X-Hpcwatch-Notice"], tuple(r.rcpt_tos)) for r in smtp.received]
    assert len(keys) == len(set(keys))


def test_the_rate_limit_defers_to_a_later_hour_and_drops_nothing(tmp_path, store, smtp, cert):
    now = [NOW]
    notifier = _notifier(store, _config(tmp_path, cert, smtp.port, extra="rate_per_hour = 2"), now)
    first = notifier.run_once()
    to_alice = [r for r in smtp.received if r.rcpt_tos == ["alice@example.org"]]
    assert len(to_alice) == 2 and first.pending > 0
    now[0] += 3601
    notifier.run_once()
    now[0] += 3601
    last = notifier.run_once()
    assert last.pending == 0
    # alice: job ends 1, 2, 5 and her daily and weekly digests
    assert len([r for r in smtp.received if r.rcpt_tos == ["alice@example.org"]]) == 5


# -- outage and recovery --------------------------------------------------------------------------------------


def test_a_dead_smtp_server_loses_nothing_and_logs_one_line_down_and_one_back(tmp_path, store, cert, caplog):
    server = SmtpServer(*cert).start()
    port = server.port
    server.stop()
    now = [NOW]
    notifier = _notifier(store, _config(tmp_path, cert, port), now)
    caplog.set_level(logging.INFO, logger="hpcwatch.notify")
    first = notifier.run_once()
    assert first.sent == 0 and first.failed == 1 and first.pending > 0 and first.down == ("mail",)
    owed = first.pending
    now[0] += 30  # within the back-off: not even tried
    assert notifier.run_once().failed == 0
    now[0] += 60  # past it: tried, fails again, no new log line
    assert notifier.run_once().failed == 1
    server = SmtpServer(*cert, port=port).start()  # the server comes back on its port
    try:
        now[0] += 600
        back = notifier.run_once()
        assert back.sent == owed == len(server.received) and back.pending == 0 and back.down == ()
    finally:
        server.stop()
    lines = [r for r in caplog.records if r.name == "hpcwatch.notify"]
    assert [r.levelname for r in lines] == ["WARNING", "INFO"]
    assert (
        "channel mail is down" in lines[0].getMessage() and "channel mail is back after 690 s" in lines[1].getMessage()
    )


# -- the webhook: HMAC, escaped JSON; digests equal to hpcwatch jobs --json ------------------------------------


def test_webhook_deliveries_are_signed_and_digests_match_jobs_json(tmp_path, store, receiver, cert):
    summary = _notifier(store, _config(tmp_path, cert, None, webhook=receiver.port), [NOW]).run_once()
    assert summary.sent == len(receiver.deliveries) > 0
    assert all(d.signature_ok for d in receiver.deliveries)
    assert all(d.headers["Content-Type"] == "application/json" for d in receiver.deliveries)
    digests = {d.document["notice"]: d.document for d in receiver.deliveries if d.document["kind"] == "digest"}
    jobs = _jobs_json(Path(store.path))
    t0, t1 = last_period("daily", NOW)
    for who, field in (("alice", "user"), ("bob", "user"), ("proj-llm", "account"), ("proj-vision", "account")):
        doc = digests[f"digest/daily/{field}/{who}/2026-11-29"]
        mine = [j for j in jobs if j[field] == who and j["end"] is not None and t0 <= j["end"] < t1]
        assert [j["id"] for j in doc["jobs"]] == [j["id"] for j in mine]
        assert doc["gpu_hours"] == pytest.approx(sum(j["gpu_hours"] for j in mine))
        assert doc["energy_kwh"] == pytest.approx(sum(j["energy_kwh"] for j in mine))
        assert [j["advice"] for j in doc["jobs"]] == [j["advice"] for j in mine]
        assert doc["gpu_hours"] > 0
    delivery_ids = [d.headers["X-Hpcwatch-Delivery"] for d in receiver.deliveries]
    assert len(set(delivery_ids)) == len(delivery_ids)


def test_a_tampered_body_fails_the_signature_check(receiver):
    from hpcwatch.notify.webhook import signature

    body = b'{"kind":"health"}'
    good = signature(SECRET, 1800000000, body)
    assert good == "sha256=" + __import__("hmac").new(SECRET, b"1800000000." + body, hashlib.sha256).hexdigest()
    assert signature(SECRET, 1800000000, body + b" ") != good and signature(SECRET, 1800000001, body) != good


def test_a_webhook_answering_503_keeps_the_delivery_pending_until_it_answers_200(tmp_path, store, receiver, cert):
    now = [NOW]
    receiver.status = 503
    notifier = _notifier(store, _config(tmp_path, cert, None, webhook=receiver.port, extra='kinds = ["job_end"]'), now)
    down = notifier.run_once()
    assert down.sent == 0 and down.failed == 1 and down.pending == 6
    receiver.status = 200
    now[0] += 120
    assert notifier.run_once().sent == 6
    sent = [d.document["notice"] for d in receiver.deliveries if d.headers.get("X-Hpcwatch-Signature")]
    assert sorted(set(sent)) == sorted(f"job-end/{i}" for i in ("1", "2", "3", "4", "5", "6"))


# -- hostile data -----------------------------------------------------------------------------------------------

EVIL_USER = "eve\r\nBcc: victim@example.net"
EVIL_NAME = "<script>alert(1)</script>\r\nX-Injected: yes \u202egnp.exe"


def _hostile_store(store) -> None:
    store.add(
        [
            Job(
                id="666",
                user=EVIL_USER,
                account="acct\nBcc: x@example.net",
                partition="gpu",
                nodes=("node1",),
                gpus=1,
                start=NOW - 7200,
                end=NOW - 3600,
                state="COMPLETED",
                name=EVIL_NAME,
            ),
            Event(
                kind="health_verdict",
                t=NOW - 100,
                source="test",
                attrs={"node": "node9\r\nBcc: a@b.c", "verdict": "drain", "reason": "<b>xid 79</b>"},
            ),
        ]
    )


def test_hostile_job_and_user_names_inject_no_header_and_are_escaped(tmp_path, store, smtp, cert):
    _hostile_store(store)
    text = _config(tmp_path, cert, smtp.port).replace(
        "[notify.languages]",
        '[notify.users]\n"eve\\r\\nBcc: victim@example.net" = "eve@example.org"\n\n[notify.languages]',
    )
    _notifier(store, text, [NOW]).run_once()
    evil = [r for r in smtp.received if r.message["X-Hpcwatch-Notice"] == "job-end/666"]
    assert len(evil) == 1 and evil[0].rcpt_tos == ["eve@example.org"]
    headers = {k.lower() for k in evil[0].message}
    assert "bcc" not in headers and "x-injected" not in headers
    assert b"\r\nBcc:" not in evil[0].raw and b"\r\nX-Injected" not in evil[0].raw
    subject = evil[0].message["Subject"]
    assert "\r" not in subject and "\n" not in subject and "\u202e" not in subject and "\\u202e" in subject
    html = evil[0].message.get_body(("html",)).get_content()
    assert "<script>" not in html and "&lt;script&gt;" in html
    plain = evil[0].message.get_body(("plain",)).get_content()
    assert "\u202e" not in plain and "\\x0d\\x0aX-Injected" in plain
    drained = [r for r in smtp.received if r.message["X-Hpcwatch-Notice"].startswith("health/node9")]
    assert len(drained) == 1 and drained[0].rcpt_tos == ["ops@example.org"]
    assert "<b>" not in drained[0].message.get_body(("html",)).get_content()
    assert all(len(r.rcpt_tos) == 1 for r in smtp.received)


def test_a_user_name_that_would_make_a_bad_address_gets_no_mail(tmp_path, store, smtp, cert):
    _hostile_store(store)
    summary = _notifier(store, _config(tmp_path, cert, smtp.port), [NOW]).run_once()
    assert summary.pending == 0
    assert not [r for r in smtp.received if r.message["X-Hpcwatch-Notice"] == "job-end/666"]
    assert not [r for r in smtp.received if any("victim" in t for t in r.rcpt_tos)]


def test_hostile_names_are_escaped_in_the_webhook_json(tmp_path, store, receiver, cert):
    _hostile_store(store)
    _notifier(store, _config(tmp_path, cert, None, webhook=receiver.port), [NOW]).run_once()
    (evil,) = [d for d in receiver.deliveries if d.document["notice"] == "job-end/666"]
    assert "\u202e".encode() not in evil.body and b"\r" not in evil.body
    assert evil.document["job"]["name"] == EVIL_NAME.replace("\r", "\\x0d").replace("\n", "\\x0a").replace(
        "\u202e", "\\u202e"
    )
    assert evil.signature_ok


# -- health verdicts: one notice per episode ----------------------------------------------------------------------


def test_a_node_drained_for_days_is_one_notice_not_one_per_run(tmp_path, store, smtp, cert):
    day = 86400.0
    store.add(
        [
            Event(kind="health_verdict", t=NOW - 3 * day + i * 600, source="t", attrs={"node": "node1", "verdict": v})
            for i, v in enumerate(["ok"] + ["drain"] * 20)
        ]
    )
    text = _config(tmp_path, cert, smtp.port, extra='kinds = ["health"]').replace(
        "lookback_s = 1e9", "lookback_s = 3600.0"
    )
    now = [NOW - 3 * day + 20 * 600 + 1]
    notifier = _notifier(store, text, now)
    assert notifier.run_once().sent == 1
    for _ in range(3):  # later runs, the drain still going on: the window no longer holds its start
        now[0] += day
        store.add(
            [Event(kind="health_verdict", t=now[0] - 10, source="t", attrs={"node": "node1", "verdict": "drain"})]
        )
        assert notifier.run_once().composed == 0
    assert len(smtp.received) == 1


# -- bad configuration: exit 2, one line --------------------------------------------------------------------------

BAD_CONFIGS = [
    # an unknown channel type, on the line of its table
    ('[notify]\n[[notify.channel]]\ntype = "pager"\n', "notify.toml:3: unknown channel type 'pager'"),
    # a key no channel kind has
    (
        '[notify]\n[[notify.channel]]\ntype = "smtp"\nhots = "x"\n',
        "notify.toml:4: unknown key 'hots' for a smtp channel",
    ),
    # the address template names a field a job does not have
    (
        '[notify]\nuser_template = "{login}@example.org"\n',
        "notify.toml:2: [notify] user_template names an unknown field {login}",
    ),
    # a wrong type
    ('[notify]\nrate_per_hour = "many"\n', "notify.toml:2: rate_per_hour must be int"),
    # a webhook without a secret: deliveries must be signed
    ('[notify]\n[[notify.channel]]\ntype = "webhook"\nurl = "http://127.0.0.1:9/x"\n', "secret_file is required"),
    # credentials in a URL would be logged
    (
        '[notify]\n[[notify.channel]]\ntype = "slack"\nurl = "https://u:p@hooks.example.org/x"\n',
        "credentials in the URL",
    ),
    # AUTH over plain text
    (
        '[notify]\n[[notify.channel]]\ntype = "smtp"\nsecurity = "none"\nusername = "u"\npassword_file = "/p"\n',
        "AUTH over a plain connection",
    ),
    # an unknown language
    ('[notify]\nlanguage = "de"\n', "language must be one of en, fr"),
    # two addresses in one string would be a second recipient
    ('[notify]\noperators = ["ops@example.org, evil@example.net"]\n', "notify.toml:2: [notify] operators: 'ops@"),
    # a CR/LF in a mapped address
    ('[notify.users]\nalice = "alice@example.org\\r\\nBcc: x@example.net"\n', "users.alice: "),
]


@pytest.mark.parametrize(("text", "message"), BAD_CONFIGS)
def test_bad_configuration_is_one_config_error(text, message):
    with pytest.raises(ConfigError) as err:
        parse_notify_text(text, path="notify.toml")
    assert message in str(err.value)


def test_a_template_naming_an_unknown_field_exits_2_with_its_line(tmp_path, store, run_cli):
    folder = tmp_path / "templates"
    folder.mkdir()
    (folder / "job_end.txt.j2").write_text("Job {{ rows }}\n{{ job_nmae }}\n")
    (tmp_path / "n.toml").write_text(f'[notify]\ntemplates = "{folder}"\n')
    code, _out, err = run_cli(["notify", "--db", str(store.path), "--config", str(tmp_path / "n.toml"), "--once"])
    assert code == 2 and err.count("\n") == 1
    assert "job_end.txt.j2:2: names an unknown field 'job_nmae'" in err


def test_an_unknown_channel_in_collects_file_stops_collect_with_one_line(tmp_path, run_cli):
    (tmp_path / "c.toml").write_text(
        f'[store]\npath = "{tmp_path / "s"}"\n[notify]\n[[notify.channel]]\ntype = "sms"\n'
    )
    code, _out, err = run_cli(["collect", "--config", str(tmp_path / "c.toml"), "--check"])
    assert code == 2 and err.count("\n") == 1 and "c.toml:5: unknown channel type 'sms'" in err


def test_collect_runs_notify_as_one_more_collector(tmp_path, store, receiver, cert):
    from hpcwatch.collect.config import parse_config
    from hpcwatch.collect.daemon import Daemon

    text = f'[store]\npath = "{store.path}"\n' + _config(
        tmp_path, cert, None, webhook=receiver.port, extra='kinds = ["job_end"]'
    )
    cfg = parse_config(text, path="c.toml")
    assert cfg.notify is not None and cfg.collectors[-1] is cfg.notify
    statuses = Daemon(cfg, node="t").run_once()
    assert statuses["notify"].last_error is None and statuses["notify"].records == 6
    assert len(receiver.deliveries) == 6


def test_the_sample_configs_notify_table_parses_once_uncommented():
    from hpcwatch.collect.config import parse_config

    text = (Path(__file__).resolve().parents[2] / "deploy" / "hpcwatch.toml").read_text()
    head, _, notify = text.partition("# [notify]")
    uncommented = head + "\n".join(
        line[2:] if line.startswith("# ") else line for line in ("# [notify]" + notify).splitlines()
    )
    cfg = parse_config(uncommented, path="hpcwatch.toml")
    assert cfg.notify is not None and [c.type for c in cfg.notify.channels] == ["smtp", "webhook", "slack"]
    assert cfg.notify.users == {"alice": "alice@lab.example.org"} and cfg.notify.coordinators["proj-llm"] == (
        "pi-llm@example.org",
    )


def test_a_new_channel_kind_is_one_registry_line(tmp_path, store):
    from dataclasses import dataclass

    from hpcwatch.notify import channels

    sent = []

    @dataclass(frozen=True, slots=True, kw_only=True)
    class ToyConfig:
        room: str = "ops"

    class Toy:
        def __init__(self, name, config):
            self.name, self.config = name, config

        def check(self):
            pass

        def send(self, payload, *, delivery):
            sent.append((self.config.room, payload.notice))

        def close(self):
            pass

    channels.register(
        channels.ChannelKind(name="toy", config=ToyConfig, make=Toy, per_address=False, audiences=("user",))
    )
    try:
        text = '[notify]\nlookback_s = 1e9\nkinds = ["job_end"]\n[[notify.channel]]\ntype = "toy"\nroom = "hpc"\n'
        summary = _notifier(store, text, [NOW]).run_once()
    finally:
        del channels.CHANNELS["toy"]
    assert summary.sent == 6 and {room for room, _ in sent} == {"hpc"}


def test_the_job_end_report_carries_the_steps_and_straggler_where_the_store_has_them(tmp_path, receiver, cert):
    """The real 4-rank gloo job of tests/data/kineto/gloo_straggler/hook (rank 2 sleeps 40 ms in backward)."""
    from hpcwatch.ingest import ingest_paths

    with Store(tmp_path / "s") as st:
        ingest_paths(st, [DATA / "kineto" / "gloo_straggler" / "hook"])
        text = _config(tmp_path, cert, None, webhook=receiver.port)
        summary = _notifier(st, text, [NOW]).run_once(job="gloo-test")
    assert summary.sent == 1
    (doc,) = [d.document for d in receiver.deliveries]
    assert doc["notice"] == "job-end/gloo-test" and doc["step_time_s"] > 0
    assert "Training steps:" in doc["text"] and "Straggler:" in doc["text"]
    straggler = next(line for line in doc["text"].splitlines() if "Straggler:" in line)
    assert "rank 2" in straggler and "backward" in straggler
    assert "job:" in doc["text"]  # what the store could not say is said (no Slurm record of this job)


def test_a_job_cancelled_before_it_started_is_composed_once_and_holds_nothing_back(tmp_path, store, smtp, cert):
    store.add([Job(id="77", user="alice", account="proj-llm", start=None, end=NOW - 10, state="CANCELLED")])
    notifier = _notifier(store, _config(tmp_path, cert, smtp.port, extra='kinds = ["job_end"]'), [NOW])
    first = notifier.run_once()
    assert first.sent == 6 and first.unrouted == 1  # the six reports of sacct.json, and job 77's nothing
    assert notifier.run_once().composed == 0
    assert "job-end/77" not in {r.message["X-Hpcwatch-Notice"] for r in smtp.received}


def test_notify_job_of_a_job_the_store_does_not_know_exits_1_and_stores_nothing(tmp_path, store, run_cli, caplog):
    (tmp_path / "n.toml").write_text('[notify]\nuser_template = "{user}@example.org"\n')
    argv = ["notify", "--db", str(store.path), "--config", str(tmp_path / "n.toml"), "--job", "424242", "--json"]
    code, out, _err = run_cli(argv)
    assert code == 1 and orjson.loads(out)["unbuilt"] == 1
    assert "cannot compose job-end/424242: InputError: no job 424242 in the store" in caplog.text
    assert queries.notice_keys(store, ["job-end/424242"]) == set()  # the run that stores the job composes it


def test_slack_posts_text_with_its_markup_escaped(tmp_path, store, receiver):
    _hostile_store(store)
    url = f"http://127.0.0.1:{receiver.port}/hooks/secret-token"
    text = f'[notify]\nlookback_s = 1e9\nkinds = ["health"]\n[[notify.channel]]\ntype = "slack"\nurl = "{url}"\n'
    assert _notifier(store, text, [NOW]).run_once().sent == 1
    (post,) = receiver.deliveries
    assert set(post.document) == {"text"} and "X-Hpcwatch-Signature" not in post.headers
    assert "&lt;b&gt;xid 79&lt;/b&gt;" in post.document["text"] and "<b>" not in post.document["text"]
    assert "\r" not in post.document["text"].split("\n", 1)[0]  # the subject line: node9\x0d\x0a..., one line


def test_collect_check_shows_no_webhook_token(tmp_path, run_cli):
    (tmp_path / "c.toml").write_text(
        f'[store]\npath = "{tmp_path / "s"}"\n[notify]\ncheck_at_start = false\n'
        '[[notify.channel]]\ntype = "slack"\nurl = "https://hooks.example.org/services/T0/B0/s3cr3t"\n'
    )
    code, out, _err = run_cli(["collect", "--config", str(tmp_path / "c.toml"), "--check", "--json"])
    assert code == 0 and "s3cr3t" not in out and "https://hooks.example.org/…" in out


# -- an account's coordinators as Slurm knows them (coordinators_file: real sacctmgr 22.05 listings) ----------

SACCTMGR = DATA / "sacctmgr"


def _slurm_coordinators(tmp_path: Path, cert, port: int | None, listing: str = "user-withcoordinator-22.05.txt") -> str:
    """alice and carol coordinate proj-vision, carol proj-llm (the real capture); carol has a mapped
    address and reads French; the hand table adds the PI of proj-llm."""
    saved = tmp_path / "coordinators.txt"
    saved.write_text((SACCTMGR / listing).read_text())
    text = _config(tmp_path, cert, port, extra=f'kinds = ["digest"]\ncoordinators_file = "{saved}"')
    return (
        text.replace('bob = "fr"', 'bob = "fr"\ncarol = "fr"') + '\n[notify.users]\ncarol = "carol@lab.example.org"\n'
    )


def test_an_accounts_digest_reaches_the_coordinators_slurm_names_and_the_hand_written_ones(tmp_path, store, smtp, cert):
    notifier = _notifier(store, _slurm_coordinators(tmp_path, cert, smtp.port), [NOW])
    assert notifier.run_once().pending == 0
    to = {}
    for r in smtp.received:
        notice = r.message["X-Hpcwatch-Notice"]
        if notice.startswith("digest/daily/account/"):
            to.setdefault(notice.split("/")[3], {}).update({a: r.message["Content-Language"] for a in r.rcpt_tos})
    assert to["proj-vision"] == {"alice@example.org": "en", "carol@lab.example.org": "fr"}  # template; users map
    assert to["proj-llm"] == {"carol@lab.example.org": "fr", "pi-llm@example.org": "en"}  # Slurm's, plus the hand's


def test_both_sacctmgr_listings_give_the_same_recipients_each_once(tmp_path, cert):
    from hpcwatch.notify.recipients import audience_addresses

    found = []
    for listing in ("user-withcoordinator-22.05.txt", "account-withcoordinator-22.05.txt"):
        folder = tmp_path / listing
        folder.mkdir()
        text = _slurm_coordinators(folder, cert, None, listing)
        text = text.replace('proj-llm = ["pi-llm@example.org"]', 'proj-llm = ["carol@lab.example.org"]')
        config = parse_notify_text(text, path="notify.toml")
        found.append({a: audience_addresses(config, "coordinators", account=a) for a in ("proj-llm", "proj-vision")})
    assert found[0] == found[1]
    assert found[0] == {
        "proj-llm": ("carol@lab.example.org",),  # in Slurm's file and in the hand table: one mail
        "proj-vision": ("alice@example.org", "carol@lab.example.org"),
    }


def test_a_bad_coordinators_file_exits_2_naming_the_config_line_and_the_files_line(tmp_path, store, cert, run_cli):
    text = _slurm_coordinators(tmp_path, cert, None)
    (tmp_path / "coordinators.txt").write_text("User|Def Acct|Admin|Coord Accounts\nalice|proj-llm|None\n")
    (tmp_path / "n.toml").write_text(text)
    code, _out, err = run_cli(["notify", "--db", str(store.path), "--config", str(tmp_path / "n.toml"), "--once"])
    line = text.splitlines().index(next(x for x in text.splitlines() if x.startswith("coordinators_file"))) + 1
    assert code == 2 and err.count("\n") == 1
    assert f"n.toml:{line}: [notify] coordinators_file: {tmp_path / 'coordinators.txt'}:2: want 4" in err
    (tmp_path / "coordinators.txt").unlink()
    with pytest.raises(ConfigError, match=r"notify.toml:\d+: \[notify\] coordinators_file: .*cannot read"):
        parse_notify_text(text, path="notify.toml")


def test_a_changed_coordinators_file_is_read_again_and_a_broken_one_keeps_the_last(tmp_path, cert, monkeypatch, caplog):
    import os

    from hpcwatch.notify.recipients import audience_addresses
    from hpcwatch.sources import sacctmgr

    config = parse_notify_text(_slurm_coordinators(tmp_path, cert, None), path="notify.toml")
    saved = tmp_path / "coordinators.txt"
    assert audience_addresses(config, "coordinators", account="proj-llm")[0] == "carol@lab.example.org"
    monkeypatch.setattr(sacctmgr, "RECHECK_S", 0.0)
    saved.write_text(saved.read_text().replace("bob|proj-vision|None|", "bob|proj-vision|None|proj-llm"))
    os.utime(saved, (1.0, 1.0))  # another mtime even within the filesystem's clock tick
    assert "bob@example.org" in audience_addresses(config, "coordinators", account="proj-llm")
    saved.write_text("half a line")
    os.utime(saved, (2.0, 2.0))
    with caplog.at_level(logging.WARNING, logger="hpcwatch.notify"):
        for _ in range(3):
            assert "bob@example.org" in audience_addresses(config, "coordinators", account="proj-llm")
    assert [r.getMessage() for r in caplog.records].count(
        f"coordinators file kept as last read: {saved}:1: want a header starting User| or Account| with a "
        "'Coord Accounts' column (sacctmgr show user withcoordinator --parsable2) (found: 'half a line')"
    ) == 1
