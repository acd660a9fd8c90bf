"""Run the twin for a while and write what the real collectors would have left on disk.

Layout of ``out`` (every file is a real format; ``hpcwatch ingest out`` reads it back):

    dcgm/<node>.prom                  every dcgm-exporter scrape of the node, one after the other (as
                                      ``while sleep 10; do curl -s node:9400/metrics; done >> file`` would
                                      leave them), each sample line with its ms timestamp
    amd-device-metrics/<node>.prom    the same for a node of AMD GPUs: AMD device-metrics-exporter's text
                                      (port 5000), its Slurm ``job_id`` label on the GPUs a job holds
    node-exporter/<node>.prom         the same for node-exporter's infiniband metrics, with the target labels
                                      a Prometheus adds (instance="<node>:9100", node="<node>")
    lustre/<t_ms>.txt                 ``lctl get_param obdfilter.*.job_stats`` every LUSTRE_EVERY_S and at the end
    perfquery/<node>/mlx5_<h>.1.txt   ``perfquery -x`` of every HCA at the end (clusters of up to
                                      SNAPSHOT_MAX_NODES nodes: thousands of tiny files cost seconds)
    slurm/squeue.json, sacct.json     ``squeue --json`` / ``sacct --json`` (Slurm 22.05) at the end
    nccl/nccl.<node>.<pid>.log        the training job's NCCL_DEBUG=INFO log, one per rank (twin/nccl.py)
    flight_recorder/fr_trace_rank_<r> (``nccl_hang`` only) each rank's Flight Recorder dump, torch's pickle
    tetragon/checkpoints.jsonl        Tetragon's ``security_file_permission`` events of every checkpoint written
                                      or read back (twin/ebpf.py), when the run saw one
    spans.jsonl                       (``spans=True`` only) the training job's step spans, one JSON object per
                                      line {"job","rank","step","phase","start","dur","attrs"} (records.Span);
                                      not a collector's format, so ``hpcwatch ingest`` does not read it
    + whatever the active scenarios' ``extra_files`` write

With ``traces_dir``, the training job's profiled steps (one per tick, the last MAX_TRACE_STEPS)
also go there as PyTorch profiler (Kineto) traces, ``rank-<r>.json``, for ``hpcwatch steps DIR``.
They live outside ``out`` because ``hpcwatch ingest`` does not read Kineto traces.

Scrapes go to one file per node, not one per scrape: creating ~100,000 small files (an hour of
128 nodes) costs far more than simulating them. The first scrape is written at the start time, before the first tick, so
every counter has a starting point and per-job deltas add up exactly.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from multiprocessing.connection import Connection
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import numpy as np
import orjson

from hpcwatch.errors import ConfigError
from hpcwatch.model import Cluster, parse_cluster, reference_cluster
from hpcwatch.twin.core import Twin
from hpcwatch.twin.ebpf import checkpoint_docs_of_tick
from hpcwatch.twin.exposition import (
    hca_device,
    kineto_traces,
    scrape_all,
    spans_jsonl,
    uniform_shape,
    write_gpu_kineto_traces,
)
from hpcwatch.twin.nccl import write_nccl_logs
from hpcwatch.twin.workload import PlannedJob

__all__ = [
    "write_run",
    "RunSummary",
    "sized_reference",
    "sized_model",
    "gpu_folder",
    "PACKAGED_MODELS",
    "AMD_FOLDER",
    "LUSTRE_EVERY_S",
    "DEFAULT_STEP_S",
    "SNAPSHOT_MAX_NODES",
]

#: How often the Lustre job_stats snapshot is taken (lustre_exporter scrapes every 15-60 s).
LUSTRE_EVERY_S = 60.0
#: Profiled steps kept for the Kineto traces (a profiler schedule records a few, not thousands).
MAX_TRACE_STEPS = 30
#: Per-HCA and per-GPU snapshot files only for clusters up to this size.
SNAPSHOT_MAX_NODES = 32

#: Default scrape interval (Prometheus' scrape_interval is often 10-15 s on GPU clusters).
DEFAULT_STEP_S = 10.0


#: Cluster models shipped in the package (``model/<name>.yaml``), for ``hpcwatch twin run --model NAME``.
PACKAGED_MODELS = ("reference", "mi300x")
#: The folder of a node's GPU exporter scrapes: dcgm-exporter's, or AMD device-metrics-exporter's.
AMD_FOLDER = "amd-device-metrics"


def gpu_folder(twin: Twin, node: str) -> str:
    """``dcgm`` or ``amd-device-metrics``: where the node's GPU exporter scrapes go."""
    return AMD_FOLDER if twin.node_is_amd(node) else "dcgm"


def sized_reference(nodes: int | None = None) -> Cluster:
    """The reference cluster, or its node type ``nodes`` times (node1 ... nodeN)."""
    return sized_model("reference", nodes)


def sized_model(model: str | Path = "reference", nodes: int | None = None) -> Cluster:
    """A packaged model (``PACKAGED_MODELS``) or a cluster YAML file, its first node group ``nodes`` times
    (node1 ... nodeN) when given."""
    if nodes is not None and nodes < 1:
        raise ConfigError(f"--nodes must be >= 1, got {nodes}")
    if str(model) in PACKAGED_MODELS:
        name = f"{model}.yaml"
        text = resources.files("hpcwatch.model").joinpath(name).read_text()
    else:
        name = str(model)
        try:
            text = Path(model).read_text()
        except OSError as err:
            known = ", ".join(PACKAGED_MODELS)
            raise ConfigError(f"{model}: no such cluster model ({known}, or a YAML file): {err.strerror}") from err
    if nodes is None:
        return reference_cluster() if str(model) == "reference" else parse_cluster(text, path=name)
    found = re.search(r"^(\s*)count: \d+\n", text, re.MULTILINE)
    if found is None:
        raise ConfigError(f"{name}: nodes[0].count: cannot resize (no 'count: N' line)")
    resized = text[: found.start()] + f"{found.group(1)}count: {nodes}\n" + text[found.end() :]
    return parse_cluster(resized, path=f"{name} (nodes={nodes})")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    out: str
    t0: float
    t1: float
    ticks: int
    files: int
    jobs: int
    spans: int
    events: int


def write_run(
    twin: Twin,
    out: str | Path,
    *,
    duration_s: float,
    step_s: float = DEFAULT_STEP_S,
    spans: bool = False,
    traces_dir: str | Path | None = None,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> RunSummary:
    """Advance ``twin`` by ``duration_s`` in ticks of ``step_s`` and write the files described above.

    ``workers`` > 1 renders and writes the per-node scrape files in that many forked processes
    (each owns a block of nodes; the simulation stays in this one), for large clusters.
    """
    if duration_s <= 0 or step_s <= 0:
        raise ConfigError(f"duration and step must be > 0, got {duration_s} and {step_s}")
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    out = Path(out)
    ticks = int(round(duration_s / step_s))
    t0 = twin.now
    w = _Writer(out, twin, workers=workers)
    w.scrape(lustre=True)
    next_lustre = t0 + LUSTRE_EVERY_S
    span_file = (out / "spans.jsonl").open("wb") if spans else None
    profiled: list[tuple] = []
    checkpoint_docs: list[dict] = []
    try:
        for k in range(ticks):
            twin.advance(step_s)
            due = twin.now >= next_lustre - 1e-9 or k == ticks - 1
            if due:
                next_lustre += LUSTRE_EVERY_S
            w.scrape(lustre=due)
            if span_file is not None:
                text, n = spans_jsonl(twin)
                span_file.write(text.encode())
                w.spans += n
            events = twin.events()
            w.events += len(events)
            checkpoint_docs += checkpoint_docs_of_tick(twin, events)
            if traces_dir is not None and (found := twin.finished_span_table()) is not None:
                profiled = (profiled + [found])[-MAX_TRACE_STEPS:]
            if progress:
                progress(k + 1, ticks)
    finally:
        if span_file is not None:
            span_file.close()
        w.close()
    w.final()
    w.tetragon(checkpoint_docs)
    if traces_dir is not None:
        w.files += _write_traces(twin, Path(traces_dir), profiled)
    if twin.scheduler.jobs:
        w.files += write_nccl_logs(twin, out)  # scenarios below may rewrite them (a socket fallback, a hang)
    for scenario in twin.scenarios:
        scenario.extra_files(twin=twin, out=out, t0=t0, t1=twin.now)
    return RunSummary(
        out=str(out),
        t0=t0,
        t1=twin.now,
        ticks=ticks,
        files=w.files,
        jobs=len(twin.jobs),
        spans=w.spans,
        events=w.events,
    )


def _write_traces(twin: Twin, folder: Path, profiled: list[tuple]) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    ranks = twin.ranks(twin.training_job)
    nodes = {r: node for r, node, _ in ranks}
    gpu = next((s for s in twin.scenarios if hasattr(s, "gpu_trace_config")), None)
    if gpu is not None and profiled:  # a scenario about the GPU's own timeline: kernel-level traces
        cfg = gpu.gpu_trace_config(ranks=list(ranks), first_node=twin.node_names[0])
        return write_gpu_kineto_traces(
            folder,
            cfg,
            steps=[p[1] for p in profiled],
            world_size=len(ranks),
            nodes_of_rank=nodes,
            base_s=int(profiled[0][4]),
        )
    docs = kineto_traces(profiled, nodes_of_rank=nodes, world_size=len(ranks))
    for r, doc in docs.items():
        (folder / f"rank-{r}.json").write_bytes(orjson.dumps(doc))
    return len(docs)


_OUR_FOLDERS = (
    "dcgm",
    AMD_FOLDER,
    "node-exporter",
    "lustre",
    "perfquery",
    "slurm",
    "nccl",
    "flight_recorder",
    "tetragon",
)


class _NodeFiles:
    """The per-node scrape files of a block of nodes (all of them, or one worker's share)."""

    def __init__(self, out: Path, twin: Twin, nodes: range) -> None:
        self.twin, self.nodes = twin, nodes
        names = twin.node_names[nodes.start : nodes.stop]
        self.handles = {
            (sub, node): (out / sub / f"{node}.prom").open("w")
            for node in names
            for sub in (gpu_folder(twin, node), "node-exporter")
        }

    def scrape(self) -> None:
        for node, dcgm, ib in scrape_all(self.twin, timestamp=True, target_labels=True, nodes=self.nodes):
            self.handles[gpu_folder(self.twin, node), node].write(dcgm)
            self.handles["node-exporter", node].write(ib)

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()


def _worker(twin: Twin, out: Path, nodes: range, conn: Connection, shape: tuple[int, int]) -> None:
    """A forked process: keeps its copy of the twin in step with the rows it is sent, writes its nodes.
    ``shape``: (GPUs, HCAs) of every node, as the pool sends its rows."""
    g, h = shape
    rows, ports = slice(nodes.start * g, nodes.stop * g), slice(nodes.start * h, nodes.stop * h)
    try:
        files = _NodeFiles(out, twin, nodes)
        while (message := conn.recv()) is not None:
            twin.now, fields, ib, labels, absent, new_ids = message
            twin.fields[rows], twin.ib[ports], twin._label_job[rows], twin.absent[rows] = fields, ib, labels, absent
            # Stand-ins: the writer reads only a job's id (its hpc_job label); the whole job lives in the parent.
            twin.scheduler.jobs.extend(cast("list[PlannedJob]", [SimpleNamespace(id=job_id) for job_id in new_ids]))
            files.scrape()
        files.close()
        conn.send(None)
    except Exception as err:  # reported to the parent, which raises it as one line
        conn.send(f"{type(err).__name__}: {err}")


class _Pool:
    """``workers`` forked writers, one block of nodes each."""

    def __init__(self, out: Path, twin: Twin, workers: int) -> None:
        self.twin = twin
        n = len(twin.node_names)
        bounds = np.linspace(0, n, workers + 1).astype(int)
        self.blocks = [range(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
        shape = uniform_shape(twin)
        if shape is None:  # _Writer forks writers only for nodes of one shape
            raise ConfigError("parallel writers need every node with the same GPUs and HCAs")
        self.g, self.h = shape
        self.known = len(twin.scheduler.jobs)
        ctx = multiprocessing.get_context("fork")
        self.conns, self.procs, self.closed = [], [], False
        for block in self.blocks:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(twin, out, block, child, shape), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def scrape(self) -> None:
        twin, g, h = self.twin, self.g, self.h
        new_ids = [j.id for j in twin.scheduler.jobs[self.known :]]
        self.known = len(twin.scheduler.jobs)
        for block, conn in zip(self.blocks, self.conns):
            rows, ports = slice(block.start * g, block.stop * g), slice(block.start * h, block.stop * h)
            try:
                conn.send(
                    (twin.now, twin.fields[rows], twin.ib[ports], twin._label_job[rows], twin.absent[rows], new_ids)
                )
            except OSError:  # the worker is gone; close() collects why and raises it
                self.close()
                raise ConfigError("writing the scrape files failed: a writer process stopped") from None

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        errors = []
        for conn, proc in zip(self.conns, self.procs):
            try:
                conn.send(None)
                answer = conn.recv()
            except (EOFError, OSError) as err:
                answer = f"writer process died: {err or type(err).__name__}"
            proc.join(10)
            if answer is not None:
                errors.append(answer)
        if errors:
            raise ConfigError(f"writing the scrape files failed: {errors[0]}")


class _Writer:
    def __init__(self, out: Path, twin: Twin, *, workers: int = 1) -> None:
        self.out, self.twin = out, twin
        self.files = self.spans = self.events = 0
        # A rerun into the same folder must not mix with the last run's files: clear our own folders.
        for sub in _OUR_FOLDERS:
            if (out / sub).is_dir():
                shutil.rmtree(out / sub)
        for sub in ("node-exporter", "lustre", "slurm", *sorted({gpu_folder(twin, n) for n in twin.node_names})):
            (out / sub).mkdir(parents=True, exist_ok=True)
        parallel = workers > 1 and uniform_shape(twin) is not None and len(twin.node_names) >= 2 * workers
        nodes = range(len(twin.node_names))
        self.nodes: _NodeFiles | _Pool = _Pool(out, twin, workers) if parallel else _NodeFiles(out, twin, nodes)
        self.files += 2 * len(twin.node_names)

    def close(self) -> None:
        self.nodes.close()

    def _put(self, path: Path, text: str) -> None:
        path.write_text(text)
        # Readers date untimed formats (job_stats, perfquery) by the file's write time: make it the
        # simulated moment the snapshot was taken, as a collector writing it then would have left it.
        os.utime(path, (self.twin.now, self.twin.now))
        self.files += 1

    def scrape(self, *, lustre: bool) -> None:
        twin = self.twin
        stamp = f"{int(round(twin.now * 1000))}"
        self.nodes.scrape()
        if lustre:
            self._put(self.out / "lustre" / f"{stamp}.txt", twin.lustre_job_stats_text())

    def tetragon(self, docs: list[dict]) -> None:
        """Tetragon's JSON lines of the checkpoints written and read back during the run (twin/ebpf.py)."""
        if not docs:
            return
        (self.out / "tetragon").mkdir(parents=True, exist_ok=True)
        self._put(self.out / "tetragon" / "checkpoints.jsonl", "".join(orjson.dumps(d).decode() + "\n" for d in docs))

    def final(self) -> None:
        twin = self.twin
        self._put(self.out / "slurm" / "squeue.json", twin.squeue_json())
        self._put(self.out / "slurm" / "sacct.json", twin.sacct_json())
        if len(twin.node_names) > SNAPSHOT_MAX_NODES:
            return
        for p, (node, hca) in enumerate(twin.ports):
            folder = self.out / "perfquery" / node
            folder.mkdir(parents=True, exist_ok=True)
            index = sum(1 for n, _ in twin.ports[:p] if n == node)
            self._put(folder / f"{hca_device(hca)}.1.txt", twin.perfquery_text(node, index))
