"""promql.py against a real Prometheus 2.42's answers, served through httpx.MockTransport."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from urllib.parse import parse_qs

import httpx
import orjson
import pyarrow.compute as pc
import pytest

from hpcwatch.errors import BackendError
from hpcwatch.promql import PrometheusBackend, result_table
from hpcwatch.records import Sample
from hpcwatch.store import SAMPLE_SCHEMA, Store

API = Path(__file__).resolve().parents[1] / "data" / "prometheus_api"
KEY_COLUMNS = ["metric", "t", "value", "host", "gpu", "job"]


def answer(name: str) -> dict:
    return json.loads((API / name).read_text())


def backend(handler) -> tuple[PrometheusBackend, list[dict]]:
    seen: list[dict] = []

    def record(request: httpx.Request) -> httpx.Response:
        form = {k: v[0] for k, v in parse_qs(request.content.decode()).items()}
        seen.append({"path": request.url.path, **form})
        return handler(request, form)

    client = httpx.Client(transport=httpx.MockTransport(record))
    return PrometheusBackend("http://prom.test:9090", client=client), seen


def test_instant_vector_becomes_sample_rows():
    prom, seen = backend(lambda r, f: httpx.Response(200, json=answer("prometheus_query_instant_vector.json")))
    table = prom.query("DCGM_FI_DEV_GPU_UTIL", t=1795990598.163)
    assert table.schema == SAMPLE_SCHEMA
    assert seen == [{"path": "/api/v1/query", "query": "DCGM_FI_DEV_GPU_UTIL", "time": "1795990598.163"}]
    rows = table.to_pylist()
    assert [(r["host"], r["gpu"], r["job"], r["value"]) for r in rows] == [
        ("node1", "0", "11", 90.0),
        ("node1", "1", "11", 70.0),
        ("node1", "2", "12", 10.0),
        ("node1", "3", "12", 20.0),
        ("node1", "6", None, 0.0),
    ]
    assert {r["metric"] for r in rows} == {"DCGM_FI_DEV_GPU_UTIL"}
    labels = orjson.loads(rows[0]["labels"])
    assert "__name__" not in labels and labels["job"] == "dcgm" and labels["hpc_job"] == "11"


def test_aggregate_without_name_takes_the_given_name_and_keeps_the_unlabelled_group():
    prom, _ = backend(lambda r, f: httpx.Response(200, json=answer("prometheus_query_sum_by_hpc_job.json")))
    table = prom.query("sum by (hpc_job) (DCGM_FI_DEV_GPU_UTIL)", name="util_by_job")
    assert table.column("metric").to_pylist() == ["util_by_job"] * 3
    assert dict(zip(table.column("job").to_pylist(), table.column("value").to_pylist())) == {
        "11": 160.0,
        "12": 30.0,
        None: 0.0,
    }


def test_query_range_matrix_keeps_every_point():
    prom, seen = backend(lambda r, f: httpx.Response(200, json=answer("prometheus_query_range.json")))
    table = prom.query_range("avg by (hpc_job) (DCGM_FI_DEV_GPU_UTIL)", t0=1795990588, t1=1795990598, step_s=2)
    assert seen[0]["path"] == "/api/v1/query_range" and seen[0]["step"] == "2"
    assert table.num_rows == 12
    job11 = table.filter(pc.equal(table["job"], "11"))
    assert job11.column("t").to_pylist() == [1795990588.0 + 2 * i for i in range(6)]
    assert set(job11.column("value").to_pylist()) == {80.0}


def test_scalar_and_special_values():
    table = result_table({"resultType": "scalar", "result": [12.5, "NaN"]}, name="x")
    assert table.num_rows == 1 and table.column("value")[0].as_py() != table.column("value")[0].as_py()
    table = result_table({"resultType": "vector", "result": [{"metric": {"__name__": "m"}, "value": [1, "+Inf"]}]})
    assert table.column("value").to_pylist() == [float("inf")]


@pytest.mark.parametrize(
    "response, message",
    [
        (
            httpx.Response(400, json={"status": "error", "errorType": "bad_data", "error": "parse error at char 5"}),
            "bad_data: parse error at char 5",
        ),
        (httpx.Response(502, text="<html>bad gateway</html>"), "not JSON"),
        (
            httpx.Response(200, json={"status": "success", "data": {"resultType": "string", "result": [1, "x"]}}),
            "unexpected PromQL result type",
        ),
    ],
)
def test_bad_answers_raise_backend_error(response, message):
    prom, _ = backend(lambda r, f: response)
    with pytest.raises(BackendError, match=message):
        prom.query("sum(")


def test_connection_error_is_a_backend_error_without_credentials():
    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)

    prom = PrometheusBackend(
        "http://user:secret@prom.test:9090", client=httpx.Client(transport=httpx.MockTransport(refuse))
    )
    with pytest.raises(BackendError) as err:
        prom.query("up")
    assert "secret" not in str(err.value) and "secret" not in repr(prom) and "ConnectError" in str(err.value)


def test_bad_url_is_refused():
    with pytest.raises(BackendError, match="http"):
        PrometheusBackend("prom.test:9090")


# -- the two backends give the same rows ----------------------------------------------------------


def _raw_matrix() -> dict:
    """The real instant answer's five series, each scraped three times (Prometheus' raw points)."""
    series = answer("prometheus_query_instant_vector.json")["data"]["result"]
    return {
        "resultType": "matrix",
        "result": [
            {"metric": s["metric"], "values": [[1795990590.0 + 2 * i, str(float(s["value"][1]) + i)] for i in range(3)]}
            for s in series
        ],
    }


def _store_with_same_points() -> Store:
    store = Store(":memory:")
    for series in _raw_matrix()["result"]:
        labels = {k: v for k, v in series["metric"].items() if k != "__name__"}
        store.add(
            Sample(metric=series["metric"]["__name__"], labels=labels, t=t, value=float(v)) for t, v in series["values"]
        )
    return store


@pytest.mark.parametrize("filters", [{}, {"job": "11"}, {"host": "node1"}, {"t0": 1795990592.0}])
def test_samples_match_store_samples(filters):
    matrix = _raw_matrix()

    def handler(request, form):
        query = form["query"]
        result = [
            s
            for s in matrix["result"]
            if ("hpc_job=" not in query or s["metric"].get("hpc_job") == filters.get("job"))
            and ('hostname="' not in query)
        ]  # no series carries the newer lower-case label
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "matrix", "result": result}})

    prom, seen = backend(handler)
    got = prom.samples("DCGM_FI_DEV_GPU_UTIL", t1=1795990594.0, **filters)
    want = _store_with_same_points().samples("DCGM_FI_DEV_GPU_UTIL", **filters)
    assert got.select(KEY_COLUMNS).to_pylist() == want.select(KEY_COLUMNS).to_pylist()
    assert [orjson.loads(x) for x in got["labels"].to_pylist()] == [orjson.loads(x) for x in want["labels"].to_pylist()]
    assert all(q["query"].startswith('{__name__=~"DCGM_FI_DEV_GPU_UTIL"') for q in seen)
    assert all(
        q["query"].endswith(f"[{int((1795990594.0 - filters.get('t0', 1795990594.0 - 3600)) * 1000) + 1}ms]")
        for q in seen
    )


def test_samples_selectors_for_host_and_job():
    prom, seen = backend(
        lambda r, f: httpx.Response(200, json={"status": "success", "data": {"resultType": "matrix", "result": []}})
    )
    table = prom.samples(["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE"], host="node2", job="7", t0=100.0, t1=160.0)
    assert table.num_rows == 0 and table.schema == SAMPLE_SCHEMA
    assert [q["query"] for q in seen] == [
        '{__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_POWER_USAGE", hpc_job="7", Hostname="node2"}[60001ms]',
        '{__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_POWER_USAGE", hpc_job="7", hostname="node2"}[60001ms]',
    ]
    assert {q["time"] for q in seen} == {"160.000"}


# -- remote write ------------------------------------------------------------------------------------


def _unsnappy_literals(data: bytes) -> bytes:
    """A decoder for literal-only snappy blocks (what encode_remote_write produces)."""
    size, i = _varint(data, 0)
    out = bytearray()
    while i < len(data):
        tag = data[i]
        assert tag & 3 == 0, "only literals expected"
        if tag >> 2 < 60:
            n, i = (tag >> 2) + 1, i + 1
        else:
            width = (tag >> 2) - 59
            n, i = int.from_bytes(data[i + 1 : i + 1 + width], "little") + 1, i + 1 + width
        out += data[i : i + n]
        i += n
    assert len(out) == size
    return bytes(out)


def _fields(buf: bytes) -> list[tuple[int, object]]:
    """(field number, payload) of a protobuf message: bytes for wire type 2, float for 1, int for 0."""
    out, i = [], 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 2:
            n, i = _varint(buf, i)
            out.append((number, buf[i : i + n]))
            i += n
        elif wire == 1:
            out.append((number, struct.unpack("<d", buf[i : i + 8])[0]))
            i += 8
        else:
            value, i = _varint(buf, i)
            out.append((number, value))
    return out


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        value |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            return value, i
        shift += 7


def test_remote_write_payload_is_a_snappy_protobuf_write_request():
    from hpcwatch.promql import encode_remote_write

    samples = [
        Sample(
            metric="DCGM_FI_DEV_GPU_UTIL",
            labels={"gpu": str(g), "Hostname": "node1", "hpc_job": "7"},
            t=1795990590.0 + i,
            value=float(i),
        )
        for g in range(8)
        for i in range(800)
    ]
    body, series = encode_remote_write(reversed(samples))  # out of order on purpose
    assert series == 8
    raw = _unsnappy_literals(body)
    assert len(raw) > 65536  # several literal chunks
    decoded = []
    for number, ts in _fields(raw):
        assert number == 1
        parts = _fields(ts)
        labels = [tuple(v.decode() for _, v in _fields(p)) for n, p in parts if n == 1]
        points = [(dict(_fields(p))[2], dict(_fields(p))[1]) for n, p in parts if n == 2]
        decoded.append((labels, points))
    for labels, points in decoded:
        assert [k for k, _ in labels] == sorted(k for k, _ in labels)  # Prometheus wants sorted label names
        assert dict(labels)["__name__"] == "DCGM_FI_DEV_GPU_UTIL"
        assert [t for t, _ in points] == [1795990590000 + 1000 * i for i in range(800)]
        assert [v for _, v in points] == [float(i) for i in range(800)]
    assert sorted(dict(labels)["gpu"] for labels, _ in decoded) == [str(g) for g in range(8)]


def test_remote_write_posts_the_headers_prometheus_wants():
    captured = {}

    def handler(request: httpx.Request) -> httpx.Response:
        captured.update(request.headers)
        return httpx.Response(204)

    prom = PrometheusBackend("http://prom.test:9090", client=httpx.Client(transport=httpx.MockTransport(handler)))
    assert prom.write([Sample(metric="m", labels={}, t=1.0, value=2.0)]) == 1
    assert captured["content-encoding"] == "snappy" and captured["content-type"] == "application/x-protobuf"
    bad = PrometheusBackend(
        "http://prom.test:9090",
        client=httpx.Client(
            transport=httpx.MockTransport(
                lambda r: httpx.Response(404, text="remote write receiver needs to be enabled")
            )
        ),
    )
    with pytest.raises(BackendError, match="remote write receiver"):
        bad.write([Sample(metric="m", labels={}, t=1.0, value=2.0)])


# -- VictoriaMetrics 1.79.5 (Debian 12): recorded answers, where MetricsQL differs ----------------

VM_API = Path(__file__).resolve().parents[1] / "data" / "victoriametrics_api"
VM_T0, VM_T1 = 1796159000.125, 1796159015.125  # 3 GPUs x 4 points, 5 s apart, written by remote write


def vm_answer(name: str) -> dict:
    return json.loads((VM_API / name).read_text())


def vm_backend() -> tuple[PrometheusBackend, list[dict]]:
    """Answers as VictoriaMetrics gave them: the range selector is picked by its window."""

    def handler(request, form):
        query = form["query"]
        if query == "time()":
            return httpx.Response(200, json=vm_answer("vm_query_time.json"))
        name = (
            "vm_query_range_selector_15001ms.json"
            if query.endswith("[15001ms]")
            else "vm_query_range_selector_15000ms.json"
        )
        if "Hostname" not in query:  # the lower-case hostname selector: no such series
            return httpx.Response(200, json={"status": "success", "data": {"resultType": "matrix", "result": []}})
        return httpx.Response(200, json=vm_answer(name))

    return backend(handler)


def test_vm_range_selector_is_left_open_so_samples_asks_one_ms_more():
    # The recorded answers themselves: (t-d, t] drops the point at exactly t-d, one ms more keeps it.
    open_window = result_table(vm_answer("vm_query_range_selector_15000ms.json")["data"])
    wider = result_table(vm_answer("vm_query_range_selector_15001ms.json")["data"])
    assert (open_window.num_rows, wider.num_rows) == (9, 12)
    assert VM_T0 not in open_window["t"].to_pylist() and VM_T0 in wider["t"].to_pylist()
    prom, seen = vm_backend()
    got = prom.samples("DCGM_FI_DEV_GPU_UTIL", host="node1", t0=VM_T0, t1=VM_T1)
    assert got.num_rows == 12 and min(got["t"].to_pylist()) == VM_T0
    assert seen[0]["query"].endswith("[15001ms]")


def test_vm_answer_order_is_not_label_order_but_samples_sorts_like_the_store():
    raw = result_table(vm_answer("vm_query_range_selector_15000ms.json")["data"])
    assert raw["gpu"].to_pylist()[0] == "2"  # VictoriaMetrics' own order
    prom, _ = vm_backend()
    got = prom.samples("DCGM_FI_DEV_GPU_UTIL", host="node1", t0=VM_T0, t1=VM_T1)
    rows = list(zip(got["gpu"].to_pylist(), got["t"].to_pylist()))
    assert rows == sorted(rows)
    assert got["job"].to_pylist()[:4] == ["11"] * 4


def test_vm_time_is_a_vector_not_a_scalar_and_samples_defaults_to_it():
    data = vm_answer("vm_query_time.json")["data"]
    assert data["resultType"] == "vector"  # Prometheus answers time() with resultType scalar
    assert result_table(data)["value"].to_pylist() == [VM_T1]
    prom, seen = vm_backend()
    got = prom.samples("DCGM_FI_DEV_GPU_UTIL", host="node1", t0=VM_T0)  # no t1: VM's time()
    assert got.num_rows == 12 and seen[0]["query"] == "time()" and seen[1]["time"] == f"{VM_T1:.3f}"


def test_vm_aggregate_and_error_answers():
    by_job = result_table(vm_answer("vm_query_sum_by_hpc_job.json")["data"], name="util")
    assert dict(zip(by_job["job"].to_pylist(), by_job["value"].to_pylist())) == {"11": 61.0, "12": 32.0}
    assert set(by_job["metric"].to_pylist()) == {"util"}
    prom, _ = backend(lambda r, f: httpx.Response(422, json=vm_answer("vm_query_error.json")))
    with pytest.raises(BackendError, match=r"HTTP 422 422: .*unexpected token"):
        prom.query("sum by (")


def test_vm_staleness_markers_come_back_as_nan_points_and_samples_drops_them():
    # The shape VictoriaMetrics 1.79.5 gave in tests/integration/test_slurm_chain.py: the unlabelled series'
    # staleness marker, written when the prolog's hpc_job label appeared, comes back as a "NaN" point.
    answer = vm_answer("vm_query_range_selector_15001ms.json")
    answer["data"]["result"][0]["values"].append([VM_T1 + 0.5, "NaN"])
    prom, _ = backend(
        lambda r, f: httpx.Response(
            200,
            json=answer
            if "Hostname" in f["query"]
            else {"status": "success", "data": {"resultType": "matrix", "result": []}},
        )
    )
    got = prom.samples("DCGM_FI_DEV_GPU_UTIL", host="node1", t0=VM_T0, t1=VM_T1 + 1)
    assert got.num_rows == 12 and not any(v != v for v in got["value"].to_pylist())
    assert result_table(answer["data"]).num_rows == 13  # query() keeps what the server said
