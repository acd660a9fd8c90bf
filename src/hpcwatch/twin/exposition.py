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

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from hpcwatch.records import Sample
from hpcwatch.twin.core import DCGM_FIELDS, IB_COUNTERS

if TYPE_CHECKING:
    from hpcwatch.twin.core import Twin

__all__ = ["DCGM_HELP", "NODE_EXPORTER_IB", "dcgm_text", "node_exporter_text", "perfquery_text",
           "lustre_job_stats_text", "ib_samples", "lustre_samples", "lustre_target", "hca_device",
           "NODE_EXPORTER_PORT"]

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
_FLOAT_FIELDS = {"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"}

#: node-exporter infiniband metrics: name -> (type, help, perfquery counter, multiplier). Sorted by name, as
#: node-exporter writes them. Data counters are 4-byte words in perfquery, octets in node-exporter.
NODE_EXPORTER_IB: dict[str, tuple[str, str, str, int]] = {
    "node_infiniband_link_downed_total": (
        "counter", "Number of times the link failed to recover from an error state and went down",
        "LinkDownedCounter", 1),
    "node_infiniband_link_error_recovery_total": (
        "counter", "Number of times the link successfully recovered from an error state",
        "LinkErrorRecoveryCounter", 1),
    "node_infiniband_port_data_received_bytes_total": (
        "counter", "Number of data octets received on all links", "PortRcvData", 4),
    "node_infiniband_port_data_transmitted_bytes_total": (
        "counter", "Number of data octets transmitted on all links", "PortXmitData", 4),
    "node_infiniband_port_discards_transmitted_total": (
        "counter", "Number of outbound packets discarded by the port because the port is down or congested",
        "PortXmitDiscards", 1),
    "node_infiniband_port_errors_received_total": (
        "counter", "Number of packets containing an error that were received on this port", "PortRcvErrors", 1),
    "node_infiniband_port_packets_received_total": (
        "counter", "Number of packets received on all VLs by this port (including errors)", "PortRcvPkts", 1),
    "node_infiniband_port_packets_transmitted_total": (
        "counter", "Number of packets transmitted on all VLs from this port (including errors)", "PortXmitPkts", 1),
    "node_infiniband_port_transmit_wait_total": (
        "counter", "Number of ticks during which the port had data to transmit but no data was sent during the "
        "entire tick", "PortXmitWait", 1),
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


def dcgm_text(twin: Twin, node: str, *, jobs_by_gpu: dict[int, str] | None = None, timestamp: bool = False) -> str:
    """One scrape of dcgm-exporter on ``node``; ``jobs_by_gpu`` overrides the hpc_job labels."""
    flat = twin.gpus_of_node(node)
    if jobs_by_gpu is None:
        label_sets = [twin.dcgm_label_text(g) for g in flat]
    else:
        label_sets = [_label_text(labels) for labels in twin.labels_by_gpu(node, jobs_by_gpu=jobs_by_gpu)]
    rows = twin.fields[flat].T.tolist()
    ts = f" {int(round(twin.now * 1000))}" if timestamp else ""
    out: list[str] = []
    for k, name in enumerate(DCGM_FIELDS):
        kind, help_text = DCGM_HELP[name]
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
        values = [repr(v) for v in rows[k]] if name in _FLOAT_FIELDS else [str(int(v)) for v in rows[k]]
        out.extend([f"{name}{{{labels}}} {v}{ts}\n" for labels, v in zip(label_sets, values)])
    return "".join(out)


def _node_ports(twin: Twin, node: str) -> list[int]:
    return twin.ports_of_node(node)


def node_exporter_text(twin: Twin, node: str, *, timestamp: bool = False, target_labels: bool = False) -> str:
    """The infiniband part of node-exporter's /metrics on ``node``.

    ``target_labels`` adds ``instance="<node>:9100"`` and ``node="<node>"`` to every sample, as they
    come out of a Prometheus that scraped the node (``/federate``), so a file on its own still names
    its host; ``timestamp`` adds the sample time in ms.
    """
    ports = _node_ports(twin, node)
    extra = f',instance="{node}:{NODE_EXPORTER_PORT}",node="{node}"' if target_labels else ""
    labels = [f'device="{hca_device(twin.ports[p][1])}",port="1"{extra}' for p in ports]
    ts = f" {int(round(twin.now * 1000))}" if timestamp else ""
    out: list[str] = []
    gauges = {
        "node_infiniband_rate_bytes_per_second": ("Maximum signal transfer rate", int(twin.link_bytes_s)),
        "node_infiniband_state_id": ("State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, "
                                     "4: active, 5: act defer)", _STATE_ACTIVE),
        "node_infiniband_physical_state_id": (
            "Physical state of the InfiniBand port (0: no change, 1: sleep, 2: polling, 3: disable, 4: shift, "
            "5: link up, 6: link error recover, 7: phytest)", _PHYS_LINKUP),
    }
    metrics = sorted(list(NODE_EXPORTER_IB) + list(gauges))
    for name in metrics:
        if name in gauges:
            help_text, value = gauges[name]
            out.append(f"# HELP {name} {help_text}\n# TYPE {name} gauge\n")
            out.extend(f"{name}{{{lab}}} {value}{ts}\n" for lab in labels)
            continue
        kind, help_text, counter, mult = NODE_EXPORTER_IB[name]
        values = (twin.ib[ports, _COL[counter]] * mult).astype(np.int64).tolist()
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
        out.extend([f"{name}{{{lab}}} {v}{ts}\n" for lab, v in zip(labels, values)])
    return "".join(out)


def perfquery_text(twin: Twin, node: str, port: int) -> str:
    """``perfquery -x`` of HCA ``port`` of ``node`` (extended counters; data in 4-byte words)."""
    ports = _node_ports(twin, node)
    if not 0 <= port < len(ports):
        raise ValueError(f"{node} has {len(ports)} HCAs, no HCA {port}")
    p = ports[port]
    lid = p + 1
    lines = [f"# Port extended counters: Lid {lid} port 1 (CapMask: 0x5300 CapMask2: 0x0000002)",
             _pq("PortSelect", "1"), _pq("CounterSelect", "0x0000")]
    for name in IB_COUNTERS:
        if name == "SymbolErrorCounter":
            lines.append(_pq("CounterSelect2", "0x00000000"))
        lines.append(_pq(name, str(int(twin.ib[p, _COL[name]]))))
    return "\n".join(lines) + "\n"


def _pq(name: str, value: str) -> str:
    # perfquery pads the name with dots to column 33.
    return f"{name}:".ljust(33, ".") + value


def lustre_job_stats_text(twin: Twin) -> str:
    """``lctl get_param obdfilter.*.job_stats`` as the OSS prints it: one block per OST."""
    counters = twin.lustre_counters()
    osts = max(1, twin.cluster.storage.osts)
    snapshot = int(twin.now)
    out: list[str] = []
    for ost in range(osts):
        out.append(f"obdfilter.{lustre_target(twin.cluster.storage.name, ost)}.job_stats=\njob_stats:\n")
        for job_id in sorted(counters, key=lambda j: (len(j), j)):
            c = counters[job_id][ost]
            out.append(f"- job_id:          {job_id}\n  snapshot_time:   {snapshot}\n")
            out.append(_lustre_bytes("read_bytes", int(c[1]), int(c[0])))
            out.append(_lustre_bytes("write_bytes", int(c[3]), int(c[2])))
            for op, n in (("getattr", 0), ("setattr", 0), ("punch", 0), ("sync", int(c[4])), ("destroy", 0),
                          ("create", 0), ("statfs", 0), ("get_info", 0), ("set_info", 0), ("quotactl", 0)):
                out.append(f"  {op + ':':<17}{{ samples: {n:>11}, unit:  reqs }}\n")
    return "".join(out)


def _lustre_bytes(name: str, samples: int, total: int) -> str:
    lo = min(4096, total) if samples else 0
    hi = min(4 * 1024**2, total) if samples else 0
    return (f"  {name + ':':<17}{{ samples: {samples:>11}, unit: bytes, min: {lo:>7}, max: {hi:>7}, "
            f"sum: {total:>15} }}\n")


def ib_samples(twin: Twin) -> Iterator[Sample]:
    """The node-exporter IB counters as samples, with the target labels a Prometheus adds."""
    for p, (node, hca) in enumerate(twin.ports):
        labels = {"device": hca_device(hca), "port": "1", "instance": f"{node}:{NODE_EXPORTER_PORT}", "node": node}
        row = twin.ib[p]
        for name, (_, _, counter, mult) in NODE_EXPORTER_IB.items():
            yield Sample(metric=name, labels=labels, t=twin.now, value=float(row[_COL[counter]] * mult))


def lustre_samples(twin: Twin) -> Iterator[Sample]:
    """Lustre job_stats as the readers' ``lustre_job_{read,write}_bytes_total`` samples."""
    name = twin.cluster.storage.name
    for job_id, c in twin.lustre_counters().items():
        for ost in range(c.shape[0]):
            labels = {"jobid": job_id, "target": lustre_target(name, ost)}
            yield Sample(metric="lustre_job_read_bytes_total", labels=labels, t=twin.now, value=float(c[ost, 0]))
            yield Sample(metric="lustre_job_write_bytes_total", labels=labels, t=twin.now, value=float(c[ost, 2]))
