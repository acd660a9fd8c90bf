"""The web app through FastAPI's TestClient: the page, the JSON API, the stream, hostile input."""

from __future__ import annotations

import re

import orjson
import pytest
from fastapi.testclient import TestClient

from hpcwatch.model import reference_cluster
from hpcwatch.records import PHASES, VECTORS, Event, Finding, Job, Sample, Span
from hpcwatch.store import Store
from hpcwatch.web.app import create_app, script_json, warm
from hpcwatch.web.i18n import LANGUAGES

T0 = 1_796_000_000.0
HOSTILE_JOB = "<img src=x onerror=alert(1)>"
HOSTILE_USER = "o\"brien's"
MIB = 1024**2


def _samples(cluster, k: int) -> list[Sample]:
    t = T0 + k
    out = []
    for node in cluster.nodes:
        for gpu in node.gpus:
            labels = {"gpu": str(gpu.index), "Hostname": node.name, "hpc_job": "4101"}
            out += [
                Sample(metric="DCGM_FI_DEV_GPU_UTIL", labels=labels, t=t, value=90 + k),
                Sample(metric="DCGM_FI_DEV_POWER_USAGE", labels=labels, t=t, value=600.0 + gpu.index),
                Sample(metric="DCGM_FI_DEV_FB_USED", labels=labels, t=t, value=1000.0),
                Sample(metric="DCGM_FI_DEV_GPU_TEMP", labels=labels, t=t, value=60.0),
            ]
        for port in (1, 2):
            labels = {"device": "mlx5_0", "port": str(port), "node": node.name}
            out += [
                Sample(metric="node_infiniband_port_data_transmitted_bytes_total", labels=labels, t=t, value=1e9 * k),
                Sample(metric="node_infiniband_port_data_received_bytes_total", labels=labels, t=t, value=2e9 * k),
            ]
    out += [
        Sample(metric="lustre_job_read_bytes_total", labels={"jobid": "4101", "target": "OST0000"}, t=t, value=5e7 * k),
        Sample(
            metric="lustre_job_write_bytes_total", labels={"jobid": "4101", "target": "OST0000"}, t=t, value=1e6 * k
        ),
    ]
    return out


def _spans(job: str, straggler: bool) -> list[Span]:
    """Two ranks-per-node layout like the twin's: barrier_wait = slowest compute - own compute."""
    base = {"load": 0.002, "forward": 0.011, "backward": 0.020, "allreduce": 0.007, "optimizer": 0.002}
    out = []
    ranks = [(r, "node1" if r < 6 else "node2", r % 6) for r in range(12)]
    compute = {
        r: sum(base[p] for p in ("load", "forward", "backward")) + (0.020 if straggler and r == 2 else 0)
        for r, _, _ in ranks
    }
    slowest = max(compute.values())
    for r, node, gpu in ranks:
        t = T0 + 1
        durs = dict(
            base, backward=base["backward"] * (2 if straggler and r == 2 else 1), barrier_wait=slowest - compute[r]
        )
        for phase in ("load", "forward", "backward", "barrier_wait", "allreduce", "optimizer"):
            out.append(
                Span(job=job, rank=r, step=7, phase=phase, start=t, dur=durs[phase], attrs={"node": node, "gpu": gpu})
            )
            t += durs[phase]
    return out


@pytest.fixture(scope="module")
def store():
    """Filled once per module: the tests below only read it."""
    cluster = reference_cluster()
    st = Store(":memory:")
    st.add(
        [
            Job(
                id="4101",
                user=HOSTILE_USER,
                account="proj-llm",
                partition="gpu",
                nodes=("node1", "node2"),
                gpus=12,
                start=T0 - 100,
                state="RUNNING",
                name=HOSTILE_JOB,
            ),
            Job(id="4102", user="bob", account="proj-vision", gpus=8, state="PENDING", name="vit-finetune"),
        ]
    )
    st.add(_samples(cluster, 0) + _samples(cluster, 1))
    st.add(_spans("4101", straggler=True) + _spans("4101-base", straggler=False))
    st.add(
        [
            Finding(
                vector="rdma_blind_spot",
                severity="high",
                target="node2:mlx5_0/1",
                title="IB bytes, no job",
                evidence={"bytes": 1e9},
                t=T0 + 1,
                rule="ib-traffic-without-job",
            ),
            Event(kind="process_exec", t=T0 + 1, source="tetragon", attrs={}),
        ]
    )
    yield st
    st.close()


@pytest.fixture
def client(store):
    app = create_app(store, reference_cluster(), stream_interval_s=0.05)
    with TestClient(app) as c:
        yield c


# -- the page -----------------------------------------------------------------------------------


def test_page_has_one_element_per_gpu(client):
    html = client.get("/").text
    gpus = re.findall(r'data-gpu="([^"]+)"', html)
    assert sorted(gpus) == sorted(f"node{n}/{i}" for n in (1, 2) for i in range(8))
    assert 'data-gpu="node1/2"' in html and 'data-el="gpu:node1/2"' in html


def test_page_places_seven_collectors_and_six_vectors(client):
    html = client.get("/").text
    assert set(re.findall(r'data-collector="([^"]+)"', html)) == {
        "slurm_exporter",
        "dcgm_exporter",
        "node_host",
        "torch_nccl",
        "ib_tools",
        "lustre_metrics",
        "ebpf_weights",
    }
    assert set(re.findall(r'<g [^>]*data-vector="([^"]+)"', html)) == set(VECTORS) - {"weights_access"}
    for element in ("slurm", "stack", "fabric", "storage", "weights", "node:node1"):
        assert f'data-el="{element}"' in html


def test_every_clickable_element_is_reachable_by_keyboard(client):
    html = client.get("/").text
    elements = re.findall(r'<g class="el"[^>]*>', html)
    assert len(elements) == 16 + 2 + 5 + 7 + 6
    for tag in elements:
        assert 'tabindex="0"' in tag and 'role="button"' in tag and 'aria-label="' in tag


def test_hostile_job_name_and_user_are_escaped_in_html(client):
    html = client.get("/").text
    assert HOSTILE_JOB not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html  # the queue table, as text
    assert "o&#34;brien&#39;s" in html or "o&quot;brien&#x27;s" in html
    # Inside the JSON the page boots from, no "<" can close the script element.
    boot = re.search(r'<script type="application/json" id="boot">(.*?)</script>', html, re.S).group(1)
    assert "<" not in boot
    assert orjson.loads(boot)["live"]["gpus"]["node1/0"]["job_name"] == HOSTILE_JOB


def test_script_json_cannot_end_the_script_element():
    text = script_json({"x": "</script><script>alert(1)</script>&"})
    assert "</" not in text and "&" not in text.replace("\\u0026", "")
    assert orjson.loads(str(text)) == {"x": "</script><script>alert(1)</script>&"}


def test_scripts_insert_text_only():
    """Live values reach the DOM through textContent: no innerHTML / insertAdjacentHTML anywhere."""
    from pathlib import Path

    import hpcwatch.web

    static = Path(hpcwatch.web.__file__).parent / "static"
    for js in static.glob("*.js"):
        source = js.read_text()
        assert "innerHTML" not in source and "insertAdjacentHTML" not in source and "document.write" not in source


@pytest.mark.parametrize(
    ("header", "query", "expected"),
    [
        ("fr-FR,fr;q=0.9,en;q=0.5", None, "fr"),
        ("en-US,en;q=0.9", None, "en"),
        ("de-DE,fr;q=0.3,en;q=0.2", None, "fr"),  # first supported by weight
        ("fr;q=0,en", None, "en"),  # q=0 means "not acceptable"
        ("fr-FR", "en", "en"),  # ?lang forces
        (None, "fr", "fr"),
        ("xx", None, "en"),  # nothing supported: English
    ],
)
def test_language_from_accept_language_or_query(client, header, query, expected):
    headers = {"Accept-Language": header} if header else {}
    r = client.get("/", params={"lang": query} if query else None, headers=headers)
    assert r.headers["content-language"] == expected
    assert f'<html lang="{expected}">' in r.text


def test_forced_language_is_remembered_by_cookie(client):
    client.get("/", params={"lang": "fr"})
    assert client.get("/", headers={"Accept-Language": "en"}).headers["content-language"] == "fr"


def test_french_page_shows_french_words(client):
    html = client.get("/", params={"lang": "fr"}).text
    assert "Rétropropagation" in html and "Ordonnanceur Slurm" in html and "À essayer" in html
    assert "Try this" not in html and "Step player" not in html and "Parallel storage" not in html


# -- the API ------------------------------------------------------------------------------------


def test_live_snapshot_shape(client):
    doc = client.get("/api/live").json()
    g = doc["gpus"]["node1/2"]
    assert g["util_pct"] == 91 and g["power_w"] == 602.0 and g["mem_used_bytes"] == 1000 * MIB
    assert g["temp_c"] == 60 and g["job"] == "4101" and g["user"] == HOSTILE_USER and g["account"] == "proj-llm"
    # Two ports x (1e9 B per 1 s): rates from the last two samples.
    assert doc["nodes"]["node1"] == {"ib_tx_bytes_s": 2e9, "ib_rx_bytes_s": 4e9}
    assert doc["storage"]["jobs"][0]["job"] == "4101"
    assert doc["storage"]["read_bytes_s"] == pytest.approx(5e7)
    assert doc["queue"]["running"] == 1 and doc["queue"]["pending"] == 1
    assert doc["collectors"]["dcgm_exporter"]["arriving"] is True
    assert doc["collectors"]["ebpf_weights"]["arriving"] is False  # nothing on checkpoints in this store
    assert doc["vectors"]["rdma_blind_spot"]["findings"] == 1
    assert all(doc["vectors"][v]["findings"] == 0 for v in VECTORS if v != "rdma_blind_spot")


def test_steps_come_from_the_stores_spans(client):
    doc = client.get("/api/steps", params={"job": "4101"}).json()
    assert doc["step"] == 7 and len(doc["ranks"]) == 12
    rank2 = {p["phase"]: p for p in doc["ranks"][2]["phases"]}
    assert set(rank2) == set(PHASES)
    assert rank2["backward"]["dur_s"] == pytest.approx(0.040)
    waits = [next(p["dur_s"] for p in r["phases"] if p["phase"] == "barrier_wait") for r in doc["ranks"]]
    assert waits[2] == 0 and all(w == pytest.approx(0.020) for i, w in enumerate(waits) if i != 2)
    assert doc["step_time_s"] == pytest.approx(0.002 + 0.011 + 0.040 + 0.007 + 0.002)
    assert doc["ranks"][2]["node"] == "node1" and doc["ranks"][2]["gpu"] == 2


def test_steps_of_unknown_job_is_404_not_a_crash(client):
    r = client.get("/api/steps", params={"job": "nope"})
    assert r.status_code == 404 and "nope" in r.json()["detail"]


def test_step_sources_list_jobs_with_spans_when_no_pair_is_configured(client):
    jobs = {s["job"] for s in client.get("/api/steps/sources").json()}
    assert jobs == {"4101", "4101-base"}


def test_configured_pair_is_labelled_in_the_requested_language(store):
    app = create_app(store, reference_cluster(), step_jobs={"baseline": "4101-base", "straggler": "4101"})
    with TestClient(app) as c:
        sources = c.get("/api/steps/sources", params={"lang": "fr"}).json()
        assert [(s["key"], s["label"]) for s in sources] == [
            ("baseline", "Sans retardataire"),
            ("straggler", "Avec retardataire"),
        ]
        assert 'data-source="straggler" data-job="4101"' in c.get("/").text


def test_findings_filter_and_bad_vector(client):
    found = client.get("/api/findings", params={"vector": "rdma_blind_spot"}).json()
    assert [f["rule"] for f in found] == ["ib-traffic-without-job"]
    assert client.get("/api/findings", params={"vector": "<script>"}).status_code == 422


def test_stragglersim_returns_points_or_a_clear_503(client):
    r = client.get("/api/stragglersim", params={"cv": 0.05, "p_slow": 0.001, "slow_factor": 2})
    if r.status_code == 503:
        assert "straggler simulator unavailable" in r.json()["detail"]
        return
    doc = r.json()
    assert next(p["gpus"] for p in doc["points"]) == 8 and doc["points"][-1]["gpus"] == 100_000
    effs = [p["efficiency"] for p in doc["points"]]
    assert all(0 < e <= 1 for e in effs) and effs[0] > effs[-1]


@pytest.mark.parametrize("params", [{"cv": -1}, {"p_slow": 2}, {"slow_factor": 0.5}, {"cv": "abc"}])
def test_stragglersim_rejects_bad_parameters(client, params):
    assert client.get("/api/stragglersim", params=params).status_code == 422


def test_openapi_documents_the_api(client):
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/api/live", "/api/stream", "/api/steps", "/api/stragglersim", "/api/findings", "/healthz"):
        assert path in paths


def test_healthz(client):
    assert client.get("/healthz").json() == {"ok": True, "latest_sample_t": T0 + 1, "nodes": 2, "gpus": 16}


def test_plotly_is_served_from_the_installed_package(client):
    r = client.get("/vendor/plotly.min.js")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
    assert len(r.content) > 1_000_000


def test_stream_sends_live_events(client):
    events = []
    with client.stream("GET", "/api/stream") as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(orjson.loads(line[6:]))
            if len(events) == 2:
                client.app.state.hpcwatch.stopping.set()  # ends the generator
                break
    assert events[0]["gpus"]["node1/2"]["util_pct"] == 91


def test_a_warmed_server_has_drawn_the_schematic_and_taken_a_snapshot_before_the_first_page(store):
    """``warm`` (run by ``serve_app`` once it listens) leaves the first page load nothing to draw or compute."""
    from hpcwatch.web import jobpage

    app = create_app(store, reference_cluster())
    state = app.state.hpcwatch
    assert state.svg_cache == {} and state.live._cached is None  # the kept snapshot (not its age: a loaded machine)
    jobpage._ENV.cache.clear()  # another test of this process may have rendered a job page
    warm(app)
    assert set(state.svg_cache) == set(LANGUAGES) and state.live._cached is not None
    assert [name for _, name in jobpage._ENV.cache] == ["job.html"]  # compiled: the first job page does not wait
    drawn = dict(state.svg_cache)
    with TestClient(app) as c:
        assert drawn["en"] in c.get("/", params={"lang": "en"}).text
    assert all(state.svg_cache[lang] is drawn[lang] for lang in LANGUAGES)  # drawn once, not again


def _stream_events(client, url: str, count: int) -> list[tuple[str, dict]]:
    """The first ``count`` (event name, data) of the stream at ``url``."""
    events: list[tuple[str, dict]] = []
    name = "message"
    with client.stream("GET", url) as r:
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((name, orjson.loads(line[6:])))
                if len(events) == count:
                    break
    return events


def test_a_page_streams_from_the_version_it_booted_with_not_the_whole_snapshot_again(client):
    """The page's boot document is the stream's document of version v, with the view's epoch: its stream
    starts with the delta from v (or the next one), never with the whole snapshot it already drew."""
    html = client.get("/").text
    boot = orjson.loads(re.search(r'<script type="application/json" id="boot">(.*?)</script>', html, re.S).group(1))
    v, epoch = boot["live"]["v"], boot["resume"]
    assert isinstance(v, int) and epoch == client.app.state.hpcwatch.live.epoch
    ((name, first),) = _stream_events(client, f"/api/stream?since={epoch}.{v}", 1)
    assert name == "delta" and first["base"] == v  # no other viewer makes versions meanwhile
    # Another process's epoch, a version it never had, or garbage: the whole snapshot first, as without.
    for since in (f"0000{epoch[4:]}.{v}" if epoch[:4] != "0000" else f"1111{epoch[4:]}.{v}", f"{epoch}.x", "9" * 80):
        ((name, first),) = _stream_events(client, f"/api/stream?since={since}", 1)
        assert name == "live" and first["gpus"]["node1/2"]["util_pct"] == 91, since


def test_a_page_boots_from_a_recent_document_without_waiting_for_a_new_one(client, monkeypatch):
    """A document up to BOOT_MAX_AGE_S old is the page's boot (its stream's first delta updates it); an older
    one is computed again, so a page never boots from data minutes old."""
    import hpcwatch.web.live as live_module

    live = client.app.state.hpcwatch.live
    now = [1000.0]
    monkeypatch.setattr(live_module.time, "monotonic", lambda: now[0])
    first = live.stream_boot()["v"]
    now[0] += live_module.BOOT_MAX_AGE_S - 0.1  # past min_interval_s: a viewer would get a new version
    assert live.stream_boot()["v"] == first
    now[0] += 0.2
    assert live.stream_boot()["v"] == first + 1


def test_the_page_links_its_scripts_under_a_versioned_address_cached_for_good(client):
    from hpcwatch.web.assets import STATIC_DIR, asset_version, module_graph

    html = client.get("/").text
    version = asset_version()
    assert f'<script type="module" src="/static/{version}/app.js">' in html
    preloaded = re.findall(rf'<link rel="modulepreload" href="/static/{version}/([\w.]+)">', html)
    # every module app.js reaches, and only those: assess.js is the assessment page's plain script
    assert preloaded == list(module_graph()) and set(preloaded) == {p.name for p in STATIC_DIR.glob("*.js")} - {
        "app.js",
        "assess.js",
    }
    kept = client.get(f"/static/{version}/tiles.js")
    assert kept.status_code == 200 and "immutable" in kept.headers["cache-control"]
    assert kept.content == (STATIC_DIR / "tiles.js").read_bytes()
    asked = client.get("/static/tiles.js")  # the old address: asked again each load, as before
    assert asked.status_code == 200 and "cache-control" not in asked.headers and asked.headers["etag"]
    assert client.get("/static/0123456789ab/tiles.js").status_code == 404  # another release's address
    assert client.get(f"/static/{version}/../app.py").status_code == 404


def test_the_asset_version_is_the_files_own_hash(tmp_path):
    from hpcwatch.web.assets import asset_version, module_graph

    (tmp_path / "app.js").write_text('import { a } from "./a.js";\nimport { b } from "./b.js";\n')
    (tmp_path / "a.js").write_text('import { b } from "./b.js";\nexport const a = 1;\n')
    (tmp_path / "b.js").write_text(
        '// import { nothing } from "./comment.js" is not a line start\nexport const b = 2;\n'
    )
    first = asset_version(tmp_path)
    assert module_graph("app.js", tmp_path) == ("a.js", "b.js")
    (tmp_path / "b.js").write_text("export const b = 3;\n")
    asset_version.cache_clear()
    assert asset_version(tmp_path) != first


def test_store_errors_become_json_errors_not_crashes():
    store = Store(":memory:")
    store.add(_spans("4101", straggler=False))
    app = create_app(store, reference_cluster())
    with TestClient(app, raise_server_exceptions=False) as c:
        store.close()
        r = c.get("/api/steps", params={"job": "4101"})
        assert r.status_code == 503 and "error" in r.json()
        r = c.get("/healthz")
        assert r.status_code == 503


def test_collectors_arrive_from_what_their_readers_produce():
    """Falco/Tetragon events light node_host; a Tetragon file hook on the weights path lights ebpf_weights."""
    store = Store(":memory:")
    store.add(_samples(reference_cluster(), 0))
    store.add(
        [
            Event(kind="falco", t=T0, source="falco.json", attrs={"rule": "Terminal shell in container"}),
            Event(
                kind="tetragon",
                t=T0,
                source="tetragon.jsonl",
                attrs={"function_name": "security_file_permission", "path": "/lustre/checkpoints/step_100.pt"},
            ),
            Event(
                kind="tetragon",
                t=T0,
                source="tetragon.jsonl",
                attrs={"function_name": "security_file_permission", "path": "/lustre/checkpointsX/other"},
            ),
        ]
    )
    app = create_app(store, reference_cluster())
    with TestClient(app) as c:
        collectors = c.get("/api/live").json()["collectors"]
    assert collectors["node_host"]["arriving"] and collectors["node_host"]["count"] > 3
    assert collectors["ebpf_weights"] == {"arriving": True, "count": 1, "last_t": T0, "state": "answering"}
    assert collectors["ib_tools"]["arriving"] is False  # no perfquery samples here
    assert collectors["ib_tools"]["state"] == "not_configured"  # ... nor ever: not silent, never set up
    store.close()


def test_findings_are_titled_in_the_pages_language(store):
    """A rule the catalogues know is titled from its template in both languages; ``title`` stays English."""
    from hpcwatch.records import Finding as F

    with Store(":memory:") as st:
        st.add(
            [
                F(
                    vector="rdma_blind_spot",
                    severity="high",
                    target="node2",
                    title="node2 moved 250.0 MB/s over InfiniBand with no job on it",
                    evidence={"host": "node2", "peak_bytes_per_s": 2.5e8},
                    t=1.0,
                    rule="rdma.traffic_no_job",
                )
            ]
        )
        with TestClient(create_app(st, reference_cluster())) as c:
            vector = c.get("/api/live").json()["vectors"]["rdma_blind_spot"]
            assert vector["text"]["en"] == vector["title"]
            assert vector["text"]["fr"] == "node2 a transféré 250,0 Mo/s sur InfiniBand sans aucun job"
            found = c.get("/api/findings", params={"lang": "fr"}).json()
            assert found[0]["text"] == vector["text"]["fr"] and found[0]["title"] == vector["title"]
            c.cookies.set("hpcwatch_lang", "fr")
            by_cookie = c.get("/api/findings").json()
            assert by_cookie[0]["lang"] == "fr" and by_cookie[0]["text"] == vector["text"]["fr"]
            assert c.get("/api/findings", params={"lang": "de"}).status_code == 422
