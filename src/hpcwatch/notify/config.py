"""The ``[notify]`` table of the TOML file (``hpcwatch notify --config`` and ``collect``'s file): every key,
its default and its meaning (docs/usage.md lists them too).

```toml
[notify]
interval_s = 60.0                   # collect: how often notify runs
lookback_s = 86400.0                # what counts as new on a first run: the last S seconds
language = "en"                     # operators', coordinators' and unmapped users' language (en, fr)
user_template = "{user}@example.org"
operators = ["hpc-ops@example.org"]
security = ["cert@example.org"]

[notify.users]                      # user -> address (first choice; then --mail-user; then the template)
alice = "alice@lab.example.org"

[notify.languages]                  # user -> language
alice = "fr"

coordinators_file = "/var/lib/hpcwatch/coordinators.txt"  # sacctmgr show user withcoordinator --parsable2

[notify.coordinators]               # account -> addresses, added to the file's coordinators (the account's digest)
proj-llm = ["pi-llm@example.org"]

[[notify.channel]]                  # one table per channel: type is a name of channels.CHANNELS
type = "smtp"
host = "smtp.example.org"
```

A key that is not listed, a value of the wrong type, an unknown channel type, a ``user_template``
naming a field other than ``{user}`` / ``{account}``, a template folder whose templates name an
unknown field, or a ``coordinators_file`` missing or not sacctmgr's listing: a ``ConfigError`` naming
the file and the line (and, for the coordinators file, its own line).
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, get_type_hints
from urllib.parse import urlsplit

from hpcwatch.errors import ConfigError
from hpcwatch.notify.address import check_address
from hpcwatch.notify.channels import CHANNELS
from hpcwatch.notify.coordinators import watch_coordinators
from hpcwatch.tomlkeys import KeyLines, load_toml, typed

__all__ = [
    "NotifyConfig",
    "ChannelSection",
    "parse_notify",
    "parse_notify_text",
    "AUDIENCES",
    "KINDS",
    "USER_TEMPLATE_FIELDS",
    "DEFAULT_INTERVAL_S",
    "DEFAULT_LOOKBACK_S",
    "DEFAULT_RATE_PER_HOUR",
]

#: Who a notice is for: the job's user, its account's coordinators, the operators, the security contacts.
AUDIENCES = ("user", "coordinators", "operators", "security")
#: What is sent: a node's health verdict warn/drain, a finding, a job's end (its report), a digest.
KINDS = ("health", "finding", "job_end", "digest")
USER_TEMPLATE_FIELDS = ("user", "account")
DEFAULT_INTERVAL_S = 60.0
DEFAULT_LOOKBACK_S = 86400.0
#: Ours: a user hearing of 30 things in an hour has stopped reading; the rest waits for the next hour.
DEFAULT_RATE_PER_HOUR = 30
LANGUAGES = ("en", "fr")
_SEVERITIES = ("info", "low", "medium", "high", "critical")


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelSection:
    name: str
    """The channel's name in logs and in the store's delivery rows (default: its type, then type-N)."""
    type: str
    """A name of ``notify.channels.CHANNELS``: ``smtp``, ``webhook``, ``slack``."""
    audiences: tuple[str, ...]
    """Whose notices it carries (default: mail carries all four, a webhook operators and security)."""
    options: Any
    """The channel type's own frozen config (``SmtpConfig``, ``WebhookConfig``, ``SlackConfig``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NotifyConfig:
    name: str = "notify"
    """Its name in ``collect``'s status."""
    interval_s: float = DEFAULT_INTERVAL_S
    """collect: seconds between two runs (``hpcwatch notify`` without ``--once`` too)."""
    lookback_s: float = DEFAULT_LOOKBACK_S
    """What counts as new: verdicts, findings and job ends of the last S seconds that no delivery row names."""
    kinds: tuple[str, ...] = KINDS
    """Which of ``KINDS`` are sent."""
    health_verdicts: tuple[str, ...] = ("warn", "drain")
    min_severity: str = "high"
    """Findings of this severity and above."""
    digests: tuple[str, ...] = ("daily", "weekly")
    """Digest periods (UTC days from 00:00, weeks from Monday), each per user and per account."""
    language: str = "en"
    languages: Mapping[str, str] = field(default_factory=dict)
    users: Mapping[str, str] = field(default_factory=dict)
    user_template: str = ""
    """``{user}@domain``: a user's address when neither ``users`` nor Slurm's mail-user give one (empty: none)."""
    coordinators: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Account → addresses written by hand: added to the coordinators ``coordinators_file`` names."""
    coordinators_file: str = ""
    """Slurm's coordinators, saved by cron: ``sacctmgr show user withcoordinator --parsable2`` (the file the
    access policy's ``[coordinators] file`` reads); each coordinator's address is found as a job's user's
    is (``users``, then ``user_template``), in their ``languages`` entry. Read at start, again when it changes."""
    operators: tuple[str, ...] = ()
    security: tuple[str, ...] = ()
    rate_per_hour: int = DEFAULT_RATE_PER_HOUR
    """Deliveries per recipient per rolling hour; the rest stays pending for a later run (nothing is dropped)."""
    retry_base_s: float = 30.0
    """A failed channel is tried again after this, doubled at each failure ..."""
    retry_max_s: float = 1800.0
    """... up to this."""
    check_at_start: bool = True
    """Connect to every channel's server at start; one that does not answer stops the start (exit 2)."""
    base_url: str = ""
    """The web app's address, for a link to the job page (empty: no link)."""
    templates: str = ""
    """A folder of templates replacing the package's (same names); checked at start."""
    channels: tuple[ChannelSection, ...] = ()

    def __post_init__(self) -> None:
        for name in ("interval_s", "lookback_s", "rate_per_hour", "retry_base_s", "retry_max_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        _subset("kinds", self.kinds, KINDS)
        _subset("health_verdicts", self.health_verdicts, ("warn", "drain"))
        _subset("digests", self.digests, ("daily", "weekly"))
        if self.min_severity not in _SEVERITIES:
            raise ValueError(f"min_severity must be one of {', '.join(_SEVERITIES)}, got {self.min_severity!r}")
        if self.language not in LANGUAGES:
            raise ValueError(f"language must be one of {', '.join(LANGUAGES)}, got {self.language!r}")
        bad = {u: lang for u, lang in self.languages.items() if lang not in LANGUAGES}
        if bad:
            raise ValueError(f"languages: {next(iter(bad))!r} = {next(iter(bad.values()))!r}: not one of en, fr")
        check_user_template(self.user_template)
        _addresses("operators", self.operators)
        _addresses("security", self.security)
        for user, address in self.users.items():
            _addresses(f"users.{user}", (address,))
        for account, addresses in self.coordinators.items():
            _addresses(f"coordinators.{account}", addresses)
        if self.coordinators_file:
            watch_coordinators(self.coordinators_file)

    def describe(self) -> dict[str, Any]:
        """Every key, as ``collect --check`` shows it: an incoming webhook's URL is its secret (Slack and
        Mattermost put the token in the path), so URLs show their scheme, host and port only."""
        doc = asdict(self)
        for channel in doc["channels"]:
            url = channel["options"].get("url")
            if url:
                parts = urlsplit(url)
                port = f":{parts.port}" if parts.port else ""
                channel["options"]["url"] = f"{parts.scheme}://{parts.hostname}{port}/…"
        return doc


def _addresses(name: str, addresses: tuple[str, ...]) -> None:
    bad = next((a for a in addresses if check_address(a) is None), None)
    if bad is not None:
        raise ValueError(f"{name}: {bad!r} is not one plain mail address (local@domain)")


def _subset(name: str, values: tuple[str, ...], known: tuple[str, ...]) -> None:
    wrong = [v for v in values if v not in known]
    if wrong:
        raise ValueError(f"{name}: unknown {wrong[0]!r} (known: {', '.join(known)})")


def check_user_template(template: str) -> None:
    """``ValueError`` when the template names a field other than ``{user}``/``{account}``, or is not a format."""
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as err:
        raise ValueError(f"user_template {template!r}: {err}") from err
    for name in names:
        if name not in USER_TEMPLATE_FIELDS:
            raise ValueError(
                f"user_template names an unknown field {{{name}}} (known: {', '.join(USER_TEMPLATE_FIELDS)})"
            )


def parse_notify_text(text: str, *, path: str = "<config>") -> NotifyConfig:
    """The ``[notify]`` table of a whole TOML file (other tables, ``collect``'s, are left to their reader)."""
    doc = load_toml(text, path)
    if "notify" not in doc:
        raise ConfigError(f"{path}: no [notify] table")
    return parse_notify(doc["notify"], path=path, text=text)


def parse_notify(raw: Any, *, path: str, text: str) -> NotifyConfig:
    """The ``[notify]`` table already read by tomllib; ``text`` is the file, for line numbers."""
    lines = KeyLines(text)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}:{lines.find('notify', None, None)}: [notify] must be a table")
    hints = get_type_hints(NotifyConfig)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"{path}:{lines.find('notify', None, key)}"
        if key == "channel":
            values["channels"] = _channels(value, path, lines)
            continue
        if key not in hints or key in ("name", "channels"):
            known = ", ".join(k for k in hints if k not in ("name", "channels"))
            raise ConfigError(f"{where}: unknown key {key!r} in [notify] (known: {known}, channel)")
        values[key] = typed(value, key, hints[key], where)
    try:
        return NotifyConfig(**values)
    except ValueError as err:
        bad = max(
            (k for k in raw if str(err).startswith(k)), key=len, default=None
        )  # coordinators_file, not coordinators
        raise ConfigError(f"{path}:{lines.find('notify', None, bad)}: [notify] {err}") from err


def _channels(raw: Any, path: str, lines: KeyLines) -> tuple[ChannelSection, ...]:
    if not isinstance(raw, list):
        raise ConfigError(
            f"{path}:{lines.find('notify', None, 'channel')}: channel must be an array: write [[notify.channel]]"
        )
    out: list[ChannelSection] = []
    for index, entry in enumerate(raw):
        where = f"{path}:{lines.find('notify.channel', index, None)}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: [[notify.channel]] must be a table")
        kind = entry.get("type")
        if kind not in CHANNELS:
            where = f"{path}:{lines.find('notify.channel', index, 'type')}"
            raise ConfigError(f"{where}: unknown channel type {kind!r} (known: {', '.join(CHANNELS)})")
        spec = CHANNELS[kind]
        name = entry.get("name") or (kind if not any(c.type == kind for c in out) else f"{kind}-{index + 1}")
        audiences = entry.get("audiences", list(spec.audiences))
        if not isinstance(audiences, list) or any(a not in AUDIENCES for a in audiences):
            raise ConfigError(
                f"{path}:{lines.find('notify.channel', index, 'audiences')}: audiences must be a list of "
                f"{', '.join(AUDIENCES)}, got {audiences!r}"
            )
        hints = get_type_hints(spec.config)
        options: dict[str, Any] = {}
        for key, value in entry.items():
            if key in ("type", "name", "audiences"):
                continue
            at = f"{path}:{lines.find('notify.channel', index, key)}"
            if key not in hints:
                raise ConfigError(
                    f"{at}: unknown key {key!r} for a {kind} channel (known: type, name, audiences, {', '.join(hints)})"
                )
            options[key] = typed(value, key, hints[key], at)
        try:
            config = spec.config(**options)
        except ValueError as err:
            bad = next((k for k in entry if str(err).startswith(k)), None)
            raise ConfigError(f"{path}:{lines.find('notify.channel', index, bad)}: [{kind} channel] {err}") from err
        if any(c.name == name for c in out):
            raise ConfigError(f"{where}: two channels are named {name!r}; names must differ")
        out.append(ChannelSection(name=str(name), type=kind, audiences=tuple(audiences), options=config))
    return tuple(out)
