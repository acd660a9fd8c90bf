"""Tetragon and Falco JSON as the twin writes it, and the events hpcwatch's readers make of it.

Shared by the threat scenarios (twin/threats.py) and the live twin's eBPF collector on checkpoints
(``checkpoint_access_docs``): a Tetragon ``process_kprobe`` on ``security_file_permission`` for every
checkpoint a training job writes (``MAY_WRITE``) or reads back (``MAY_READ``), as the TracingPolicy
deploy/tetragon/weights-read.yaml reports it. The shapes follow Tetragon's and Falco's JSON output
(https://tetragon.io/docs/concepts/events/, https://falco.org/docs/concepts/outputs/formatting/).
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from hpcwatch.records import Event
from hpcwatch.vocab import EventKind

__all__ = [
    "rfc3339",
    "unrfc3339",
    "tetragon_doc",
    "falco_doc",
    "events_of",
    "tetragon_attrs",
    "checkpoint_access_docs",
    "checkpoint_docs_of_tick",
    "IMAGE",
    "MAY_READ",
    "MAY_WRITE",
    "CHECKPOINT_POLICY",
]

#: The container image of the twin's jobs (NGC PyTorch).
IMAGE = "nvcr.io/nvidia/pytorch"
#: ``security_file_permission``'s mask argument: MAY_WRITE 0x2, MAY_READ 0x4 (linux/fs.h), as
#: sources/tetragon.py names them (tests/unit/test_twin_physics.py holds them equal).
MAY_WRITE, MAY_READ = 2, 4
#: The TracingPolicy's name in deploy/tetragon/weights-read.yaml.
CHECKPOINT_POLICY = "weights-read"


def rfc3339(t: float) -> str:
    """UTC seconds as Tetragon and Falco write times (nanosecond RFC 3339)."""
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def tetragon_doc(
    t: float,
    host: str,
    kind: str,
    *,
    binary: str,
    user: str,
    uid: int,
    args: str = "",
    parent: str = "/usr/bin/bash",
    function: str | None = None,
    path: str | None = None,
    mask: int | None = None,
    policy: str = CHECKPOINT_POLICY,
) -> dict:
    """One Tetragon JSON event (``process_exec`` or ``process_kprobe`` on a file hook) as the agent exports it."""
    process = {
        "exec_id": hashlib.sha1(f"{host}{binary}{t}".encode()).hexdigest()[:16],
        "pid": int(t) % 60000,
        "uid": uid,
        "cwd": f"/home/{user}",
        "binary": binary,
        "arguments": args,
        "flags": "execve clone",
        "start_time": rfc3339(t - 5),
        "auid": uid,
        "user": {"name": user},
    }
    body: dict[str, Any] = {"process": process, "parent": {"binary": parent, "pid": 1, "uid": uid}}
    if kind == "process_kprobe":
        body.update(
            function_name=function,
            policy_name=policy,
            action="KPROBE_ACTION_POST",
            args=[{"file_arg": {"path": path, "permission": "-rw-r--r--"}}, {"int_arg": mask}],
            **{"return": {"int_arg": 0}},
        )
    return {kind: body, "node_name": host, "time": rfc3339(t)}


def falco_doc(t: float, host: str, rule: str, priority: str, *, user: str, cmdline: str, job: str) -> dict:
    """One Falco JSON alert (``json_output: true``) of a process in the job's container."""
    fields = {
        "container.id": hashlib.sha1(job.encode()).hexdigest()[:12],
        "container.image.repository": IMAGE,
        "container.image.tag": "24.05-py3",
        "container.name": f"train-{job}",
        "evt.time": int(t * 1e9),
        "evt.type": "execve",
        "proc.cmdline": cmdline,
        "proc.name": cmdline.split()[0],
        "proc.pname": "runc",
        "proc.tty": 34816,
        "user.name": user,
        "user.uid": 0 if user == "root" else 1001,
    }
    output = (
        f"{rfc3339(t)[11:29]}: {priority} {rule} (user={user} process={fields['proc.name']} "
        f"command={cmdline} container_id={fields['container.id']} container_image={IMAGE})"
    )
    return {
        "hostname": host,
        "output": output,
        "output_fields": fields,
        "priority": priority,
        "rule": rule,
        "source": "syscall",
        "tags": ["container", "maturity_stable", "mitre_execution"],
        "time": rfc3339(t),
    }


def events_of(docs: list[dict], kind: str) -> list[Event]:
    """The Events the readers (sources/falco.py, sources/tetragon.py) make of these documents.

    The twin may not import the readers (docs/architecture.md, the layering table: the twin imports records and model only), so it
    builds the same attrs itself from the documents it wrote; tests/unit/test_security_scenarios.py
    holds the two equal."""
    source = f"<twin {kind}>"
    if kind == EventKind.FALCO:
        return [
            Event(
                kind=EventKind.FALCO,
                t=unrfc3339(d["time"]),
                source=source,
                attrs={**d, "host": d.get("hostname") or (d.get("output_fields") or {}).get("evt.hostname")},
            )
            for d in docs
        ]
    return [
        Event(kind=EventKind.TETRAGON, t=unrfc3339(d["time"]), source=source, attrs=tetragon_attrs(d)) for d in docs
    ]


def unrfc3339(text: str) -> float:
    """UTC seconds of the ``rfc3339`` strings this module writes (nanoseconds past micro dropped)."""
    head, _, rest = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{rest[:6]}+00:00").timestamp()


def tetragon_attrs(doc: dict) -> dict[str, Any]:
    """Flat attrs of one ``tetragon_doc`` document, as sources/tetragon.py flattens it."""
    kind = "process_kprobe" if "process_kprobe" in doc else "process_exec"
    body = doc[kind]
    process = body["process"]
    attrs: dict[str, Any] = {
        "type": kind,
        "host": doc.get("node_name"),
        "binary": process.get("binary"),
        "arguments": process.get("arguments"),
        "pid": process.get("pid"),
        "uid": process.get("uid"),
        "user": (process.get("user") or {}).get("name"),
        "cwd": process.get("cwd"),
        "parent_binary": (body.get("parent") or {}).get("binary"),
        "pod": process.get("pod"),
    }
    if kind == "process_kprobe":
        args = body.get("args") or []
        attrs.update(
            function_name=body.get("function_name"),
            policy_name=body.get("policy_name"),
            action=body.get("action"),
            path=next((a["file_arg"]["path"] for a in args if "file_arg" in a), None),
            mask=next((a["int_arg"] for a in args if isinstance(a.get("int_arg"), int)), None),
        )
    return attrs


def checkpoint_access_docs(event: Event, *, nodes: tuple[str, ...], user: str, uid: int) -> list[dict]:
    """What Tetragon reports of one checkpoint ``event`` (kind ``checkpoint``: every node of the job writes its
    ranks' shards; ``checkpoint_restore``: every node reads them back), one document per node."""
    mask = MAY_READ if event.kind == EventKind.CHECKPOINT_RESTORE else MAY_WRITE
    path = str(event.attrs.get("path") or "")
    return [
        tetragon_doc(
            event.t,
            node,
            "process_kprobe",
            binary="/usr/bin/python3",
            user=user,
            uid=uid,
            args="train.py --resume" if mask == MAY_READ else "train.py",
            function="security_file_permission",
            path=path,
            mask=mask,
            policy=CHECKPOINT_POLICY,
        )
        for node in nodes
        if path
    ]


def checkpoint_docs_of_tick(twin: Any, events: list[Event]) -> list[dict]:
    """Tetragon's documents for the checkpoints saved or read back among a tick's ``events`` (the twin's)."""
    docs: list[dict] = []
    for e in events:
        if e.kind in (EventKind.CHECKPOINT, EventKind.CHECKPOINT_RESTORE):
            job = twin.planned(str(e.attrs["job"]))
            docs += checkpoint_access_docs(e, nodes=job.nodes, user=job.user, uid=job.uid)
    return docs
