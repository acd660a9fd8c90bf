"""The live twin's host captures: what the scenarios write for a run on disk (``Scenario.extra_files``: smartctl
JSON, ``df``, ``dmesg``, ``ibstat``...), fed to the store as a cluster's agent ships a node's captures.

A run on disk (``hpcwatch twin run``) writes these files once, at its end, for ``hpcwatch ingest --host``. A live
twin has no end: ``HostFiles`` writes them at its first tick and then every ``HOST_FILES_PERIOD_S`` of simulated
time into a fresh private folder, hands each ``host/<node>/`` folder (named by ``host=<node>``; none of these
tools prints its host) to an ingest function, and deletes the folder::

    tick:   0     10    20   ...  300   310  ...  600
    feed:   F                     F               F        F: extra_files -> temp folder -> ingest -> rm

The twin does not import the ingest (it sits below it): the caller hands in a ``FolderIngest``
(``hpcwatch.ingest.ingest_folder`` over the store). A file that carried events is a log of what happened
(``dmesg``, the BMC's SEL) or a benchmark's result (``dcgmi diag``, nccl-tests, ``ib_write_bw``): the tool
printing it again later would not make it happen again, so it is fed once, at the first feed, and ages out of the
health window as a real one does. A file of samples is a reading of state (a drive's SMART log, ``df``): read
again every period, so a persistent fault stays in the window.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from hpcwatch.twin.host_faults import HOST_FAULT_RULES
from hpcwatch.twin.scenarios import Scenario

__all__ = ["HostFiles", "FolderIngest", "IngestedFile", "LIVE_FILE_SCENARIOS", "HOST_FILES_PERIOD_S"]

log = logging.getLogger(__name__)

#: How often (simulated seconds) the live twin's host captures are fed. Ours: a third of the health rules' window
#: (reports.health.DEFAULT_HEALTH_WINDOW_S, 900 s), so a persistent fault is read three times per window and stays
#: marked even if one feed fails; an agent running smartctl, df or chronyc every few minutes does the same.
HOST_FILES_PERIOD_S = 300.0

#: The scenarios whose files are fed live, each checked by running its extra_files into a temp folder and
#: ingesting it twice, 300 s apart (tests/unit/test_live_host_files.py runs two of them):
#:   - every host fault (twin/host_faults.py): files under host/<node>/ only, its rule fires on its node;
#:   - ofed_drift, hca_firmware_drift (twin/fleet_faults.py): ofed_info and ibstat of every node.
#: Left out, and why:
#:   - kubernetes: rewrites the twin's own scrape files of a run, which a live twin never writes;
#:   - neglected, well_kept (twin/assess_scenarios.py): a whole assessment's evidence for hpcwatch assess, whose
#:     dcgm scrapes and ibstat would stand beside the live twin's own and warn cuda_mismatch on every node;
#:   - threat_* and benign_* (twin/threats.py): their events come live through ``events`` already, and their
#:     files (dataset shards, an OSV dump, pip lists) make sense for a run on disk scanned by hpcwatch scan;
#:   - nccl_socket_fallback, nccl_conf_stale (twin/nccl.py): the live twin emits their nccl_rank events itself,
#:     their logs would count every rank twice; nccl_hang: Flight Recorder dumps for hpcwatch hang, no health
#:     rule; nccl_drift: its acceptance logs fired nothing when fed this way.
LIVE_FILE_SCENARIOS: frozenset[str] = frozenset(HOST_FAULT_RULES) | {"ofed_drift", "hca_firmware_drift"}


class IngestedFile(Protocol):
    """What the ingest says of one file (``hpcwatch.ingest.FileResult`` is one)."""

    @property
    def path(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def counts(self) -> Mapping[str, int]: ...

    @property
    def reason(self) -> str: ...


#: Ingests every file under a folder into the store, ``host`` naming the node (None: the files name it).
FolderIngest = Callable[[Path, str | None], Iterable[IngestedFile]]


class HostFiles:
    """``capture(twin)`` (under the twin's lock) writes the due scenarios' files; ``feed(folder)`` (without it)
    ingests and deletes them. Neither raises: a failing scenario or a refused file is logged once."""

    def __init__(
        self, scenarios: Iterable[Scenario], ingest: FolderIngest, *, period_s: float = HOST_FILES_PERIOD_S
    ) -> None:
        self.scenarios = tuple(s for s in scenarios if s.name in LIVE_FILE_SCENARIOS)
        self.ingest = ingest
        self.period_s = period_s
        self._t0: float | None = None
        self._last_t: float | None = None
        self._fed_once: set[str] = set()
        """Files (relative to the folder) that carried events: logs and benchmark results, fed once."""
        self._logged: set[str] = set()

    def capture(self, twin: Any) -> Path | None:
        """The due scenarios' files of ``twin.now`` in a new private folder, or None when not due (or none)."""
        if not self.scenarios or not self._due(twin.now):
            return None
        self._t0 = twin.now if self._t0 is None else self._t0
        folder = Path(tempfile.mkdtemp(prefix="hpcwatch-live-files-"))  # mode 0700: ours alone
        for scenario in self.scenarios:
            try:
                scenario.extra_files(twin=twin, out=folder, t0=self._t0, t1=twin.now)
            except Exception as err:  # a scenario's bug must not stop the twin thread
                self._log_once(f"scenario {scenario.name}", f"{type(err).__name__}: {err}")
        return folder

    def feed(self, folder: Path) -> None:
        """Ingest what ``capture`` wrote (each node's folder naming it, the rest as is), then delete it."""
        try:
            for path, host in self._inputs(folder):
                self._ingest(folder, path, host)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _due(self, now: float) -> bool:
        if self._last_t is not None and now - self._last_t < self.period_s:
            return False
        self._last_t = now
        return True

    def _inputs(self, folder: Path) -> list[tuple[Path, str | None]]:
        for name in self._fed_once:  # written again by the scenario: a log already read
            (folder / name).unlink(missing_ok=True)
        hosts = folder / "host"
        nodes = [(p, p.name) for p in sorted(hosts.iterdir())] if hosts.is_dir() else []
        others: list[tuple[Path, str | None]] = [(p, None) for p in sorted(folder.iterdir()) if p != hosts]
        return nodes + others

    def _ingest(self, folder: Path, path: Path, host: str | None) -> None:
        try:
            results = list(self.ingest(path, host))
        except Exception as err:  # the store or a reader failing: the demo goes on, the next feed tries again
            self._log_once(f"ingest {path.relative_to(folder)}", f"{type(err).__name__}: {err}")
            return
        for result in results:
            name = str(Path(result.path).relative_to(folder))
            if result.counts.get("events"):
                self._fed_once.add(name)
            if result.status == "bad":
                self._log_once(f"file {name}", result.reason)

    def _log_once(self, what: str, why: str) -> None:
        if what not in self._logged:
            self._logged.add(what)
            log.warning("live twin: %s not fed (logged once): %s", what, why)
