"""One host check's result on its way from a node's agent to the central store, and its spool layout.

A shipment is the raw output of one command (bounded by the agent), with what the centre needs to
read it: the node, the check's name, the command, the registry format of its output, when it ran
(UTC seconds, the agent's clock), how long it took (monotonic seconds), its exit status.

On the wire (HTTP push, the agent's local queue) it is one JSON object, the output in base64.
In a spool folder it is one folder, renamed into place whole (a reader never sees half of it)::

    SPOOL/agent-NODE-CHECK-NS/          NS: nanoseconds of the run, the agent's clock
        shipment.json                   everything but the output
        output                          the raw bytes, write time set to the run's start

so the spool collector (``collect/spool.py``) knows the folder by its ``shipment.json`` and reads
``output`` through the registry with the named format and node, as ``hpcwatch ingest`` would.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import shutil
import tempfile
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from hpcwatch.errors import ParseError

__all__ = [
    "Shipment",
    "MARKER",
    "OUTPUT",
    "write_to_spool",
    "read_from_spool",
    "is_shipment",
    "NAME_RE",
    "WIRE_VERSION",
    "PUSH_PATH",
]

#: Where the central ``[[receive]]`` takes shipments (HTTP POST).
PUSH_PATH = "/v1/agent/shipments"
MARKER = "shipment.json"
OUTPUT = "output"
WIRE_VERSION = 1
#: What a node or check name may be: it becomes part of a folder name.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_MAX_COMMAND = 64
"""Arguments of a command kept in a shipment (and each at most 4096 characters)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Shipment:
    host: str
    check: str
    command: tuple[str, ...]
    format: str
    started_s: float
    """UTC seconds when the command started (the agent's wall clock)."""
    duration_s: float
    """How long it ran (the agent's monotonic clock), seconds."""
    exit_status: int | None
    """The command's exit status; None when it was killed at its timeout or could not start."""
    output: bytes = b""
    truncated: bool = False
    """The output was longer than the check's ``max_output_bytes``: only its head is here."""
    timed_out: bool = False
    error: str = ""
    """Why the command did not run or was cut (one line, e.g. ``not found``); "" when it ran."""
    stderr_tail: str = ""
    """The last bytes of its standard error (at most 2 KiB), for the operator."""
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    """Unique per run: the centre stores a shipment it receives twice (a retried push) once."""

    def meta(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("output")
        d["command"] = list(self.command)
        d["output_bytes"] = len(self.output)
        d["version"] = WIRE_VERSION
        return d

    def to_wire(self) -> bytes:
        return orjson.dumps({**self.meta(), "output_b64": base64.b64encode(self.output).decode("ascii")})

    @classmethod
    def from_wire(cls, body: bytes, *, where: str = "<push>") -> Shipment:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as err:
            raise ParseError(f"not JSON: {err}", path=where) from err
        if not isinstance(doc, dict) or "output_b64" not in doc:
            raise ParseError("not a shipment (no output_b64)", path=where)
        try:
            output = base64.b64decode(doc["output_b64"], validate=True)
        except (binascii.Error, TypeError, ValueError) as err:
            raise ParseError(f"output_b64 is not base64: {err}", path=where) from err
        return cls._from_meta(doc, output, where)

    @classmethod
    def _from_meta(cls, doc: dict[str, Any], output: bytes, where: str) -> Shipment:
        def text(key: str, limit: int = 4096) -> str:
            v = doc.get(key, "")
            if not isinstance(v, str) or len(v) > limit:
                raise ParseError(f"{key} must be a string of at most {limit} characters", path=where)
            return v

        def number(key: str) -> float:
            v = doc.get(key)
            if not isinstance(v, int | float) or isinstance(v, bool) or not (0 <= v < 1e12):
                raise ParseError(f"{key} must be a number of seconds, got {str(v)[:40]!r}", path=where)
            return float(v)

        host, check = text("host", 128), text("check", 128)
        for key, value in (("host", host), ("check", check)):
            if not NAME_RE.fullmatch(value):
                raise ParseError(f"{key} {value[:60]!r} is not a name ([A-Za-z0-9._-], at most 128)", path=where)
        command = doc.get("command", [])
        if (
            not isinstance(command, list)
            or len(command) > _MAX_COMMAND
            or not all(isinstance(a, str) and len(a) <= 4096 for a in command)
        ):
            raise ParseError(f"command must be a list of at most {_MAX_COMMAND} strings", path=where)
        status = doc.get("exit_status")
        if status is not None and (not isinstance(status, int) or isinstance(status, bool) or abs(status) > 1 << 16):
            raise ParseError(f"exit_status must be an integer or null, got {str(status)[:40]!r}", path=where)
        ident = text("id", 64)
        if not re.fullmatch(r"[0-9a-f]{32}", ident):
            raise ParseError("id must be 32 hex digits", path=where)
        return cls(
            host=host,
            check=check,
            command=tuple(command),
            format=text("format", 64),
            started_s=number("started_s"),
            duration_s=number("duration_s"),
            exit_status=status,
            output=output,
            truncated=doc.get("truncated") is True,
            timed_out=doc.get("timed_out") is True,
            error=text("error", 1024),
            stderr_tail=text("stderr_tail", 4096),
            id=ident,
        )

    def spool_name(self) -> str:
        return f"agent-{self.host}-{self.check}-{int(self.started_s * 1e9)}-{self.id[:8]}"


def is_shipment(entry: Path) -> bool:
    return entry.is_dir() and (entry / MARKER).is_file()


def write_to_spool(spool: str | os.PathLike[str], shipment: Shipment) -> Path:
    """The shipment as a folder of ``spool``: written under a hidden name, then renamed whole."""
    folder = Path(spool)
    final = folder / shipment.spool_name()
    tmp = Path(tempfile.mkdtemp(dir=folder, prefix=".incoming-"))
    try:
        out = tmp / OUTPUT
        out.write_bytes(shipment.output)
        os.utime(out, (shipment.started_s, shipment.started_s))
        (tmp / MARKER).write_bytes(orjson.dumps(shipment.meta(), option=orjson.OPT_INDENT_2))
        os.chmod(tmp, 0o750)
        os.rename(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not final.is_dir():  # else: a folder of that name is there already, the same run shipped twice
            raise
    return final


def read_from_spool(entry: Path) -> Shipment:
    """A shipment folder back (its output read whole: the agent bounded it)."""
    where = str(entry / MARKER)
    try:
        meta = (entry / MARKER).read_bytes()
        output = (entry / OUTPUT).read_bytes()
    except OSError as err:
        raise ParseError(f"cannot read the shipment: {err.strerror or err}", path=where) from err
    if len(meta) > 1 << 20:
        raise ParseError("shipment.json is over 1 MiB", path=where)
    try:
        doc = orjson.loads(meta)
    except orjson.JSONDecodeError as err:
        raise ParseError(f"not JSON: {err}", path=where) from err
    if not isinstance(doc, dict):
        raise ParseError("not a shipment (not a JSON object)", path=where)
    return Shipment._from_meta(doc, output, where)
