"""Shared test helpers: where the captured data lives, the CLI run in-process, a free port."""

import socket
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


def free_port() -> int:
    """A TCP port of 127.0.0.1 nobody listens on now (the OS's choice; a server started next takes it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def reference_twin(store, *, seed: int, ticks: int):
    """The reference cluster's live twin with a straggler, ``ticks`` ticks of 10 s written into ``store`` (from
    a fixed start time): a job store that keeps growing, on demand (``twin.step()``)."""
    from hpcwatch.model import reference_cluster
    from hpcwatch.twin.live import LiveTwin

    twin = LiveTwin(store, reference_cluster(), seed=seed, scenarios=["straggler"], tick_s=10.0, start=1_796_000_000.0)
    twin.write_tick()
    for _ in range(ticks):
        twin.step()
    return twin


@pytest.fixture
def data_dir() -> Path:
    return DATA


@pytest.fixture
def run_cli(capsys):
    """Run ``hpcwatch ARGV...`` in this process; returns (exit status, stdout, stderr)."""
    from hpcwatch.cli import main

    def run(argv: list[str]) -> tuple[int, str, str]:
        old, sys.argv = sys.argv, ["hpcwatch", *argv]
        try:
            main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code or 0
        finally:
            sys.argv = old
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def records_of(paths, *, hosts=()) -> list:
    """Every record under ``paths``, read the way ``hpcwatch ingest`` reads them (advisories and manifests as
    events), in file order."""
    from hpcwatch.sources.registry import Input, plan_inputs
    from hpcwatch.sources.stored import advisory_events, manifest_event

    records: list = []
    for item in plan_inputs(paths, hosts=hosts):
        if not isinstance(item, Input) or item.format is None:
            continue
        fmt, read = item.format, item.format.read(item.path, item.context)
        if fmt.yields == "advisories":
            records += advisory_events(read, t=0.0)
        elif fmt.yields == "manifest":
            records.append(manifest_event(read, t=0.0))
        elif fmt.yields == "records":
            records += read
    return records


def scan_folder(folder, cluster, **config_overrides) -> list:
    """``hpcwatch scan FOLDER`` in-process: ingest into a store of its own, then every detector."""
    from hpcwatch.ingest import ingest_paths
    from hpcwatch.security.scan import ScanConfig, scan_store
    from hpcwatch.store import Store

    with Store(":memory:") as store:
        ingest_paths(store, [folder], hosts=[n.name for n in cluster.nodes])
        return scan_store(store, config=ScanConfig.for_cluster(cluster, **config_overrides))
