"""What the twin gives out: its state as the real formats (text, JSON) and as hpcwatch records.

The writers of the real formats live in twin/exposition.py (dcgm-exporter, node-exporter,
perfquery, Lustre job_stats) and twin/slurm_out.py (squeue, sacct); the methods here delegate to
them, importing them when called since they import the Twin's constants from twin/core.py.
``samples()`` / ``sample_table()`` give the same tick as records, labelled as the real collectors
label them, without a text round trip.

``TwinOutputs`` is a mixin of ``Twin``, not an object it holds: every output reads the Twin's
current state (fields, counters, placement of jobs, the clock) and nothing else. The annotations at
the top of the class name what it reads of the Twin.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import orjson
import pyarrow as pa

from hpcwatch.records import Event, Job, Sample, Span
from hpcwatch.twin.devices import DCGM_FIELDS
from hpcwatch.twin.scenarios import Scenario
from hpcwatch.twin.workload import Scheduler

if TYPE_CHECKING:
    from hpcwatch.twin.core import Twin

__all__ = ["TwinOutputs"]


class TwinOutputs:
    """The Twin's real formats and records of the current tick."""

    # What it reads of the Twin (twin/core.py sets these up).
    seed: int
    now: float
    n_gpus: int
    scheduler: Scheduler
    scenarios: tuple[Scenario, ...]
    node_names: tuple[str, ...]
    ports: tuple[tuple[str, int], ...]
    gpu_labels: list[dict[str, str]]
    fields: np.ndarray
    absent: np.ndarray
    _gpu_flat: dict[tuple[str, int], int]
    _gpu_node: np.ndarray
    _label_job: np.ndarray
    _events: list[Event]

    if TYPE_CHECKING:

        @property
        def jobs(self) -> list[Job]: ...

        def gpus_of_node(self, node: str) -> list[int]: ...

        def job_of(self, node: str, gpu: int) -> str | None: ...

        def finished_spans(self) -> list[Span]: ...

    @property
    def _as_twin(self) -> Twin:
        """This object as the Twin the writers take (the mixin is only ever a base of ``Twin``)."""
        return cast("Twin", self)

    # -- the real formats -----------------------------------------------------------------------------

    def labels_by_gpu(self, node: str, *, jobs_by_gpu: Mapping[int | str, str] | None = None) -> list[dict[str, str]]:
        """dcgm-exporter label sets of a node's GPUs, with ``hpc_job`` where a job holds the GPU."""
        out = []
        for g in range(len(self.gpus_of_node(node))):
            labels = dict(self.gpu_labels[self._gpu_flat[(node, g)]])
            job = jobs_by_gpu.get(g) if jobs_by_gpu is not None else self.job_of(node, g)
            if job:
                labels["hpc_job"] = job
            out.append(labels)
        return out

    def dcgm_text(
        self, node: str, *, jobs_by_gpu: Mapping[int | str, str] | None = None, timestamp: bool = False
    ) -> str:
        """One dcgm-exporter scrape of a node (``timestamp``: add the sample time in ms to each line)."""
        from hpcwatch.twin import exposition

        return exposition.dcgm_text(self._as_twin, node, jobs_by_gpu=jobs_by_gpu, timestamp=timestamp)

    def node_exporter_text(self, node: str, *, timestamp: bool = False, target_labels: bool = False) -> str:
        """node-exporter's InfiniBand collector output for a node (``target_labels``: add instance/node)."""
        from hpcwatch.twin import exposition

        return exposition.node_exporter_text(self._as_twin, node, timestamp=timestamp, target_labels=target_labels)

    def perfquery_text(self, node: str, port: int) -> str:
        """``perfquery -x`` of one HCA (``port`` = the HCA's index on the node, mlx5_<port> port 1)."""
        from hpcwatch.twin import exposition

        return exposition.perfquery_text(self._as_twin, node, port)

    def lustre_job_stats_text(self) -> str:
        """``lctl get_param obdfilter.*.job_stats`` on the OSS, all OSTs."""
        from hpcwatch.twin import exposition

        return exposition.lustre_job_stats_text(self._as_twin)

    def squeue_json(self) -> str:
        from hpcwatch.twin import slurm_out

        return slurm_out.squeue_json(self._as_twin)

    def sacct_json(self) -> str:
        from hpcwatch.twin import slurm_out

        return slurm_out.sacct_json(self._as_twin)

    # -- records ---------------------------------------------------------------------------------------

    def events(self) -> list[Event]:
        """Events of the last tick (job start/end, checkpoints, what scenarios planted)."""
        return list(self._events)

    def samples(self) -> Iterator[Sample]:
        """The current state as samples, labelled as the real collectors label them."""
        absent = self.absent.tolist()
        for g, labels in enumerate(self.labels_of_all()):
            if absent[g]:
                continue
            row = self.fields[g].tolist()
            for name, value in zip(DCGM_FIELDS, row):
                yield Sample(metric=name, labels=labels, t=self.now, value=value)
        from hpcwatch.twin.exposition import ib_samples, lustre_samples

        yield from ib_samples(self._as_twin)
        yield from lustre_samples(self._as_twin)

    def labels_of_all(self, gpus: np.ndarray | None = None) -> list[dict[str, str]]:
        """dcgm-exporter's labels of every GPU (or of the GPUs at these indexes), with its job's ``hpc_job``."""
        out = []
        jobs = self.scheduler.jobs
        indexes = range(self.n_gpus) if gpus is None else gpus.tolist()
        label_job = self._label_job.tolist()
        for g in indexes:
            labels, j = self.gpu_labels[g], label_job[g]
            out.append({**labels, "hpc_job": jobs[j].id} if j >= 0 else labels)
        return out

    def sample_table(self, *, scrape: tuple[int, int] = (0, 1)) -> pa.Table:
        """``samples()`` as one table with the store's columns (``hpcwatch.store.SAMPLE_SCHEMA``): the fast
        way to put a tick of a large cluster into a Store (``Store.add_sample_table``). Built by column, a
        block of rows sharing labels at a time (a GPU's fields, a port's counters), with the same rows in the
        same order as ``samples()``: at 1,024 nodes a tick is about 170,000 samples, too many for one object each.

        ``scrape`` ``(k, n)``: only the rows of the k-th of n scrape groups, as a Prometheus that scrapes its
        targets in turn over its interval writes them: a node's GPUs and ports are in group ``node index % n``
        (its dcgm-exporter and node-exporter), a Lustre target's job stats in ``OST index % n``."""
        from hpcwatch.schemas import SAMPLE_SCHEMA
        from hpcwatch.twin.exposition import ib_block, lustre_block

        k, n = scrape
        nodes = None if n == 1 else set(self.node_names[k::n])
        osts = None if n == 1 else range(k, self._as_twin.cluster.storage.osts, n)
        blocks = [
            self._dcgm_block(None if nodes is None else self._gpu_node % n == k),
            ib_block(self._as_twin, nodes=nodes),
            lustre_block(self._as_twin, osts=osts),
        ]
        parts = [_block_columns(block, self.now) for block in blocks]
        return pa.table(
            {name: pa.concat_arrays([part[name] for part in parts]) for name in SAMPLE_SCHEMA.names},
            schema=SAMPLE_SCHEMA,
        )

    def _dcgm_block(self, scraped: np.ndarray | None = None) -> Any:
        """The GPUs dcgm-exporter exports (a lost one writes no rows), a row each, a column per DCGM field;
        ``scraped``: a mask of the GPUs whose exporter is scraped now (None: all)."""
        from hpcwatch.twin.exposition import SampleBlock

        present = ~self.absent if scraped is None else scraped & ~self.absent
        rows = present.nonzero()[0]
        labels, fields = self.labels_of_all(rows), self.fields
        if len(rows) < len(present):
            fields = fields[present]
        keys = [(lab["Hostname"], lab["gpu"], lab.get("hpc_job")) for lab in labels]
        return SampleBlock(tuple(DCGM_FIELDS), fields, labels, keys)

    def records(self) -> Iterator[Sample | Event | Span | Job]:
        """The current tick as records: samples, every job, spans of the step that finished, events."""
        yield from self.samples()
        yield from self.jobs
        yield from self.finished_spans()
        yield from self._events

    def describe(self) -> dict[str, Any]:
        return {
            "nodes": len(self.node_names),
            "gpus": self.n_gpus,
            "ports": len(self.ports),
            "now": self.now,
            "seed": self.seed,
            "scenarios": [s.name for s in self.scenarios],
        }


def _block_columns(block: Any, now: float) -> dict[str, pa.Array]:
    """A ``SampleBlock``'s rows as arrow arrays of SAMPLE_SCHEMA: what a row shares (labels, keys) is made
    once a row and repeated by ``take``, the values come from the grid as they lie."""
    rows, width = len(block.labels), len(block.metrics)
    each_row = pa.array(np.repeat(np.arange(rows, dtype=np.int64), width))

    def repeated(strings: list[str | None]) -> pa.Array:
        return pa.array(strings, type=pa.string()).take(each_row)

    return {
        "metric": pa.array(block.metrics, type=pa.string()).take(pa.array(np.tile(np.arange(width), rows))),
        "t": pa.array(np.full(rows * width, now, dtype=np.float64)),
        "value": pa.array(np.asarray(block.values, dtype=np.float64).reshape(rows * width)),
        "host": repeated([k[0] for k in block.keys]),
        "gpu": repeated([k[1] for k in block.keys]),
        "job": repeated([k[2] for k in block.keys]),
        "labels": repeated(block.texts or [orjson.dumps(lab).decode() for lab in block.labels]),
    }
