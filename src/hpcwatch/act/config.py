"""The ``[act]`` table of the TOML file (``hpcwatch act --config`` and ``collect``'s file): every key, its default.

```toml
[act]
interval_s = 60.0                  # collect: how often the policies run
dry_run = false                    # say what would be done; run no Slurm command, queue no notice, store nothing
who = ""                           # who the audit names as the actor (empty: hpcwatch-act@<host>)
command_timeout_s = 30.0           # each scontrol / sbatch / scancel / squeue
scontrol = "scontrol"              # the commands (a path, or a name on PATH); tests give stand-ins
sbatch = "sbatch"
scancel = "scancel"
squeue = "squeue"

[act.idle]                         # policy 1: allocated GPUs left idle
enabled = false
idle_minutes = 30.0                # every GPU of the job idle (health rule idle_allocated) this long ...
grace_minutes = 15.0               # ... a notice to its user, then this long still idle: the action
action = "hold"                    # "hold" (undo: scontrol release) or "cancel" (no undo; must be written)
fallback = "none"                  # Slurm refuses to requeue the job (--no-requeue, JobRequeue=0, not a batch job):
                                   # "none" (told, left running) or "cancel" (scancel; must be written)
allow_jobs = []                    # never acted on
allow_users = []
exempt_partitions = []
exempt_accounts = []

[act.remediate]                    # policy 2: a drained node is tested and given back when it passes
enabled = false
nodes = []                         # only these nodes (empty: every node)
exempt_nodes = []                  # never these
work_dir = "/var/lib/hpcwatch/act" # the check job's script and outputs: a folder the node can write
reservation_user = "root"          # the reservation's user, who the check job runs as
reservation_minutes = 60.0
check_timeout_minutes = 60.0       # a check job that has not finished by then: a failure (kept drained)
warn_minutes = 15.0                # a notice to the operators, then this long before the node is reserved
partition = ""                     # sbatch --partition (empty: the default)
diag_level = 1                     # dcgmi diag -r N
gpus = 8                           # all_reduce_perf -g N
ib_device = "mlx5_0"               # ib_write_bw -d DEVICE (loopback on the node)
link = "ndr"                       # the catalog's link the IB results are judged against
dcgmi = "dcgmi"                    # the check programs as the node runs them
all_reduce_perf = "all_reduce_perf"
ib_write_bw = "ib_write_bw"
```

Both policies warn before they act, and stand down when the warning is withdrawn (``hpcwatch act undo`` of the
``warn`` step). The policies warn through ``[notify]`` (its channels and its once-only notice keys): a policy enabled in a file
without a ``[notify]`` table is refused, since its warning would reach no one. A key that is not listed, a value of
the wrong type, ``action`` other than hold/cancel: a ``ConfigError`` naming the file and the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, get_type_hints

from hpcwatch.errors import ConfigError
from hpcwatch.tomlkeys import KeyLines, load_toml, typed

__all__ = [
    "ActConfig",
    "IdlePolicy",
    "RemediatePolicy",
    "parse_act",
    "parse_act_text",
    "DEFAULT_INTERVAL_S",
    "DEFAULT_COMMAND_TIMEOUT_S",
    "COMMANDS",
]

DEFAULT_INTERVAL_S = 60.0
#: Ours: scontrol and sbatch answer in well under a second on a healthy controller; 30 s is a controller in trouble.
DEFAULT_COMMAND_TIMEOUT_S = 30.0
#: The Slurm commands the runner may run, by their key in ``[act]``.
COMMANDS = ("scontrol", "sbatch", "scancel", "squeue")


def _positive(obj: Any, *names: str) -> None:
    for name in names:
        if getattr(obj, name) <= 0:
            raise ValueError(f"{name} must be > 0, got {getattr(obj, name)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class IdlePolicy:
    enabled: bool = False
    idle_minutes: float = 30.0
    """Every GPU the job holds at or under the health rule's idle utilisation (5 %) for this long (data clock)."""
    grace_minutes: float = 15.0
    """After the warning, the job must stay idle this long more (data clock, and as long on the wall clock)."""
    action: Literal["hold", "cancel"] = "hold"
    """``hold``: ``scontrol requeuehold`` (undo: ``scontrol release``); ``cancel``: ``scancel`` (cannot be undone)."""
    fallback: Literal["none", "cancel"] = "none"
    """When Slurm refuses to requeue the job (``idle.NOT_REQUEUEABLE``): ``none`` tells its user and the operators
    and leaves it running; ``cancel`` cancels it. Never an escalation that was not written."""
    allow_jobs: tuple[str, ...] = ()
    allow_users: tuple[str, ...] = ()
    exempt_partitions: tuple[str, ...] = ()
    exempt_accounts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _positive(self, "idle_minutes", "grace_minutes")
        if self.action == "cancel" and self.fallback != "none":
            raise ValueError(
                f"fallback = {self.fallback!r} is the fallback of action = 'hold': with 'cancel' write none"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class RemediatePolicy:
    enabled: bool = False
    nodes: tuple[str, ...] = ()
    """Only these nodes (empty: every node with a drain verdict)."""
    exempt_nodes: tuple[str, ...] = ()
    work_dir: str = "/var/lib/hpcwatch/act"
    reservation_user: str = "root"
    reservation_minutes: float = 60.0
    check_timeout_minutes: float = 60.0
    warn_minutes: float = 15.0
    """A notice to the operators (what will be done, how to stop it), then this long before the first command."""
    partition: str = ""
    diag_level: int = 1
    gpus: int = 8
    ib_device: str = "mlx5_0"
    link: str = "ndr"
    dcgmi: str = "dcgmi"
    all_reduce_perf: str = "all_reduce_perf"
    ib_write_bw: str = "ib_write_bw"

    def __post_init__(self) -> None:
        _positive(self, "reservation_minutes", "check_timeout_minutes", "warn_minutes", "gpus")
        if self.diag_level not in (1, 2, 3, 4):
            raise ValueError(f"diag_level must be 1, 2, 3 or 4 (dcgmi diag -r), got {self.diag_level}")
        for name in ("reservation_user", "ib_device", "partition", "dcgmi", "all_reduce_perf", "ib_write_bw"):
            if not re.fullmatch(r"[A-Za-z0-9_./@:+-]*", getattr(self, name)):
                raise ValueError(f"{name} must be a plain name or path (no spaces, quotes or shell signs)")


@dataclass(frozen=True, slots=True, kw_only=True)
class ActConfig:
    name: str = "act"
    """Its name in ``collect``'s status."""
    interval_s: float = DEFAULT_INTERVAL_S
    dry_run: bool = False
    who: str = ""
    command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
    scontrol: str = "scontrol"
    sbatch: str = "sbatch"
    scancel: str = "scancel"
    squeue: str = "squeue"
    idle: IdlePolicy = IdlePolicy()
    remediate: RemediatePolicy = RemediatePolicy()

    def __post_init__(self) -> None:
        _positive(self, "interval_s", "command_timeout_s")

    @property
    def commands(self) -> dict[str, str]:
        return {c: getattr(self, c) for c in COMMANDS}


def parse_act_text(text: str, *, path: str = "<config>") -> tuple[ActConfig, Any]:
    """The ``[act]`` table of a whole TOML file and its ``[notify]`` table (``NotifyConfig`` or None)."""
    from hpcwatch.notify.config import parse_notify

    doc = load_toml(text, path)
    if "act" not in doc:
        raise ConfigError(f"{path}: no [act] table")
    notify = parse_notify(doc["notify"], path=path, text=text) if "notify" in doc else None
    return parse_act(doc["act"], path=path, text=text, has_notify=notify is not None), notify


def parse_act(raw: Any, *, path: str, text: str, has_notify: bool) -> ActConfig:
    """The ``[act]`` table already read by tomllib; ``text`` is the file, for line numbers."""
    lines = KeyLines(text)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}:{lines.find('act', None, None)}: [act] must be a table")
    values = _fields(ActConfig, raw, "act", path, lines, skip=("name", "idle", "remediate"))
    for key, cls in (("idle", IdlePolicy), ("remediate", RemediatePolicy)):
        if key in raw:
            sub = raw[key]
            if not isinstance(sub, dict):
                raise ConfigError(f"{path}:{lines.find('act', None, key)}: {key} must be a table: write [act.{key}]")
            values[key] = _build(cls, _fields(cls, sub, f"act.{key}", path, lines), sub, f"act.{key}", path, lines)
    config = _build(ActConfig, values, raw, "act", path, lines)
    for key in ("idle", "remediate"):
        if getattr(config, key).enabled and not has_notify:
            raise ConfigError(
                f"{path}:{lines.find(f'act.{key}', None, 'enabled')}: [act.{key}] is enabled but the file has no [notify] "
                "table: its warnings and notices would reach no one"
            )
    return config


def _fields(cls: type, raw: dict[str, Any], table: str, path: str, lines: KeyLines, skip: tuple[str, ...] = ()) -> dict:
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if table == "act" and key in ("idle", "remediate"):
            continue
        where = f"{path}:{lines.find(table, None, key)}"
        if key not in hints or key in skip:
            known = ", ".join(k for k in hints if k not in skip)
            extra = ", idle, remediate" if table == "act" else ""
            raise ConfigError(f"{where}: unknown key {key!r} in [{table}] (known: {known}{extra})")
        values[key] = typed(value, key, hints[key], where)
    return values


def _build(cls: type, values: dict[str, Any], raw: dict[str, Any], table: str, path: str, lines: KeyLines) -> Any:
    try:
        return cls(**values)
    except ValueError as err:
        bad = next((k for k in raw if str(err).startswith(k)), None)
        raise ConfigError(f"{path}:{lines.find(table, None, bad)}: [{table}] {err}") from err
