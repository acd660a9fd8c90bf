"""The PromQL collector: consecutive polls read (last end, now], no point twice, across a restart too."""

from __future__ import annotations

import httpx
import orjson

from hpcwatch.collect.config import PrometheusSection
from hpcwatch.collect.prometheus import PromqlCollector
from hpcwatch.store import Store


def prometheus(clock: list[float]) -> httpx.Client:
    """Answers time() with ``clock[0]``, and every range selector with one series sampled each second."""

    def answer(request: httpx.Request) -> httpx.Response:
        query = httpx.QueryParams(request.content.decode())["query"]
        now = clock[0]
        if query == "time()":
            data = {"resultType": "scalar", "result": [now, str(now)]}
        else:
            points = [[t, "1"] for t in range(int(now) - 600, int(now) + 1)]
            data = {
                "resultType": "matrix",
                "result": [
                    {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": "node1", "gpu": "0"}, "values": points}
                ],
            }
        return httpx.Response(200, content=orjson.dumps({"status": "success", "data": data}))

    return httpx.Client(transport=httpx.MockTransport(answer))


def test_polls_neither_overlap_nor_leave_a_gap_across_a_restart(tmp_path):
    clock = [1000.0]
    section = PrometheusSection(name="prom", url="http://prom:9090", lookback_s=60)
    with Store(tmp_path / "store") as store:
        first = PromqlCollector(store, section, client=prometheus(clock)).run()
        assert first.records == 60  # (940, 1000]
        clock[0] = 1030.0
        assert PromqlCollector(store, section, client=prometheus(clock)).run().records == 30  # a new process
        ts = store.samples("DCGM_FI_DEV_GPU_UTIL").column("t").to_pylist()
    assert sorted(ts) == [float(t) for t in range(941, 1031)]
