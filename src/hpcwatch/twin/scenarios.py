"""The scenario hook: how a story (a straggler, a failing GPU, an attack) bends the twin.

A scenario is a subclass of ``Scenario`` that overrides the hooks it needs; the
twin calls every hook of every active scenario while it simulates, *before* it
writes the real formats, so what a scenario plants comes out exactly as a real
cluster would emit it. Modules that define scenarios register them with
``register``; ``twin/__init__.py`` imports those modules so the registry is full.

Hooks (all optional; each mutates the dict it is given in place):

- ``adjust_gpu``   DCGM field values of one GPU at time t, keyed by dcgm-exporter
                   metric name (``DCGM_FI_DEV_GPU_UTIL``, ``DCGM_FI_DEV_XID_ERRORS``...).
- ``adjust_ib``    counters of one InfiniBand port at time t, keyed by perfquery
                   name (``PortXmitData``, ``SymbolErrorCounter``...), cumulative.
- ``adjust_step``  phase durations (seconds) of one rank's training step, keyed by
                   phase (``load``, ``forward``, ``backward``, ``allreduce``, ``optimizer``);
                   the twin derives ``barrier_wait`` afterwards.
- ``events``       extra events between t0 and t1 (Falco alerts, checkpoints, failures).
- ``extra_files``  extra real-format files written into ``out`` (a pip list, Tetragon
                   JSON lines...) when the twin writes a run to disk.
- ``gpu_exporter_lines``  families the node's GPU exporter would add to each scrape that the twin
                   does not model itself (AMD's ECC-per-block and violation-residency gauges), in
                   the exporter's text; appended to every scrape of the node (files and served).
- ``node_exporter_lines``  the same for the node's node-exporter scrape (its uname collector's
                   ``node_uname_info``).
- ``diag_failures``  what ``dcgmi diag`` run on a node at time t would fail, per GPU: the test and its
                   warning (the twin's Slurm runs the remediation's check job with it, twin/slurmctl.py).

A scenario that kills a job does it from ``events`` through the twin: ``twin.fail_job`` (the job
stops stepping; returns its ``failure`` event) and later ``twin.requeue_job`` (Slurm requeues it,
optionally draining a node for a while; it restarts from its last checkpoint when its nodes are
back). ``failures.Xid79`` is the example.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hpcwatch.errors import ConfigError
from hpcwatch.records import Event

__all__ = ["Scenario", "register", "get_scenario", "scenario_names"]


class Scenario:
    """Base class: every hook does nothing."""

    name: str = ""
    description: str = ""

    def adjust_gpu(self, *, node: str, gpu: int, t: float, fields: dict[str, float]) -> None:
        """Change one GPU's DCGM field values at time t."""

    def adjust_ib(self, *, node: str, port: int, t: float, counters: dict[str, float]) -> None:
        """Change one IB port's cumulative counters at time t."""

    def adjust_step(self, *, rank: int, node: str, gpu: int, step: int, phases: dict[str, float]) -> None:
        """Change one rank's phase durations for one step."""

    def events(self, *, twin: Any, t0: float, t1: float) -> Iterable[Event]:
        """Extra events that happen between t0 and t1."""
        return ()

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        """Write extra real-format files for a run on disk."""

    def gpu_exporter_lines(self, *, twin: Any, node: str, stamp: str) -> str:
        """Exposition lines (HELP, TYPE, samples; each sample followed by ``stamp``, " <ms>" or "") to append to
        the node's GPU exporter scrape at ``twin.now``; "" for none."""
        return ""

    def node_exporter_lines(self, *, twin: Any, node: str, stamp: str, target: str) -> str:
        """Exposition lines to append to the node's node-exporter scrape at ``twin.now``, as
        ``gpu_exporter_lines``; ``target`` is the label text a Prometheus adds to each sample (``,instance="...",
        node="..."``, or "" for a plain scrape), to end each label set with."""
        return ""

    def diag_failures(self, *, node: str, t: float) -> dict[int, tuple[str, dict[str, Any]]]:
        """GPU index -> (the ``dcgmi diag`` test it fails, the warning as DCGM 4 writes it: ``{"warning": ...}``)
        for a diagnostic run on ``node`` at t; empty while the fault leaves that node's GPUs sound, or once it
        has cleared."""
        return {}


_REGISTRY: dict[str, type[Scenario]] = {}


def register(cls: type[Scenario]) -> type[Scenario]:
    """Class decorator: make a scenario available by its ``name``."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def get_scenario(name: str) -> Scenario:
    try:
        return _REGISTRY[name]()
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise ConfigError(f"unknown scenario {name!r} (known: {known})") from None


def scenario_names() -> list[str]:
    return sorted(_REGISTRY)
