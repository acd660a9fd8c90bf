"""``hpcwatch collect``: the long-running collector (a view-level driver: it imports reports and below).

- ``config.py``   the TOML file: every key, its default, its meaning; errors name the file and line
- ``cursor.py``   positions kept across restarts, committed with the data they cover
- ``slurm.py``    slurmrestd or squeue/sacct/sinfo --json      ``prometheus.py``  PromQL, exporter scrapes
- ``follow.py``   logs followed like tail -F                   ``spool.py``       folders of dropped files
- ``schedule.py`` detectors and health rules on a timer        ``daemon.py``      the threads and the status file
- ``agent.py``    a node's host checks (``collect --agent``)   ``receive.py``     the agents' HTTP push, centrally
- ``shipment.py`` one check's result: wire and spool layouts
- ``active.py``   ``[active]``: dcgmi diag, nccl-tests, ib_write_bw on idle nodes at a cadence, as reserved Slurm jobs

``Daemon`` loads on first use: the node agent imports this package but never the store (pyarrow,
DuckDB, numpy: most of a process's resident memory, benchmarks/RESULTS.md).
"""

from typing import TYPE_CHECKING, Any

from hpcwatch.collect.config import CollectConfig, load_config, parse_config

if TYPE_CHECKING:
    from hpcwatch.collect.daemon import Daemon

__all__ = ["CollectConfig", "Daemon", "load_config", "parse_config"]


def __getattr__(name: str) -> Any:
    if name == "Daemon":
        from hpcwatch.collect.daemon import Daemon

        return Daemon
    raise AttributeError(f"module 'hpcwatch.collect' has no attribute {name!r}")
