"""A job's NCCL topology from its debug logs, and the rules that say what is wrong with it.

Input: the attrs of ``nccl_rank`` events (``sources.nccl_log``), one per process and device, from all
the logs of one job (one file from mpirun, or one per process with ``NCCL_DEBUG_FILE=%h.%p``).

Rules (each names the ranks or hosts it fired on and the lines' evidence):

========================  =========================================================================  ======
rule                      fires when                                                                 verdict
========================  =========================================================================  ======
``nccl_socket_fallback``  a rank sends over NET/Socket (or ``Using network Socket``) while IB exists: warn
                          some rank lists NET/IB devices, an IB net plugin is loaded, the store holds
                          IB ports of its host (``ib_hosts``) or the cluster model says its nodes
                          have InfiniBand (``expect_ib``); without any of these, a connection over
                          NET/Socket is still noted (TCP between nodes is worth knowing)           ok
``nccl_few_channels``     a rank's coll channels (or rings) are fewer than its topology search found  warn
                          (``Pattern .. nChannels N``), or fewer than another rank of the job built
``nccl_forced_tuning``    NCCL_ALGO, NCCL_PROTO, NCCL_MIN/MAX_NCHANNELS... set (``FORCING_VARIABLES``) warn
``nccl_version_mismatch`` NCCL version, CUDA runtime or net plugin differ across the job's ranks        warn
``nccl_ib_missing``       some hosts list NET/IB devices and others list fewer or none               drain
``nccl_intranode_net``    two GPUs of one host connect over NET (IB, Socket) instead of P2P or SHM    warn
                          (NCCL_P2P_DISABLE / NCCL_SHM_DISABLE set, or P2P unavailable: the pair
                          runs at NIC speed, not NVLink's); a host name shared by several nodes
                          (an anonymised log: one cudaDev in two processes) is not judged
========================  =========================================================================  ======

Why these: ClusterMAX (SemiAnalysis, https://www.clustermax.ai/) counts NCCL tuning variables a user
must set against a cluster; NCCL's maintainers call NCCL_ALGO/NCCL_PROTO debug knobs not for
production (https://github.com/NVIDIA/nccl/issues/790); a rank on NET/Socket next to IB ranks runs
the whole ring at TCP speed (ring all-reduce time is bounded by its slowest link, docs/reference.md); a
host without its HCAs is a hardware or driver fault on that host (drain it, as ``ib_link`` does).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from hpcwatch.analysis.health_rules import HealthRuleId

__all__ = [
    "NcclTopology",
    "NcclRule",
    "NcclConfig",
    "summarize_nccl",
    "network_of",
    "nccl_jobs",
    "communicator_groups",
    "nccl_rules",
    "RULES",
    "FORCING_VARIABLES",
]

Verdict = Literal["ok", "warn", "drain"]
#: Its rules (rows of ``analysis.health_rules.HEALTH_RULES``, where their thresholds and sources are listed).
RULES: tuple[HealthRuleId, ...] = (
    "nccl_socket_fallback",
    "nccl_few_channels",
    "nccl_forced_tuning",
    "nccl_version_mismatch",
    "nccl_ib_missing",
    "nccl_intranode_net",
)
#: Variables that turn the intra-node transports off (the evidence of ``nccl_intranode_net``).
_INTRANODE_VARIABLES = ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE", "NCCL_NET_DISABLE_INTRA")
#: Variables that force NCCL's own tuning (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html):
#: NCCL's authors call NCCL_ALGO / NCCL_PROTO debug and workaround knobs "not supposed to be used in production"
#: (https://github.com/NVIDIA/nccl/issues/790, sjeaugey, 2023-02-24); NCCL_TREE_THRESHOLD is
#: their pre-2.5 form (https://github.com/NVIDIA/nccl/issues/211).
FORCING_VARIABLES = (
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_CTAS",
    "NCCL_MAX_CTAS",
    "NCCL_TREE_THRESHOLD",
    "NCCL_LL_THRESHOLD",
    "NCCL_NTHREADS",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclConfig:
    """What the logs cannot say themselves."""

    expect_ib: bool = False
    """The cluster model gives the job's nodes InfiniBand (a Socket transport is then a fallback even if no log lists an HCA)."""
    ib_hosts: frozenset[str] = frozenset()
    """Hosts the store knows have HCAs (ibstat / perfquery ports): a Socket transport of theirs is a fallback."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclRule:
    rule: HealthRuleId
    verdict: Verdict
    title: str
    hosts: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclTopology:
    """One job's NCCL view: what every rank said, merged."""

    processes: int
    ranks: tuple[int, ...]
    nranks: int | None
    hosts: tuple[str, ...]
    versions: Mapping[str, tuple[str, ...]]
    """NCCL version -> hosts that printed it."""
    cuda_runtimes: tuple[str, ...]
    cuda_drivers: tuple[int, ...]
    networks: Mapping[str, int]
    """``Using network X`` (else what its transports say: ``Socket``, ``IB``) -> how many processes."""
    plugins: Mapping[str, int]
    ib_devices: Mapping[str, tuple[str, ...]]
    """host -> the NET/IB devices it listed (name:port/link)."""
    socket_ifs: Mapping[str, tuple[str, ...]]
    transports: Mapping[str, int]
    """transport kind -> connections (channel lines) over all ranks."""
    gdr: bool
    coll_channels: tuple[int, ...]
    """distinct coll channel counts seen."""
    rings_max: int
    trees_max: int
    env: Mapping[str, str]
    warns: int
    rank_rows: tuple[Mapping[str, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _dev_name(d: Mapping[str, Any]) -> str:
    return f"{d.get('name')}:{d.get('port')}/{d.get('link')}" + ("/SHARP" if d.get("sharp") else "")


def network_of(r: Mapping[str, Any]) -> str | None:
    """The network a process used: its ``Using network X`` line, else its transports' (an excerpt, or a
    version that prints no such line: ``via NET/Socket/0`` is the Socket network)."""
    if r.get("network"):
        return str(r["network"])
    transports = r.get("transports") or {}
    return next((name for kind, name in (("NET/IB", "IB"), ("NET/Socket", "Socket")) if transports.get(kind)), None)


def summarize_nccl(ranks: Sequence[Mapping[str, Any]]) -> NcclTopology:
    """Merge the ``nccl_rank`` attrs of one job into its topology."""
    versions: dict[str, set[str]] = defaultdict(set)
    networks: dict[str, int] = defaultdict(int)
    plugins: dict[str, int] = defaultdict(int)
    transports: dict[str, int] = defaultdict(int)
    ib: dict[str, set[str]] = defaultdict(set)
    socks: dict[str, set[str]] = defaultdict(set)
    env: dict[str, str] = {}
    for r in ranks:
        host = str(r.get("host"))
        if r.get("version"):
            versions[str(r["version"])].add(host)
        if network := network_of(r):
            networks[network] += 1
        if r.get("net_plugin"):
            plugins[str(r["net_plugin"])] += 1
        for kind, n in (r.get("transports") or {}).items():
            transports[kind] += int(n)
        ib[host] |= {_dev_name(d) for d in r.get("ib_devices") or []}
        socks[host] |= set(r.get("socket_ifs") or [])
        env.update(r.get("env") or {})
    numbered = sorted({int(r["rank"]) for r in ranks if r.get("rank") is not None})
    return NcclTopology(
        processes=len(ranks),
        ranks=tuple(numbered),
        nranks=max((int(r["nranks"]) for r in ranks if r.get("nranks")), default=None),
        hosts=tuple(sorted({str(r.get("host")) for r in ranks})),
        versions={v: tuple(sorted(h)) for v, h in sorted(versions.items())},
        cuda_runtimes=tuple(sorted({str(r["cuda_runtime"]) for r in ranks if r.get("cuda_runtime")})),
        cuda_drivers=tuple(sorted({int(r["cuda_driver"]) for r in ranks if r.get("cuda_driver")})),
        networks=dict(networks),
        plugins=dict(plugins),
        ib_devices={h: tuple(sorted(d)) for h, d in sorted(ib.items()) if d},
        socket_ifs={h: tuple(sorted(s)) for h, s in sorted(socks.items()) if s},
        transports=dict(transports),
        gdr=any(r.get("gdr") for r in ranks),
        coll_channels=tuple(sorted({int(r["coll_channels"]) for r in ranks if r.get("coll_channels") is not None})),
        rings_max=max((int(r.get("rings") or 0) for r in ranks), default=0),
        trees_max=max((int(r.get("trees") or 0) for r in ranks), default=0),
        env=env,
        warns=sum(int(r.get("warns") or 0) for r in ranks),
        rank_rows=tuple(ranks),
    )


def communicator_groups(events: Sequence[Any], lone: Callable[[Any], Any]) -> list[list[Any]]:
    """``nccl_rank`` events grouped by the communicators they share (``comm_ids``, union-find), in the order
    of each group's first event; an event that logged no commId joins the events of its ``lone(event)`` key."""
    parent: dict[Any, Any] = {}

    def root(x: Any) -> Any:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, e in enumerate(events):
        for key in [("comm", c) for c in (e.attrs.get("comm_ids") or {})] or [lone(e)]:
            parent[root(key)] = root(("proc", i))
    groups: dict[Any, list[Any]] = {}
    for i, e in enumerate(events):
        groups.setdefault(root(("proc", i)), []).append(e)
    return list(groups.values())


def nccl_jobs(events: Sequence[Any], job_of: Callable[[Sequence[Any]], str | None] | None = None) -> list[list[Any]]:
    """``nccl_rank`` events grouped by job, so that the rules compare only processes that met.

    A communicator (``commId``) joins its processes; a process that logged none is of its file's job
    (``source``: one mpirun log is one job); groups ``job_of`` places in one Slurm job are one (per-process
    ``NCCL_DEBUG_FILE`` logs of a version that prints no commId). Logs of unrelated clusters ingested
    into one store thus stay apart: their versions and networks are not compared.
    """
    groups = communicator_groups(events, lambda e: ("file", e.source))
    if job_of is None:
        return groups
    jobs: dict[Any, list[Any]] = {}
    for n, group in enumerate(groups):
        job = job_of(group)
        jobs.setdefault(("job", job) if job is not None else ("group", n), []).extend(group)
    return list(jobs.values())


def _who(rows: Sequence[Mapping[str, Any]]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    return (
        tuple(sorted({str(r.get("host")) for r in rows})),
        tuple(sorted({int(r["rank"]) for r in rows if r.get("rank") is not None})),
    )


def _socket_fallback(top: NcclTopology, config: NcclConfig) -> list[NcclRule]:
    on_socket = [r for r in top.rank_rows if network_of(r) == "Socket"]
    if not on_socket:
        return []
    hosts, ranks = _who(on_socket)
    ib_plugin = any("IB" in p.upper() or "RDMA" in p.upper() for p in top.plugins)
    hcas = sorted(set(hosts) & config.ib_hosts)
    why = (
        ("NET/IB devices on " + ", ".join(top.ib_devices))
        if top.ib_devices
        else "an IB net plugin is loaded"
        if ib_plugin
        else ("the store holds IB ports of " + ", ".join(hcas))
        if hcas
        else "the cluster model gives these nodes InfiniBand"
        if config.expect_ib
        else None
    )
    if why is None:
        # no sign of InfiniBand: a note, and only where data crosses a socket (one GPU alone says "Socket" too)
        if len(hosts) < 2 and not any((r.get("transports") or {}).get("NET/Socket") for r in on_socket):
            return []
        return [
            NcclRule(
                rule="nccl_socket_fallback",
                verdict="ok",
                hosts=hosts,
                ranks=ranks,
                title=f"{len(on_socket)} process(es) send over NET/Socket (TCP); no InfiniBand seen "
                "(an HCA in the store or --expect-ib would make this a warning)",
                evidence={"socket_ifs": dict(top.socket_ifs)},
            )
        ]
    return [
        NcclRule(
            rule="nccl_socket_fallback",
            verdict="warn",
            hosts=hosts,
            ranks=ranks,
            title=f"{len(on_socket)} process(es) send over NET/Socket although InfiniBand exists ({why})",
            evidence={
                "ib_devices": dict(top.ib_devices),
                "plugins": dict(top.plugins),
                "socket_ifs": dict(top.socket_ifs),
            },
        )
    ]


def _few_channels(top: NcclTopology) -> list[NcclRule]:
    out = []
    below_search = [
        r
        for r in top.rank_rows
        if r.get("coll_channels") is not None
        and r.get("pattern_channels")
        and int(r["coll_channels"]) < int(r["pattern_channels"])
    ]
    if below_search:
        hosts, ranks = _who(below_search)
        out.append(
            NcclRule(
                rule="nccl_few_channels",
                verdict="warn",
                hosts=hosts,
                ranks=ranks,
                title="fewer coll channels than the topology search found "
                f"({below_search[0]['coll_channels']} < {below_search[0]['pattern_channels']})",
                evidence={"env": {k: v for k, v in top.env.items() if "CHANNELS" in k}},
            )
        )
    for key, label in (("coll_channels", "coll channels"), ("rings", "rings")):
        counts = [int(r[key]) for r in top.rank_rows if r.get(key)]
        if len(set(counts)) > 1:
            most = max(counts)
            fewer = [r for r in top.rank_rows if r.get(key) and int(r[key]) < most]
            hosts, ranks = _who(fewer)
            out.append(
                NcclRule(
                    rule="nccl_few_channels",
                    verdict="warn",
                    hosts=hosts,
                    ranks=ranks,
                    title=f"{len(fewer)} process(es) built fewer {label} than others of the job "
                    f"({min(counts)} < {most})",
                    evidence={key: sorted(set(counts))},
                )
            )
    return out


def _forced(top: NcclTopology) -> list[NcclRule]:
    forced = {k: v for k, v in top.env.items() if k in FORCING_VARIABLES}
    if not forced:
        return []
    rows = [r for r in top.rank_rows if set(r.get("env") or {}) & set(forced)]
    hosts, ranks = _who(rows)
    return [
        NcclRule(
            rule="nccl_forced_tuning",
            verdict="warn",
            hosts=hosts,
            ranks=ranks,
            title="NCCL tuning forced by the environment: " + ", ".join(f"{k}={v}" for k, v in forced.items()),
            evidence={"variables": forced},
        )
    ]


def _mismatch(top: NcclTopology) -> list[NcclRule]:
    out = []
    for label, key in (("NCCL version", "version"), ("CUDA runtime", "cuda_runtime"), ("net plugin", "net_plugin")):
        seen: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for r in top.rank_rows:
            if r.get(key):
                seen[str(r[key])].append(r)
        if len(seen) > 1:
            hosts, ranks = _who([r for rows in seen.values() for r in rows])
            out.append(
                NcclRule(
                    rule="nccl_version_mismatch",
                    verdict="warn",
                    hosts=hosts,
                    ranks=ranks,
                    title=f"{label} differs across the job: " + ", ".join(sorted(seen)),
                    evidence={v: sorted(_who(rows)[0]) for v, rows in seen.items()},
                )
            )
    return out


def _ib_missing(top: NcclTopology) -> list[NcclRule]:
    if not top.ib_devices:
        return []
    most = max(len(d) for d in top.ib_devices.values())
    short = [
        h
        for h in top.hosts
        if len(top.ib_devices.get(h, ())) < most
        and any(r.get("host") == h and (r.get("ib_none") or r.get("ib_devices")) for r in top.rank_rows)
    ]
    if not short:
        return []
    return [
        NcclRule(
            rule="nccl_ib_missing",
            verdict="drain",
            hosts=tuple(short),
            title=f"{len(short)} host(s) list fewer NET/IB devices than the others ({most})",
            evidence={"ib_devices": {h: list(top.ib_devices.get(h, ())) for h in top.hosts}},
        )
    ]


def _hosts_of_ranks(rows: Sequence[Mapping[str, Any]]) -> dict[int, str]:
    """rank -> host, for hosts that are one node: a host name two processes print with one cudaDev is
    several nodes behind one name (an anonymised paste: ``<cluster_name>``), so its ranks are left out."""
    devices: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for r in rows:
        devices[str(r.get("host"))].add((int(r.get("pid") or 0), int(r.get("cuda_dev") or 0)))
    shared = {h for h, procs in devices.items() if len({dev for _, dev in procs}) < len(procs)}
    return {
        int(r["rank"]): str(r.get("host"))
        for r in rows
        if r.get("rank") is not None and str(r.get("host")) not in shared
    }


def _intranode_net(top: NcclTopology) -> list[NcclRule]:
    host_of = _hosts_of_ranks(top.rank_rows)
    pairs, rows = [], []
    for r in top.rank_rows:
        if r.get("rank") is None or int(r["rank"]) not in host_of:
            continue
        same_host = [p for p in r.get("net_peers") or () if host_of.get(int(p)) == host_of[int(r["rank"])]]
        if same_host:
            rows.append(r)
            pairs += [(int(r["rank"]), int(p)) for p in same_host]
    if not pairs:
        return []
    hosts, ranks = _who(rows)
    unique = sorted({tuple(sorted(p)) for p in pairs})
    return [
        NcclRule(
            rule="nccl_intranode_net",
            verdict="warn",
            hosts=hosts,
            ranks=ranks,
            title=f"{len(unique)} GPU pair(s) on one host connect over NET instead of P2P/SHM "
            f"(ranks {', '.join(f'{a}-{b}' for a, b in unique[:4])}{'...' if len(unique) > 4 else ''})",
            evidence={
                "pairs": [list(p) for p in unique[:32]],
                "env": {k: v for k, v in top.env.items() if k in _INTRANODE_VARIABLES},
            },
        )
    ]


def nccl_rules(top: NcclTopology, *, config: NcclConfig = NcclConfig()) -> list[NcclRule]:
    """Every rule that fired on the job (an empty list for a clean log)."""
    return (
        _socket_fallback(top, config)
        + _few_channels(top)
        + _forced(top)
        + _mismatch(top)
        + _ib_missing(top)
        + _intranode_net(top)
    )
