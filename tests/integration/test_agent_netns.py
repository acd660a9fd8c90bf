"""Two node agents, each in its own network namespace, push their host checks over HTTP to a central
``hpcwatch collect`` in a third, the head node's (a veth pair from the head to each node, 10.77.0.x);
the central store then answers ``hpcwatch health --json`` and holds the runs of both nodes.

The root namespace sees no link or address come and go: a browser running beside this test (another
group's) would fail every request in flight with ERR_NETWORK_CHANGED if it did.

The checks are stand-in commands writing real outputs from tests/data (nvidia-smi -q -x of an H200,
perfquery -x of a real HCA, ibstat). Needs root (ip netns); the namespaces and links are removed in
teardown whatever happened. Skipped with the reason without root, failed under CI=true.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import need, wait_until

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
TAG = f"{os.getpid() % 100000}"
HEAD = f"hwh-{TAG}"
NODES = {  # node -> (namespace, head-side veth, node-side veth, head address, node address, nvidia-smi output)
    "node-a1": (f"hwa1-{TAG}", f"hwr1{TAG}", f"hwn1{TAG}", "10.77.0.1", "10.77.0.2", "nvidia_smi_q.xml"),
    "node-a2": (f"hwa2-{TAG}", f"hwr2{TAG}", f"hwn2{TAG}", "10.77.0.5", "10.77.0.6", "nvidia_smi_q_with_processes.xml"),
}
TOKENS = {"node-a1": "token-of-node-a1-0123456789abcdef", "node-a2": "token-of-node-a2-0123456789abcdef"}


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


@pytest.fixture
def namespaces():
    need(os.geteuid() == 0, "network namespaces need root (ip netns add)")
    need(shutil.which("ip") is not None, "ip (iproute2) is missing")
    made: list[str] = []
    root_seen = subprocess.Popen(["ip", "monitor", "link", "address"], stdout=subprocess.PIPE, text=True)
    try:
        ip("netns", "add", HEAD)
        made.append(HEAD)
        ip("-n", HEAD, "link", "set", "lo", "up")
        for ns, head_if, node_if, head_addr, node_addr, _ in NODES.values():
            ip("netns", "add", ns)
            made.append(ns)
            # both ends made inside namespaces: no link ever appears in the root one
            ip("-n", HEAD, "link", "add", head_if, "type", "veth", "peer", "name", node_if, "netns", ns)
            ip("-n", HEAD, "addr", "add", f"{head_addr}/30", "dev", head_if)
            ip("-n", HEAD, "link", "set", head_if, "up")
            ip("-n", ns, "addr", "add", f"{node_addr}/30", "dev", node_if)
            ip("-n", ns, "link", "set", node_if, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        root_seen.terminate()
        seen = root_seen.communicate(timeout=20)[0]
        assert not [line for line in seen.splitlines() if TAG in line or "10.77.0." in line], seen
        yield
    finally:
        if root_seen.poll() is None:
            root_seen.kill()
            root_seen.wait()
        for ns in reversed(made):
            ip("netns", "del", ns, check=False)  # its veth ends go with it
        left = ip("netns", "list", check=False).stdout
        assert not any(ns in left for ns in made), left


def stand_in(path: Path) -> list[str]:
    return [PY, "-c", f"import sys; sys.stdout.buffer.write(open({str(path)!r}, 'rb').read())"]


def agent_config(tmp: Path, node: str, url: str) -> Path:
    (tmp / f"{node}.token").write_text(TOKENS[node] + "\n")
    checks = [
        ("nvidia-smi", stand_in(DATA / "nvidia_smi" / NODES[node][5]), "nvidia-smi-xml"),
        ("perfquery", stand_in(DATA / "health" / "perfquery_hca_0x7cfe9003003b4b96.out"), "perfquery"),
        ("ibstat", stand_in(DATA / "infiniband" / "ibstat_two_cas.txt"), "ibstat"),
    ]
    text = (
        f'[agent]\nnode = "{node}"\npush_url = "{url}"\ntoken_file = "{tmp / (node + ".token")}"\n'
        f'queue_dir = "{tmp / (node + "-queue")}"\n'
    )
    for name, command, fmt in checks:
        text += (
            f'\n[[agent.check]]\nname = "{name}"\ncommand = {json.dumps(command)}\nformat = "{fmt}"\ninterval_s = 2\n'
        )
    path = tmp / f"{node}.toml"
    path.write_text(text)
    return path


def test_two_agents_in_their_own_namespaces_push_to_the_central_store(namespaces, tmp_path):
    store, spool = tmp_path / "store", tmp_path / "in"
    (tmp_path / "tokens").write_text("".join(f"{n} {t}\n" for n, t in TOKENS.items()))
    central = tmp_path / "central.toml"
    central.write_text(
        f'[store]\npath = "{store}"\n[collect]\nnode = "central"\nstatus_every_s = 0.5\n'
        f'[[receive]]\nlisten = "0.0.0.0:0"\nspool = "{spool}"\ntokens_file = "{tmp_path / "tokens"}"\ninterval_s = 0.5\n'
        f'[[spool]]\npath = "{spool}"\ninterval_s = 0.5\n'
    )
    log = (tmp_path / "central.log").open("w")
    proc = subprocess.Popen(  # ip netns exec execs the command: proc is the collector itself
        ["ip", "netns", "exec", HEAD, PY, "-m", "hpcwatch", "collect", "--config", str(central)],
        env=ENV,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        status = store / "collect" / "status-central.json"

        def port() -> int | None:
            try:
                notes = [c["note"] for c in json.loads(status.read_text())["collectors"] if c["name"] == "receive"]
            except (OSError, ValueError, KeyError):
                return None
            return int(notes[0].split()[1].rstrip(":")) if notes and notes[0].startswith("port ") else None

        listening = wait_until(port, timeout_s=60, what="the central receiver's port in its status")
        agents = []
        for node, (ns, _h, _n, head_addr, _a, _x) in NODES.items():
            cfg = agent_config(tmp_path, node, f"http://{head_addr}:{listening}")
            agents.append(
                subprocess.run(
                    [
                        "ip",
                        "netns",
                        "exec",
                        ns,
                        PY,
                        "-m",
                        "hpcwatch",
                        "collect",
                        "--agent",
                        "--once",
                        "--json",
                        "--config",
                        str(cfg),
                    ],
                    env=ENV,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
            )
        for done in agents:
            assert done.returncode == 0, done.stdout + done.stderr
            summary = json.loads(done.stdout)
            assert summary["shipped"] == 3 and summary["queued"] == 0 and summary["dropped"] == 0

        # a node in its namespace cannot reach the other's address: the pushes really crossed the veths
        cross = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                NODES["node-a1"][0],
                PY,
                "-c",
                f"import socket; socket.create_connection(('{NODES['node-a2'][4]}', {listening}), timeout=2)",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert cross.returncode != 0

        def stored_runs() -> set[tuple[str, str]] | None:
            done = subprocess.run(
                [
                    PY,
                    "-c",
                    "import sys, json\nfrom hpcwatch.store import Store\n"
                    f"s = Store({str(store)!r})\n"
                    "print(json.dumps([[e.attrs['node'], e.attrs['check'], e.attrs['ingest']] for e in s.events('agent_check')]))",
                ],
                env=ENV,
                capture_output=True,
                text=True,
                timeout=60,
            )
            if done.returncode:
                return None
            runs = {(n, c) for n, c, how in json.loads(done.stdout) if how == "stored"}
            return runs if len(runs) == 6 else None

        runs = wait_until(stored_runs, timeout_s=90, every_s=0.5, what="both nodes' runs stored")
        assert runs == {(n, c) for n in NODES for c in ("nvidia-smi", "perfquery", "ibstat")}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    health = subprocess.run(
        [PY, "-m", "hpcwatch", "health", "--db", str(store), "--json"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert health.returncode == 0, health.stderr
    nodes = {n["node"]: n for n in json.loads(health.stdout)["nodes"]}
    assert {"node-a1", "node-a2"} <= set(nodes), sorted(nodes)
    assert all(nodes[n]["checks"] for n in NODES)
    assert not list(spool.iterdir())  # every shipment read and removed
