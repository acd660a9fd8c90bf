"""The node agent (collect/agent.py), its shipments (collect/shipment.py), the central receiver
(collect/receive.py) and the spool collector reading what they wrote: real outputs from tests/data,
written by stand-in commands, shipped over a spool folder and over HTTP on port 0."""

from __future__ import annotations

import http.client
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcwatch.collect.agent import Agent, ShipmentQueue, run_check
from hpcwatch.collect.config import AgentCheck, AgentSection, ReceiveSection, SpoolSection, parse_config
from hpcwatch.collect.receive import Receiver
from hpcwatch.collect.shipment import PUSH_PATH, Shipment, read_from_spool, write_to_spool
from hpcwatch.collect.spool import SpoolCollector
from hpcwatch.errors import ConfigError
from hpcwatch.store import Store
from hpcwatch.vocab import EventKind

DATA = Path(__file__).resolve().parents[1] / "data"
XML = DATA / "nvidia_smi" / "nvidia_smi_q.xml"
PERFQUERY = DATA / "health" / "perfquery_hca_0x7cfe9003003b4b96.out"
IBSTAT = DATA / "infiniband" / "ibstat_two_cas.txt"
DCGMI = DATA / "health" / "dcgmi_diag_r3_dcgm4_fail.json"
TOKEN = "s3cret-token-of-node7-0123456789"


def stand_in(path: Path, status: int = 0) -> tuple[str, ...]:
    """A command that writes a real output and exits with ``status`` (dcgmi diag exits non-zero on a fail)."""
    code = f"import sys; sys.stdout.buffer.write(open({str(path)!r}, 'rb').read()); sys.exit({status})"
    return (sys.executable, "-c", code)


def checks() -> tuple[AgentCheck, ...]:
    return (
        AgentCheck(name="nvidia-smi", command=stand_in(XML), format="nvidia-smi-xml"),
        AgentCheck(name="perfquery", command=stand_in(PERFQUERY), format="perfquery"),
        AgentCheck(name="ibstat", command=stand_in(IBSTAT), format="ibstat"),
        AgentCheck(name="dcgmi-diag", command=stand_in(DCGMI, 226), format="dcgmi-diag"),
    )


def section(tmp_path: Path, **kw) -> AgentSection:
    kw.setdefault("checks", checks())
    return AgentSection(queue_dir=str(tmp_path / "queue"), **kw)


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "store") as s:
        yield s


# -- one check -------------------------------------------------------------------------------------------------


def test_a_check_ships_its_output_byte_for_byte_with_status_and_times():
    s = run_check(AgentCheck(name="d", command=stand_in(DCGMI, 226), format="dcgmi-diag"), "node7", clock=lambda: 1e9)
    assert s.output == DCGMI.read_bytes() and s.exit_status == 226 and s.started_s == 1e9
    assert not s.truncated and not s.timed_out and 0 < s.duration_s < 30


def test_output_past_the_bound_is_cut_and_said_and_the_command_is_not_blocked():
    s = run_check(
        AgentCheck(
            name="big",
            command=(sys.executable, "-c", "print('x' * 3_000_000)"),
            format="perfquery",
            max_output_bytes=1000,
        ),
        "node7",
    )
    assert len(s.output) == 1000 and s.truncated and s.exit_status == 0


def test_a_check_past_its_timeout_is_killed_with_its_children():
    code = "import subprocess, sys; subprocess.run(['sleep', '60']); print('never')"
    s = run_check(
        AgentCheck(name="slow", command=(sys.executable, "-c", code), format="perfquery", timeout_s=0.5), "node7"
    )
    assert s.timed_out and s.exit_status is None and s.duration_s < 10 and s.output == b""


def test_a_missing_command_is_a_shipment_saying_so():
    s = run_check(AgentCheck(name="gone", command=("/nonexistent/ibstat",), format="ibstat"), "node7")
    assert s.exit_status is None and "cannot run /nonexistent/ibstat" in s.error


# -- the config ------------------------------------------------------------------------------------------------

AGENT_TOML = """
[agent]
node = "node7"
push_url = "http://central:8471"
token_file = "/etc/hpcwatch/agent.token"

[[agent.check]]
command = ["nvidia-smi", "-q", "-x"]
format = "nvidia-smi-xml"

[[agent.check]]
name = "hca"
command = ["perfquery", "-x"]
format = "perfquery"
interval_s = 30
"""


def test_agent_config_takes_any_registered_format_by_name():
    cfg = parse_config(AGENT_TOML, path="agent.toml")
    assert cfg.agent is not None and [c.name for c in cfg.agent.checks] == ["nvidia-smi-xml", "hca"]
    assert cfg.agent.checks[1].interval_s == 30.0 and cfg.agent.checks[0].command == ("nvidia-smi", "-q", "-x")


def test_an_unknown_format_is_refused_naming_its_line():
    with pytest.raises(ConfigError, match=r"agent.toml:14: .*unknown format 'perfqueri'"):
        parse_config(AGENT_TOML.replace('"perfquery"', '"perfqueri"'), path="agent.toml")


def test_a_receiver_whose_spool_no_spool_collector_reads_is_refused(tmp_path):
    text = f'[[receive]]\nspool = "{tmp_path}/in"\ntokens_file = "{tmp_path}/t"\n'
    with pytest.raises(ConfigError, match="read by no"):
        parse_config(text, path="c.toml")
    cfg = parse_config(text + f'[[spool]]\npath = "{tmp_path}/in"\n', path="c.toml")
    assert any(isinstance(c, ReceiveSection) for c in cfg.collectors)


# -- spool mode end to end -------------------------------------------------------------------------------------


def test_agent_into_a_spool_then_the_central_spool_collector_stores_every_output(tmp_path, store):
    spool = tmp_path / "spool"
    spool.mkdir()
    agent = Agent(section(tmp_path, spool=str(spool)), node="node7")
    assert agent.run_once(drain_timeout_s=20)
    shipped = sorted(p.name for p in spool.iterdir())
    assert len(shipped) == 4 and all(n.startswith("agent-node7-") for n in shipped)
    assert read_from_spool(next(spool.glob("agent-node7-nvidia-smi-*"))).output == XML.read_bytes()

    result = SpoolCollector(store, SpoolSection(name="spool", path=str(spool), settle_s=30)).run()
    assert result.records > 0 and not result.note  # shipments need no settling: renamed into place whole
    runs = {e.attrs["check"]: e.attrs for e in store.events(EventKind.AGENT_CHECK)}
    assert set(runs) == {"nvidia-smi", "perfquery", "ibstat", "dcgmi-diag"}
    assert runs["dcgmi-diag"]["exit_status"] == 226 and runs["nvidia-smi"]["exit_status"] == 0
    assert all(r["ingest"] == "stored" and r["node"] == "node7" for r in runs.values())
    diag = store.events(EventKind.DCGM_DIAG)
    assert diag and diag[0].attrs["node"] == "node7"  # the node came from the shipment, not the file
    assert set(store.samples()["host"].to_pylist()) == {"node7"}
    assert {"DCGM_FI_DEV_GPU_UTIL", "ib_PortXmitData_bytes", "ib_port_up"} <= set(store.metrics())
    assert not list(spool.iterdir())  # read and removed


def test_host_checks_df_and_edac_through_the_agent_are_judged_at_the_centre(tmp_path, store):
    from hpcwatch.analysis.health import health_report

    spool = tmp_path / "spool"
    spool.mkdir()
    host_checks = (
        AgentCheck(name="df", command=stand_in(DATA / "df" / "df_i_root_inodes_100pct_psf_chef_43.txt"), format="df"),
        AgentCheck(
            name="edac", command=stand_in(DATA / "edac" / "edac_util_v_mc2_7836_ce_liaosirui.txt"), format="edac"
        ),
        AgentCheck(name="no-edac", command=(sys.executable, "-c", "import sys; sys.exit(2)"), format="edac"),
    )
    agent = Agent(section(tmp_path, spool=str(spool), checks=host_checks), node="node7")
    assert agent.run_once(drain_timeout_s=20)
    SpoolCollector(store, SpoolSection(name="spool", path=str(spool), settle_s=30)).run()
    runs = {e.attrs["check"]: e.attrs for e in store.events(EventKind.AGENT_CHECK)}
    assert runs["df"]["ingest"] == runs["edac"]["ingest"] == "stored"
    assert runs["no-edac"]["exit_status"] == 2 and runs["no-edac"]["ingest"] != "stored"  # a node without EDAC
    node = health_report(store.samples()).node("node7")
    assert {c.rule: c.verdict for c in node.checks if c.verdict != "ok"} == {
        "disk_inodes": "drain",
        "memory_corrected": "warn",
    }


def test_a_shipment_the_centre_cannot_read_is_kept_aside_and_named(tmp_path, store):
    spool = tmp_path / "spool"
    spool.mkdir()
    bad = Shipment(
        host="node7",
        check="nv",
        command=("x",),
        format="nvidia-smi-xml",
        started_s=1e9,
        duration_s=0.1,
        exit_status=0,
        output=b"<nvidia_smi_log><gpu id=",
    )
    write_to_spool(spool, bad)
    result = SpoolCollector(store, SpoolSection(name="spool", path=str(spool))).run()
    assert "refused" in result.note
    (kept,) = (spool / ".rejected").iterdir()
    assert kept.name == bad.spool_name()
    (run,) = store.events(EventKind.AGENT_CHECK)
    assert run.attrs["ingest"] == "bad" and "output" in run.attrs["ingest_error"]


def test_the_same_shipment_twice_is_one_run(tmp_path, store):
    spool = tmp_path / "spool"
    spool.mkdir()
    s = run_check(checks()[1], "node7")
    collector = SpoolCollector(store, SpoolSection(name="spool", path=str(spool)))
    for _ in range(2):  # a push retried after its answer was lost
        write_to_spool(spool, s)
        collector.run()
    assert len(store.events(EventKind.AGENT_CHECK)) == 1


# -- the queue -------------------------------------------------------------------------------------------------


def test_the_queue_keeps_the_newest_up_to_its_bound_and_counts_the_dropped(tmp_path):
    q = ShipmentQueue(tmp_path / "q", bound=3)
    made = [run_check(checks()[1], "node7") for _ in range(5)]
    for s in made:
        q.put(s)
    assert len(q) == 3 and q.dropped == 2
    kept = []
    while (item := q.oldest()) is not None:
        kept.append(item[1].id)
        q.done(item[0])
    assert kept == [s.id for s in made[2:]]


# -- HTTP push -------------------------------------------------------------------------------------------------


def receiver(tmp_path: Path, *, port: int = 0, **kw) -> Receiver:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# node token\nnode7 {TOKEN}\nnode8 another-token-0123456789\n")
    (tmp_path / "in").mkdir(exist_ok=True)
    r = Receiver(ReceiveSection(listen=f"127.0.0.1:{port}", spool=str(tmp_path / "in"), tokens_file=str(tokens), **kw))
    r.start()
    return r


def pusher(tmp_path: Path, port: int, token: str = TOKEN, **kw) -> Agent:
    (tmp_path / "token").write_text(token + "\n")
    sec = section(tmp_path, push_url=f"http://127.0.0.1:{port}", token_file=str(tmp_path / "token"), timeout_s=5, **kw)
    return Agent(sec, node="node7")


def test_a_push_with_the_node_s_token_lands_in_the_spool(tmp_path, store):
    r = receiver(tmp_path)
    try:
        agent = pusher(tmp_path, r.port)
        assert agent.run_once(drain_timeout_s=20)
        assert r.accepted == 4 and agent.stats.shipped == 4 and len(agent.queue) == 0
    finally:
        r.stop()
    SpoolCollector(store, SpoolSection(name="spool", path=str(tmp_path / "in"))).run()
    assert {e.attrs["check"] for e in store.events(EventKind.AGENT_CHECK)} == {c.name for c in checks()}


def test_a_bad_token_is_refused_401_kept_queued_and_logged_once(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    r = receiver(tmp_path)
    try:
        agent = pusher(tmp_path, r.port, token="not-the-token-0123456789")
        for check in checks()[:2]:
            agent.run_one(check)
        for _ in range(3):
            assert agent.ship_next() is False
        assert r.refused == {401: 3} and r.accepted == 0 and len(agent.queue) == 2
    finally:
        r.stop()
    central = [m for m in caplog.messages if "refused a push" in m]
    outage = [m for m in caplog.messages if "cannot ship" in m]
    assert len(central) == 1 and "wrong token" in central[0] and TOKEN not in central[0]
    assert len(outage) == 1 and "401" in outage[0]


def test_a_node_cannot_ship_as_another(tmp_path):
    r = receiver(tmp_path)
    try:
        s = run_check(checks()[1], "node8")
        status = post(r.port, s.to_wire(), node="node7")
        assert status == 403 and not list((tmp_path / "in").iterdir())
    finally:
        r.stop()


def post(port: int, body: bytes, *, node: str = "node7", length: int | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.putrequest("POST", PUSH_PATH)
        conn.putheader("Authorization", f"Bearer {TOKEN}")
        conn.putheader("X-Hpcwatch-Node", node)
        conn.putheader("Content-Length", str(len(body) if length is None else length))
        conn.endheaders()
        if length is None:
            conn.send(body)
        return conn.getresponse().status
    finally:
        conn.close()


def test_an_oversize_body_is_refused_413_before_it_is_read(tmp_path):
    r = receiver(tmp_path, max_body_bytes=4096)
    try:
        assert post(r.port, b"", length=10 << 20) == 413  # no byte of the body sent: it is not waited for
        agent = pusher(tmp_path, r.port)
        agent.run_one(checks()[0])  # nvidia-smi -q -x: larger than 4 KiB
        assert agent.ship_next() is True and agent.queue.dropped == 1  # never retried: it never fits
        assert r.refused == {413: 2}
    finally:
        r.stop()


def test_past_its_rate_a_node_is_told_when_to_come_back(tmp_path):
    r = receiver(tmp_path, burst=2, rate_per_s=0.01)
    try:
        body = run_check(checks()[1], "node7").to_wire()
        assert [post(r.port, body) for _ in range(3)] == [202, 202, 429]
    finally:
        r.stop()


def test_the_centre_down_then_up_drains_the_queue_and_loses_nothing(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    first = receiver(tmp_path)
    port = first.port
    first.stop()  # the centre goes down: nothing listens on its port
    agent = pusher(tmp_path, port)
    made = [agent.run_one(c) for c in checks() * 3]
    assert agent.ship_next() is False and agent.ship_next() is False
    assert len(agent.queue) == 12
    again = receiver(tmp_path, port=port)  # back, on the same address
    try:
        agent.start_sender()
        agent._wake.set()
        deadline = time.monotonic() + 60
        while len(agent.queue) and time.monotonic() < deadline:
            agent._stop.wait(0.05)
        agent.stop()
        assert len(agent.queue) == 0
    finally:
        again.stop()
    landed = {read_from_spool(p).id for p in (tmp_path / "in").iterdir()}
    assert landed == {s.id for s in made} and agent.queue.dropped == 0
    assert len([m for m in caplog.messages if "cannot ship" in m]) == 1
    assert len([m for m in caplog.messages if "answers again" in m and "12 queued shipments sent" in m]) == 1


def test_the_sample_agent_config_and_the_sample_central_receive_block_parse():
    from hpcwatch.collect.config import load_config

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "deploy" / "hpcwatch-agent.toml")
    assert cfg.agent is not None and [c.format for c in cfg.agent.checks] == [
        "nvidia-smi-xml",
        "perfquery",
        "ibstat",
        "dcgmi-diag",
        "df",
        "edac",
    ]
    sample = (root / "deploy" / "hpcwatch.toml").read_text()
    block = sample[sample.index("# [[receive]]") : sample.index("# [notify]")].split("\n\n")[0]
    central = parse_config("\n".join(line.removeprefix("# ") for line in block.splitlines()), path="receive")
    assert [type(c).__name__ for c in central.collectors] == ["SpoolSection", "ReceiveSection"]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl missing: apt-get install openssl")
def test_a_push_over_tls_checks_the_centre_s_certificate(tmp_path):
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=central",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    r = receiver(tmp_path, cert_file=str(cert), key_file=str(key))
    try:
        (tmp_path / "token").write_text(TOKEN)
        base = dict(push_url=f"https://127.0.0.1:{r.port}", token_file=str(tmp_path / "token"), timeout_s=5)
        trusting = Agent(section(tmp_path, ca_file=str(cert), **base), node="node7")
        trusting.run_one(checks()[1])
        assert trusting.ship_next() is True and r.accepted == 1
        other = tmp_path / "other"
        other.mkdir()
        stranger = Agent(section(other, **base), node="node7")  # the system's CAs: ours is not one of them
        stranger.run_one(checks()[1])
        assert stranger.ship_next() is False and r.accepted == 1 and len(stranger.queue) == 1
    finally:
        r.stop()


@pytest.mark.parametrize("fmt", ["no-such-format", "site-packages", "kineto"])
def test_a_shipment_naming_a_format_no_command_writes_is_set_aside_not_retried(tmp_path, store, fmt):
    spool = tmp_path / "spool"
    spool.mkdir()
    s = Shipment(
        host="node7",
        check="odd",
        command=("x",),
        format=fmt,
        started_s=1e9,
        duration_s=0.1,
        exit_status=0,
        output=XML.read_bytes(),
    )
    write_to_spool(spool, s)
    collector = SpoolCollector(store, SpoolSection(name="spool", path=str(spool)))
    collector.run()
    collector.run()
    assert [p.name for p in spool.iterdir()] == [".rejected"]
    (run,) = store.events(EventKind.AGENT_CHECK)
    assert run.attrs["ingest"] == "bad" and run.attrs["ingest_error"]


def test_the_agent_runs_each_check_on_its_cadence_until_stopped(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    fast = tuple(
        AgentCheck(name=n, command=("cat", str(p)), format=f, interval_s=0.2)
        for n, p, f in (("perfquery", PERFQUERY, "perfquery"), ("ibstat", IBSTAT, "ibstat"))
    )
    agent = Agent(section(tmp_path, spool=str(spool), checks=fast), node="node7")
    agent.run(duration_s=3.0)
    names = [p.name for p in spool.iterdir()]
    assert sum("-perfquery-" in n for n in names) >= 2 and sum("-ibstat-" in n for n in names) >= 2
    assert agent.stats.runs == len(names) + len(agent.queue)  # each run shipped, or still queued on disk


def test_a_token_rotated_in_the_tokens_file_takes_effect_without_a_restart(tmp_path):
    r = receiver(tmp_path)
    try:
        body = run_check(checks()[1], "node7").to_wire()
        assert post(r.port, body) == 202
        tokens = tmp_path / "tokens"
        tokens.write_text("node7 a-brand-new-token-0123456789\n")
        os.utime(tokens, (1, 1))  # a different write time, even within the file system's time resolution
        assert post(r.port, body) == 401
    finally:
        r.stop()
