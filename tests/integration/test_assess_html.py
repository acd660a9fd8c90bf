"""The assessment's HTML report in a real Chromium (Debian's /usr/bin/chromium via Playwright): it opens
from a file, draws its plots, shows every category, and no request leaves the machine."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import pytest

from hpcwatch.assess import AssessConfig
from hpcwatch.ingest import ingest_paths
from hpcwatch.model import reference_cluster
from hpcwatch.reports.assess import assessment_document, assessment_report
from hpcwatch.store import Store
from hpcwatch.twin import Twin
from hpcwatch.twin.run import write_run
from hpcwatch.web.assess_html import render_assessment_html

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip("Debian chromium is not installed", allow_module_level=True)
playwright_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def report_file(tmp_path_factory) -> tuple[Path, dict]:
    cluster = reference_cluster()
    out = tmp_path_factory.mktemp("neglected")
    write_run(Twin(cluster, seed=0, scenarios=["neglected"]), out, duration_s=360)
    store = Store(":memory:")
    ingest_paths(store, [out], hosts=[n.name for n in cluster.nodes])
    doc = assessment_document(assessment_report(store, AssessConfig(cluster=cluster)))
    page = out / "assess.html"
    page.write_text(render_assessment_html(doc), encoding="utf-8")
    return page, doc


def _local(url: str) -> bool:
    parsed = urlparse(url)
    return parsed.scheme in ("file", "data", "about") or parsed.hostname in ("127.0.0.1", "localhost", "::1")


def test_report_opens_offline_and_shows_the_tier_and_every_category(report_file):
    page_path, doc = report_file
    left: list[str] = []
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        )
        try:
            context = browser.new_context()

            def guard(route):
                if _local(route.request.url):
                    route.continue_()
                else:
                    left.append(route.request.url)
                    route.abort()

            context.route("**/*", guard)
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_path.as_uri())
            page.wait_for_selector("body[data-ready='1']", timeout=30_000)
            assert page.inner_text("#tier") == doc["tier"] == "Underperform"
            assert page.locator("#status-plot .main-svg").count() >= 1  # plotly drew from the inlined bundle
            for i, cat in enumerate(doc["categories"], 1):
                page.click(f"nav a[href='#cat-{i}']")
                section = page.locator(f"#cat-{i}")
                assert section.is_visible()
                assert section.locator("tr[data-criterion]").count() == len(cat["criteria"])
            page.click("nav a[href='#cat-4']")  # networking: the half-rate port, with its evidence
            assert "node2/mlx5_3: 200 Gb/s" in page.inner_text("#cat-4")
            assert not errors
        finally:
            browser.close()
    assert left == [], f"requests left the machine: {left}"
