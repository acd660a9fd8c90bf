"""Issue 15, items 2, 5, 7: the job page (report and routes), the player's sources, the page's data source.

Real inputs: the hook files of a real 4-rank gloo job on CPU (rank 2 sleeps 40 ms in backward,
tests/data/kineto/gloo_straggler/hook/), the sacct output of a real Slurm 22.05 (tests/data/slurm/sacct.json)
and the real Lustre job_stats of GSI-HPC/lustre_exporter (tests/data/lustre/); see tests/data/SOURCES.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from hpcwatch.ingest import ingest_paths
from hpcwatch.model import reference_cluster
from hpcwatch.records import PHASES, Finding
from hpcwatch.reports.jobpage import concerns_job, job_overview
from hpcwatch.reports.live import data_seen, live_snapshot
from hpcwatch.store import Store
from hpcwatch.web.app import create_app
from hpcwatch.web.jobpage import fmt_bytes, fmt_number, job_url
from tests.conftest import reference_twin

DATA = Path(__file__).resolve().parents[1] / "data"
HOOK = DATA / "kineto" / "gloo_straggler" / "hook"
SACCT = DATA / "slurm" / "sacct.json"


@pytest.fixture(scope="module")
def store():
    st = Store(":memory:")
    ingest_paths(st, [HOOK, SACCT])
    st.add(
        [
            Finding(
                vector="rdma_blind_spot",
                severity="high",
                target="node2",
                title="IB bytes, no job",
                evidence={"bytes": 1e9},
                t=st.job("9").start + 1,
                rule="rdma.traffic_no_job",
            ),
            Finding(
                vector="weights_access",
                severity="medium",
                target="node9",
                title="read of the weights",
                evidence={"job": "gloo-test"},
                t=1.0,
                rule="weights.foreign_reader",
            ),
        ]
    )
    yield st
    st.close()


@pytest.fixture(scope="module")
def client(store):
    with TestClient(create_app(store, reference_cluster(), step_jobs={"baseline": "7", "straggler": "8"})) as c:
        yield c


# -- the report ---------------------------------------------------------------------------------------------


def test_overview_of_a_real_gloo_job_names_rank_2_slow_in_backward(store):
    o = job_overview(store, "gloo-test")
    assert o.job is None and "gloo-test" in o.missing["job"]  # known from its spans only
    assert (o.steps.first_step, o.steps.last_step, o.steps.steps) == (0, 5, 6)
    assert o.steps.straggler["rank"] == 2 and o.steps.straggler["phase"] == "backward"
    assert 0.030 < o.steps.straggler["excess_s"] < 0.045  # the 40 ms sleep, less noise
    slow = next(r for r in o.steps.ranks if r.rank == 2)
    fast = next(r for r in o.steps.ranks if r.rank == 0)
    backward = PHASES.index("backward")
    assert slow.phase_s[backward] > 0.035 > fast.phase_s[backward]
    assert [f.rule for f in o.findings] == ["weights.foreign_reader"]  # names the job in its evidence


def test_overview_of_a_slurm_job_without_spans_says_why_steps_are_missing(store):
    o = job_overview(store, "3")  # COMPLETED on node2, 20 s
    assert o.job is not None and o.job.nodes == ("node2",) and o.job.state == "COMPLETED"
    assert o.steps is None and o.missing["steps"] == "job 3: no step spans in the store"
    assert o.goodput is not None and o.goodput.total_s == pytest.approx(20.0)
    assert o.findings == ()  # node2's finding came after job 3 ended
    running = job_overview(store, "9")  # RUNNING, no steps: nothing to split yet
    assert [f.rule for f in running.findings] == ["rdma.traffic_no_job"]  # 9 runs on node2
    assert running.goodput is None and "no wall time to account yet" in running.missing["goodput"]


def test_overview_of_an_unknown_job_is_an_input_error(store):
    from hpcwatch.errors import InputError

    with pytest.raises(InputError, match="no job nope in the store"):
        job_overview(store, "nope")


@pytest.mark.parametrize(
    "finding_kw, expected",
    [
        ({"target": "501"}, True),  # names the job as its target
        ({"target": "node1", "evidence": {"hpc_job": "501"}}, True),  # dcgm-exporter's label in the evidence
        ({"target": "node1", "t": 150.0}, True),  # its node, while it ran
        ({"target": "node1", "t": 50.0}, False),  # its node, before it started
        ({"target": "node1", "t": 250.0}, False),  # its node, after it ended
        ({"target": "node3", "t": 150.0}, False),  # another node
    ],
)
def test_which_findings_concern_a_job(finding_kw, expected):
    finding = Finding(
        **{
            "vector": "rdma_blind_spot",
            "severity": "high",
            "title": "x",
            "evidence": {},
            "t": 150.0,
            "rule": "r",
            **finding_kw,
        }
    )
    assert concerns_job(finding, "501", ("node1", "node2"), 100.0, 200.0) is expected


# -- the routes ---------------------------------------------------------------------------------------------


def test_api_job_document_carries_every_part(client):
    doc = client.get("/api/job/3").json()
    assert set(doc) == {
        "id",
        "job",
        "steps",
        "goodput",
        "findings",
        "missing",
        "cost",
        "timeline",
        "acting",
        "alerts",
        "live",
        "series",
    }
    assert doc["cost"]["cost"] is None and doc["cost"]["gpu_hours"] == doc["job"]["gpu_hours_allocated"]
    assert doc["job"]["id"] == "3" and doc["job"]["per_gpu"] == [] and doc["steps"] is None
    assert doc["goodput"]["total_s"] == pytest.approx(doc["job"]["elapsed_s"])
    gloo = client.get("/api/job/gloo-test").json()
    assert gloo["job"] is None and gloo["steps"]["straggler"]["rank"] == 2 and gloo["steps"]["phases"] == list(PHASES)
    assert client.get("/api/job/nope").status_code == 400


def test_job_page_in_french_and_english(client):
    fr = client.get("/job/gloo-test", params={"lang": "fr"})
    assert fr.status_code == 200 and fr.headers["content-language"] == "fr"
    assert "Retardataire" in fr.text and "rang 2 (node2/GPU0), lent en Rétropropagation" in fr.text
    en = client.get("/job/3", params={"lang": "en"}).text
    assert "Job 3" in en and "Not available: job 3: no step spans in the store" in en
    missing = client.get("/job/nope")
    assert missing.status_code == 404 and "no job nope in the store" in missing.text


def test_an_id_longer_than_any_job_id_is_refused_before_the_store_is_asked(client, monkeypatch):
    """A 60 KB id (httpx's URL limit is 64 KB) used to run every query and come back whole in the answer."""
    from hpcwatch.records import MAX_JOB_ID_CHARS
    from hpcwatch.web import jobpage

    asked: list[str] = []
    real = jobpage.overview_of
    monkeypatch.setattr(jobpage, "overview_of", lambda state, job_id: asked.append(job_id) or real(state, job_id))
    huge = "9" * 60_000
    api = client.get(f"/api/job/{huge}")
    assert api.status_code == 400 and len(api.content) < 300 and huge[:1000] not in api.text
    assert api.json()["error"].startswith(f"a job id of 60000 characters: ids are at most {MAX_JOB_ID_CHARS}")
    page = client.get(f"/job/{huge}")
    assert page.status_code == 404 and "60000 characters" in page.text and huge[:1000] not in page.text
    assert asked == []  # neither route reached the report
    longest = "a" * MAX_JOB_ID_CHARS  # as long as an id may be: still looked up
    assert client.get(f"/api/job/{longest}").status_code == 400 and asked == [longest]


def test_job_page_escapes_names_from_data():
    st = Store(":memory:")
    ingest_paths(st, [HOOK])
    st.add(
        [
            Finding(
                vector="weights_access",
                severity="low",
                target="<script>x</script>",
                title="<b>t</b>",
                evidence={"job": "gloo-test"},
                t=1.0,
                rule="r",
            )
        ]
    )
    with TestClient(create_app(st, reference_cluster())) as c:
        html = c.get("/job/gloo-test").text
    assert "<script>x</script>" not in html and "&lt;script&gt;x&lt;/script&gt;" in html
    st.close()


def test_queue_rows_link_to_the_job_page(client):
    html = client.get("/").text
    assert 'href="/job/7" data-job-page="7"' in html and 'href="/job/9"' in html


@pytest.mark.parametrize(
    "value, digits, lang, text",
    [
        (1234.5, 1, "en", "1,234.5"),
        (1234.5, 1, "fr", "1\u202f234,5"),  # French: narrow no-break space, decimal comma
        (None, 0, "en", "—"),
    ],
)
def test_numbers_in_the_pages_language(value, digits, lang, text):
    assert fmt_number(value, digits, lang=lang) == text


def test_bytes_and_urls():
    assert fmt_bytes(2.5e9, lang="en") == "2.5 GB" and fmt_bytes(999, lang="en") == "999 B"
    assert job_url("ns/pod-1") == "/job/ns/pod-1"


# -- the player's sources -----------------------------------------------------------------------------------


def test_player_offers_the_recorded_example_then_live_jobs(client):
    sources = client.get("/api/steps/sources", params={"lang": "en"}).json()
    assert [(s["key"], s["kind"]) for s in sources] == [
        ("baseline", "example"),
        ("straggler", "example"),
        ("gloo-test", "live"),
    ]
    assert sources[0]["label"] == "Without straggler" and sources[2]["label"] == "gloo-test"
    html = client.get("/").text
    assert '<option value="gloo-test">gloo-test</option>' in html and "Guided example (recorded)" in html


def test_live_job_labels_carry_the_slurm_name_and_user():
    from hpcwatch.records import Job, Span

    st = Store(":memory:")
    st.add(
        [
            Job(id="4101", user="alice", name="llama", state="RUNNING", nodes=("node1",), gpus=1),
            Span(job="4101", rank=0, step=1, phase="forward", start=1.0, dur=0.1, attrs={}),
        ]
    )
    with TestClient(create_app(st, reference_cluster())) as c:
        (src,) = c.get("/api/steps/sources").json()
    assert (src["label"], src["kind"]) == ("4101 · llama (alice)", "live")
    st.close()


# -- where the data comes from --------------------------------------------------------------------------------


def test_collector_states_tell_silent_from_not_configured(store):
    """The hook's samples are old relative to the sacct's (``now`` later): silent, not missing; nothing ever fed
    ibstat/perfquery or the weights hooks: not configured."""
    now = max(j.end or j.start or 0 for j in store.jobs()) + 3600
    doc = live_snapshot(store, weights_path="/lustre/checkpoints", now=now)
    states = {k: v["state"] for k, v in doc["collectors"].items()}
    assert states["torch_nccl"] == "silent" and states["ib_tools"] == "not_configured"
    assert states["ebpf_weights"] == "not_configured"
    assert doc["source"] == {"samples": "store", "prometheus": None, "store": ":memory:"}
    assert "train" in data_seen(store).prefixes


def test_page_says_where_its_data_comes_from(client):
    assert "Data: live twin in memory" in client.get("/").text


def test_job_report_from_its_share_of_the_samples_equals_the_report_from_all():
    """``job_samples`` (the job's nodes and window, and its label anywhere) changes no number of any job."""
    from hpcwatch.analysis.attribution import report_dict
    from hpcwatch.reports.jobs import job_report, job_samples, jobs_report

    st = Store(":memory:")
    reference_twin(st, seed=21, ticks=30)
    every = {r.id: r for r in jobs_report(st)}
    ran = [j for j in every if st.job(j) is not None and st.job(j).start is not None]
    assert len(ran) >= 3
    for job_id in ran:
        narrowed = job_samples(st, job_id)
        assert narrowed is not None and narrowed.num_rows < st.samples().num_rows
        assert report_dict(job_report(st, job_id), per_gpu=True) == report_dict(every[job_id], per_gpu=True)
    st.close()


@pytest.mark.parametrize(
    "url, says",
    [
        ("ftp://prom:9090", "prometheus url must be http(s)://host:port"),  # not an HTTP API
        ("http://127.0.0.1:1", "ConnectError"),  # nothing listens: said at start-up
    ],
)
def test_serve_with_a_prometheus_that_cannot_answer_is_one_line_and_exit_2(tmp_path, url, says):
    import socket
    import subprocess
    import sys

    import hpcwatch

    with socket.socket() as sock:  # a free port, so only the Prometheus can be the problem
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {"PYTHONPATH": str(Path(hpcwatch.__file__).parents[1]), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcwatch",
            "serve",
            "--db",
            str(tmp_path / "store"),
            "--prometheus",
            url,
            "--port",
            str(port),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcwatch: ") and says in lines[0]


# -- advice in the page's language --------------------------------------------------------------------------


def test_advice_is_worded_in_the_pages_language(client, store):
    """Real sacct job 3 (8000 MiB asked, 3.1 MiB used, 20 s of a year's limit, no GPU samples): its three notes
    on the page in English are the report's own lines, and in French the same values in French words, with
    the French decimal mark (as every other number of the page)."""
    from hpcwatch.analysis.attribution import ADVICE
    from hpcwatch.reports.jobs import job_report

    english = job_report(store, "3").advice
    assert len(english) == 3
    en = client.get("/job/3?lang=en").text
    fr = client.get("/job/3?lang=fr").text
    for line in english:
        assert line.replace("'", "&#39;") in en
    assert 'data-advice="memory"' in fr and "demandés par nœud, au plus 3,2 MB utilisés" in fr
    assert "de sa limite de temps" in fr and "les mesures couvrent 0 % de l&#39;allocation" in fr
    assert not any(line.replace("'", "&#39;") in fr for line in english)
    assert set(ADVICE) <= {k.split(".", 1)[1] for k in _catalogue_keys("fr") if k.startswith("advice.")}


def test_english_advice_catalogue_says_what_the_report_says():
    from hpcwatch.analysis.attribution import ADVICE
    from hpcwatch.web.i18n import load_catalogue

    t = load_catalogue("en")
    assert {key: t(f"advice.{key}") for key in ADVICE} == dict(ADVICE)


def _catalogue_keys(lang: str) -> set[str]:
    from importlib import resources

    import yaml

    def walk(node, prefix=""):
        for key, value in node.items():
            yield from walk(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}"]

    return set(walk(yaml.safe_load(resources.files("hpcwatch.web").joinpath(f"{lang}.yaml").read_text("utf-8"))))


# -- a large job's tables: the rows to look at first ------------------------------------------------------


@pytest.fixture(scope="module")
def twin_store():
    """Two nodes of the twin with a straggler: one job on all 16 GPUs, 16 ranks, steps recorded."""
    from hpcwatch.twin.live import LiveTwin

    st = Store(":memory:")
    live = LiveTwin(st, reference_cluster(), seed=3, scenarios=["straggler"], tick_s=5.0, start=1_796_000_000.0)
    live.write_tick()
    for _ in range(12):
        live.step()
    yield st
    st.close()


def _largest_job(st: Store) -> str:
    running = [j for j in st.jobs() if j.state == "RUNNING" and j.gpus]
    return max(running, key=lambda j: (j.gpus, j.id)).id


def test_a_table_past_the_limit_lists_the_gpus_and_ranks_to_look_at_first(twin_store):
    import dataclasses

    from hpcwatch.reports.jobpage import rows_to_show

    o = job_overview(twin_store, _largest_job(twin_store))
    assert o.job is not None and o.steps is not None and o.steps.straggler is not None
    gpus = list(o.job.per_gpu)
    assert len(gpus) >= 8 and len(o.steps.ranks) >= 8
    # One GPU with XID errors, one idle, one nearly idle: those come first, in that order.
    gpus[5] = dataclasses.replace(gpus[5], xid_errors=2)
    gpus[6] = dataclasses.replace(gpus[6], idle=True, mean_util_pct=1.0)
    gpus[7] = dataclasses.replace(gpus[7], mean_util_pct=0.5)
    o = dataclasses.replace(o, job=dataclasses.replace(o.job, per_gpu=tuple(gpus)))

    shown = rows_to_show(o, 3)
    assert [g.device for g in shown.gpus] == [gpus[5].device, gpus[6].device, gpus[7].device]
    assert (shown.all_gpus, shown.all_ranks, len(shown.ranks)) == (len(gpus), len(o.steps.ranks), 3)
    assert shown.ranks[0].rank == o.steps.straggler["rank"]
    work = [
        sum(r.phase_s[PHASES.index(p)] or 0.0 for p in ("load", "forward", "backward", "optimizer"))
        for r in shown.ranks[1:]
    ]
    assert work == sorted(work, reverse=True)  # then the slowest work per step
    everything = rows_to_show(o, None)
    assert everything.gpus == o.job.per_gpu and everything.ranks == o.steps.ranks
    assert rows_to_show(o, len(gpus)).gpus == o.job.per_gpu  # at the limit: every row, in the report's order


def test_the_page_of_a_large_job_says_how_many_rows_it_shows_and_links_to_all(twin_store, monkeypatch):
    import hpcwatch.web.jobpage as web_jobpage

    monkeypatch.setattr(web_jobpage, "SHOWN_ROWS", 4)
    job = _largest_job(twin_store)
    with TestClient(create_app(twin_store, reference_cluster())) as c:
        page = c.get(f"/job/{job}", params={"lang": "en"}).text
        every = c.get(f"/job/{job}", params={"lang": "fr", "rows": "all"}).text
    gpus = len(job_overview(twin_store, job).job.per_gpu)
    assert page.count("<tr data-gpu=") == 4 and every.count("<tr data-gpu=") == gpus
    assert f"The 4 GPUs to look at first, of {gpus}" in page and 'href="?rows=all&amp;lang=en#job-gpus"' in page
    assert "The 4 ranks to look at first" in page and 'id="gpus-shown"' not in every


def test_each_ranks_phase_medians_are_its_own_over_the_steps():
    """The page's per-rank phase table (``_phase_medians``, from the straggler scores' medians): each rank's
    median seconds per phase over the steps, the mean of the middle two for an even count; a phase a rank did
    not run in a step counts 0 s there."""
    from hpcwatch.analysis.steps import anatomy_from_spans
    from hpcwatch.records import Span
    from hpcwatch.reports.jobpage import _phase_medians
    from hpcwatch.reports.steps import step_report_of

    forward = {0: [0.10, 0.30, 0.20, 0.40], 1: [0.10, 0.50, 0.20, 0.20], 2: [0.20, 0.20, 0.20, 0.20]}
    spans = []
    for rank, durations in forward.items():
        for step, dur in enumerate(durations):
            t = 10.0 * step
            spans.append(Span(job="j", rank=rank, step=step, phase="forward", start=t, dur=dur, attrs={}))
            if rank != 2 and not (rank == 1 and step == 2):  # rank 2 never loads, rank 1 not in step 2
                spans.append(Span(job="j", rank=rank, step=step, phase="load", start=t + 1.0, dur=0.01, attrs={}))
    rows = {r.rank: dict(zip(PHASES, r.phase_s)) for r in _phase_medians(step_report_of(anatomy_from_spans(spans)))}
    assert rows[0]["forward"] == pytest.approx(0.25) and rows[1]["forward"] == pytest.approx(0.20)
    assert rows[2]["forward"] == pytest.approx(0.20) and rows[2]["load"] == 0.0
    assert rows[0]["load"] == pytest.approx(0.01) and rows[1]["load"] == pytest.approx(0.01)
