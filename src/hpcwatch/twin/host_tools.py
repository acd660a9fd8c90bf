"""What a node's own tools print of the twin's devices, for the scenarios that plant a host fault: ``ibstat`` of
its HCAs, and where such a capture goes (``out/host/<node>/``, dated by the run's end).

None of these tools prints the host it ran on: the files are ingested naming it, ``hpcwatch ingest --host node2
out/host/node2``, as an agent ships them.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from hpcwatch.twin.exposition import hca_device

__all__ = ["write_host_file", "ibstat_text", "HCA_TYPE", "HCA_FIRMWARE"]

#: The HCAs' ``CA type`` and firmware as ibstat prints them: a ConnectX-7 (MT4129) on firmware 28.41.1000, the
#: NDR H100 node of tests/data/infiniband/ibstat_h100_8ndr_ib_plus_ethernet_bond_gpud.txt (leptonai/gpud).
HCA_TYPE = "MT4129"
HCA_FIRMWARE = "28.41.1000"


def write_host_file(out: Path, node: str, name: str, text: str, t1: float) -> Path:
    """``text`` as ``out/host/<node>/<name>``, its write time set to ``t1`` (readers date by it)."""
    folder = out / "host" / node
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    os.utime(path, (t1, t1))
    return path


def _guid(twin: Any, node: str, hca: int) -> str:
    """A stable 64-bit GUID in ibstat's spelling, from the HCA's place in the cluster (as ``gpu_uuid`` is)."""
    return "0x" + hashlib.sha1(f"{twin.cluster.name}/{node}/{hca_device(hca)}".encode()).hexdigest()[:16]


def ibstat_text(twin: Any, node: str, *, firmware: str = HCA_FIRMWARE, down: int | None = None) -> str:
    """``ibstat`` of ``node``'s HCAs (one port each, InfiniBand, at the fabric's rate; Base lid as the twin's
    ``perfquery`` gives it), in rdma-core's layout (tab-indented, tests/data/infiniband/ibstat_two_cas.txt);
    ``down``: the HCA whose port is Down / Polling, as an unplugged or dead cable leaves it (Rate 10, lid 0)."""
    rate = int(round(twin.link_bytes_s * 8 / 1e9))
    blocks = []
    for row in twin.ports_of_node(node):
        hca = twin.ports[row][1]
        guid = _guid(twin, node, hca)
        up = hca != down
        blocks.append(
            f"CA '{hca_device(hca)}'\n"
            f"\tCA type: {HCA_TYPE}\n"
            "\tNumber of ports: 1\n"
            f"\tFirmware version: {firmware}\n"
            "\tHardware version: 0\n"
            f"\tNode GUID: {guid}\n"
            f"\tSystem image GUID: {guid}\n"
            "\tPort 1:\n"
            f"\t\tState: {'Active' if up else 'Down'}\n"
            f"\t\tPhysical state: {'LinkUp' if up else 'Polling'}\n"
            f"\t\tRate: {rate if up else 10}\n"
            f"\t\tBase lid: {row + 1 if up else 0}\n"
            "\t\tLMC: 0\n"
            f"\t\tSM lid: {1 if up else 0}\n"
            "\t\tCapability mask: 0xa751e848\n"
            f"\t\tPort GUID: {guid}\n"
            "\t\tLink layer: InfiniBand\n"
        )
    return "".join(blocks)
