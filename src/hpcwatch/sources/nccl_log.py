"""Reader of NCCL debug logs (``NCCL_DEBUG=INFO``, any ``NCCL_DEBUG_SUBSYS``), with PyTorch's watchdog lines.

An NCCL line is ``<host>:<pid>:<tid> [<cudaDev>] [<file>:<line> ]NCCL <LEVEL> <message>``
(``src/debug.cc``, ``ncclDebugLog``: ``"%s:%d:%d [%d] %s:%d NCCL WARN "`` and ``"%s:%d:%d [%d] NCCL INFO "``),
whatever a launcher puts before it (``[1,0]<stdout>:``, ``node: `` of pdsh). ``NCCL version X+cudaY`` is
also printed bare by older versions; it is given to the process of the last prefixed line. One log
may hold many processes (mpirun's merged output) or one (``NCCL_DEBUG_FILE=nccl.%h.%p``).

What is read, per process and device (the ``[cudaDev]`` of the line):

- ``NCCL version 2.19.3+cuda12.3`` (NCCL version, CUDA runtime it was built for), ``cudaDriverVersion 12000``;
- ``comm 0x.. rank R nranks N cudaDev D [nvmlDev D] busId B [commId C] - Init START|COMPLETE`` (rank, bus id);
- the network: ``Using network IB|Socket|IBext``, ``NET/Plugin`` lines (the plugin loaded or none),
  ``NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ...`` (devices, port, link layer), ``NET/IB : No device
  found``, ``NET/Socket : Using [0]eth0:10.0.0.1<0>``, the topology's ``+ NET[<GB/s>] - NET/<i>`` (speed);
- transports: ``Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read`` and ``Ring 00 : 3 -> 4 [send] via NET/Socket/0``
  counted per kind (``P2P``, ``SHM``, ``NET/IB``, ``NET/Socket``, ``COLLNET``...), GPU Direct (``/GDRDMA``) noted;
  a process with no ``Init`` line takes its rank from them (the sender prints a connection, the receiver
  its ``[receive]`` half: ``transport/p2p.cc``, ``net.cc``) or from its ``Trees [0] c/-1/-1->R->p`` line;
  the peers it reaches over NET are kept (``net_peers``: on its own host, a P2P/SHM miss);
- ``Ring NN : ...`` and ``Channel NN/MM :    0 1 ...`` (rings), ``Trees [..]`` / ``Tree N : ...`` (trees),
  ``N coll channels, M collnet channels, K nvls channels, P p2p channels``, the search's ``Pattern P, crossNic C,
  nChannels N`` (what the topology allowed before any limit);
- ``NCCL_X set by environment to V`` (the variables the job set), ``WARN`` lines, and PyTorch's
  ``Watchdog caught collective operation timeout: WorkNCCL(SeqNum=.., OpType=.., ..., Timeout(ms)=..)``.

Records: one ``nccl_rank`` Event per process/device at the end of the file (everything above that
concerns it), one ``nccl_warn`` per WARN line and one ``nccl_timeout`` per watchdog timeout, all dated
``t`` (NCCL lines carry no time; ``read_nccl_log`` uses the file's write time).

Lenient by design: NCCL prints hundreds of kinds of lines that change between versions; a line this
reader does not know is skipped, not an error, and a log with none it knows yields nothing. Only a
line that looks like one it knows but breaks its shape (``rank x nranks``) is a bad line, handed to
``on_bad_line`` (strict when None: the first raises).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

from hpcwatch.errors import ParseError
from hpcwatch.records import Event
from hpcwatch.sources.lines import OnBadLine, file_time, iter_lines, line_text, report_bad_line, shown
from hpcwatch.sources.nccl_sniff import LINE_PREFIX, WATCHDOG_TIMEOUT, is_nccl_log
from hpcwatch.vocab import EventKind

__all__ = ["parse_nccl_log", "read_nccl_log", "is_nccl_log", "NcclLogStream", "TRANSPORT_KINDS"]

_VERSION = re.compile(r"NCCL version (?P<version>[\w.]+)(?:\+cuda(?P<cuda>[\d.]+))?")
_DRIVER = re.compile(r"cudaDriverVersion (\d+)")
_COMM = re.compile(
    r"comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\S+) nranks (?P<nranks>\S+) cudaDev (?P<dev>\d+)"
    r"(?: nvmlDev \d+)?(?: busId (?P<bus>[0-9a-fA-F]+))?(?: commId (?P<commid>0x[0-9a-f]+))?"
    r" - Init (?P<phase>START|COMPLETE)"
)
_COMM_NODES = re.compile(r"comm 0x[0-9a-f]+ rank \d+ nRanks \d+ nNodes (?P<nodes>\d+) localRanks (?P<local>\d+)")
_NETWORK = re.compile(r"Using network (\S+)")
_IB_USING = re.compile(r"NET/IB ?: Using (?P<devs>.*?)(?:; OOB (?P<oob>\S+))?$")
_IB_DEV = re.compile(r"\[(?P<i>\d+)\](?P<name>[\w.-]+):(?P<port>\d+)/(?P<link>[A-Za-z]+)(?P<sharp>/SHARP)?")
_SOCKET_USING = re.compile(r"NET/Socket ?: Using (.*)$")
#: An address ends at the next ``[`` so that a line of ``[0]a:[0]a:...`` without ``<`` is read in linear time.
_SOCKET_IF = re.compile(r"\[\d+\](?P<name>[\w.-]++):(?P<addr>[^<\s\[]++)<")
_NET_SPEED = re.compile(r"\+ NET\[(?P<gbs>[\d.]+)\] - NET/(?P<i>\d+)")
_NET_SPEED_SYSFS = re.compile(r"Could not get speed from (\S+)\. Defaulting to (\d+) Gbps")
_PLUGIN = re.compile(
    r"NET/Plugin ?: ?(?P<what>.*)|Loaded net plugin (?P<loaded>.*)|Initialized NET plugin (?P<init>\S+)"
    r"|Assigned NET plugin (?P<assigned>\S+)|P2P plugin (?P<p2p>\S+)"
)
_VIA = re.compile(
    r"(?:Channel|Ring) (?P<ch>\d+)(?:/\d+)? : (?P<src>\d+)(?:\[[0-9a-f]+\])? -> (?P<dst>\d+)"
    r"(?:\[[0-9a-f]+\])?(?: \[(?P<dir>send|receive)\])? via (?P<via>\S+(?: [\w/]+)*)"
)
_RING = re.compile(r"(?:Ring (?P<r>\d+) : [\d\s>-]+$)|(?:Channel (?P<c>\d+)/(?P<of>\d+) :(?P<ranks>(?:\s+\d+)+)\s*$)")
_TREE = re.compile(r"Trees? ?(?:\[(?P<t>\d+)\]|(?P<n>\d+) :)")
#: ``Trees [0] 5/-1/-1->4->3``: the rank between the arrows is the process's own (``graph/connect.cc``).
_TREE_SELF = re.compile(r"->(\d++)->")
_CHANNELS = re.compile(
    r"(?P<coll>\d+) coll channels,(?: (?P<collnet>\d+) collnet channels,)?"
    r"(?: (?P<nvls>\d+) nvls channels,)? (?P<p2p>\d+) p2p channels"
)
_PATTERN = re.compile(r"Pattern (?P<p>\d+), crossNic \d+, nChannels (?P<n>\d+)")
_ENV = re.compile(r"(?P<name>NCCL_[A-Z0-9_]+) set by environment to (?P<value>.*?)\.?$")
#: The watchdog's line is matched where its first mark is (``str.find``), never searched: a search
#: tries the lazy ``WorkNCCL(...)`` from every mark on a line of many, O(n^2).
_WATCHDOG = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\((?P<work>.*?)\) ran for (?P<ran>\d++) milliseconds"
)
#: ``[PG 0 Rank 3] `` right before the mark (PyTorch's prefix), looked for in the 200 characters before it.
_WATCHDOG_RANK = re.compile(r"\[(?:PG (?P<pg>\S++) )?Rank (?P<rank>\d++)\] $")

#: Peers over NET kept per process (a ring and a tree give a handful; the cap bounds a hostile log).
_MAX_PEERS_KEPT = 256
#: Transport kinds as NCCL names them after "via" (transport/*.cc: p2p, shm, net, coll_net, nvls).
TRANSPORT_KINDS = ("P2P", "SHM", "NET/IB", "NET/Socket", "NET", "COLLNET", "NVLS", "CUMEM")


@dataclass(slots=True)
class _Rank:
    """What the log said about one process and device, gathered line by line."""

    host: str
    pid: int
    cuda_dev: int
    rank: int | None = None
    nranks: int | None = None
    bus_id: str | None = None
    comm_ids: dict[str, int] = field(default_factory=dict)
    version: str | None = None
    cuda_runtime: str | None = None
    cuda_driver: int | None = None
    network: str | None = None
    net_plugin: str | None = None
    ib_devices: list[dict[str, Any]] = field(default_factory=list)
    ib_none: bool = False
    socket_ifs: list[str] = field(default_factory=list)
    net_speed_gbs: dict[int, float] = field(default_factory=dict)
    transports: dict[str, int] = field(default_factory=dict)
    gdr: bool = False
    net_peers: set[int] = field(default_factory=set)
    """Ranks this process connects to over NET (IB, Socket, a plugin): on its own host, a P2P/SHM miss."""
    rings: set[int] = field(default_factory=set)
    trees: set[int] = field(default_factory=set)
    channels: dict[str, int] = field(default_factory=dict)
    pattern_channels: int | None = None
    nnodes: int | None = None
    local_ranks: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    warns: int = 0

    def attrs(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "node": self.host,
            "pid": self.pid,
            "cuda_dev": self.cuda_dev,
            "rank": self.rank,
            "nranks": self.nranks,
            "bus_id": self.bus_id,
            "comm_ids": dict(self.comm_ids),
            "version": self.version,
            "cuda_runtime": self.cuda_runtime,
            "cuda_driver": self.cuda_driver,
            "network": self.network,
            "net_plugin": self.net_plugin,
            "ib_devices": list(self.ib_devices),
            "ib_none": self.ib_none,
            "socket_ifs": list(self.socket_ifs),
            "net_speed_gbs": {str(k): v for k, v in self.net_speed_gbs.items()},
            "transports": dict(self.transports),
            "gdr": self.gdr,
            "net_peers": sorted(self.net_peers)[:_MAX_PEERS_KEPT],
            "rings": len(self.rings),
            "trees": len(self.trees),
            "coll_channels": self.channels.get("coll"),
            "nvls_channels": self.channels.get("nvls"),
            "p2p_channels": self.channels.get("p2p"),
            "collnet_channels": self.channels.get("collnet"),
            "pattern_channels": self.pattern_channels,
            "nnodes": self.nnodes,
            "local_ranks": self.local_ranks,
            "env": dict(self.env),
            "warns": self.warns,
        }


def _transport_kind(via: str) -> str:
    """``P2P/IPC/read`` -> ``P2P``; ``NET/IB/0/GDRDMA`` -> ``NET/IB``; ``SHM/direct/direct`` -> ``SHM``."""
    head = via.split("/")
    if head[0] == "NET" and len(head) > 1:
        return "NET/" + ("IB" if head[1].startswith("IB") else head[1])
    return head[0].upper() if head[0].upper() in TRANSPORT_KINDS else head[0]


class _Reader:
    def __init__(self, path: str | os.PathLike[str], t: float, on_bad_line: OnBadLine) -> None:
        self.path, self.t, self.on_bad_line = path, t, on_bad_line
        self.ranks: dict[tuple[str, int, int], _Rank] = {}
        self.last: _Rank | None = None
        self.completed: list[tuple[str, int, int]] = []
        """Processes whose ``Init COMPLETE`` line was read (NcclLogStream emits them there)."""

    def rank_of(self, host: str, pid: str, dev: str) -> _Rank:
        key = (host, _whole(pid), _whole(dev))
        if key not in self.ranks:
            self.ranks[key] = _Rank(host=host, pid=key[1], cuda_dev=key[2])
        return self.ranks[key]

    def line(self, raw: str, lineno: int) -> Iterator[Event]:
        try:
            yield from self.known_line(raw, lineno)
        except _BadNumber as err:  # a line of a known shape whose number cannot be stored
            bad = ParseError(str(err), path=self.path, line=lineno, text=line_text(raw))
            report_bad_line(bad, self.on_bad_line)

    def known_line(self, raw: str, lineno: int) -> Iterator[Event]:
        if WATCHDOG_TIMEOUT in raw:
            yield from self.watchdog(raw, lineno)
            return
        m = LINE_PREFIX.search(raw)
        if m is None:
            version = _VERSION.search(raw)
            if version and self.last is not None and "NCCL version" in raw[: version.start() + 12]:
                self.version(self.last, version)
            return
        r = self.rank_of(m["host"], m["pid"], m["dev"])
        self.last = r
        msg = m["msg"].rstrip()
        if m["level"] == "WARN":
            r.warns += 1
            yield Event(
                kind=EventKind.NCCL_WARN,
                t=self.t,
                source=str(self.path),
                attrs={
                    "host": r.host,
                    "node": r.host,
                    "pid": r.pid,
                    "cuda_dev": r.cuda_dev,
                    "where": m["src"],
                    "message": msg[:1000],
                    "line": lineno,
                },
            )
            return
        self.info(r, msg, raw, lineno)

    def version(self, r: _Rank, m: re.Match[str]) -> None:
        r.version, r.cuda_runtime = m["version"], m["cuda"]

    def info(self, r: _Rank, msg: str, raw: str, lineno: int) -> None:
        for handler in (self.on_version, self.on_comm, self.on_net, self.on_via, self.on_graph, self.on_env):
            if handler(r, msg, raw, lineno):
                return

    def on_version(self, r: _Rank, msg: str, raw: str, lineno: int) -> bool:
        if (m := _VERSION.match(msg)) is not None:
            self.version(r, m)
            return True
        if (m := _DRIVER.match(msg)) is not None:
            r.cuda_driver = _whole(m[1])
            return True
        return False

    def on_comm(self, r: _Rank, msg: str, raw: str, lineno: int) -> bool:
        m = _COMM.search(msg)
        if m is None:
            if (n := _COMM_NODES.match(msg)) is not None:
                r.nnodes, r.local_ranks = _whole(n["nodes"]), _whole(n["local"])
                return True
            return False
        if not (m["rank"].isdigit() and m["nranks"].isdigit()):
            report_bad_line(
                ParseError("rank and nranks must be integers", path=self.path, line=lineno, text=line_text(raw)),
                self.on_bad_line,
            )
            return True
        rank, nranks = _whole(m["rank"]), _whole(m["nranks"])
        if r.nranks is None or nranks >= r.nranks:  # the widest communicator names the rank in the job
            r.rank, r.nranks = rank, nranks
        r.bus_id = m["bus"] or r.bus_id
        if m["commid"]:
            r.comm_ids[m["commid"]] = rank
        if m["phase"] == "COMPLETE":
            self.completed.append((r.host, r.pid, r.cuda_dev))
        return True

    def on_net(self, r: _Rank, msg: str, raw: str, lineno: int) -> bool:
        if (m := _NETWORK.match(msg)) is not None:
            r.network = m[1]
        elif msg.startswith("NET/IB") and "No device found" in msg:
            r.ib_none = True
        elif (m := _IB_USING.match(msg)) is not None:
            devices = [
                {
                    "index": _whole(d["i"]),
                    "name": d["name"],
                    "port": _whole(d["port"]),
                    "link": d["link"],
                    "sharp": bool(d["sharp"]),
                }
                for d in _IB_DEV.finditer(m["devs"])
            ]
            r.ib_devices, r.ib_none = devices, not devices
        elif (m := _SOCKET_USING.match(msg)) is not None:
            r.socket_ifs = [s["name"] for s in _SOCKET_IF.finditer(m[1])]
        elif (m := _NET_SPEED.search(msg)) is not None:
            r.net_speed_gbs[_whole(m["i"])] = _speed(m["gbs"])
        elif (m := _PLUGIN.search(msg)) is not None:
            self.on_plugin(r, m)
        elif "Failed to initialize NET plugin IB" in msg:
            r.ib_none = True
        else:
            return False
        return True

    @staticmethod
    def on_plugin(r: _Rank, m: re.Match[str]) -> None:
        loaded = m["loaded"] or (m["what"] and m["what"].partition("Loaded net plugin ")[2])
        if loaded:
            r.net_plugin = loaded.strip()
        elif m["p2p"]:
            r.net_plugin = r.net_plugin or m["p2p"]
        elif (
            (m["what"] and ("No plugin found" in m["what"] or "Using internal" in m["what"]))
            or m["init"]
            or m["assigned"]
        ):
            r.net_plugin = r.net_plugin or "internal"

    def on_via(self, r: _Rank, msg: str, raw: str, lineno: int) -> bool:
        m = _VIA.match(msg)
        if m is None:
            return False
        kind = _transport_kind(m["via"])
        r.transports[kind] = r.transports.get(kind, 0) + 1
        src, dst = _whole(m["src"]), _whole(m["dst"])
        if r.rank is None:  # no Init line (an excerpt, NCCL < 2.9): the connection names this process's rank
            r.rank = dst if m["dir"] == "receive" else src
        if kind.startswith("NET") and len(r.net_peers) < _MAX_PEERS_KEPT:
            r.net_peers.add(src if m["dir"] == "receive" else dst)
        r.gdr = r.gdr or "GDRDMA" in m["via"]
        if msg.startswith("Ring"):
            r.rings.add(_whole(m["ch"]))
        return True

    def on_graph(self, r: _Rank, msg: str, raw: str, lineno: int) -> bool:
        if (m := _CHANNELS.match(msg)) is not None:
            r.channels = {k: _whole(v) for k, v in m.groupdict().items() if v is not None}
        elif (m := _PATTERN.match(msg)) is not None:
            r.pattern_channels = max(r.pattern_channels or 0, _whole(m["n"]))
        elif (m := _RING.match(msg)) is not None:
            r.rings.add(_whole(m["r"] if m["r"] is not None else m["c"]))
        elif (m := _TREE.match(msg)) is not None:
            if m["n"] is not None:
                r.trees.add(_whole(m["n"]))
            else:
                r.trees |= {_whole(t) for t in re.findall(r"\[(\d+)\]", msg)}
                if r.rank is None and (me := _TREE_SELF.search(msg)) is not None:  # children->me->parent
                    r.rank = _whole(me[1])
        else:
            return False
        return True

    def on_env(self, r: _Rank, msg: str, raw: str, lineno: int) -> bool:
        m = _ENV.match(msg)
        if m is None:
            return False
        r.env[m["name"]] = m["value"].strip()
        return True

    def watchdog(self, raw: str, lineno: int) -> Iterator[Event]:
        at = raw.find(WATCHDOG_TIMEOUT)
        m = _WATCHDOG.match(raw, at)
        who = _WATCHDOG_RANK.search(raw, max(0, at - 200), at)
        if m is None:
            report_bad_line(
                ParseError(
                    "a watchdog timeout line without its WorkNCCL(...)",
                    path=self.path,
                    line=lineno,
                    text=line_text(raw),
                ),
                self.on_bad_line,
            )
            return
        work = dict(kv.split("=", 1) for kv in m["work"].split(", ") if "=" in kv)
        attrs: dict[str, Any] = {
            "rank": _whole(who["rank"]) if who else None,
            "pg": who["pg"] if who else None,
            "seq": _int(work.get("SeqNum")),
            "op": work.get("OpType"),
            "numel_in": _int(work.get("NumelIn")),
            "numel_out": _int(work.get("NumelOut")),
            "timeout_ms": _int(work.get("Timeout(ms)")),
            "ran_ms": _whole(m["ran"]),
            "line": lineno,
        }
        yield Event(kind=EventKind.NCCL_TIMEOUT, t=self.t, source=str(self.path), attrs=attrs)

    def finish(self) -> Iterator[Event]:
        for r in self.ranks.values():
            yield Event(kind=EventKind.NCCL_RANK, t=self.t, source=str(self.path), attrs=r.attrs())


class _BadNumber(ValueError):
    """A number of the log that is none or that the store cannot hold (it holds 64-bit integers)."""


#: The largest signed 64-bit number.
_INT64_MAX = (1 << 63) - 1


def _whole(digits: str) -> int:
    """``int(digits)`` of digits a pattern matched, or _BadNumber beyond 64 bits (orjson's limit too).

    The length is looked at first: ``int()`` of a run of over 4300 digits is a ValueError of its own.
    """
    if len(digits.lstrip("-")) > 19 or abs(value := int(digits)) > _INT64_MAX:
        raise _BadNumber(f"the number {shown(digits)} is beyond 64 bits")
    return value


def _speed(text: str) -> float:
    """A ``[\\d.]+`` the topology printed as GB/s (``24.0``), or _BadNumber (``1.2.3``)."""
    try:
        return float(text)
    except ValueError:
        raise _BadNumber(f"the speed {shown(text)} is not a number") from None


def _int(text: str | None) -> int | None:
    return _whole(text) if text is not None and text.lstrip("-").isdecimal() else None


def parse_nccl_log(
    lines: Iterable[str | bytes],
    *,
    path: str | os.PathLike[str] = "<nccl>",
    t: float = 0.0,
    on_bad_line: OnBadLine = None,
) -> Iterator[Event]:
    """Events of one NCCL debug log (see the module docstring); ``nccl_rank`` events come at the end."""
    reader = _Reader(path, t, on_bad_line)
    for lineno, raw in enumerate(lines, 1):
        text = raw.decode("utf-8", errors="replace") if isinstance(raw, (bytes, bytearray)) else raw
        yield from reader.line(text.rstrip("\r\n"), lineno)
    yield from reader.finish()


def read_nccl_log(path: str | os.PathLike[str], *, on_bad_line: OnBadLine = None) -> Iterator[Event]:
    """The events of an NCCL debug log file, read line by line and dated by the file's write time."""
    yield from parse_nccl_log(iter_lines(path), path=path, t=file_time(path), on_bad_line=on_bad_line)


def _rank_state(r: _Rank) -> dict[str, Any]:
    state = {f.name: getattr(r, f.name) for f in fields(r)}
    state.update(
        rings=sorted(r.rings),
        trees=sorted(r.trees),
        net_peers=sorted(r.net_peers),
        net_speed_gbs={str(k): v for k, v in r.net_speed_gbs.items()},
    )
    return state


def _rank_of_state(state: dict[str, Any]) -> _Rank:
    r = _Rank(
        **{
            **state,
            "rings": set(state["rings"]),
            "trees": set(state["trees"]),
            "net_peers": set(state.get("net_peers", ())),  # a state saved before peers were kept has none
            "net_speed_gbs": {int(k): v for k, v in state["net_speed_gbs"].items()},
        }
    )
    r.ib_devices = [dict(d) for d in r.ib_devices]
    return r


class NcclLogStream:
    """``parse_nccl_log`` over a log read in pieces as it grows (collect's follower), its state a JSON value.

    A process's ``nccl_rank`` event comes when its ``Init COMPLETE`` line is read (NCCL prints it once the
    communicator's rings, trees and transports are set up, ``init.cc``), or at ``finish()`` (the file rotated
    or ended) for a process that never printed one (excerpts, a crash during init): each process's event
    once. Lines about a process after its event (a second communicator's) are not in it; its WARN lines
    and watchdog timeouts still are events of their own. ``state()`` holds the processes not yet emitted
    (and the keys of those that were), so a follower restarted from its cursor neither loses nor repeats one.
    """

    def __init__(self, state: dict[str, Any] | None = None, *, path: str | os.PathLike[str] = "<nccl>") -> None:
        self._reader = _Reader(path, 0.0, None)
        state = state or {}
        self._emitted = {tuple(k) for k in state.get("emitted", ())}
        for s in state.get("ranks", ()):
            r = _rank_of_state(s)
            self._reader.ranks[(r.host, r.pid, r.cuda_dev)] = r
        for k in self._emitted:  # a later line about an emitted process lands here, never emitted again
            self._reader.ranks.setdefault(k, _Rank(host=k[0], pid=k[1], cuda_dev=k[2]))
        last = state.get("last")
        self._reader.last = self._reader.ranks.get(tuple(last)) if last else None

    def feed(
        self, lines: Iterable[str | bytes], *, first_line: int = 1, t: float = 0.0, on_bad_line: OnBadLine = None
    ) -> list[Event]:
        """The events of these lines (``first_line``: the number of the first in the file), dated ``t``."""
        reader = self._reader
        reader.t, reader.on_bad_line = t, on_bad_line
        out: list[Event] = []
        for lineno, raw in enumerate(lines, first_line):
            text = raw.decode("utf-8", errors="replace") if isinstance(raw, (bytes, bytearray)) else raw
            out.extend(reader.line(text.rstrip("\r\n"), lineno))
            while reader.completed:
                out.extend(self._emit(reader.completed.pop(0)))
        return out

    def finish(self, *, t: float = 0.0) -> list[Event]:
        """The events of the processes not yet emitted (the log is over)."""
        self._reader.t = t
        return [e for key in list(self._reader.ranks) for e in self._emit(key)]

    def _emit(self, key: tuple[str, int, int]) -> list[Event]:
        if key in self._emitted:
            return []
        self._emitted.add(key)
        r = self._reader.ranks[key]
        return [Event(kind=EventKind.NCCL_RANK, t=self._reader.t, source=str(self._reader.path), attrs=r.attrs())]

    def state(self) -> dict[str, Any]:
        """A JSON value: ``NcclLogStream(state)`` goes on where this one is."""
        last = self._reader.last
        return {
            "emitted": sorted(list(k) for k in self._emitted),
            "ranks": [_rank_state(r) for k, r in self._reader.ranks.items() if k not in self._emitted],
            "last": [last.host, last.pid, last.cuda_dev] if last is not None else None,
        }
