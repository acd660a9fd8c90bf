"""twin/serve.py with a stub text source: ports per node, content type, mapping re-read per scrape."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hpcwatch.errors import ConfigError
from hpcwatch.twin.serve import CONTENT_TYPE, ServeConfig, TwinEndpoints, jobs_by_gpu, prometheus_config


class StubTwin:
    """Renders dcgm-exporter-shaped text; one series per (GPU, job) like dcgm-exporter's hpc mapping."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls: list[tuple[str, object]] = []

    def advance(self, dt_s: float) -> None:
        self.now += dt_s

    def dcgm_text(self, node, *, jobs_by_gpu=None):
        self.calls.append((node, jobs_by_gpu))
        lines = ["# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).", "# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
        for gpu in range(2):
            jobs = (jobs_by_gpu or {}).get(gpu)
            for job in jobs.split(",") if jobs else [None]:
                extra = f',hpc_job="{job}"' if job else ""
                lines.append(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{gpu}",Hostname="{node}"{extra}}} {50 + gpu}')
        return "\n".join(lines) + "\n"

    def node_exporter_text(self, node):
        return (
            "# HELP node_infiniband_port_data_received_bytes_total Number of data octets received.\n"
            "# TYPE node_infiniband_port_data_received_bytes_total counter\n"
            f'node_infiniband_port_data_received_bytes_total{{device="mlx5_0",port="1"}} {self.now}\n'
        )


def read_dir(directory: Path) -> dict[str, list[str]]:
    return {p.name: p.read_text().split() for p in directory.iterdir() if not p.name.startswith(".")}


def free_port(count: int) -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count < 65535 and all(_free(base + i) for i in range(count)):
            return base
    raise RuntimeError("no free port range")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_each_node_on_its_own_port_with_the_exposition_content_type(tmp_path):
    twin = StubTwin()
    port = free_port(3)
    config = ServeConfig(nodes=("node1", "node2", "node3"), port=port, tick_s=0)
    with TwinEndpoints(twin, config, read_mapping=read_dir) as ep:
        assert ep.targets == {f"node{i + 1}": f"127.0.0.1:{port + i}" for i in range(3)}
        for i in range(3):
            r = httpx.get(f"http://127.0.0.1:{port + i}/metrics")
            assert r.status_code == 200 and r.headers["content-type"] == CONTENT_TYPE
            samples = families(r.text)["DCGM_FI_DEV_GPU_UTIL"].samples
            assert {s.labels["Hostname"] for s in samples} == {f"node{i + 1}"}
        r = httpx.get(f"http://127.0.0.1:{port}/node-exporter/metrics")
        assert "node_infiniband_port_data_received_bytes" in families(r.text)
        assert httpx.get(f"http://127.0.0.1:{port}/nope").status_code == 404
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1)


def test_mapping_dir_is_read_on_every_scrape(tmp_path):
    twin = StubTwin()
    port = free_port(2)
    node1 = tmp_path / "node1"
    node1.mkdir()
    config = ServeConfig(nodes=("node1", "node2"), port=port, mapping_dir=tmp_path, tick_s=0)
    with TwinEndpoints(twin, config, read_mapping=read_dir):

        def jobs_seen() -> set[tuple[str, str]]:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
            return {
                (s.labels["gpu"], s.labels.get("hpc_job", "")) for s in families(text)["DCGM_FI_DEV_GPU_UTIL"].samples
            }

        assert jobs_seen() == {("0", ""), ("1", "")}
        (node1 / "0").write_text("7\n")
        (node1 / "1").write_text("7\n8\n")
        assert jobs_seen() == {("0", "7"), ("1", "7"), ("1", "8")}
        (node1 / "0").unlink()
        assert jobs_seen() == {("0", ""), ("1", "7"), ("1", "8")}
        httpx.get(f"http://127.0.0.1:{port + 1}/metrics")  # node2 has no directory: nothing maps
    assert twin.calls[-1] == ("node2", {})


def test_without_mapping_dir_the_twin_keeps_its_own_jobs():
    twin = StubTwin()
    port = free_port(1)
    with TwinEndpoints(twin, ServeConfig(nodes=("node1",), port=port, tick_s=0)):
        httpx.get(f"http://127.0.0.1:{port}/metrics")
    assert twin.calls == [("node1", None)]


def test_the_twin_ticks_in_the_background():
    twin = StubTwin()
    port = free_port(1)
    with TwinEndpoints(twin, ServeConfig(nodes=("node1",), port=port, tick_s=0.05)):
        import time

        deadline = time.monotonic() + 30  # four ticks take 0.2 s; a loaded machine may take longer
        while twin.now < 0.2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert twin.now >= 0.2  # it went on ticking with no request


def test_a_failing_twin_answers_500_not_a_dropped_connection():
    class Broken(StubTwin):
        def dcgm_text(self, node, *, jobs_by_gpu=None):
            raise RuntimeError("boom")

    port = free_port(1)
    with TwinEndpoints(Broken(), ServeConfig(nodes=("node1",), port=port, tick_s=0)):
        assert httpx.get(f"http://127.0.0.1:{port}/metrics").status_code == 500


@pytest.mark.parametrize("late_stop", [False, True])
def test_port_in_use_is_a_config_error(monkeypatch, late_stop):
    """The loop thread closes its loop after a failed bind. A start() that stopped the thread after the
    close and before the thread returned got "Event loop is closed" (4 runs in 400 on a 2-core VM);
    with ``late_stop``, a thread that lingers after its close and a stop() that comes late make that
    order certain."""
    if late_stop:
        import time

        from hpcwatch.twin import serve

        close, stop = serve._close, TwinEndpoints.stop
        monkeypatch.setattr(serve, "_close", lambda loop, servers: (close(loop, servers), time.sleep(0.3)))
        monkeypatch.setattr(TwinEndpoints, "stop", lambda self: (time.sleep(0.1), stop(self)))
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port}"):
            TwinEndpoints(StubTwin(), ServeConfig(nodes=("node1",), port=port, tick_s=0)).start()


def test_jobs_by_gpu_shape():
    assert jobs_by_gpu({"0": ["7"], "1": ["7", "8"], "2.0": ["9"], "3": []}) == {0: "7", 1: "7,8", "2.0": "9"}


def test_bad_settings():
    with pytest.raises(ConfigError, match="nodes"):
        ServeConfig(nodes=())
    with pytest.raises(ConfigError, match="port"):
        ServeConfig(nodes=("a", "b"), port=65535)


def test_prometheus_config_lists_every_target_for_both_exporters():
    import yaml

    doc = yaml.safe_load(prometheus_config({"node1": "127.0.0.1:1", "node2": "127.0.0.1:2"}, scrape_interval_s=1))
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert set(jobs) == {"dcgm", "node"} and jobs["node"]["metrics_path"] == "/node-exporter/metrics"
    assert [c["targets"] for c in jobs["dcgm"]["static_configs"]] == [["127.0.0.1:1"], ["127.0.0.1:2"]]
    assert doc["global"]["scrape_interval"] == "1s"


def test_without_hpc_job_no_gpu_is_mapped_even_with_the_twins_own_jobs():
    twin = StubTwin()
    port = free_port(1)
    with TwinEndpoints(twin, ServeConfig(nodes=("node1",), port=port, tick_s=0, hpc_job=False)):
        httpx.get(f"http://127.0.0.1:{port}/metrics")
    assert twin.calls == [("node1", {})]


def test_a_mapping_dir_with_hpc_job_off_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="hpc_job"):
        ServeConfig(nodes=("node1",), mapping_dir=tmp_path, hpc_job=False)


def test_timestamps_are_asked_of_the_source_only_when_configured():
    class Stamped(StubTwin):
        def dcgm_text(self, node, *, jobs_by_gpu=None, timestamp=False):
            return f"m {int(timestamp)} 1000\n"

    port = free_port(1)
    with TwinEndpoints(Stamped(), ServeConfig(nodes=("node1",), port=port, tick_s=0, timestamps=True)):
        assert httpx.get(f"http://127.0.0.1:{port}/metrics").text == "m 1 1000\n"


def test_one_keep_alive_connection_serves_many_scrapes_and_counts_them():
    port = free_port(2)
    with TwinEndpoints(StubTwin(), ServeConfig(nodes=("node1", "node2"), port=port, tick_s=0)) as ep:
        with httpx.Client() as client:
            bodies = [client.get(f"http://127.0.0.1:{port + i % 2}/metrics").content for i in range(6)]
        assert ep.scrapes == 6 and ep.bytes_served == sum(len(b) for b in bodies)


def test_requests_a_scraper_would_not_send():
    port = free_port(1)
    with TwinEndpoints(StubTwin(), ServeConfig(nodes=("node1",), port=port, tick_s=0)):
        assert httpx.post(f"http://127.0.0.1:{port}/metrics").status_code == 405  # GET only
        with socket.create_connection(("127.0.0.1", port)) as raw:  # a head past the limit: dropped
            raw.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n")
            assert raw.recv(100) == b""
        assert httpx.get(f"http://127.0.0.1:{port}/metrics").status_code == 200  # and the port still serves


def test_open_files_limit_is_raised_for_many_nodes_and_refused_past_the_hard_limit(monkeypatch):
    import resource

    from hpcwatch.cli.twinserve import raise_open_files_limit

    calls = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 8000))
    monkeypatch.setattr(resource, "setrlimit", lambda _, limits: calls.append(limits))
    raise_open_files_limit(100)  # 664 files: the soft limit holds them
    raise_open_files_limit(1024)  # 6,208: raised to the hard limit
    assert calls == [(8000, 8000)]
    with pytest.raises(ConfigError, match="hard limit is 8000"):
        raise_open_files_limit(2000)


def _get(sock: socket.socket) -> bytes:
    """One keep-alive scrape on a raw connection; the answer's first bytes."""
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    return sock.recv(65536)


def test_a_node_past_its_connection_cap_closes_the_connection_idle_longest():
    port = free_port(1)
    config = ServeConfig(nodes=("node1",), port=port, tick_s=0, max_connections_per_node=2)
    with TwinEndpoints(StubTwin(), config) as ep:
        connect = lambda: socket.create_connection(("127.0.0.1", port), timeout=5)  # noqa: E731
        with connect() as gave_up, connect() as live:
            assert _get(gave_up).startswith(b"HTTP/1.1 200")
            assert _get(live).startswith(b"HTTP/1.1 200")
            with connect() as new:  # a third: the idle-longest one goes
                assert _get(new).startswith(b"HTTP/1.1 200")
                assert gave_up.recv(100) == b""
                assert _get(live).startswith(b"HTTP/1.1 200")
        assert ep.connections_evicted == 1


def test_connection_cap_below_one_is_refused():
    with pytest.raises(ConfigError, match="max_connections_per_node"):
        ServeConfig(nodes=("node1",), max_connections_per_node=0)


_OUT_OF_FILES = """
import resource, sys, time, os
sys.path.insert(0, {tests!r})
from test_twin_serve import StubTwin
from test_twin_serve import free_port
from hpcwatch.errors import ConfigError
from hpcwatch.twin.serve import ServeConfig, TwinEndpoints
for attempt in range(20):  # a free port can be taken by another test's client before we bind it
    port = free_port(1)
    try:
        ep = TwinEndpoints(StubTwin(), ServeConfig(nodes=("node1",), port=port, tick_s=0, max_connections_per_node=100))
        ep.start()
        break
    except ConfigError:
        continue
opened = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (opened + 3, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
print("ready", port, flush=True)
deadline = time.monotonic() + 20
while ep.serving and time.monotonic() < deadline:
    time.sleep(0.05)
print("serving" if ep.serving else f"stopped: {{ep.failure}}", flush=True)
"""


def test_running_out_of_file_descriptors_stops_the_server_with_one_line():
    import subprocess
    import sys

    code = _OUT_OF_FILES.format(tests=str(Path(__file__).parent))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = proc.stdout.readline().split()
    if ready[:1] != ["ready"]:
        proc.kill()
        pytest.fail(f"the server did not start: {proc.communicate()[1]}")
    port = int(ready[1])
    clients = []
    for _ in range(8):  # 3 fit; the fourth runs the server out of descriptors
        try:
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except (ConnectionRefusedError, ConnectionResetError):  # it stopped and closed its port first: refused,
            # or reset while the connection waited in the closed port's backlog (seen on a quiet fresh clone too)
            assert len(clients) > 3, "refused before the server ran out of descriptors"
            break
    out, err = proc.communicate(timeout=30)
    for client in clients:
        client.close()
    assert out.startswith("stopped: out of file descriptors accepting on port")
    assert "Traceback" not in err and err.count("\n") == 1, err  # one line, not a retry every second


def test_fds_per_node_covers_the_listening_socket_and_the_connection_cap():
    from hpcwatch.cli.twinserve import FDS_PER_NODE
    from hpcwatch.twin.serve import DEFAULT_MAX_CONNECTIONS_PER_NODE

    assert FDS_PER_NODE == 1 + DEFAULT_MAX_CONNECTIONS_PER_NODE


def test_two_scrapers_in_one_tick_cost_one_render():
    port = free_port(1)
    stub = StubTwin()
    with TwinEndpoints(stub, ServeConfig(nodes=("node1",), port=port, tick_s=600)) as ep:  # no tick comes
        first, second = (httpx.get(f"http://127.0.0.1:{port}/metrics").text for _ in range(2))
    assert first == second and len(stub.calls) == 1 and ep.bodies_reused == 1


def test_a_frozen_twin_is_rendered_on_every_scrape():
    port = free_port(1)
    stub = StubTwin()
    with TwinEndpoints(stub, ServeConfig(nodes=("node1",), port=port, tick_s=0)):
        before = httpx.get(f"http://127.0.0.1:{port}/node-exporter/metrics").text
        stub.advance(5.0)  # its owner moves it by hand, between scrapes
        after = httpx.get(f"http://127.0.0.1:{port}/node-exporter/metrics").text
    assert before != after
