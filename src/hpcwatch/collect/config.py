"""The collector's one TOML file: every key, its default and its meaning (docs/deploy.md lists them too).

```toml
[store]
path = "/var/lib/hpcwatch/store"     # the store folder serve/exporter read (--db)

[collect]
status_every_s = 5.0                  # how often STORE/collect/status.json is rewritten
stop_timeout_s = 10.0                 # on SIGTERM, how long a running collector may finish

[[slurm]]                             # one table per Slurm to poll
mode = "rest"                         # "rest" (slurmrestd) or "cli" (squeue/sacct/sinfo --json)
...
```

``[notify]`` (one table, see ``hpcwatch.notify.config``) runs ``hpcwatch notify`` in the daemon, every
``interval_s``, as one more collector named ``notify``; ``[act]`` (``hpcwatch.act.config``) runs the policies
that act (``hpcwatch act``) the same way, as a collector named ``act``, its warnings through ``[notify]``.
``[active]`` (with its ``[[active.check]]`` tables; off by default) runs the active tests on idle nodes at a
cadence, as a collector named ``active`` (``collect/active.py``).

Collector tables are arrays (``[[slurm]]``, ``[[prometheus]]``, ``[[scrape]]``, ``[[follow]]``,
``[[spool]]``, ``[[schedule]]``), each entry one collector with its own ``interval_s``; ``name``
(default: the kind and its position, ``follow-2``) names it in the status and on /metrics. A key
that is not listed, or a value of the wrong type, is a ``ConfigError`` naming the file and line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_type_hints

from hpcwatch.act.config import ActConfig, parse_act
from hpcwatch.errors import ConfigError
from hpcwatch.notify.config import NotifyConfig, parse_notify
from hpcwatch.tomlkeys import KeyLines, load_toml, typed

__all__ = [
    "CollectConfig",
    "StoreSection",
    "DaemonSection",
    "SlurmSection",
    "PrometheusSection",
    "ScrapeSection",
    "FollowSection",
    "SpoolSection",
    "LiveSection",
    "ScheduleSection",
    "ReceiveSection",
    "AgentSection",
    "AgentCheck",
    "ActiveSection",
    "ActiveCheck",
    "load_config",
    "parse_config",
    "DEFAULT_CONFIG_PATH",
    "FOLLOW_FORMATS",
    "SCHEDULE_TASKS",
    "SECTIONS",
]

DEFAULT_CONFIG_PATH = Path("/etc/hpcwatch/hpcwatch.toml")
#: Line-oriented formats a follower can read (their readers parse lines: sources/falco, tetragon, hook,
#: nccl_log — the last through its stream, collect/follow.STREAM_PARSERS).
FOLLOW_FORMATS = ("falco-json", "tetragon-json", "hook-jsonl", "nccl-log")
SCHEDULE_TASKS = ("scan", "health", "assess")


def _positive(section: Any, *names: str) -> None:
    for name in names:
        if getattr(section, name) <= 0:
            raise ValueError(f"{name} must be > 0, got {getattr(section, name)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreSection:
    path: str = "/var/lib/hpcwatch/store"
    """The store folder ``collect`` writes and ``serve``/``exporter`` read (their ``--db``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DaemonSection:
    node: str = ""
    """This daemon's name in its status file and its cursors (empty: the host name). Daemons writing one
    store (a DaemonSet's pods) must have different names."""
    status_every_s: float = 5.0
    """How often the status file (STORE/collect/status.json) is rewritten."""
    stop_timeout_s: float = 10.0
    """On SIGTERM/SIGINT, how long running collectors may take to finish their run."""

    def __post_init__(self) -> None:
        _positive(self, "status_every_s", "stop_timeout_s")


@dataclass(frozen=True, slots=True, kw_only=True)
class SlurmSection:
    name: str = ""
    mode: Literal["rest", "cli"] = "rest"
    """``rest``: slurmrestd's API; ``cli``: ``squeue --json``, ``sacct --json``, ``sinfo --json``."""
    url: str = "unix:/run/slurmrestd/slurmrestd.socket"
    """slurmrestd: ``unix:/path`` (rest_auth/local) or ``http://host:6820`` (rest_auth/jwt)."""
    api_version: str = "v0.0.38"
    """OpenAPI plugin version of the paths (Slurm 22.05: v0.0.38; 23.02: v0.0.39; 23.11+: v0.0.40...)."""
    user: str = ""
    """JWT only: the X-SLURM-USER-NAME header."""
    token_file: str = ""
    """JWT only: a file holding the token (``scontrol token``), re-read every poll so it can be renewed."""
    interval_s: float = 30.0
    timeout_s: float = 10.0
    """Seconds per request or command."""
    jobs: bool = True
    """The controller's jobs (pending, running, ended within MinJobAge)."""
    accounting: bool = True
    """slurmdbd's jobs (``/slurmdb/.../jobs`` or ``sacct``): jobs that ended between two polls too."""
    accounting_window_s: float = 86400.0
    """How far back the first accounting poll looks; later polls start where the last one ended."""
    nodes: bool = True
    partitions: bool = True
    slurm_conf: str = ""
    """cli mode: SLURM_CONF for the commands (empty: their default)."""

    def __post_init__(self) -> None:
        _positive(self, "interval_s", "timeout_s", "accounting_window_s")
        if self.mode == "rest" and not re.match(r"(unix:/|https?://)", self.url):
            raise ValueError(f"url must be unix:/path or http(s)://host:port, got {self.url!r}")
        if bool(self.user) != bool(self.token_file):
            raise ValueError("user and token_file go together (JWT), or neither (local auth)")


@dataclass(frozen=True, slots=True, kw_only=True)
class PrometheusSection:
    name: str = ""
    url: str = "http://127.0.0.1:9090"
    """Prometheus / VictoriaMetrics / Thanos base URL (no /api/v1)."""
    metrics: tuple[str, ...] = ()
    """Metric names to copy (empty: every series with a Hostname, hostname or hpc_job label)."""
    interval_s: float = 30.0
    lookback_s: float = 300.0
    """How far back the first poll reads; later polls read from where the last one ended."""
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        _positive(self, "interval_s", "lookback_s", "timeout_s")


@dataclass(frozen=True, slots=True, kw_only=True)
class ScrapeSection:
    name: str = ""
    url: str = ""
    """An exporter endpoint, e.g. http://node1:9400/metrics (dcgm-exporter) or :9100 (node-exporter)."""
    interval_s: float = 15.0
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        _positive(self, "interval_s", "timeout_s")
        if not re.match(r"https?://", self.url):
            raise ValueError(f"url must be http(s)://host:port/path, got {self.url!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class FollowSection:
    name: str = ""
    path: str = ""
    """The log to follow like tail -F (rotation and truncation handled, position kept in the store)."""
    format: str = "falco-json"
    """One of FOLLOW_FORMATS."""
    interval_s: float = 2.0
    max_batch_bytes: int = 8 << 20
    """At most this many bytes per commit (a backlog is read in several commits)."""

    def __post_init__(self) -> None:
        _positive(self, "interval_s", "max_batch_bytes")
        if not self.path:
            raise ValueError("path is required")
        if self.format not in FOLLOW_FORMATS:
            raise ValueError(f"format must be one of {', '.join(FOLLOW_FORMATS)}, got {self.format!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SpoolSection:
    name: str = ""
    path: str = ""
    """A folder where cron jobs or a Slurm epilog drop files (nvidia-smi, perfquery, job_stats, health...)."""
    format: str = ""
    """Force one format (empty: each file's format is detected, as ``hpcwatch ingest`` does)."""
    host: str = ""
    """The node the files belong to, for formats that do not say it (empty: from the file name)."""
    interval_s: float = 30.0
    settle_s: float = 5.0
    """A file is read once unchanged for this long (a writer may still be writing it)."""

    def __post_init__(self) -> None:
        _positive(self, "interval_s")
        if self.settle_s < 0:
            raise ValueError(f"settle_s must be >= 0, got {self.settle_s}")
        if not self.path:
            raise ValueError("path is required")


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveSection:
    """The training hook's live stream (collect/live.py): a per-node spool folder of ``<job>/rank-N.jsonl``."""

    name: str = ""
    path: str = ""
    """The folder the hooks write to (their ``HPCWATCH_LIVE_DIR``)."""
    interval_s: float = 1.0
    window_steps: int = 20
    """Steps kept per rank: the straggler verdict is on these."""
    hang_after_s: float = 60.0
    """No rank advancing this long is a hang (above the job's longest pause: checkpoints, evaluation)."""
    dump_on_hang: bool = True
    """Ask the ranks for a Flight Recorder dump when a hang is named (they write it; nothing is killed)."""
    max_records_per_s: float = 2000.0
    """Per rank: lines past this rate are refused and counted (a step is ~10 lines)."""

    def __post_init__(self) -> None:
        _positive(self, "interval_s", "hang_after_s", "max_records_per_s")
        if self.window_steps < 3:
            raise ValueError(f"window_steps must be >= 3 (a straggler verdict needs 3 steps), got {self.window_steps}")
        if not self.path:
            raise ValueError("path is required")


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSection:
    name: str = ""
    task: Literal["scan", "health", "assess"] = "scan"
    """``scan``: the security detectors (findings replace the previous scan's); ``health``: health rules;
    ``assess``: the ClusterMAX-style assessment (reports/assess), its verdict stored as an ``assessment`` event."""
    interval_s: float = 300.0
    window_s: float = 3600.0
    """scan: look at the last S seconds of data (0: the whole store). assess: unused (the criteria set their windows)."""
    cluster: str = ""
    """assess: the cluster model YAML (empty: the reference cluster, as ``hpcwatch assess``)."""

    def __post_init__(self) -> None:
        _positive(self, "interval_s")
        if self.task not in SCHEDULE_TASKS:
            raise ValueError(f"task must be one of {', '.join(SCHEDULE_TASKS)}, got {self.task!r}")
        if self.window_s < 0:
            raise ValueError(f"window_s must be >= 0, got {self.window_s}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiveSection:
    """The central end of the agents' HTTP push (collect/receive.py): shipments into a spool folder."""

    name: str = ""
    listen: str = "0.0.0.0:8471"
    """HOST:PORT to listen on (port 0: any free port, said in the status note)."""
    spool: str = ""
    """The folder shipments are written to; a ``[[spool]]`` of this file must read it."""
    tokens_file: str = ""
    """One ``NODE TOKEN`` a line (``#`` comments): the bearer token each node's agent sends. Re-read when it
    changes. Keep it 0600, owned by the collector's user."""
    cert_file: str = ""
    key_file: str = ""
    """TLS: the server certificate chain and its key (PEM); both empty: plain HTTP."""
    max_body_bytes: int = 8 << 20
    """A request body larger than this is refused (413) before it is read."""
    rate_per_s: float = 5.0
    burst: int = 120
    """Per node: a token bucket of ``burst`` requests refilled at ``rate_per_s``; past it, 429 + Retry-After."""
    interval_s: float = 30.0
    """How often the status note (accepted, refused) is refreshed."""
    live_spool: str = ""
    """Where hooks' pushed live streams are appended (``POST /v1/live/JOB/RANK``), for a ``[[live]]`` of that
    folder; empty: live pushes are refused (404)."""

    def __post_init__(self) -> None:
        _positive(self, "max_body_bytes", "rate_per_s", "burst", "interval_s")
        if not self.spool:
            raise ValueError("spool is required")
        if not self.tokens_file:
            raise ValueError("tokens_file is required (the agents authenticate)")
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("cert_file and key_file go together (TLS), or neither (plain HTTP)")
        if not re.fullmatch(r"\[?[0-9A-Za-z.:-]*\]?:\d{1,5}", self.listen):
            raise ValueError(f"listen must be HOST:PORT, got {self.listen!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentCheck:
    """One command the agent runs on its node (``[[agent.check]]``)."""

    name: str = ""
    command: tuple[str, ...] = ()
    """The argument vector (no shell), e.g. ["nvidia-smi", "-q", "-x"]."""
    format: str = ""
    """The registry format its output is read with at the centre (``hpcwatch ingest --list-formats``)."""
    interval_s: float = 60.0
    timeout_s: float = 30.0
    """Killed (its process group) after this long; the shipment then says timed_out."""
    max_output_bytes: int = 4 << 20
    """Output past this is cut (the shipment says truncated, and the centre does not read it)."""

    def __post_init__(self) -> None:
        _positive(self, "interval_s", "timeout_s", "max_output_bytes")
        if not self.command:
            raise ValueError("command is required")
        if not self.format:
            raise ValueError("format is required")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", self.name):
            raise ValueError(f"name must be [A-Za-z0-9._-] (it names files), got {self.name!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentSection:
    """``hpcwatch collect --agent``: the host checks of this node, and where their results go."""

    node: str = ""
    """This node's name in its shipments (empty: ``$HPCWATCH_NODE``, else the host name)."""
    spool: str = ""
    """Ship by writing into this (shared) folder, which the central ``[[spool]]`` reads."""
    push_url: str = ""
    """Or ship by HTTP POST to the central ``[[receive]]``: http(s)://central:8471 (exactly one of the two)."""
    token_file: str = ""
    """push: a file holding this node's bearer token (its line of the centre's tokens_file)."""
    ca_file: str = ""
    """push over https: the CA bundle that signed the centre's certificate (empty: the system's)."""
    queue_dir: str = "/var/lib/hpcwatch-agent/queue"
    """Shipments wait here while the centre (or the shared folder) is unreachable."""
    max_queue: int = 1000
    """At most this many wait; past it the oldest are dropped (and counted)."""
    timeout_s: float = 10.0
    """Seconds per push request."""
    backoff_max_s: float = 60.0
    """Retries after a failure wait 1 s, 2 s, 4 s... up to this (plus up to 10 % jitter)."""
    checks: tuple[AgentCheck, ...] = ()

    def __post_init__(self) -> None:
        _positive(self, "max_queue", "timeout_s", "backoff_max_s")
        if bool(self.spool) == bool(self.push_url):
            raise ValueError("give exactly one of spool (a shared folder) and push_url (HTTP push)")
        if self.push_url and not re.match(r"https?://[^/]+", self.push_url):
            raise ValueError(f"push_url must be http(s)://host:port, got {self.push_url!r}")
        if self.push_url and not self.token_file:
            raise ValueError("push_url needs token_file (the centre refuses unauthenticated pushes)")


#: A program or user name as it may go into a batch script or an argv (no spaces, quotes or shell signs).
_PLAIN = re.compile(r"[A-Za-z0-9_./@:+-]*")
#: What each active check runs when ``program`` is empty.
ACTIVE_PROGRAMS = {"dcgmi_diag": "dcgmi", "nccl_tests": "all_reduce_perf", "ib_write_bw": "ib_write_bw"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ActiveCheck:
    """One active test of ``[active]`` (``[[active.check]]``), run on each node in scope at its cadence."""

    kind: Literal["dcgmi_diag", "nccl_tests", "ib_write_bw"] = "dcgmi_diag"
    """``dcgmi_diag`` (``dcgmi diag -r LEVEL -j``), ``nccl_tests`` (``all_reduce_perf ARGS``; rccl-tests' own
    ``all_reduce_perf`` on AMD nodes prints the same table), ``ib_write_bw`` (loopback through ``device``)."""
    every_minutes: float = 1440.0
    """Cadence: a node is due when its last run of this check started this long ago (or never ran)."""
    program: str = ""
    """The program on the node (empty: ``dcgmi``, ``all_reduce_perf``, ``ib_write_bw`` on its PATH)."""
    level: int = 1
    """dcgmi_diag: ``-r LEVEL`` (1: seconds, 2: about 2 min, 3: about 30 min, 4: hours; DCGM's user guide)."""
    args: tuple[str, ...] = ("-b", "8", "-e", "1G", "-f", "2", "-g", "8")
    """nccl_tests: all_reduce_perf's arguments (one node's GPUs: ``-g`` GPUs per process)."""
    device: str = "mlx5_0"
    """ib_write_bw: the HCA (``-d``)."""

    def __post_init__(self) -> None:
        _positive(self, "every_minutes")
        if self.level not in (1, 2, 3, 4):
            raise ValueError(f"level must be 1, 2, 3 or 4 (dcgmi diag -r), got {self.level}")
        for name in ("program", "device"):
            if not _PLAIN.fullmatch(getattr(self, name)):
                raise ValueError(f"{name} must be a plain name or path (no spaces, quotes or shell signs)")

    @property
    def command(self) -> str:
        return self.program or ACTIVE_PROGRAMS[self.kind]


@dataclass(frozen=True, slots=True, kw_only=True)
class ActiveSection:
    """``[active]``: the active tests as Slurm jobs on idle nodes only, each check at its cadence."""

    name: str = "active"
    enabled: bool = False
    """Off by default: it reserves nodes and submits jobs."""
    interval_s: float = 60.0
    """How often it looks for finished check jobs and for idle nodes that are due."""
    partitions: tuple[str, ...] = ()
    """Only nodes of these partitions (empty: any partition)."""
    nodes: tuple[str, ...] = ()
    """Only these nodes (empty: every node of ``partitions``)."""
    exempt_nodes: tuple[str, ...] = ()
    max_nodes: int = 1
    """At most this many nodes under test at once (across all checks)."""
    time_limit_minutes: float = 15.0
    """The check job's ``sbatch --time``; its reservation lasts this plus 5 minutes."""
    work_dir: str = "/var/lib/hpcwatch/active"
    """The check jobs' scripts and outputs: a folder the nodes can write and the collector read."""
    reservation_user: str = "root"
    """The reservation's user: the collector's own user, who submits the check jobs."""
    partition: str = ""
    """sbatch --partition (empty: the default; the reservation names the node anyway)."""
    link: str = "ndr"
    """The catalog's link the IB results are judged against."""
    command_timeout_s: float = 30.0
    """Each scontrol / sbatch / scancel / squeue."""
    scontrol: str = "scontrol"
    sbatch: str = "sbatch"
    scancel: str = "scancel"
    squeue: str = "squeue"
    checks: tuple[ActiveCheck, ...] = ()

    def __post_init__(self) -> None:
        _positive(self, "interval_s", "max_nodes", "time_limit_minutes", "command_timeout_s")
        for name in ("reservation_user", "partition", "work_dir"):
            if not _PLAIN.fullmatch(getattr(self, name)):
                raise ValueError(f"{name} must be a plain name or path (no spaces, quotes or shell signs)")
        for name in ("partitions", "nodes", "exempt_nodes"):
            if not all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", v) for v in getattr(self, name)):
                raise ValueError(f"{name} must be plain names (no commas, brackets or spaces)")

    @property
    def commands(self) -> dict[str, str]:
        return {c: getattr(self, c) for c in ("scontrol", "sbatch", "scancel", "squeue")}


#: Collector kinds: the TOML array name and its section type.
SECTIONS: dict[str, type] = {
    "slurm": SlurmSection,
    "prometheus": PrometheusSection,
    "scrape": ScrapeSection,
    "follow": FollowSection,
    "spool": SpoolSection,
    "live": LiveSection,
    "schedule": ScheduleSection,
    "receive": ReceiveSection,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectConfig:
    path: str = ""
    """The file this was read from."""
    store: StoreSection = field(default_factory=StoreSection)
    collect: DaemonSection = field(default_factory=DaemonSection)
    collectors: tuple[Any, ...] = ()
    """Every collector section, in file order within each kind (``[notify]``'s last, when there is one)."""
    notify: NotifyConfig | None = None
    """The ``[notify]`` table (also one of ``collectors``), None when the file has none."""
    agent: AgentSection | None = None
    """The ``[agent]`` table (``hpcwatch collect --agent``), None when the file has none."""
    act: ActConfig | None = None
    """The ``[act]`` table (also the last of ``collectors``), None when the file has none."""
    active: ActiveSection | None = None
    """The ``[active]`` table (also one of ``collectors`` when enabled), None when the file has none."""


def load_config(path: str | Path) -> CollectConfig:
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the config: {err.strerror or err}") from err
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 (byte {err.start})") from err
    return parse_config(text, path=str(path))


def parse_config(text: str, *, path: str = "<config>") -> CollectConfig:
    doc = load_toml(text, path)
    lines = KeyLines(text)
    for key in doc:
        if key not in ("store", "collect", "notify", "act", "agent", "active", *SECTIONS):
            raise ConfigError(
                f"{path}:{lines.find(None, 0, key)}: unknown table [{key}] "
                f"(known: store, collect, notify, act, agent, active, {', '.join(SECTIONS)})"
            )
    store = _section(StoreSection, doc.get("store", {}), "store", None, path, lines)
    daemon = _section(DaemonSection, doc.get("collect", {}), "collect", None, path, lines)
    collectors = []
    for kind, cls in SECTIONS.items():
        entries = doc.get(kind, [])
        if not isinstance(entries, list):
            raise ConfigError(
                f"{path}:{lines.find(None, 0, kind)}: [{kind}] must be an array of tables: write [[{kind}]]"
            )
        for i, entry in enumerate(entries):
            section = _section(cls, entry, kind, i, path, lines)
            collectors.append(section)
    notify = parse_notify(doc["notify"], path=path, text=text) if "notify" in doc else None
    if notify is not None:
        collectors.append(notify)
    act = parse_act(doc["act"], path=path, text=text, has_notify=notify is not None) if "act" in doc else None
    if act is not None:
        collectors.append(act)
    active = _active(doc["active"], path, lines) if "active" in doc else None
    if active is not None and active.enabled:
        collectors.append(active)
    names = [c.name for c in collectors]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"{path}: two collectors are named {name!r}; names must differ")
    agent = _agent(doc["agent"], path, lines) if "agent" in doc else None
    spools = {str(Path(c.path)) for c in collectors if isinstance(c, SpoolSection)}
    for c in collectors:
        if isinstance(c, ReceiveSection) and str(Path(c.spool)) not in spools:
            raise ConfigError(
                f"{path}:{lines.find('receive', 0, 'spool')}: [receive] spool {c.spool!r} is read by no [[spool]] "
                "of this file: add one with that path, or the shipments are never stored"
            )
    return CollectConfig(
        path=path,
        store=store,
        collect=daemon,
        collectors=tuple(collectors),
        notify=notify,
        agent=agent,
        act=act,
        active=active,
    )


def _agent(raw: Any, path: str, lines: KeyLines) -> AgentSection:
    """``[agent]`` and its ``[[agent.check]]`` array; each check's format must be a registered one."""
    from hpcwatch.errors import ParseError
    from hpcwatch.sources.registry import format_named

    if not isinstance(raw, dict):
        raise ConfigError(f"{path}:{lines.find('agent', None, None)}: [agent] must be a table")
    raw = dict(raw)
    entries = raw.pop("check", [])
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}:{lines.find('agent', None, None)}: [agent] needs [[agent.check]] tables")
    checks: list[AgentCheck] = []
    for i, entry in enumerate(entries):
        if isinstance(entry, dict) and "name" not in entry and isinstance(entry.get("format"), str):
            entry = {**entry, "name": entry["format"] if not i else f"{entry['format']}-{i + 1}"}
        check = _section(AgentCheck, entry, "agent.check", i, path, lines)
        if check.name in {c.name for c in checks}:
            raise ConfigError(f"{path}:{lines.find('agent.check', i, 'name')}: two checks are named {check.name!r}")
        try:
            fmt = format_named(check.format)
        except ParseError as err:
            raise ConfigError(f"{path}:{lines.find('agent.check', i, 'format')}: [agent.check] {err.what}") from err
        if fmt.yields != "records" or fmt.folder:
            raise ConfigError(
                f"{path}:{lines.find('agent.check', i, 'format')}: [agent.check] format {fmt.name!r} is not a "
                "file of records (a command's output must be one)"
            )
        checks.append(check)
    section: AgentSection = _section(AgentSection, raw, "agent", None, path, lines)
    return replace(section, checks=tuple(checks))


def _active(raw: Any, path: str, lines: KeyLines) -> ActiveSection:
    """``[active]`` and its ``[[active.check]]`` array; an enabled one needs a check, each kind once."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}:{lines.find('active', None, None)}: [active] must be a table")
    raw = dict(raw)
    entries = raw.pop("check", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{path}:{lines.find('active', None, 'check')}: write the checks as [[active.check]]")
    checks = [_section(ActiveCheck, entry, "active.check", i, path, lines) for i, entry in enumerate(entries)]
    for i, check in enumerate(checks):
        if check.kind in {c.kind for c in checks[:i]}:
            raise ConfigError(f"{path}:{lines.find('active.check', i, 'kind')}: two checks of kind {check.kind!r}")
    section: ActiveSection = _section(ActiveSection, raw, "active", None, path, lines)
    if section.enabled and not checks:
        raise ConfigError(
            f"{path}:{lines.find('active', None, 'enabled')}: [active] is enabled but has no [[active.check]]"
        )
    return replace(section, checks=tuple(checks))


def _section(cls: type, raw: Any, table: str, index: int | None, path: str, lines: KeyLines) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}:{lines.find(table, index, None)}: [{table}] must be a table")
    known = get_type_hints(cls)
    known.pop("path", None) if cls is CollectConfig else None
    values: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"{path}:{lines.find(table, index, key)}"
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r} in [{table}] (known: {', '.join(known)})")
        values[key] = typed(value, key, known[key], where, table=table)
    if "name" in known and not values.get("name"):
        values["name"] = table if not index else f"{table}-{index + 1}"  # the first of an array: the plain name
    try:
        return cls(**values)
    except (ValueError, TypeError) as err:
        bad = next((k for k in raw if str(err).startswith(k)), None)
        raise ConfigError(f"{path}:{lines.find(table, index, bad)}: [{table}] {err}") from err
