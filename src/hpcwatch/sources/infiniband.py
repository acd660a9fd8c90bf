"""InfiniBand port counters and port state: ``perfquery [-x]`` and ``ibstat`` text.

perfquery prints one block per port, a header then ``Name:.....value`` lines
(https://linux.die.net/man/8/perfquery). Each counter becomes a sample
``ib_<CounterName>`` with labels ``node`` (when given), ``device`` (when given),
``lid`` and ``port``. ``PortXmitData`` / ``PortRcvData`` count 4-byte words
(IBA spec vol. 1, PortCounters; "divided by 4"), so they become
``ib_PortXmitData_bytes`` / ``ib_PortRcvData_bytes``, already multiplied by 4.

ibstat prints per HCA (``CA 'mlx5_0'``) and per port its state, rate and lid
(https://linux.die.net/man/8/ibstat); each port gives ``ib_port_up`` (1 when
``State: Active`` and ``Physical state: LinkUp``), ``ib_port_rate_gbps`` and
``ib_port_lid``, with the state words kept as labels. Each HCA's ``Firmware version`` gives one
``node_infiniband_info`` 1 (labels ``device``, ``firmware_version``, ``hca_type`` from ``CA type``), the name and
labels node-exporter's infiniband collector gives the same facts, so the fleet rule comparing HCA firmware
across a partition reads either.

ibstat stops at the first HCA it cannot read: ``ibpanic: [PID] main: stat of IB device 'mlx5_8' failed: No
such file or directory`` and exit 255 (rdma-core's ibstat before PR #1501; the real capture
tests/data/infiniband/ibstat_a100_ibpanic_mlx5_8_gpud.txt lists mlx5_0..7, then panics on mlx5_8). That
line becomes ``ib_device_up`` 0 (labels ``device``, ``error``: the panic's reason) so that health drains the
node naming the device; HCAs after it in ibstat's order were not read, and say nothing. A capture pasted with
its shell prompts (``$ ibstat``, ``user@host:~$ ibstat mlx5_0``, ``[root@n1 ~]# ibstat``) is read with those
prompt lines skipped.

Not checked: that 32-bit counters have not wrapped or saturated (perfquery
without ``-x`` saturates at 2^32-1), that ports and lids are unique, fields
this module does not know (they are skipped, not rejected, in ibstat).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from hpcwatch import vocab
from hpcwatch.errors import ParseError
from hpcwatch.records import Sample
from hpcwatch.sources.lines import file_time, read_text, to_float

__all__ = [
    "parse_perfquery",
    "read_perfquery",
    "parse_ibstat",
    "read_ibstat",
    "DATA_COUNTERS",
    "is_perfquery",
    "is_ibstat",
]

#: Counters in 4-byte words (PortCounters / PortCountersExtended).
DATA_COUNTERS = frozenset({"PortXmitData", "PortRcvData"})
#: Selector fields of the MAD, not counters.
_SELECTORS = frozenset({"PortSelect", "CounterSelect", "CounterSelect2"})
_HEADER_RE = re.compile(r"#\s*Port (?:extended )?counters:\s*Lid\s+(\d+)\s+port\s+(\S+)")
_COUNTER_RE = re.compile(r"([A-Za-z][A-Za-z0-9_]*):\.*(\S*)\s*\Z")


def parse_perfquery(
    text: str,
    *,
    path: str | os.PathLike[str] = "<input>",
    node: str | None = None,
    device: str | None = None,
    t: float = 0.0,
) -> Iterator[Sample]:
    """Samples of ``perfquery`` / ``perfquery -x`` output (one or more port blocks)."""
    base = {k: v for k, v in (("node", node), ("device", device)) if v}
    labels: dict[str, str] | None = None
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = _HEADER_RE.match(line)
            if m is None:
                raise ParseError(
                    "not a perfquery header (want '# Port counters: Lid N port P')", path=path, line=number, text=raw
                )
            labels = {**base, "lid": m.group(1), "port": m.group(2)}
            continue
        m = _COUNTER_RE.match(line)
        if m is None:
            raise ParseError("not a perfquery counter line (want 'Name:....value')", path=path, line=number, text=raw)
        if labels is None:
            raise ParseError("counter before any '# Port counters' header", path=path, line=number, text=raw)
        name, value = m.groups()
        if name in _SELECTORS:
            continue
        if not value.isdigit():
            raise ParseError(f"{name} is not a counter value", path=path, line=number, text=raw)
        if name in DATA_COUNTERS:
            yield Sample(metric=f"ib_{name}_bytes", labels=labels, t=t, value=float(int(value) * 4))
        else:
            yield Sample(metric=f"ib_{name}", labels=labels, t=t, value=float(int(value)))


# "<device>.<port>.txt" in a folder named after the node, as ``hpcwatch twin run`` writes them
# (perfquery/node1/mlx5_0.1.txt).
_SAVED_NAME_RE = re.compile(r"([A-Za-z][A-Za-z0-9]*_[0-9]+)\.([0-9]+)\.(?:txt|out)\Z")


def read_perfquery(
    path: str | os.PathLike[str], *, node: str | None = None, device: str | None = None, t: float | None = None
) -> Iterator[Sample]:
    """``parse_perfquery`` of a saved output; ``t`` defaults to the file's write time.

    Without ``node`` and ``device``, a file named ``<device>.<port>.txt`` (``mlx5_0.1.txt``) gives
    its device from the name and its node from the folder it is in.
    """
    p = Path(path)
    saved = _SAVED_NAME_RE.match(p.name)
    if saved and node is None and device is None:
        node, device = p.parent.name or None, saved.group(1)
    text = read_text(p)
    yield from parse_perfquery(text, path=p, node=node, device=device, t=file_time(p) if t is None else t)


_CA_RE = re.compile(r"CA\s+'([^']+)'\s*\Z")
#: ibstat's panic on an HCA it cannot stat (module docstring); group 1 the device, group 2 the reason.
_PANIC_RE = re.compile(r"ibpanic:\s*(?:\[\d+\]\s*)?\S*:?\s*stat of IB device '([^']+)' failed:?\s*(.*?)\s*\Z")
#: A shell prompt running ibstat, as pasted with the capture: ``$ ibstat``, ``user@host:~$ ibstat mlx5_0``,
#: ``[root@node1 ~]# sudo ibstat``.
_PROMPT_RE = re.compile(r"(?:\[[^\]]*\]|[\w.@:~/-]*)\s*[$#]\s*(?:sudo\s+)?ibstat(?:\s.*)?\Z")
_PORT_RE = re.compile(r"Port\s+(\d+):\s*\Z")
_KEY_RE = re.compile(r"([A-Za-z][A-Za-z ]*?):\s*(.*?)\s*\Z")


def _port_samples(
    port: dict[str, str], labels: dict[str, str], t: float, *, path: str | os.PathLike[str], line: int
) -> Iterator[Sample]:
    state, phys = port.get("State", ""), port.get("Physical state", "")
    tags = {**labels, "state": state, "physical_state": phys, "link_layer": port.get("Link layer", "")}
    yield Sample(
        metric=vocab.IB_PORT_UP, labels=tags, t=t, value=1.0 if (state == "Active" and phys == "LinkUp") else 0.0
    )
    if port.get("Rate"):
        yield Sample(
            metric=vocab.IB_PORT_RATE_GBPS, labels=tags, t=t, value=to_float(port["Rate"], "Rate", path=path, line=line)
        )
    if port.get("Base lid"):
        yield Sample(
            metric="ib_port_lid", labels=tags, t=t, value=to_float(port["Base lid"], "Base lid", path=path, line=line)
        )


def _hca_info(device: str, firmware: str, hca_type: str, base: dict[str, str], t: float) -> Sample:
    labels = {**base, "device": device, "firmware_version": firmware, "hca_type": hca_type}
    return Sample(metric=vocab.NODE_INFINIBAND_INFO, labels=labels, t=t, value=1.0)


def _vanished(device: str, reason: str, base: dict[str, str], t: float) -> Sample:
    """``ib_device_up`` 0 for the HCA ibstat panicked on."""
    labels = {**base, "device": device, "error": reason or "stat failed"}
    return Sample(metric=vocab.IB_DEVICE_UP, labels=labels, t=t, value=0.0)


def parse_ibstat(
    text: str, *, path: str | os.PathLike[str] = "<input>", node: str | None = None, t: float = 0.0
) -> Iterator[Sample]:
    """Port state samples of ``ibstat`` output (every CA, every port)."""
    base = {"node": node} if node else {}
    device: str | None = None
    port: dict[str, str] | None = None
    labels: dict[str, str] = {}
    port_line = 0
    hca_type = ""
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line:
            continue
        if _PROMPT_RE.match(line):
            continue
        panic = _PANIC_RE.match(line)
        if panic:
            if port is not None:
                yield from _port_samples(port, labels, t, path=path, line=port_line)
                port = None
            yield _vanished(panic.group(1), panic.group(2), base, t)
            device = None
            continue
        ca, pm = _CA_RE.match(line), _PORT_RE.match(line)
        if ca or pm:
            if port is not None:
                yield from _port_samples(port, labels, t, path=path, line=port_line)
                port = None
            if ca:
                device, hca_type = ca.group(1), ""
            elif pm:
                if device is None:
                    raise ParseError("port before any CA 'name' line", path=path, line=number, text=raw)
                port, port_line = {}, number
                labels = {**base, "device": device, "port": pm.group(1)}
            continue
        kv = _KEY_RE.match(line)
        if kv is None or device is None:
            raise ParseError(
                "not an ibstat line (want CA 'name', Port N:, or Key: value)", path=path, line=number, text=raw
            )
        if port is not None:
            port[kv.group(1)] = kv.group(2)
        elif kv.group(1) == "CA type":
            hca_type = kv.group(2).strip()
        elif kv.group(1) == "Firmware version":
            yield _hca_info(device, kv.group(2).strip(), hca_type, base, t)
    if port is not None:
        yield from _port_samples(port, labels, t, path=path, line=port_line)


def read_ibstat(path: str | os.PathLike[str], *, node: str | None = None, t: float | None = None) -> Iterator[Sample]:
    text = read_text(path)
    yield from parse_ibstat(text, path=path, node=node, t=file_time(path) if t is None else t)


def is_perfquery(head: str) -> bool:
    return _HEADER_RE.match(head.lstrip()) is not None


def is_ibstat(head: str) -> bool:
    """The first line that is not a shell prompt running ibstat is a ``CA 'name'`` line or ibstat's panic."""
    for raw in head.lstrip().split("\n")[:8]:
        line = raw.strip()
        if line and not _PROMPT_RE.match(line):
            return _CA_RE.match(line) is not None or _PANIC_RE.match(line) is not None
    return False
