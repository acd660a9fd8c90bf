"""The per-rank reduce of ``hpcwatch steps`` on Dask workers: a local cluster, Slurm jobs, or a running scheduler.

One task per rank file, each on a worker with one thread, so a worker holds one rank's
trace at a time whatever the size of the set; a task sends back its rank's reduced
table (``analysis.reduce.to_ipc``, ~10 kB), and the cross-rank analysis runs here on
the tables (``reports.steps.reduced_report``), exactly as in one process::

    client (this process)             workers (LocalCluster processes, Slurm jobs, …)
    paths ── one task per rank ──>    reduce_trace_file(path) ─> one-row Arrow table
    reduced_report(rows)  <── tables ─┘

Dask is an optional extra (``pip install 'hpcwatch[dask]'``): this module imports
``distributed`` and ``dask_jobqueue`` only inside the functions that start a cluster, and
nothing imports this module unless ``--dask`` is given.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hpcwatch.analysis.reduce import RankReduction, from_table, table_of_ipc, to_ipc
from hpcwatch.errors import BackendError, ConfigError, HpcwatchError, InputError
from hpcwatch.reports.steps import reduce_trace_file

__all__ = [
    "SlurmWorkers",
    "DaskConfig",
    "DaskRun",
    "reduce_on_dask",
    "reduced_table_of_file",
    "DEFAULT_SLURM_MEMORY",
    "DEFAULT_SLURM_WALLTIME",
    "DEFAULT_START_TIMEOUT_S",
    "INSTALL_HINT",
]

#: Memory of one Slurm worker job. Ours: a worker holds one rank's trace; the reader needs ~1/10 of the
#: trace's JSON over the interpreter's ~150 MB with Dask loaded (sources/kineto.py), so 2 GiB covers
#: traces of a few GB of JSON.
DEFAULT_SLURM_MEMORY = "2GiB"
#: Walltime of a Slurm worker job (sbatch --time): the set is reduced in minutes; the job ends with the client.
DEFAULT_SLURM_WALLTIME = "01:00:00"
#: How long to wait for the first workers (Slurm jobs may queue); then the reduce starts on those present.
DEFAULT_START_TIMEOUT_S = 300.0
INSTALL_HINT = "--dask needs Dask: pip install 'hpcwatch[dask]' (dask[distributed], dask-jobqueue)"


@dataclass(frozen=True, kw_only=True)
class SlurmWorkers:
    """How ``--dask slurm`` submits its workers (dask-jobqueue's ``SLURMCluster``), one Slurm job per worker."""

    partition: str | None = None
    """``sbatch --partition`` (None: the cluster's default partition)."""
    account: str | None = None
    """``sbatch --account``."""
    python: str | None = None
    """The interpreter the job runs (must import hpcwatch on the node; None: dask-jobqueue's default, this one)."""
    interface: str | None = None
    """Network interface the scheduler and workers listen on (``lo`` on a one-host test cluster, ``ib0``...)."""
    memory: str = DEFAULT_SLURM_MEMORY
    """Memory per worker job (``sbatch --mem``; Dask's memory limit too)."""
    walltime: str = DEFAULT_SLURM_WALLTIME
    local_directory: str | None = None
    """Worker scratch space on the node (spilled data, locks); None: the job's temporary folder."""
    log_directory: str | None = None
    """Where the jobs' stdout/stderr go (None: the submitting folder)."""
    job_extra: tuple[str, ...] = ()
    """More ``#SBATCH`` options, e.g. ``--exclusive`` for one worker per node."""

    def __post_init__(self) -> None:
        if not self.memory or not self.walltime:
            raise ConfigError("SlurmWorkers.memory and SlurmWorkers.walltime must not be empty")


@dataclass(frozen=True, kw_only=True)
class DaskConfig:
    """Where ``hpcwatch steps --dask`` runs its per-rank tasks."""

    target: str
    """``local`` (a ``LocalCluster`` here), ``slurm`` (workers as Slurm jobs) or ``tcp://HOST:PORT`` (a running
    scheduler, whose workers must import hpcwatch and see the trace paths)."""
    workers: int | None = None
    """Workers to start (local: processes, default one per core; slurm: jobs, default 2). Ignored for tcp://."""
    slurm: SlurmWorkers = field(default_factory=SlurmWorkers)
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.target not in ("local", "slurm") and not self.target.startswith(("tcp://", "tls://")):
            raise ConfigError(f"--dask must be local, slurm or tcp://HOST:PORT, got {self.target!r}")
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {self.workers}")
        if self.start_timeout_s <= 0:
            raise ConfigError(f"DaskConfig.start_timeout_s must be > 0, got {self.start_timeout_s}")


@dataclass(frozen=True, kw_only=True)
class DaskRun:
    """What ran where: for the report and for tests."""

    target: str
    workers: int
    """Workers that were connected when the tasks were submitted."""
    worker_hosts: tuple[str, ...]
    slurm_job_ids: tuple[str, ...] = ()


def reduced_table_of_file(path: str) -> tuple[bytes | None, tuple[str, ...], str | None]:
    """The task a worker runs: one rank's reduced table (an Arrow IPC stream, ``analysis.reduce.to_ipc``), its reader's warnings, and the
    one-line error when the trace could not be read (sent as text: our exceptions take keyword arguments,
    which pickling back to the client does not carry)."""
    try:
        reduction, warned = reduce_trace_file(path)
    except HpcwatchError as err:
        return None, (), str(err)
    return to_ipc([reduction]), warned, None


def reduce_on_dask(paths: Sequence[str], config: DaskConfig) -> tuple[list[RankReduction], list[str], DaskRun]:
    """Every path's reduction, in the order of ``paths``, with the readers' warnings and where they ran."""
    with _client(config) as (client, slurm_jobs):
        info = client.scheduler_info()["workers"]
        run = DaskRun(
            target=config.target,
            workers=len(info),
            worker_hosts=tuple(sorted(w["host"] for w in info.values())),
            slurm_job_ids=slurm_jobs,
        )
        futures = client.map(reduced_table_of_file, list(paths), pure=False)
        done = client.gather(futures)
    errors = [error for _, _, error in done if error is not None]
    if errors:
        raise InputError(errors[0] + (f" (and {len(errors) - 1} more ranks failed)" if len(errors) > 1 else ""))
    reductions = from_table(table_of_ipc(table for table, _, _ in done))
    return reductions, [message for _, messages, _ in done for message in messages], run


@contextmanager
def _client(config: DaskConfig) -> Iterator[tuple[Any, tuple[str, ...]]]:
    try:
        from distributed import Client, LocalCluster
    except ImportError as err:
        raise ConfigError(INSTALL_HINT) from err
    if config.target.startswith(("tcp://", "tls://")):
        with Client(config.target, timeout=config.start_timeout_s) as client:
            yield client, ()
        return
    if config.target == "local":
        cluster = LocalCluster(
            n_workers=config.workers or os.cpu_count() or 1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
        )
    else:
        cluster = _slurm_cluster(config.slurm)
        cluster.scale(jobs=config.workers or 2)
    with cluster, Client(cluster) as client:
        _wait_for_workers(client, config)
        yield client, _job_ids(cluster)


def _wait_for_workers(client: Any, config: DaskConfig) -> None:
    """All the workers asked for, or after ``start_timeout_s`` those that came (Slurm jobs may still queue)."""
    wanted = config.workers or (os.cpu_count() or 1 if config.target == "local" else 2)
    try:
        client.wait_for_workers(wanted, timeout=config.start_timeout_s)
    except TimeoutError as err:  # distributed raises the builtin TimeoutError
        if not client.scheduler_info()["workers"]:
            raise BackendError(
                f"--dask {config.target}: no worker connected within {config.start_timeout_s:g} s "
                "(squeue shows whether the worker jobs are pending; see --slurm-log-dir)"
            ) from err


def _slurm_cluster(cfg: SlurmWorkers) -> Any:
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError as err:
        raise ConfigError(INSTALL_HINT) from err
    options: dict[str, Any] = {
        "queue": cfg.partition,
        "account": cfg.account,
        "python": cfg.python,
        "local_directory": cfg.local_directory,
        "log_directory": cfg.log_directory,
    }
    return SLURMCluster(
        cores=1,
        processes=1,
        memory=cfg.memory,
        walltime=cfg.walltime,
        interface=cfg.interface,
        job_extra_directives=list(cfg.job_extra),
        scheduler_options={"dashboard_address": None},
        **{k: v for k, v in options.items() if v is not None},
    )


def _job_ids(cluster: Any) -> tuple[str, ...]:
    """Slurm job ids of a dask-jobqueue cluster's workers (none for a LocalCluster)."""
    jobs = getattr(cluster, "workers", {})
    return tuple(sorted(str(job.job_id) for job in jobs.values() if getattr(job, "job_id", None)))
