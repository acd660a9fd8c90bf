"""deploy/prometheus/hpcwatch-alerts.yml and alertmanager.yml, end to end on Debian's Prometheus 2.42 and
Alertmanager 0.25: the twin writes a store, hpcwatch's exporter publishes the store's health verdicts, Prometheus
evaluates the shipped alerting rules and sends them to Alertmanager, which routes them through the shipped
routing tree to a webhook receiver in this test. The health verdicts are those ``hpcwatch collect``'s health task
stores (its daemon runs here, in-process, with the task alone). A drain verdict on two nodes reaches the pager route as one
notification, once, and its resolution follows when the twin's fault clears; an exporter that stops answering
pages, and resolves when it is back.

    LiveTwin (XID 48 on two GPUs, on and off) -> Store <- collect daemon (health task: verdict events)
                                                   -> exporter /metrics -> Prometheus (rules) -> Alertmanager
                                                                                              -> this test's receiver

The rule file and the routing tree are the shipped ones with the clock shortened: every group evaluated each
second, every ``for:`` and ``keep_firing_for:`` a second per minute of the original (1m -> 1s; ``absent()``
alerts 15 s, see ABSENT_FOR_S), Alertmanager's group_wait and
group_interval 1 s; receivers pointed at the test's. Nothing waits a fixed time: each step waits on the event
it needs (a series in Prometheus, a notification at the receiver).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpcwatch import vocab
from hpcwatch.alertmanager import AlertmanagerClient, AlertWatch
from hpcwatch.collect.config import parse_config
from hpcwatch.collect.daemon import Daemon
from hpcwatch.exporter import serve_metrics
from hpcwatch.model.cluster import reference_cluster
from hpcwatch.reports.alerting import node_of_labels
from hpcwatch.store import Store
from hpcwatch.twin.live import LiveTwin
from hpcwatch.twin.scenarios import Scenario

from .conftest import need, stop_process, wait_until
from .services import ServiceError, start_alertmanager

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "hpcwatch-alerts.yml"
ALERTMANAGER_CONFIG = ROOT / "deploy" / "prometheus" / "alertmanager.yml"
PROMETHEUS_PORT = 29089  # 29090-29099 are the other modules' (they run beside this one)
ALERTMANAGER_PORT = 29500
EXPORTER_PORT = 29978
TICK_S = 0.5
"""The live twin's tick, real and simulated seconds (speed 1: the store's clock runs with the wall clock)."""
HEALTH_WINDOW_S = 5.0
"""What the health task judges: the last 5 s of samples, so a cleared XID leaves it in seconds (deploy/hpcwatch.toml:
900 s)."""
HEALTH_INTERVAL_S = 1.0
"""The health task runs each second (deploy/hpcwatch.toml: every 600 s)."""
XID = 48
"""Double-bit ECC error: the catalogue's action is a GPU reset, the health verdict drain (analysis.xid)."""
FAULTY_GPUS = (("node1", 0), ("node2", 5))
TIMEOUT_S = 120.0
"""Each wait of this module: an event that comes in seconds; a machine at load 30 was seen to pass 60 s."""


class XidFault(Scenario):
    """XID 48 on ``FAULTY_GPUS`` while ``on`` is set: dcgm-exporter's DCGM_FI_DEV_XID_ERRORS holds the code; once
    cleared the GPUs read 0 again, as after their reset."""

    name = "alerting-test-xid48"

    def __init__(self) -> None:
        self.on = threading.Event()

    def adjust_gpu(self, *, node: str, gpu: int, t: float, fields: dict[str, float]) -> None:
        if self.on.is_set() and (node, gpu) in FAULTY_GPUS:
            fields[vocab.DCGM_FI_DEV_XID_ERRORS] = float(XID)


# -- the receiver ------------------------------------------------------------------------------------


class Receiver:
    """A webhook receiver on 127.0.0.1 (port 0): every POST kept as (receiver name from the path, JSON body)."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with receiver._changed:
                    receiver.posts.append((self.path.strip("/"), body))
                    receiver._changed.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def notifications(self, alertname: str) -> list[tuple[str, dict[str, Any]]]:
        with self._changed:
            return [(r, body) for r, body in self.posts if body["groupLabels"].get("alertname") == alertname]

    def wait_for(self, check: Callable[[], object], *, what: str, timeout_s: float = TIMEOUT_S) -> None:
        with self._changed:
            if not self._changed.wait_for(check, timeout=timeout_s):
                pytest.fail(f"timed out after {timeout_s:g}s waiting for {what}; received: {self.posts}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _seconds_per_minute(duration: str) -> str:
    """``for: 5m`` -> ``5s``: a minute of the shipped rule is a second here."""
    m = re.fullmatch(r"(\d+)([smh])", duration)
    assert m, f"unexpected duration {duration!r}"
    seconds = int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]
    return f"{max(1, seconds // 60)}s"


SCRAPE_S = 5
UP_FOR_SCRAPES = 3
"""A scrape-failure alert (``up == 0``) fires here after this many failed scrapes, not after one: the shipped
``for: 2m`` is four default scrapes, and one slow scrape on a loaded machine is not an exporter gone."""
ABSENT_FOR_S = 25
"""An ``absent()`` alert's ``for:`` here: a fresh Prometheus applies its targets on its scrape manager's 5 s reload
tick and scrapes every SCRAPE_S, so every series is absent for about 10 s after each start (the shipped 5 and 10
minutes cover it)."""


def fast_rules(path: Path) -> Path:
    doc = yaml.safe_load(ALERTS.read_text())
    for group in doc["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            for key in ("for", "keep_firing_for"):
                if key in rule:
                    rule[key] = _seconds_per_minute(rule[key])
            if "absent(" in rule["expr"]:
                rule["for"] = f"{ABSENT_FOR_S}s"
            elif rule["expr"].startswith("up{"):
                rule["for"] = f"{UP_FOR_SCRAPES * SCRAPE_S}s"
    path.write_text(yaml.safe_dump(doc))
    return path


def fast_alertmanager_config(receiver_url: str) -> str:
    doc = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    for route in (doc["route"], *doc["route"].get("routes", [])):
        for key in ("group_wait", "group_interval"):
            if key in route or route is doc["route"]:
                route[key] = "1s"
    for r in doc["receivers"]:
        r.pop("email_configs", None)
        r["webhook_configs"] = [{"url": f"{receiver_url}/{r['name']}", "send_resolved": True}]
    return yaml.safe_dump(doc)


def collect_daemon(store: Path) -> Daemon:
    """``hpcwatch collect`` with the health task alone, as deploy/hpcwatch.toml declares it, faster."""
    text = (
        f'[store]\npath = "{store}"\n[collect]\nstatus_every_s = 0.5\n'
        f'[[schedule]]\nname = "health"\ntask = "health"\ninterval_s = {HEALTH_INTERVAL_S}\n'
        f"window_s = {HEALTH_WINDOW_S}\n"
    )
    return Daemon(parse_config(text, path="alerting-test.toml"), node="head1")


def prometheus_config(rules: Path) -> str:
    return json.dumps(
        {
            # Rules evaluated each second; scrapes every SCRAPE_S with as long a timeout: the exporter answers this
            # store in 0.6 s on a quiet machine, 2.4 s and more with the whole suite on 2 cores (2 s timed out:
            # every scrape failed, and a scrape that times out ends and restarts every alert).
            "global": {
                "scrape_interval": f"{SCRAPE_S}s",
                "scrape_timeout": f"{SCRAPE_S}s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(rules)],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{ALERTMANAGER_PORT}"]}]}]},
            "scrape_configs": [
                {
                    "job_name": "hpcwatch",
                    "static_configs": [{"targets": [f"127.0.0.1:{EXPORTER_PORT}"], "labels": {"cluster": "twin"}}],
                }
            ],
        }
    )


@dataclass
class Chain:
    fault: XidFault
    store: Store
    receiver: Receiver
    prometheus: Any
    exporter: Any = None

    def start_exporter(self) -> None:
        self.exporter, _ = serve_metrics(self.store, port=EXPORTER_PORT)

    def stop_exporter(self) -> None:
        self.exporter.shutdown()
        self.exporter.server_close()  # frees the port for the restart
        self.exporter = None


@pytest.fixture(scope="module")
def chain(start_prometheus, tmp_path_factory) -> Iterator[Chain]:
    """The whole loop, running: live twin -> store -> exporter -> Prometheus -> Alertmanager -> receiver."""
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    need(binary is not None, "prometheus-alertmanager (Debian 0.25) is not installed: run scripts/install-system")
    workdir = tmp_path_factory.mktemp("alerting")
    receiver = Receiver()
    procs: list[subprocess.Popen] = []
    fault = XidFault()
    store = Store(workdir / "store")
    twin = LiveTwin(store, reference_cluster(), seed=2, scenarios=(fault,), tick_s=TICK_S)
    daemon = collect_daemon(workdir / "store")
    chain = None
    try:
        (workdir / "alertmanager").mkdir()
        start_alertmanager(
            binary,
            workdir / "alertmanager",
            fast_alertmanager_config(receiver.url),
            port=ALERTMANAGER_PORT,
            on_start=procs.append,
        )
        twin.start()
        daemon.start()
        prometheus = start_prometheus(prometheus_config(fast_rules(workdir / "alerts.yml")), port=PROMETHEUS_PORT)
        procs.append(prometheus.proc)
        chain = Chain(fault=fault, store=store, receiver=receiver, prometheus=prometheus)
        chain.start_exporter()
        yield chain
    except ServiceError as err:
        pytest.fail(str(err))
    finally:
        # Prometheus first: left running it would go on sending this module's alerts to the next Alertmanager.
        for proc in reversed(procs):
            stop_process(proc)
        if chain is not None and chain.exporter is not None:
            chain.stop_exporter()
        daemon.stop()
        twin.stop()
        store.close()
        receiver.close()


# -- the tests -----------------------------------------------------------------------------------------


def _alerts(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """node -> alert of one notification."""
    return {a["labels"]["node"]: a for a in body["alerts"]}


def _summary(notices: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    """What a failed assertion shows: per notification its receiver, status and (node, status, startsAt) alerts."""
    return [
        (r, b["status"], [(a["labels"].get("node", ""), a["status"], a["startsAt"]) for a in b["alerts"]])
        for r, b in notices
    ]


def _scrapes(prom: Any) -> dict[str, list]:
    """How the exporter's scrapes went, for a failed assertion: a failed or late scrape ends every alert."""
    queries = {
        "up min": 'min_over_time(up{job="hpcwatch"}[5m])',
        "scrape s max": 'max_over_time(scrape_duration_seconds{job="hpcwatch"}[5m])',
        "collect errors": "max_over_time(hpcwatch_exporter_collect_errors[5m])",
        "verdict changes": 'changes(hpcwatch_health_verdict{rule="xid"}[5m])',
        "verdict samples": 'count_over_time(hpcwatch_health_verdict{rule="xid"}[5m])',
    }
    return {name: [r["value"][1] for r in prom.query(q)] for name, q in queries.items()}


def _firing_evaluations(prom: Any, alertname: str) -> list[float]:
    """Per firing alert of that name, the evaluations in the last minute that found it firing."""
    query = f'count_over_time(ALERTS{{alertname="{alertname}",alertstate="firing"}}[1m])'
    return [float(r["value"][1]) for r in prom.query(query)]


def test_a_drain_verdict_pages_once_grouped_and_resolves_when_the_fault_clears(chain):
    prom, receiver = chain.prometheus, chain.receiver
    # Healthy first: both nodes' XID rule looked and found nothing, and nothing pages.
    wait_until(
        lambda: len(prom.query('hpcwatch_health_verdict{rule="xid"} == 0')) == 2,
        timeout_s=TIMEOUT_S,
        what="Prometheus to scrape both nodes' xid verdict at ok",
    )
    assert not receiver.notifications("HpcwatchNodeDrain")

    chain.fault.on.set()
    receiver.wait_for(lambda: receiver.notifications("HpcwatchNodeDrain"), what="the drain notification")
    # What `hpcwatch serve --alertmanager` reads of this real Alertmanager's v2 API: both drains firing.
    watch = AlertWatch(AlertmanagerClient(f"http://127.0.0.1:{ALERTMANAGER_PORT}"))
    watch.poll()
    seen = watch.snapshot()
    assert seen["error"] is None, seen
    assert {node_of_labels(a["labels"]) for a in seen["firing"] if a["name"] == "HpcwatchNodeDrain"} == {
        "node1",
        "node2",
    }, seen
    # Alertmanager flushes the group each second while both alerts fire (and Prometheus re-sends them):
    # after five evaluations firing, still nothing was sent again.
    wait_until(
        lambda: (n := _firing_evaluations(prom, "HpcwatchNodeDrain")) and len(n) == 2 and min(n) >= 5,
        timeout_s=TIMEOUT_S,
        what="five evaluations with both drains firing",
    )
    notices = receiver.notifications("HpcwatchNodeDrain")
    assert len(notices) == 1, (_summary(notices), _scrapes(prom))
    ((receiver_name, fired),) = notices

    chain.fault.on.clear()
    receiver.wait_for(
        lambda: any(b["status"] == "resolved" for _, b in receiver.notifications("HpcwatchNodeDrain")),
        what="the resolution",
    )

    # Resolved, they leave the v2 API's list: the watch says so.
    def resolved_nodes() -> set[str | None]:
        watch.poll()
        return {node_of_labels(a["labels"]) for a in watch.snapshot()["resolved"] if a["name"] == "HpcwatchNodeDrain"}

    wait_until(
        lambda: resolved_nodes() == {"node1", "node2"}, timeout_s=TIMEOUT_S, what="the watch to see both resolved"
    )
    watch.client.close()

    # One notification for both nodes (grouped by alertname and cluster), to the pager route (severity critical).
    assert receiver_name == "operators-page"
    assert fired["status"] == "firing" and fired["groupLabels"] == {"alertname": "HpcwatchNodeDrain", "cluster": "twin"}
    alerts = _alerts(fired)
    assert set(alerts) == {"node1", "node2"}
    for node, alert in alerts.items():
        assert alert["status"] == "firing"
        labels = alert["labels"]
        assert (labels["rule"], labels["severity"], labels["action"]) == ("xid", "critical", "drain")
        notes = alert["annotations"]
        assert notes["summary"] == f"{node}: health rule xid says drain"
        assert f"hpcwatch health --node {node}" in notes["description"]
        assert f"scontrol update nodename={node} state=drain" in notes["description"]
        assert notes["runbook_url"] == "docs/alerts.md#hpcwatchnodedrain"

    # Each alert once: the firing notification, then the resolution of the same alerts, nothing else.
    notices = receiver.notifications("HpcwatchNodeDrain")
    assert [b["status"] for _, b in notices] == ["firing", "resolved"], _summary(notices)
    receiver_name, resolved = notices[1]
    assert receiver_name == "operators-page"
    ended = _alerts(resolved)
    assert set(ended) == {"node1", "node2"}
    for node, alert in ended.items():
        assert alert["status"] == "resolved" and alert["fingerprint"] == alerts[node]["fingerprint"]
        assert alert["startsAt"] == alerts[node]["startsAt"] and alert["endsAt"] > alert["startsAt"]
    # Nothing else paged or queued: the other 13 rules, their clock shortened too, find nothing on the twin.
    assert {b["groupLabels"].get("alertname") for _, b in receiver.posts} == {"HpcwatchNodeDrain"}


def test_an_exporter_gone_silent_pages_and_resolves_when_it_answers_again(chain):
    prom, receiver = chain.prometheus, chain.receiver
    wait_until(lambda: prom.query('up{job="hpcwatch"} == 1'), timeout_s=TIMEOUT_S, what="the exporter scraped")
    assert not receiver.notifications("HpcwatchExporterDown")

    chain.stop_exporter()
    receiver.wait_for(lambda: receiver.notifications("HpcwatchExporterDown"), what="the exporter-down notification")
    chain.start_exporter()
    receiver.wait_for(
        lambda: any(b["status"] == "resolved" for _, b in receiver.notifications("HpcwatchExporterDown")),
        what="the exporter-down resolution",
    )

    notices = receiver.notifications("HpcwatchExporterDown")
    assert [(r, b["status"]) for r, b in notices] == [("operators-page", "firing"), ("operators-page", "resolved")]
    ((alert,),) = [b["alerts"] for _, b in notices[:1]]
    assert alert["labels"]["instance"] == f"127.0.0.1:{EXPORTER_PORT}" and alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["summary"] == f"hpcwatch exporter 127.0.0.1:{EXPORTER_PORT} does not answer"
    assert alert["annotations"]["runbook_url"] == "docs/alerts.md#hpcwatchexporterdown"
