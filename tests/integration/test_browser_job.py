"""Issue 15, items 2, 5 and 7 in a real Chromium: a live job in the step player, the job page opened from a
GPU card, and ``hpcwatch serve --prometheus`` against a real Prometheus 2.42 scraping the twin's exporters.

Reuses test_browser.py's server (``hpcwatch demo``), browser and page fixtures; screenshots go to
tests/integration/artifacts/15-*.png.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port

from .conftest import wait_until
from .test_browser import (  # noqa: F401 - fixtures are used by name
    VIEWPORT,
    _shot,
    _stop,
    _wait_ticks,
    browser,
    page,
    server,
)

pytestmark = pytest.mark.integration

#: Ports of this module's Prometheus and twin endpoints (conftest's and test_prometheus.py's are 2909x, 294xx).
PROM_PORT = 29088  # apart from every other test's (29090-29099, VictoriaMetrics +100/+200)
TWIN_PORT = 29420


# -- item 2: the live step player -------------------------------------------------------------------------


def test_player_plays_a_live_job_chosen_in_the_list(page):
    live = page.locator("#player-live")
    # The live twin's job writes spans from its first steps; the list refreshes every 15 s.
    page.wait_for_function(
        "() => document.querySelectorAll('#player-live option:not([value=\"\"])').length > 0", timeout=40_000
    )
    job = live.locator("option:not([value=''])").first.get_attribute("value")
    live.select_option(job)
    page.wait_for_function(
        f"() => document.getElementById('player').dataset.job === {job!r} && "
        "document.getElementById('player').dataset.state === 'ready'",
        timeout=20_000,
    )
    summary = page.locator("#player-summary").inner_text()
    assert f"of job {job}:" in summary and "step-player/" not in summary
    rows = page.locator("#step-table tbody tr").count()
    assert rows >= 2  # one row per rank of the live job
    assert page.locator("[data-source='baseline']").get_attribute("aria-pressed") == "false"
    page.locator("#player").scroll_into_view_if_needed()
    _shot(page, "15-player-live-job")
    # Back to the guided example: named by what it shows, never by its internal job id.
    page.click("[data-source='straggler']")
    page.wait_for_function(
        "() => document.getElementById('player').dataset.state === 'ready' && "
        "document.getElementById('player').dataset.job.startsWith('step-player/')"
    )
    example = page.locator("#player-summary").inner_text()
    assert "recorded example" in example and "step-player/" not in example and live.input_value() == ""


# -- item 5: the job page ---------------------------------------------------------------------------------


def test_job_page_opens_from_a_gpu_card_in_both_languages(page):
    page.evaluate("window.hpcwatch.openCard('gpu:node1/2')")
    link = page.locator("#card a.job-page-link").first
    job = link.get_attribute("data-job-page")
    assert job
    link.click()
    page.wait_for_url(f"**/job/{job}")
    assert page.locator("#job-title").inner_text().startswith(f"Job {job}")
    assert page.locator("#job-gpus tbody tr").count() >= 1  # per GPU, from the store's samples
    assert "ms" in page.locator("#job-steps [data-value='step_time']").inner_text()
    assert page.locator("#job-goodput, #job-findings").count() == 2
    _shot(page, "15-job-page-en", full_page=True)
    page.click("a[hreflang='fr']")
    page.wait_for_url("**?lang=fr")
    assert page.locator("#job-steps h2").inner_text() == "Pas d'entraînement"
    _shot(page, "15-job-page-fr", full_page=True)
    page.click("a.back")
    page.wait_for_url(f"**/?job={job}")
    assert page.evaluate("window.hpcwatch.monitor.job") == job  # back on the cluster, its GPUs lit


def test_job_page_draws_the_jobs_life_as_svg_charts_in_both_languages(page):
    """Issue 27: the job of GPU node1/2 on the twin's demo, its life drawn on the server as inline SVG (no
    script), each chart labelled with its figures, in English then in French."""
    page.evaluate("window.hpcwatch.openCard('gpu:node1/2')")
    link = page.locator("#card a.job-page-link").first
    job = link.get_attribute("data-job-page")
    assert job
    link.click()
    page.wait_for_url(f"**/job/{job}")
    charts = page.locator("#job-series svg.chart[role='img']")
    assert charts.count() >= 3  # utilisation and power from the twin's DCGM samples, step time from its spans
    util = page.locator("#job-series svg.chart[data-series='gpu_util']")
    label = util.get_attribute("aria-label") or ""
    assert label.startswith("GPU utilisation, mean over the job's GPUs:") and " max " in label
    assert util.locator("polyline, circle").count() >= 1  # drawn, not an empty frame
    assert "Time (UTC)" in (util.text_content() or "") and "%" in (util.text_content() or "")
    box = util.bounding_box()
    assert box is not None and box["width"] > 200 and box["height"] > 80
    page.locator("#job-series").scroll_into_view_if_needed()
    _shot(page, "27-job-charts-en")
    page.click("a[hreflang='fr']")
    page.wait_for_url("**?lang=fr")
    assert page.locator("#job-series h2").inner_text() == "Sur la vie du job"
    fr = page.locator("#job-series svg.chart[data-series='gpu_util']").get_attribute("aria-label") or ""
    assert fr.startswith("Utilisation des GPU, moyenne sur les GPU du job :")
    _shot(page, "27-job-charts-fr")


def test_queue_and_alert_strip_link_to_the_job_page(page):
    _wait_ticks(page, 1)
    hrefs = page.eval_on_selector_all("#queue-table a.job-page-link", "els => els.map(e => e.getAttribute('href'))")
    assert hrefs and all(h.startswith("/job/") for h in hrefs)
    links = page.eval_on_selector_all(
        "#queue-table a.job-page-link", "els => els.map(e => [e.textContent, e.getAttribute('aria-label'), e.title])"
    )
    for text, name, title in links:  # the spoken name starts with the visible text (axe), then says which job
        assert (
            name.startswith(text + " ") and title.startswith("Open the page of job ") and name[len(text) + 1 :] in title
        )


# -- item 7: serve --prometheus ---------------------------------------------------------------------------


def _store_with_jobs(path: Path) -> None:
    """The store ``serve`` reads Slurm jobs from: job 501 on node1's GPUs 0 and 1, as squeue would say."""
    from hpcwatch.records import Job
    from hpcwatch.store import Store

    with Store(str(path)) as store:
        store.add(
            [
                Job(
                    id="501",
                    user="ann",
                    account="proj-llm",
                    partition="gpu",
                    nodes=("node1",),
                    gpus=2,
                    gpus_by_node={"node1": (0, 1)},
                    start=time.time() - 120,
                    state="RUNNING",
                    name="llm-pretrain",
                )
            ]
        )


def _serve(db: Path, prometheus: str | None, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpcwatch",
            "serve",
            "--db",
            str(db),
            *(["--prometheus", prometheus] if prometheus else []),
            "--port",
            str(port),
            "--duration",
            "300",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/"

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"hpcwatch serve exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            return urllib.request.urlopen(url + "healthz", timeout=1).status == 200
        except OSError:
            return False

    wait_until(up, timeout_s=60, what="hpcwatch serve /healthz")
    return proc, url


def test_serve_prometheus_reads_a_real_prometheus_and_says_so(start_prometheus, browser, tmp_path):
    from hpcwatch.model.cluster import reference_cluster
    from hpcwatch.sources.mapping import read_job_mapping_dir
    from hpcwatch.twin import Twin
    from hpcwatch.twin.serve import ServeConfig, TwinEndpoints, prometheus_config

    mapping = tmp_path / "mapping"
    (mapping / "node1").mkdir(parents=True)
    for gpu in (0, 1):
        (mapping / "node1" / str(gpu)).write_text("501\n")
    db = tmp_path / "store"
    _store_with_jobs(db)
    config = ServeConfig(nodes=("node1", "node2"), port=TWIN_PORT, mapping_dir=mapping, tick_s=1.0)
    with TwinEndpoints(Twin(reference_cluster(), seed=3), config, read_mapping=read_job_mapping_dir) as endpoints:
        prom = start_prometheus(prometheus_config(endpoints.targets, scrape_interval_s=1), port=PROM_PORT)
        wait_until(lambda: len(prom.query("up == 1")) == 4, timeout_s=30, what="4 targets up")
        wait_until(
            lambda: prom.query("count(rate(node_infiniband_port_data_transmitted_bytes_total[60s]))"),
            timeout_s=30,
            what="two scrapes of node-exporter (a rate)",
        )
        proc, url = _serve(db, prom.url)
        context = browser.new_context(viewport=VIEWPORT, locale="en-US")
        try:
            _check_page(context.new_page(), url, prom.url)
        finally:
            context.close()
            _stop(proc)


def _check_page(pg, url: str, prom_url: str) -> None:
    errors: list[str] = []
    pg.on("pageerror", lambda err: errors.append(str(err)))
    pg.goto(url)
    _wait_ticks(pg, 1)
    assert f"Prometheus {prom_url}" in pg.locator("#data-source").inner_text()
    util = pg.locator("[data-live='util:node1/0']").text_content()
    assert util.endswith("%") and util != "–"  # a value Prometheus scraped from the twin
    assert "IB ↑" in pg.locator("[data-live='ib:node1']").text_content()
    pg.click("[data-view='observer']")
    _wait_ticks(pg, 1)
    state = lambda cid: pg.locator(f"[data-collector='{cid}']").get_attribute("data-state")  # noqa: E731
    assert state("dcgm_exporter") == "answering" and state("node_host") == "answering"
    assert state("slurm_exporter") == "answering"  # the store's open job
    assert state("ib_tools") == "not_configured" and state("lustre_metrics") == "not_configured"
    assert pg.locator("[data-collector='ib_tools'] .collector-state").text_content() == "–"
    pg.evaluate("window.hpcwatch.openCard('collector:dcgm_exporter')")
    assert f"Prometheus {prom_url}" in pg.locator("#card-live").inner_text()
    _shot(pg, "15-serve-prometheus-observer")
    _check_history_through_promql(url)
    pg.goto(url + "job/501")
    assert pg.locator("#job-gpus tbody tr").count() == 2  # the two GPUs hpc_job=501 labels, via PromQL
    assert f"Prometheus {prom_url}" in pg.locator("#job-source").inner_text()
    _shot(pg, "15-serve-prometheus-job-page", full_page=True)
    assert not errors, errors


def _history(url: str, el: str) -> dict[str, list]:
    with urllib.request.urlopen(f"{url}api/history?el={el}&range_s=300", timeout=10) as answer:
        doc = json.load(answer)
    return {series["field"]: series["values"] for series in doc["series"]}


def _check_history_through_promql(url: str) -> None:
    """The card's sparklines read Prometheus too: a GPU's buckets hold what it scraped, and a node's power
    is the sum of its eight GPUs' in each bucket that all of them fill."""

    # Nine requests straddle scrapes on a loaded machine: the newest bucket may fill between them. So the node is
    # read before and after its GPUs, and only the buckets that did not move meanwhile are compared; until the
    # scrapes have filled one bucket of all eight GPUs (a loaded machine scrapes late), it reads again.
    def read() -> tuple[dict, list[dict], list[int]]:
        before = _history(url, "node:node1")
        gpus = [_history(url, f"gpu:node1/{g}") for g in range(8)]
        node = _history(url, "node:node1")
        full = [
            i
            for i, total in enumerate(node["power_w"])
            if total is not None
            and i < len(before["power_w"])
            and before["power_w"][i] == total
            and all(g["power_w"][i] is not None for g in gpus)
        ]
        return node, gpus, full

    def filled() -> tuple[dict, list[dict], list[int]] | None:
        got = read()
        return got if got[2] else None

    node, gpus, full = wait_until(filled, timeout_s=60, what="a bucket all eight GPUs fill")
    util = [v for v in gpus[0]["util_pct"] if v is not None]
    assert util and all(0.0 <= v <= 100.0 for v in util)
    for i in full:
        assert node["power_w"][i] == pytest.approx(sum(g["power_w"][i] for g in gpus), rel=1e-3)


# -- issue 25: the pages under the Content-Security-Policy --------------------------------------------------


def test_the_assess_and_job_pages_run_under_the_csp_without_a_violation(browser, server):
    """``script-src 'self'``: the served assessment draws its plotly figures from /vendor/plotly.min.js and
    static/assess.js, the job page needs no script; a blocked script or style would be a console error."""
    context = browser.new_context(viewport=VIEWPORT, locale="en-US")
    errors: list[str] = []
    for path, ready in (("assess", "body[data-ready='1']"), ("job/step-player/baseline", "#job-title")):
        pg = context.new_page()
        pg.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        pg.on("pageerror", lambda err: errors.append(str(err)))
        response = pg.goto(server + path)
        assert response is not None and "script-src 'self'" in response.headers["content-security-policy"]
        assert response.headers["x-frame-options"] == "DENY"
        pg.wait_for_selector(ready, state="attached", timeout=30_000)
        if path == "assess":
            assert pg.locator("#status-plot .main-svg").count() >= 1  # plotly ran, from this origin
    context.close()
    assert not errors, errors


# -- issue 24 item 5: what hpcwatch did, on the page ------------------------------------------------------


def _store_with_acting(path: Path) -> None:
    """Job 502 on node2, idle: ``hpcwatch act`` warned its user (a notice sent to ann@example.org) and is testing
    node2 (reserved, resumed into the reservation, checks submitted); one sample, so the page has a ``now``."""
    from hpcwatch.act.audit import Action
    from hpcwatch.records import Job, Sample
    from hpcwatch.store import NoticeRow, Store

    now = time.time()
    job = Job(id="502", user="ann", nodes=("node2",), gpus=8, start=now - 600, state="RUNNING", name="idle-job")

    def action(step: str, t: float, policy: str = "remediate", target: str = "node node2") -> Action:
        episode = "idle/502" if policy == "idle_gpus" else f"remediate/node2/{now - 300:.3f}"
        return Action(id=f"act-{step}", policy=policy, step=step, episode=episode, target=target, t=t,
                      who="hpcwatch-act@ops1", why=f"{step}: because", rc=0)  # fmt: skip

    payload = json.dumps({"subject": "GPUs idle", "document": {"target": "job 502", "action": "act-warn"}})
    notice = NoticeRow(key="act/idle_gpus/act-warn|mail|ann@example.org", notice="act/idle_gpus/act-warn",
                       kind="action", channel="mail", recipient="ann@example.org", state="sent", t=now - 110,
                       payload=payload)  # fmt: skip
    with Store(str(path)) as store:
        store.add(
            [job, Sample(metric="DCGM_FI_DEV_GPU_UTIL", labels={"Hostname": "node2", "gpu": "0"}, t=now, value=0.0)]
        )
        store.add([action("warn", now - 120, "idle_gpus", "job 502").to_event(), notice])
        store.add([action("reserve", now - 60).to_event(), action("resume", now - 59).to_event()])
        store.add([action("check", now - 58).to_event()])


def test_the_page_shows_a_node_under_test_the_actions_and_the_notices(browser, tmp_path):
    from .test_browser_fit import _axe

    db = tmp_path / "store"
    _store_with_acting(db)
    nowhere = f"http://127.0.0.1:{free_port()}"  # an Alertmanager that is down
    proc, url = _serve(db, None, "--alertmanager", nowhere)
    context = browser.new_context(viewport=VIEWPORT, locale="en-US")
    try:
        pg = context.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda err: errors.append(str(err)))
        pg.goto(url)
        pg.wait_for_selector("g[data-node='node2'][data-remediation='checking']", state="attached", timeout=60_000)
        title = pg.locator("g[data-node='node2'] .node-title").first.text_content()
        assert title == "node2 · ⚙ checks running"  # the mark says it in words, not by its frame alone
        pg.wait_for_selector("#events-list li[data-what='action'][data-node='node2']", state="attached")
        strip = pg.locator("#events-list").inner_text()
        assert "action taken: check (remediate) by hpcwatch-act@ops1" in strip
        assert "notice sent (action, mail) to ann@example.org" in strip
        pg.evaluate("window.hpcwatch.openCard('node:node2')")  # its card says it too, with its own timeline
        assert "⚙ checks running" in pg.locator("#card-live [data-value='state']").first.text_content()
        assert pg.locator("#card [data-timeline='node2'] li[data-what='action']").count() == 3
        pg.wait_for_selector("#am-down:not([hidden])", timeout=30_000)
        assert pg.locator("#am-down").inner_text().startswith("Alertmanager unreachable since ")
        assert _axe(pg) == []
        _shot(pg, "24-acting-schematic", full_page=True)
        pg.goto(url + "job/502")
        row = pg.locator("#job-notices tbody tr").first
        assert row.locator("[data-field='recipient']").inner_text() == "ann@example.org"
        assert "sent" in row.inner_text()
        assert pg.locator("#job-actions tr[data-action='act-warn']").count() == 1
        assert _axe(pg) == []
        pg.goto(url + "job/502?lang=fr")
        assert pg.locator("#acting-title").inner_text() == "Avis et actions"
        _shot(pg, "24-acting-job-page-fr", full_page=True)
        assert not errors, errors
    finally:
        context.close()
        _stop(proc)
