"""Writers of the real text formats from the twin's state: dcgm-exporter, node-exporter, perfquery, Lustre.

Each function renders exactly what the real tool prints (HELP/TYPE lines and
label sets of dcgm-exporter's ``etc/default-counters.csv`` and
``etc/dcp-metrics-included.csv``; node-exporter's infiniband collector; the
``perfquery -x`` layout; ``lctl get_param obdfilter.*.job_stats``), so the
readers in ``hpcwatch.sources`` read the twin and a real cluster alike.

Sources of the shapes:
- https://github.com/NVIDIA/dcgm-exporter/blob/main/etc/default-counters.csv
- https://github.com/prometheus/node_exporter/blob/master/collector/infiniband_linux.go (fixtures/e2e-output.txt)
- perfquery -x outputs in data/public/formats/perfquery (treydock/infiniband_exporter fixtures)
- obdfilter job_stats in data/public/formats/lustre_job_stats (GSI-HPC/lustre_exporter fixtures)
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import orjson
import pyarrow as pa

from hpcwatch import vocab
from hpcwatch.errors import ConfigError
from hpcwatch.records import Sample
from hpcwatch.schemas import SAMPLE_SCHEMA, sample_keys
from hpcwatch.twin.core import _SPAN_COLUMNS, DCGM_FIELDS, IB_COUNTERS, SPAN_ORDER

if TYPE_CHECKING:
    from hpcwatch.twin.core import Twin

__all__ = [
    "DCGM_HELP",
    "AMD_EXPORTER_FIELDS",
    "exporter_values",
    "NODE_EXPORTER_IB",
    "dcgm_text",
    "node_exporter_text",
    "perfquery_text",
    "lustre_job_stats_text",
    "ib_samples",
    "ib_block",
    "SampleBlock",
    "perfquery_samples",
    "perfquery_table",
    "scrape_all",
    "spans_jsonl",
    "kineto_traces",
    "gpu_kineto_traces",
    "write_gpu_kineto_traces",
    "GpuTraceConfig",
    "with_kernels_per_step",
    "uniform_shape",
    "lustre_samples",
    "lustre_block",
    "lustre_target",
    "hca_device",
    "NODE_EXPORTER_PORT",
    "scenario_gpu_lines",
    "forget_templates",
]

#: (type, help) of each DCGM field, verbatim from dcgm-exporter's counter CSVs.
DCGM_HELP: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("counter", "Total energy consumption since boot (in mJ)."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
}
_FLOAT_FIELDS = frozenset({vocab.DCGM_FI_DEV_POWER_USAGE, vocab.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE})
#: What AMD's device-metrics-exporter writes for the twin's fields on an AMD node: (its metric, the twin's DCGM
#: field, its help text verbatim from pkg/amdgpu/gpuagent/gpuagent_gpu_metrics.go, what follows the value), in the
#: exporter's order (client_golang sorts families by name). Every family is a gauge there. The units are the
#: DCGM ones but for energy: uJ, written as the integer mJ followed by "000". The SM clock (no catalog clock
#: for AMD parts), XID (no such counter) and tensor activity (no exporter field) are not written.
AMD_EXPORTER_FIELDS: tuple[tuple[str, str, str, str], ...] = (
    (
        vocab.GPU_ENERGY_CONSUMED,
        vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        "Accumulated energy consumed by the GPU in uJ",
        "000",
    ),
    (vocab.GPU_FREE_VRAM, vocab.DCGM_FI_DEV_FB_FREE, "Free VRAM memory of the GPU (in MB)", ""),
    (vocab.GPU_GFX_ACTIVITY, vocab.DCGM_FI_DEV_GPU_UTIL, "Graphics engine usage in Percentage (0-100)", ""),
    (vocab.GPU_JUNCTION_TEMPERATURE, vocab.DCGM_FI_DEV_GPU_TEMP, "Current junction/hotspot temperature in Celsius", ""),
    (vocab.GPU_POWER_USAGE, vocab.DCGM_FI_DEV_POWER_USAGE, "GPU Power usage in Watts", ""),
    (vocab.GPU_USED_VRAM, vocab.DCGM_FI_DEV_FB_USED, "Used VRAM memory of the GPU (in MB)", ""),
)
_AMD_COLUMNS = tuple(DCGM_FIELDS.index(field) for _, field, _, _ in AMD_EXPORTER_FIELDS)

#: node-exporter infiniband metrics: name -> (type, help, perfquery counter, multiplier). Sorted by name, as
#: node-exporter writes them. Data counters are 4-byte words in perfquery, octets in node-exporter.
NODE_EXPORTER_IB: dict[str, tuple[str, str, str, int]] = {
    "node_infiniband_link_downed_total": (
        "counter",
        "Number of times the link failed to recover from an error state and went down",
        "LinkDownedCounter",
        1,
    ),
    "node_infiniband_link_error_recovery_total": (
        "counter",
        "Number of times the link successfully recovered from an error state",
        "LinkErrorRecoveryCounter",
        1,
    ),
    "node_infiniband_port_data_received_bytes_total": (
        "counter",
        "Number of data octets received on all links",
        "PortRcvData",
        4,
    ),
    "node_infiniband_port_data_transmitted_bytes_total": (
        "counter",
        "Number of data octets transmitted on all links",
        "PortXmitData",
        4,
    ),
    "node_infiniband_port_discards_transmitted_total": (
        "counter",
        "Number of outbound packets discarded by the port because the port is down or congested",
        "PortXmitDiscards",
        1,
    ),
    "node_infiniband_port_errors_received_total": (
        "counter",
        "Number of packets containing an error that were received on this port",
        "PortRcvErrors",
        1,
    ),
    "node_infiniband_port_packets_received_total": (
        "counter",
        "Number of packets received on all VLs by this port (including errors)",
        "PortRcvPkts",
        1,
    ),
    "node_infiniband_port_packets_transmitted_total": (
        "counter",
        "Number of packets transmitted on all VLs from this port (including errors)",
        "PortXmitPkts",
        1,
    ),
    "node_infiniband_port_transmit_wait_total": (
        "counter",
        "Number of ticks during which the port had data to transmit but no data was sent during the entire tick",
        "PortXmitWait",
        1,
    ),
}
#: node-exporter's default port; Prometheus names the target ``<host>:9100`` in the ``instance`` label.
NODE_EXPORTER_PORT = 9100
#: IB port state 4 = ACTIVE, physical state 5 = LinkUp (node-exporter's HELP texts list the codes).
_STATE_ACTIVE, _PHYS_LINKUP = 4, 5
_COL = {name: i for i, name in enumerate(IB_COUNTERS)}


def hca_device(hca: int) -> str:
    """The kernel name of a node's HCA number ``hca`` (ConnectX: mlx5_0, mlx5_1...)."""
    return f"mlx5_{hca}"


def lustre_target(storage_name: str, ost: int) -> str:
    """OST names are the fs name and the index in 4 hex digits: lustre-OST000a."""
    return f"{storage_name}-OST{ost:04x}"


def _label_text(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


# Rendered text templates per twin: label sets change only when jobs move, values every tick, so each
# scrape is one ``template % values`` (fast enough for an hour of 128 nodes in seconds).
_TEMPLATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TS = "%s"  # the sample's " <ms timestamp>" (or nothing): one more argument per line


def _cache(twin: Twin) -> dict:
    cache = _TEMPLATES.get(twin)
    if cache is None:
        cache = _TEMPLATES[twin] = {}
    return cache


def forget_templates(twin: Twin) -> None:
    """Drop the twin's rendered templates (its label sets changed: ``Twin.set_gpu_label``)."""
    _TEMPLATES.pop(twin, None)


def _esc(text: str) -> str:
    return text.replace("%", "%%")


def _float_fields(twin: Twin) -> frozenset[str]:
    """Fields written as floats: power and tensor activity, and the SM clock when the catalog does not know
    the GPU's clock (it is NaN then, and "%d" cannot write NaN)."""
    if np.isnan(twin.fields[:, DCGM_FIELDS.index(vocab.DCGM_FI_DEV_SM_CLOCK)]).any():
        return _FLOAT_FIELDS | {vocab.DCGM_FI_DEV_SM_CLOCK}
    return _FLOAT_FIELDS


def _dcgm_template(
    label_sets: tuple[str, ...], float_fields: frozenset[str] = _FLOAT_FIELDS, *, amd: bool = False
) -> str:
    if amd:
        return _amd_template(label_sets, float_fields)
    out = []
    for name in DCGM_FIELDS:
        kind, help_text = DCGM_HELP[name]
        spec = "%r" if name in float_fields else "%d"
        out.append(_esc(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"))
        out.extend(_esc(f"{name}{{{labels}}} ") + spec + _TS + "\n" for labels in label_sets)
    return "".join(out)


def _amd_template(label_sets: tuple[str, ...], float_fields: frozenset[str]) -> str:
    """device-metrics-exporter's text for the GPUs of ``label_sets``; its values come from ``_amd_values``."""
    out = []
    for name, field, help_text, suffix in AMD_EXPORTER_FIELDS:
        spec = "%r" if field in float_fields else "%d"
        out.append(_esc(f"# HELP {name} {help_text}\n# TYPE {name} gauge\n"))
        out.extend(_esc(f"{name}{{{labels}}} ") + spec + suffix + _TS + "\n" for labels in label_sets)
    return "".join(out)


def _amd_values(values: list, gpus: int) -> list:
    """A node's field-major values (``_gpu_values``) cut to the fields of ``AMD_EXPORTER_FIELDS``, in its order."""
    return [v for k in _AMD_COLUMNS for v in values[k * gpus : (k + 1) * gpus]]


def exporter_values(twin: Twin, node: str, values: list, gpus: int) -> list:
    """``values`` as the node's exporter template takes them (all fields for dcgm-exporter)."""
    return _amd_values(values, gpus) if twin.node_is_amd(node) else values


def _stamp_of(twin: Twin, timestamp: bool) -> str:
    return f" {int(round(twin.now * 1000))}" if timestamp else ""


def _with_stamp(values: list, stamp: str) -> tuple:
    """Interleave each value with the timestamp text, as the templates expect (value, stamp, value...)."""
    out = [stamp] * (2 * len(values))
    out[0::2] = values
    return tuple(out)


def dcgm_text(
    twin: Twin, node: str, *, jobs_by_gpu: Mapping[int | str, str] | None = None, timestamp: bool = False
) -> str:
    """One scrape of dcgm-exporter on ``node``; ``jobs_by_gpu`` overrides the hpc_job labels. GPUs the
    exporter lost (``twin.absent``) have no lines."""
    flat = twin.gpus_of_node(node)
    lost = twin.absent[flat]
    absent = lost if lost.any() else None
    if jobs_by_gpu is not None and twin.node_is_amd(node):  # device-metrics-exporter's labels, its job_id
        jobs = [jobs_by_gpu.get(k) or jobs_by_gpu.get(str(k)) for k in range(len(flat))]
        label_sets = tuple(twin.exporter_label_text(g, job) for g, job in zip(flat, jobs))
        if absent is not None:
            label_sets = tuple(lab for lab, gone in zip(label_sets, absent.tolist()) if not gone)
        template = _dcgm_template(label_sets, _float_fields(twin), amd=True)
    elif jobs_by_gpu is not None:
        label_sets = tuple(_label_text(labels) for labels in twin.labels_by_gpu(node, jobs_by_gpu=jobs_by_gpu))
        if absent is not None:
            label_sets = tuple(lab for lab, gone in zip(label_sets, absent.tolist()) if not gone)
        template = _dcgm_template(label_sets, _float_fields(twin))
    else:
        template = _dcgm_node_template(twin, node, flat, absent=absent)
    rows = flat if absent is None else [g for g, gone in zip(flat, absent.tolist()) if not gone]
    values = exporter_values(twin, node, _gpu_values(twin.fields[rows][None], _float_fields(twin))[0], len(rows))
    stamp = _stamp_of(twin, timestamp)
    text = template % _with_stamp(values, stamp) + scenario_gpu_lines(twin, node, stamp)
    return _one_series_per_job(text) if jobs_by_gpu and any("," in j for j in jobs_by_gpu.values()) else text


def scenario_gpu_lines(twin: Twin, node: str, stamp: str) -> str:
    """What the active scenarios add to the node's GPU exporter scrape (``Scenario.gpu_exporter_lines``)."""
    hooked = twin._hooked("gpu_exporter_lines")
    return "".join(s.gpu_exporter_lines(twin=twin, node=node, stamp=stamp) for s in hooked) if hooked else ""


_SHARED_GPU = re.compile(r'hpc_job="([^"]*,[^"]*)"')


def _one_series_per_job(text: str) -> str:
    """A GPU shared by several jobs: dcgm-exporter (pkg/dcgmexporter/hpc.go) repeats each of the GPU's
    series once per job id in its mapping file, rather than joining the ids into one label."""
    lines = []
    for line in text.split("\n"):
        shared = _SHARED_GPU.search(line)
        if shared is None:
            lines.append(line)
            continue
        head, tail = line[: shared.start(1)], line[shared.end(1) :]
        lines.extend(head + job + tail for job in shared.group(1).split(",") if job)
    return "\n".join(lines)


def _dcgm_node_template(
    twin: Twin, node: str, flat: list[int], placement: bytes | None = None, absent: np.ndarray | None = None
) -> str:
    """The node's template for the jobs now on its GPUs (cached; keyed by the job indices, cheap to hash).
    ``absent``: which of the node's GPUs the exporter lost (None: none), left out of the text."""
    cache = _cache(twin)
    key: tuple[str | bytes, ...] = (
        "dcgm",
        node,
        placement if placement is not None else twin._label_job[flat].tobytes(),
    )
    if absent is not None:
        key += (absent.tobytes(),)
        flat = [g for g, gone in zip(flat, absent.tolist()) if not gone]
    template = cache.get(key)
    if template is None:
        cache.pop(cache.get(("dcgm-key", node)), None)  # the node's previous placement is not coming back
        template = cache[key] = _dcgm_template(
            tuple(twin.dcgm_label_text(g) for g in flat), _float_fields(twin), amd=twin.node_is_amd(node)
        )
        cache[("dcgm-key", node)] = key
    return template


def uniform_shape(twin: Twin) -> tuple[int, int] | None:
    """(GPUs, HCAs) per node when every node has the same; None for mixed node groups."""
    per_node_gpus = {len(twin.gpus_of_node(n)) for n in twin.node_names}
    per_node_ports = {len(twin.ports_of_node(n)) for n in twin.node_names}
    if len(per_node_gpus) != 1 or len(per_node_ports) != 1:
        return None
    return per_node_gpus.pop(), per_node_ports.pop()


def scrape_all(
    twin: Twin, *, timestamp: bool = True, target_labels: bool = True, nodes: range | None = None
) -> Iterator[tuple[str, str, str]]:
    """(node, dcgm-exporter text, node-exporter text) of every node (or of the node positions ``nodes``),
    the values of all of them taken in one go."""
    shape = uniform_shape(twin)
    names = twin.node_names if nodes is None else twin.node_names[nodes.start : nodes.stop]
    if shape is None:  # mixed node groups: one node at a time
        for node in names:
            yield (
                node,
                dcgm_text(twin, node, timestamp=timestamp),
                node_exporter_text(twin, node, timestamp=timestamp, target_labels=target_labels),
            )
        return
    (g, h), n = shape, len(names)
    lo = 0 if nodes is None else nodes.start
    fields = twin.fields[lo * g : (lo + n) * g]
    ib = twin.ib[lo * h : (lo + n) * h]
    gpu_values = _gpu_values(fields.reshape(n, g, -1), _float_fields(twin))
    columns = _ib_node_template(twin, names[0], target_labels).columns
    ib_values = _ib_matrix(ib, columns).reshape(n, h, -1).transpose(0, 2, 1).reshape(n, -1).tolist()
    static = ib[:, _STATIC_COLS].reshape(n, h, -1)
    stamp = _stamp_of(twin, timestamp)
    placements = twin._label_job[lo * g : (lo + n) * g].reshape(n, g)
    absent = twin.absent[lo * g : (lo + n) * g].reshape(n, g)
    lost = set(np.flatnonzero(absent.any(axis=1)).tolist())
    extra = bool(twin._hooked("gpu_exporter_lines"))
    extra_node = bool(twin._hooked("node_exporter_lines"))
    for k, node in enumerate(names):
        if k in lost:  # the exporter lost a GPU of this node: its lines go
            gone = absent[k]
            template = _dcgm_node_template(twin, node, twin.gpus_of_node(node), placements[k].tobytes(), gone)
            values = _gpu_values(fields.reshape(n, g, -1)[k][~gone][None], _float_fields(twin))[0]
            dcgm = template % _with_stamp(exporter_values(twin, node, values, int((~gone).sum())), stamp)
        else:
            template = _dcgm_node_template(twin, node, twin.gpus_of_node(node), placements[k].tobytes())
            dcgm = template % _with_stamp(exporter_values(twin, node, gpu_values[k], g), stamp)
        if extra:
            dcgm += scenario_gpu_lines(twin, node, stamp)
        ib_template = _ib_node_template(twin, node, target_labels, static[k])
        ib_text = ib_template.text % ib_template.args(ib_values[k], stamp)
        yield node, dcgm, ib_text + (scenario_node_lines(twin, node, stamp, target_labels) if extra_node else "")


def _gpu_values(fields: np.ndarray, float_fields: frozenset[str]) -> list[list]:
    """Rows of (nodes, gpus, fields) as per-node lists, field-major: Python ints for integer fields
    (formatting an int is cheaper than a float through %d), floats for the float fields."""
    n, g, _ = fields.shape
    by_field = fields.transpose(0, 2, 1)
    out = np.nan_to_num(by_field).astype(np.int64).reshape(n, -1).tolist()
    for k, name in enumerate(DCGM_FIELDS):
        if name in float_fields:
            for node_values, row in zip(out, by_field[:, k, :].tolist()):
                node_values[k * g : (k + 1) * g] = row
    return out


def _node_ports(twin: Twin, node: str) -> list[int]:
    return twin.ports_of_node(node)


def _ib_gauges(twin: Twin) -> dict[str, tuple[str, int]]:
    return {
        "node_infiniband_rate_bytes_per_second": ("Maximum signal transfer rate", int(twin.link_bytes_s)),
        "node_infiniband_state_id": (
            "State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, 4: active, 5: act defer)",
            _STATE_ACTIVE,
        ),
        "node_infiniband_physical_state_id": (
            "Physical state of the InfiniBand port (0: no change, 1: sleep, 2: polling, 3: disable, 4: shift, "
            "5: link up, 6: link error recover, 7: phytest)",
            _PHYS_LINKUP,
        ),
    }


@dataclass(frozen=True, slots=True)
class _IbTemplate:
    """A node's node-exporter text with ``%d`` where counters go and ``%s`` for each timestamp.

    ``columns``: (ib column, multiplier) of each counter metric, in text order; ``offsets``: where each
    counter block's first argument sits in the argument list (a gauge block takes timestamps only).
    """

    text: str
    columns: list[tuple[int, int]]
    offsets: list[int]
    n_args: int
    ports: int

    def args(self, values: list[int], stamp: str) -> tuple:
        """Arguments for one node: ``values`` counter-major (metric k's ports at k*ports...)."""
        out: list[str | int] = [stamp] * self.n_args
        h = self.ports
        for k, offset in enumerate(self.offsets):
            out[offset : offset + 2 * h : 2] = values[k * h : (k + 1) * h]
        return tuple(out)


#: Counters that move only when something goes wrong (a scenario): written into the template, which is
#: rebuilt when one of them changes, so a scrape formats only the counters that move every tick.
_STATIC_IB = ("LinkDownedCounter", "LinkErrorRecoveryCounter", "PortXmitDiscards", "PortRcvErrors", "PortXmitWait")
_STATIC_COLS = [_COL[c] for c in _STATIC_IB]


def _ib_template(twin: Twin, node: str, target_labels: bool, static: np.ndarray) -> _IbTemplate:
    """Build the node's ``_IbTemplate``: constant gauges and the ``static`` counters (ports x _STATIC_IB)
    are written into the text."""
    ports = _node_ports(twin, node)
    extra = f',instance="{node}:{NODE_EXPORTER_PORT}",node="{node}"' if target_labels else ""
    labels = [f'device="{hca_device(twin.ports[p][1])}",port="1"{extra}' for p in ports]
    gauges = _ib_gauges(twin)
    out: list[str] = []
    columns: list[tuple[int, int]] = []
    offsets: list[int] = []
    n_args = 0
    for name in sorted(list(NODE_EXPORTER_IB) + list(gauges)):
        if name in gauges:
            help_text, value = gauges[name]
            out.append(_esc(f"# HELP {name} {help_text}\n# TYPE {name} gauge\n"))
            out.extend(_esc(f"{name}{{{lab}}} {value}") + _TS + "\n" for lab in labels)
            n_args += len(labels)
            continue
        kind, help_text, counter, mult = NODE_EXPORTER_IB[name]
        out.append(_esc(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"))
        if counter in _STATIC_IB:
            values = (static[:, _STATIC_IB.index(counter)] * mult).astype(np.int64).tolist()
            out.extend(_esc(f"{name}{{{lab}}} {v}") + _TS + "\n" for lab, v in zip(labels, values))
            n_args += len(labels)
            continue
        out.extend(_esc(f"{name}{{{lab}}} ") + "%d" + _TS + "\n" for lab in labels)
        columns.append((_COL[counter], mult))
        offsets.append(n_args)
        n_args += 2 * len(labels)
    return _IbTemplate(text="".join(out), columns=columns, offsets=offsets, n_args=n_args, ports=len(labels))


def _ib_matrix(ib: np.ndarray, columns: list[tuple[int, int]]) -> np.ndarray:
    """(ports, counter metrics) int64 values: the counter column x its multiplier."""
    cols = [c for c, _ in columns]
    mults = np.array([m for _, m in columns], dtype=float)
    return (ib[:, cols] * mults).astype(np.int64)


def _ib_node_template(twin: Twin, node: str, target_labels: bool, static: np.ndarray | None = None) -> _IbTemplate:
    """The node's template for its current static counters (cached; the previous one is dropped)."""
    if static is None:
        static = twin.ib[_node_ports(twin, node)][:, _STATIC_COLS]
    cache = _cache(twin)
    key = ("ib", node, target_labels, static.tobytes())
    template = cache.get(key)
    if template is None:
        cache.pop(cache.get(("ib-key", node, target_labels)), None)
        template = cache[key] = _ib_template(twin, node, target_labels, static)
        cache[("ib-key", node, target_labels)] = key
    return template


def node_exporter_text(twin: Twin, node: str, *, timestamp: bool = False, target_labels: bool = False) -> str:
    """The infiniband part of node-exporter's /metrics on ``node``.

    ``target_labels`` adds ``instance="<node>:9100"`` and ``node="<node>"`` to every sample, as they
    come out of a Prometheus that scraped the node (``/federate``), so a file on its own still names
    its host; ``timestamp`` adds the sample time in ms.
    """
    template = _ib_node_template(twin, node, target_labels)
    ports = _node_ports(twin, node)
    values = _ib_matrix(twin.ib[ports], template.columns).T.ravel().tolist()
    stamp = _stamp_of(twin, timestamp)
    return template.text % template.args(values, stamp) + scenario_node_lines(twin, node, stamp, target_labels)


def scenario_node_lines(twin: Twin, node: str, stamp: str, target_labels: bool) -> str:
    """What the active scenarios add to the node's node-exporter scrape (``Scenario.node_exporter_lines``)."""
    hooked = twin._hooked("node_exporter_lines")
    if not hooked:
        return ""
    target = f',instance="{node}:{NODE_EXPORTER_PORT}",node="{node}"' if target_labels else ""
    return "".join(s.node_exporter_lines(twin=twin, node=node, stamp=stamp, target=target) for s in hooked)


def perfquery_text(twin: Twin, node: str, port: int) -> str:
    """``perfquery -x`` of HCA ``port`` of ``node`` (extended counters; data in 4-byte words)."""
    ports = _node_ports(twin, node)
    if not 0 <= port < len(ports):
        raise ConfigError(f"{node} has {len(ports)} HCAs, no HCA {port}")
    p = ports[port]
    lid = p + 1
    lines = [
        f"# Port extended counters: Lid {lid} port 1 (CapMask: 0x5300 CapMask2: 0x0000002)",
        _pq("PortSelect", "1"),
        _pq("CounterSelect", "0x0000"),
    ]
    for name in IB_COUNTERS:
        if name == "SymbolErrorCounter":
            lines.append(_pq("CounterSelect2", "0x00000000"))
        lines.append(_pq(name, str(int(twin.ib[p, _COL[name]]))))
    return "\n".join(lines) + "\n"


def _pq(name: str, value: str) -> str:
    # perfquery pads the name with dots to column 33.
    return f"{name}:".ljust(33, ".") + value


_LUSTRE_ENTRY = (
    "- job_id:          %s\n"
    "  snapshot_time:   %d\n"
    "  read_bytes:      { samples: %11d, unit: bytes, min: %7d, max: %7d, sum: %15d }\n"
    "  write_bytes:     { samples: %11d, unit: bytes, min: %7d, max: %7d, sum: %15d }\n"
    # The twin's jobs only read, write and sync: the other OST operations stay at 0.
    + "".join(
        f"  {op + ':':<17}{{ samples: {'%11d' if op == 'sync' else f'{0:>11}'}, unit:  reqs }}\n"
        for op in (
            "getattr",
            "setattr",
            "punch",
            "sync",
            "destroy",
            "create",
            "statfs",
            "get_info",
            "set_info",
            "quotactl",
        )
    )
)


def lustre_job_stats_text(twin: Twin) -> str:
    """``lctl get_param obdfilter.*.job_stats`` as the OSS prints it: one block per OST."""
    counters = twin.lustre_counters()
    osts = max(1, twin.cluster.storage.osts)
    snapshot = int(twin.now)
    order = sorted(counters, key=lambda j: (len(j), j))
    out: list[str] = []
    for ost in range(osts):
        out.append(f"obdfilter.{lustre_target(twin.cluster.storage.name, ost)}.job_stats=\njob_stats:\n")
        if not order:
            continue
        c = np.array([counters[j][ost] for j in order]).astype(np.int64)  # rsum, rn, wsum, wn, syncs
        rmin, rmax = _min_max(c[:, 1], c[:, 0])
        wmin, wmax = _min_max(c[:, 3], c[:, 2])
        numbers = np.stack([c[:, 1], rmin, rmax, c[:, 0], c[:, 3], wmin, wmax, c[:, 2], c[:, 4]], axis=1).tolist()
        args = [v for job_id, row in zip(order, numbers) for v in (job_id, snapshot, *row)]
        out.append((_LUSTRE_ENTRY * len(order)) % tuple(args))
    return "".join(out)


def _min_max(samples: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Smallest and largest RPC of a counter: 4 KiB pages up to 4 MiB bulk RPCs (0 when none)."""
    some = samples > 0
    return np.where(some, np.minimum(4096, total), 0), np.where(some, np.minimum(4 * 1024**2, total), 0)


_SPAN_LINE = (
    '{"kind":"span","job":"%s","rank":%d,"step":%d,"phase":"%s","start":%r,"dur":%r,"attrs":{"node":"%s","gpu":%d}}\n'
)


def spans_jsonl(twin: Twin) -> tuple[str, int]:
    """The spans of the step that finished in the last tick as JSON lines (records.Span fields), and how many.

    Same content as ``twin.finished_spans()`` written one object per line, without building the objects.
    """
    found = twin.finished_span_table()
    if found is None:
        return "", 0
    job, step, ranks, table, start = found
    ordered = table[:, _SPAN_COLUMNS]
    starts = np.round(start + np.cumsum(ordered, axis=1) - ordered, 6).tolist()
    durs = ordered.tolist()
    args = [
        v
        for r, node, g in ranks
        for k, phase in enumerate(SPAN_ORDER)
        for v in (job, r, step, phase, starts[r][k], durs[r][k], node, g)
    ]
    n = len(ranks) * len(SPAN_ORDER)
    return (_SPAN_LINE * n) % tuple(args), n


#: Kineto's ``schemaVersion`` and the NCCL collective's host-side name as torch.profiler records it.
_KINETO_SCHEMA, _NCCL_ALLREDUCE = 1, "nccl:all_reduce"
#: The ``record_function`` names the steps anatomy reads (analysis/steps.py), per phase.
_ANNOTATIONS = {"load": "data_load", "forward": "forward", "backward": "backward", "optimizer": "optimizer"}


def kineto_traces(steps: list[tuple], *, nodes_of_rank: dict[int, str], world_size: int) -> dict[int, dict]:
    """PyTorch profiler (Kineto) Chrome traces, one per rank, of profiled steps.

    ``steps`` are ``Twin.finished_span_table()`` tuples. Each step is a ``ProfilerStep#N``
    annotation holding ``data_load``, ``forward``, ``backward``, the ``nccl:all_reduce`` collective
    (the barrier wait and the transfer: a rank waits inside it for the last one) and ``optimizer``,
    all ``user_annotation`` events in µs since ``baseTimeNanoseconds``, with ``distributedInfo``.
    """
    if not steps:
        return {}
    base_s = int(steps[0][4])
    events: dict[int, list[dict]] = {r: [] for r in nodes_of_rank}
    for _, step, ranks, table, start in steps:
        ordered = table[:, _SPAN_COLUMNS]
        starts = start + np.cumsum(ordered, axis=1) - ordered
        for r, _node, _gpu in ranks:
            us = (starts[r] - base_s) * 1e6
            durs = ordered[r] * 1e6
            row = dict(zip(SPAN_ORDER, zip(us.tolist(), durs.tolist())))
            pid = 1000 + r
            out = events[r]
            out.append(_x("ProfilerStep#%d" % step, us[0], float(durs.sum()), pid))
            for phase, name in _ANNOTATIONS.items():
                out.append(_x(name, row[phase][0], row[phase][1], pid))
            wait_at, wait = row["barrier_wait"]
            out.append(_x(_NCCL_ALLREDUCE, wait_at, wait + row["allreduce"][1], pid))
    return {
        r: {
            "schemaVersion": _KINETO_SCHEMA,
            "deviceProperties": [],
            "distributedInfo": {"backend": "nccl", "rank": r, "world_size": world_size},
            "host_name": nodes_of_rank[r],
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": base_s * 10**9,
            "traceEvents": events[r],
            "traceName": f"rank-{r}.json",
        }
        for r in events
    }


def _x(name: str, ts_us: float, dur_us: float, pid: int) -> dict:
    return {
        "ph": "X",
        "cat": "user_annotation",
        "name": name,
        "pid": pid,
        "tid": pid,
        "ts": round(float(ts_us), 3),
        "dur": round(float(dur_us), 3),
        "args": {},
    }


@dataclass(frozen=True, slots=True)
class SampleBlock:
    """Samples that come as a grid, built by column rather than one ``Sample`` each (``Twin.sample_table``):
    row ``r``, column ``k`` is the sample of ``metrics[k]`` with ``labels[r]`` and value ``values[r, k]``, in
    row-major order. ``keys`` holds each row's (host, gpu, job): the same for every column of the row."""

    metrics: tuple[str, ...]
    values: np.ndarray
    labels: Sequence[Mapping[str, str]]
    keys: Sequence[tuple[str | None, str | None, str | None]]
    texts: Sequence[str] | None = None
    """Each row's labels as the store's JSON text (orjson's compact text), when already made (None: not)."""


@dataclass(frozen=True, slots=True)
class _Row:
    """What every sample of a row shares: its labels, their (host, gpu, job) and their JSON text."""

    labels: dict[str, str]
    keys: tuple[str | None, str | None, str | None]
    text: str


def _row(labels: dict[str, str], metric: str) -> _Row:
    """A row's labels with their ``sample_keys`` (``metric``: any of the row's, they agree on the keys) and text."""
    return _Row(labels, sample_keys(labels, metric), orjson.dumps(labels).decode())


def _block(metrics: tuple[str, ...], values: np.ndarray, rows: Sequence[_Row]) -> SampleBlock:
    return SampleBlock(metrics, values, [r.labels for r in rows], [r.keys for r in rows], [r.text for r in rows])


class _RowCache:
    """A twin's sample rows whose labels outlive a tick, each made once: a port's (its node and HCA never
    change) and a Lustre job's, one per OST (while the OSS lists the job: jobs it dropped are forgotten, so the
    cache stays the listing's size). Making every row's labels, keys and JSON text anew each tick was ~20 ms
    of a 1,024-node live tick's ~50 ms of twin work (8,192 HCAs, ~3,000 jobs listed)."""

    def __init__(self) -> None:
        self._ib: list[_Row] | None = None
        self._perfquery: tuple[np.ndarray, dict[str, pa.Array]] | None = None
        self._jobs: dict[str, tuple[_Row, ...]] = {}

    def ib_rows(self, twin: Twin) -> list[_Row]:
        """node-exporter's rows, one per row of ``twin.ib``."""
        if self._ib is None:
            first = next(iter(NODE_EXPORTER_IB))
            self._ib = [
                _row(
                    {"device": hca_device(hca), "port": "1", "instance": f"{node}:{NODE_EXPORTER_PORT}", "node": node},
                    first,
                )
                for node, hca in twin.ports
            ]
        return self._ib

    def perfquery_columns(self, twin: Twin) -> tuple[np.ndarray, dict[str, pa.Array]]:
        """The rows of ``twin.ib`` perfquery reads, in its order, and the columns of its table that repeat."""
        if self._perfquery is None:
            self._perfquery = _perfquery_label_columns(twin)
        return self._perfquery

    def lustre_rows(self, storage: str, job_ids: list[str], osts: int) -> list[tuple[_Row, ...]]:
        """Each listed job's rows, one per OST; the jobs no longer listed are forgotten."""
        known = self._jobs
        self._jobs = {job_id: known.get(job_id) or _lustre_job_rows(storage, job_id, osts) for job_id in job_ids}
        return [self._jobs[job_id] for job_id in job_ids]


def _rows(twin: Twin) -> _RowCache:
    """The twin's ``_RowCache``, kept with its templates (``_cache``; made again after ``forget_templates``)."""
    cache = _cache(twin)
    rows = cache.get("rows")
    if rows is None:
        rows = cache["rows"] = _RowCache()
    return rows


def _lustre_job_rows(storage: str, job_id: str, osts: int) -> tuple[_Row, ...]:
    metric = vocab.LUSTRE_JOB_READ_BYTES_TOTAL
    return tuple(_row({"jobid": job_id, "target": lustre_target(storage, ost)}, metric) for ost in range(osts))


#: The ``ib`` columns and multipliers of NODE_EXPORTER_IB, in its order.
_IB_COLUMNS = np.array([_COL[counter] for _, _, counter, _ in NODE_EXPORTER_IB.values()], dtype=np.int64)
_IB_MULTS = np.array([mult for _, _, _, mult in NODE_EXPORTER_IB.values()], dtype=np.int64)


def ib_block(twin: Twin, *, nodes: Container[str] | None = None) -> SampleBlock:
    """``ib_samples`` by column: a row per port (of ``nodes``, or every node), a column per node-exporter metric."""
    rows = _rows(twin).ib_rows(twin)
    if nodes is None:
        return _block(tuple(NODE_EXPORTER_IB), twin.ib[:, _IB_COLUMNS] * _IB_MULTS, rows)
    ports = _ports_of(twin, nodes)
    return _block(tuple(NODE_EXPORTER_IB), twin.ib[ports][:, _IB_COLUMNS] * _IB_MULTS, [rows[p] for p in ports])


def _ports_of(twin: Twin, nodes: Container[str]) -> list[int]:
    """The rows of ``twin.ib`` (HCAs) of ``nodes``, in order."""
    scraped = np.array([name in nodes for name in twin.node_names], dtype=bool)
    return np.flatnonzero(scraped[twin._port_node]).tolist()


#: The job_stats columns lustre_block writes: read and write bytes.
_LUSTRE_BYTES = [0, 2]


def lustre_block(twin: Twin, *, osts: Sequence[int] | None = None) -> SampleBlock:
    """``lustre_samples`` by column: a row per (job, OST) (of ``osts``, or every OST), the read and write
    bytes as columns."""
    job_ids, counters = twin.lustre_listing()
    n_osts = counters.shape[1]
    kept = list(range(n_osts)) if osts is None else [o for o in osts if o < n_osts]
    by_job = _rows(twin).lustre_rows(twin.cluster.storage.name, job_ids, n_osts)
    values = counters[:, kept][:, :, _LUSTRE_BYTES].reshape(-1, 2).astype(np.float64)
    metrics = (vocab.LUSTRE_JOB_READ_BYTES_TOTAL, vocab.LUSTRE_JOB_WRITE_BYTES_TOTAL)
    return _block(metrics, values, [job[o] for job in by_job for o in kept])


def ib_samples(twin: Twin) -> Iterator[Sample]:
    """The node-exporter IB counters as samples, with the target labels a Prometheus adds."""
    for p, (node, hca) in enumerate(twin.ports):
        labels = {"device": hca_device(hca), "port": "1", "instance": f"{node}:{NODE_EXPORTER_PORT}", "node": node}
        row = twin.ib[p]
        for name, (_, _, counter, mult) in NODE_EXPORTER_IB.items():
            yield Sample(metric=name, labels=labels, t=twin.now, value=float(row[_COL[counter]] * mult))


#: perfquery's data counters, in 4-byte words on the wire, which the reader turns into bytes (``ib_<name>_bytes``);
#: sources/infiniband.py's DATA_COUNTERS (the twin may not import the reader; tests/unit/test_twin_physics.py
#: holds these samples equal to what the reader makes of ``perfquery_text``).
_PERFQUERY_DATA = frozenset({"PortXmitData", "PortRcvData"})


def _perfquery_ports(twin: Twin) -> Iterator[tuple[int, dict[str, str]]]:
    """(row of ``ib``, the labels the reader gives its samples) of every HCA, node by node."""
    for node in twin.node_names:
        for hca, p in enumerate(_node_ports(twin, node)):
            yield p, {"node": node, "device": hca_device(hca), "lid": str(p + 1), "port": "1"}


#: The metric name the reader gives each of IB_COUNTERS, and the factor from the counter to its value.
_PERFQUERY_NAMES = tuple(f"ib_{n}_bytes" if n in _PERFQUERY_DATA else f"ib_{n}" for n in IB_COUNTERS)
_PERFQUERY_SCALE = np.array([4.0 if n in _PERFQUERY_DATA else 1.0 for n in IB_COUNTERS])


def perfquery_samples(twin: Twin) -> Iterator[Sample]:
    """``perfquery -x`` of every HCA as the samples sources/infiniband.py reads from it (``ib_PortXmitData_bytes``,
    ``ib_SymbolErrorCounter``...; labels node, device, lid, port): what a perfquery collector stores."""
    for p, labels in _perfquery_ports(twin):
        values = np.floor(twin.ib[p]) * _PERFQUERY_SCALE
        for name, value in zip(_PERFQUERY_NAMES, values.tolist()):
            yield Sample(metric=name, labels=labels, t=twin.now, value=value)


def perfquery_table(twin: Twin) -> pa.Table:
    """``perfquery_samples`` as one table with the store's columns (schemas.SAMPLE_SCHEMA), built per port rather
    than per sample: 128 nodes are 22,528 counters every time the collector polls. Only the values and the
    time change from one poll to the next; the other columns are made once (``_RowCache``)."""
    ports, columns = _rows(twin).perfquery_columns(twin)
    values = (np.floor(twin.ib[ports]) * _PERFQUERY_SCALE).ravel()
    times = np.full(len(values), twin.now, dtype=np.float64)
    return pa.table({**columns, "t": pa.array(times), "value": pa.array(values)}, schema=SAMPLE_SCHEMA)


def _perfquery_label_columns(twin: Twin) -> tuple[np.ndarray, dict[str, pa.Array]]:
    """The rows of ``twin.ib`` perfquery reads, and the columns of its table other than ``t`` and ``value``."""
    rows = [(p, _row(labels, _PERFQUERY_NAMES[0])) for p, labels in _perfquery_ports(twin)]
    m = len(IB_COUNTERS)

    def each_counter(strings: list[str | None]) -> pa.Array:
        return pa.array([s for s in strings for _ in range(m)], pa.string())

    columns = {
        "metric": pa.array(list(_PERFQUERY_NAMES) * len(rows), pa.string()),
        "host": each_counter([r.keys[0] for _, r in rows]),
        "gpu": each_counter([r.keys[1] for _, r in rows]),
        "job": each_counter([r.keys[2] for _, r in rows]),
        "labels": each_counter([r.text for _, r in rows]),
    }
    return np.array([p for p, _ in rows], dtype=np.int64), columns


def lustre_samples(twin: Twin) -> Iterator[Sample]:
    """Lustre job_stats as the readers' ``lustre_job_{read,write}_bytes_total`` samples."""
    name = twin.cluster.storage.name
    for job_id, c in twin.lustre_counters().items():
        for ost in range(c.shape[0]):
            labels = {"jobid": job_id, "target": lustre_target(name, ost)}
            yield Sample(metric=vocab.LUSTRE_JOB_READ_BYTES_TOTAL, labels=labels, t=twin.now, value=float(c[ost, 0]))
            yield Sample(metric=vocab.LUSTRE_JOB_WRITE_BYTES_TOTAL, labels=labels, t=twin.now, value=float(c[ost, 2]))


# -- kernel-level traces: the twin with a GPU --------------------------------------------------------

#: Names as a real PyTorch 2.x / NCCL 2.2x trace spells them (tests/data/kineto/hta_a100_nccl_rank0,
#: h200_annotated_steps): a cuBLAS GEMM for compute, NCCL's device kernel on its own stream.
_GEMM_KERNEL = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
_NCCL_KERNEL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
_H2D_COPY = "Memcpy HtoD (Pageable -> Device)"
#: Streams as Kineto numbers them: the default compute stream 7, NCCL's own stream.
_COMPUTE_STREAM, _NCCL_STREAM = 7, 20


@dataclass(frozen=True, kw_only=True)
class GpuTraceConfig:
    """How the twin's GPU runs a data-parallel step (kernel-level Kineto traces).

    Defaults: ~25 ms steps of a GPU-bound job whose host launches ~140 kernels in ~3 ms and
    runs ``queue_depth`` steps ahead; ring all-reduce time from docs/reference.md, "Ring all-reduce and busbw".
    """

    kernels: tuple[int, int, int] = (40, 80, 20)
    """Compute kernels launched in forward, backward, optimizer."""
    kernel_us: tuple[float, float, float] = (150.0, 150.0, 40.0)
    """Duration of one such kernel per phase."""
    launch_us: float = 6.0
    """``cudaLaunchKernel`` call duration; the host spends ``host_op_us`` more per op."""
    host_op_us: float = 14.0
    load_us: float = 400.0
    """Host data loading per step (ends with a host-to-device copy)."""
    queue_depth: int = 2
    """Steps the host may run ahead of the GPU before a sync blocks it."""
    allreduce_bytes: float = 100e6
    """Gradient bytes all-reduced per step (one bucket)."""
    bus_bytes_s: float = 100e9
    """Bus bandwidth of the ring: transfer = 2(p−1)/p · bytes / bus (nccl-tests' busbw)."""
    jitter: float = 0.01
    """Relative standard deviation of each kernel's duration."""
    slow_rank: int | None = None
    slow_backward_factor: float = 1.0
    """The slow rank's backward kernels take this much longer (GPU only: its host is unchanged)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.queue_depth < 1:
            raise ConfigError(f"GpuTraceConfig.queue_depth must be >= 1, got {self.queue_depth}")
        if self.slow_backward_factor <= 0 or self.jitter < 0:
            raise ConfigError("GpuTraceConfig.slow_backward_factor must be > 0 and jitter >= 0")


def with_kernels_per_step(cfg: GpuTraceConfig, kernels: int) -> GpuTraceConfig:
    """``cfg`` with ``kernels`` compute kernels a step, split as ``cfg``'s (forward : backward : optimizer) and each
    longer in proportion, so a step keeps its GPU time per phase (and a slow backward its share): small
    per-rank traces for sets of thousands of ranks."""
    if kernels < 3:
        raise ConfigError(f"kernels per step must be >= 3 (one per phase), got {kernels}")
    total = sum(cfg.kernels)
    forward, backward = (max(1, round(kernels * n / total)) for n in cfg.kernels[:2])
    counts = (forward, backward, max(1, kernels - (forward + backward)))
    f_us, b_us, o_us = (us * n / c for us, n, c in zip(cfg.kernel_us, cfg.kernels, counts))
    return replace(cfg, kernels=counts, kernel_us=(f_us, b_us, o_us))


class _RankSim:
    """One rank's host and GPU clocks while a step is written."""

    def __init__(self, rank: int, pid: int, rng: np.random.Generator, *, device: int | None = None) -> None:
        self.rank, self.pid, self.rng = rank, pid, rng
        self.device = rank if device is None else device
        """The GPU's index: Kineto's pid and ``device`` arg of its activities."""
        self.host = 0.0
        self.stream_end = {_COMPUTE_STREAM: 0.0, _NCCL_STREAM: 0.0}
        self.events: list[dict] = []
        self.gpu_ends: list[float] = []
        """End of each step's GPU work (µs)."""
        self.step_start = 0.0
        self.pending_nccl: tuple[float, dict] = (0.0, {})
        """(start, event) of the step's NCCL kernel, whose end waits for every rank's start."""

    def launch(
        self,
        cfg: GpuTraceConfig,
        corr: int,
        name: str,
        stream: int,
        dur_us: float,
        *,
        not_before: float = 0.0,
        cat: str = "kernel",
        args: dict | None = None,
        api: str = "cudaLaunchKernel",
    ) -> tuple[float, float]:
        """Launch one GPU activity: the runtime call, the flow, the kernel; returns its (start, end)."""
        t = self.host
        self.events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": api,
                "pid": self.pid,
                "tid": self.pid,
                "ts": round(t, 3),
                "dur": cfg.launch_us,
                "args": {"correlation": corr, "External id": corr},
            }
        )
        self.events.append(
            {"ph": "s", "id": corr, "pid": self.pid, "tid": self.pid, "ts": round(t, 3), "cat": "ac2g", "name": "ac2g"}
        )
        start = max(t + cfg.launch_us + 2.0, self.stream_end[stream], not_before)
        self.stream_end[stream] = start + dur_us
        self.host = t + cfg.launch_us + cfg.host_op_us
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": self.device,
                "tid": stream,
                "ts": round(start, 3),
                "dur": round(dur_us, 3),
                "args": {
                    "device": self.device,
                    "stream": stream,
                    "correlation": corr,
                    "External id": corr,
                    **(args or {}),
                },
            }
        )
        self.events.append(
            {
                "ph": "f",
                "id": corr,
                "pid": self.device,
                "tid": stream,
                "ts": round(start, 3),
                "cat": "ac2g",
                "name": "ac2g",
                "bp": "e",
            }
        )
        return start, start + dur_us

    def annotate(self, name: str, start: float) -> None:
        self.events.append(_x(name, start, self.host - start, self.pid))


def gpu_kineto_traces(
    cfg: GpuTraceConfig,
    *,
    steps: list[int],
    world_size: int,
    nodes_of_rank: dict[int, str] | None = None,
    base_s: int = 0,
) -> dict[int, dict]:
    """Kernel-level Kineto traces, one per rank, of ``steps`` of a data-parallel job.

    Per step the host (``ProfilerStep#N`` with ``data_load``, ``forward``, ``backward``,
    ``nccl:all_reduce``, ``optimizer`` annotations) launches compute kernels on stream 7
    and the all-reduce on NCCL's stream, each through a ``cudaLaunchKernel`` call with a
    correlation id and an ``ac2g`` flow. The GPU runs each kernel when it is launched and
    its stream is free; the NCCL kernel starts after the backward kernels and ends when
    the last rank's has started plus the ring transfer; the optimizer waits for it. The
    host blocks in ``cudaStreamSynchronize`` at a step's start while the GPU is more than
    ``queue_depth`` steps behind. A GPU-only slowdown (``slow_rank``) lengthens that rank's
    backward kernels: every host, blocked on its own GPU, which waits at the collective
    for the slow one, looks alike.
    """
    nodes_of_rank = nodes_of_rank or {r: "node1" for r in range(world_size)}
    events: dict[int, list[dict]] = {r: [] for r in range(world_size)}
    for sims in _simulated_steps(cfg, steps=steps, world_size=world_size):
        for sim in sims:
            events[sim.rank] += sim.events
    return {
        r: {**_gpu_trace_head(cfg, r, r, world_size, nodes_of_rank.get(r), base_s), "traceEvents": events[r]}
        for r in range(world_size)
    }


def write_gpu_kineto_traces(
    folder: Path,
    cfg: GpuTraceConfig,
    *,
    steps: list[int],
    world_size: int,
    nodes_of_rank: dict[int, str] | None = None,
    base_s: int = 0,
    gpus_per_node: int | None = None,
) -> int:
    """``gpu_kineto_traces`` written to ``folder/rank-<r>.json`` a step at a time: memory holds one step of
    every rank, not the set (1,024 ranks × 30 steps of ~560 events each would be ~17M dicts). Each file is
    the document's head, then each step's events appended, then the closing brackets. ``gpus_per_node``
    numbers each rank's GPU ``rank % gpus_per_node`` (default: its rank, as ``gpu_kineto_traces``).
    Returns the number of files."""
    folder.mkdir(parents=True, exist_ok=True)
    nodes_of_rank = nodes_of_rank or {r: "node1" for r in range(world_size)}
    paths = [folder / f"rank-{r}.json" for r in range(world_size)]
    for r, path in enumerate(paths):
        device = r % gpus_per_node if gpus_per_node else r
        head = orjson.dumps(_gpu_trace_head(cfg, r, device, world_size, nodes_of_rank.get(r), base_s))
        path.write_bytes(head[:-1] + b',"traceEvents":[')
    for k, sims in enumerate(_simulated_steps(cfg, steps=steps, world_size=world_size, gpus_per_node=gpus_per_node)):
        for sim, path in zip(sims, paths):
            with path.open("ab") as f:
                f.write((b"," if k else b"") + orjson.dumps(sim.events)[1:-1])
    for path in paths:
        with path.open("ab") as f:
            f.write(b"]}")
    return len(paths)


def _gpu_trace_head(
    cfg: GpuTraceConfig, rank: int, device: int, world_size: int, node: str | None, base_s: int
) -> dict:
    return {
        "schemaVersion": _KINETO_SCHEMA,
        "deviceProperties": [{"id": device, "name": "NVIDIA H100 80GB HBM3"}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size},
        "host_name": node,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": base_s * 10**9,
        "traceName": f"rank-{rank}.json",
    }


def _simulated_steps(
    cfg: GpuTraceConfig, *, steps: list[int], world_size: int, gpus_per_node: int | None = None
) -> Iterator[list[_RankSim]]:
    """Every rank's simulation after each step, its ``events`` holding that step's events only."""
    rng = np.random.default_rng(cfg.seed)
    sims = [
        _RankSim(
            r, 1000 + r, np.random.default_rng(rng.integers(1 << 31)), device=r % gpus_per_node if gpus_per_node else r
        )
        for r in range(world_size)
    ]
    transfer_us = 2 * (world_size - 1) / world_size * cfg.allreduce_bytes / cfg.bus_bytes_s * 1e6
    corr = 1
    for k, step in enumerate(steps):
        arrivals = []
        for sim in sims:
            sim.events = []
            corr = _host_until_allreduce(cfg, sim, k, step, corr, world_size)
            arrivals.append(sim.pending_nccl)
        done = max(a[0] for a in arrivals) + transfer_us
        for sim, (start, nccl_event) in zip(sims, arrivals):
            nccl_event["dur"] = round(done - start, 3)
            sim.stream_end[_NCCL_STREAM] = done
            corr = _optimizer(cfg, sim, step, corr, done)
        yield sims


def _kernel_us(cfg: GpuTraceConfig, sim: _RankSim, phase: int) -> float:
    factor = cfg.slow_backward_factor if phase == 1 and sim.rank == cfg.slow_rank else 1.0
    return cfg.kernel_us[phase] * factor * max(0.5, 1.0 + cfg.jitter * float(sim.rng.standard_normal()))


def _host_until_allreduce(cfg: GpuTraceConfig, sim: _RankSim, k: int, step: int, corr: int, world: int) -> int:
    sim.step_start = sim.host
    load = sim.host
    if k >= cfg.queue_depth:  # the host may not run further ahead: it syncs on step k − depth's GPU work
        ready = sim.gpu_ends[k - cfg.queue_depth]
        if ready > sim.host:
            sim.events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaStreamSynchronize",
                    "pid": sim.pid,
                    "tid": sim.pid,
                    "ts": round(sim.host, 3),
                    "dur": round(ready - sim.host, 3),
                    "args": {},
                }
            )
            sim.host = ready
    sim.host += cfg.load_us
    sim.launch(cfg, corr, _H2D_COPY, _COMPUTE_STREAM, 50.0, cat="gpu_memcpy", api="cudaMemcpyAsync")
    corr += 1
    sim.annotate("data_load", load)
    for phase, name in ((0, "forward"), (1, "backward")):
        start = sim.host
        for _ in range(cfg.kernels[phase]):
            sim.launch(cfg, corr, _GEMM_KERNEL, _COMPUTE_STREAM, _kernel_us(cfg, sim, phase))
            corr += 1
        sim.annotate(name, start)
    start = sim.host
    nelems = int(cfg.allreduce_bytes // 2)
    args = {
        "Collective name": "allreduce",
        "In msg nelems": nelems,
        "Out msg nelems": nelems,
        "Group size": world,
        "dtype": "BFloat16",
        "Process Group Name": "0",
        "Process Group Description": "default_pg",
    }
    at, _ = sim.launch(
        cfg, corr, _NCCL_KERNEL, _NCCL_STREAM, 0.0, not_before=sim.stream_end[_COMPUTE_STREAM], args=args
    )
    sim.pending_nccl = (at, sim.events[-2])
    sim.annotate(_NCCL_ALLREDUCE, start)
    return corr + 1


def _optimizer(cfg: GpuTraceConfig, sim: _RankSim, step: int, corr: int, nccl_end: float) -> int:
    start = sim.host
    for _ in range(cfg.kernels[2]):
        sim.launch(cfg, corr, _GEMM_KERNEL, _COMPUTE_STREAM, _kernel_us(cfg, sim, 2), not_before=nccl_end)
        corr += 1
    sim.annotate("optimizer", start)
    sim.gpu_ends.append(sim.stream_end[_COMPUTE_STREAM])
    sim.events.append(_x("ProfilerStep#%d" % step, sim.step_start, sim.host - sim.step_start, sim.pid))
    return corr
