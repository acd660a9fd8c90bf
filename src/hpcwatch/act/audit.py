"""The audit trail: every action a policy takes is an ``act_action`` event, every undo an ``act_undo`` event.

An action records who acted (``who``), what (``step``, the ``argv`` it ran and what that answered: ``rc``,
``output``), on what (``target``, ``episode``), why (``why``: one sentence) and on which evidence (the health
checks that fired, the check job's results), and how to reverse it (``undo``: an argv; or ``undo_note`` saying
why it cannot be). Events are the store's own rows: any process reading the store sees them, none rewrites them;
an undo is one more event naming the action (``of``), never an edit of it.

    id = act-<10 hex>   BLAKE2b of (episode, step, t): the same action read back has the same id
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpcwatch.errors import ConfigError
from hpcwatch.records import Event
from hpcwatch.store import Store
from hpcwatch.vocab import EventKind

__all__ = ["Action", "Undo", "Recorded", "action_id", "recorded", "find", "SOURCE"]

SOURCE = "hpcwatch act"


def action_id(episode: str, step: str, t: float) -> str:
    return "act-" + hashlib.blake2b(f"{episode}|{step}|{t:.6f}".encode(), digest_size=5).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    id: str
    policy: str
    """``idle_gpus`` or ``remediate``."""
    step: str
    """idle_gpus: ``warn``, ``hold``, ``cancel``; remediate: ``reserve``, ``resume``, ``check``, ``release``, ``drain``."""
    episode: str
    """What the steps belong to: ``idle/<job>``, ``remediate/<node>/<drain verdict's start>``."""
    target: str
    """``job <id>`` or ``node <name>``."""
    t: float
    """UTC seconds (wall clock) when it was done."""
    who: str
    why: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    argv: tuple[str, ...] = ()
    """The command run (empty for a notice)."""
    rc: int | None = None
    output: str = ""
    undo: tuple[str, ...] = ()
    undo_note: str = ""
    """Why there is no undo (a cancel; a notice), or what the undo does."""
    details: Mapping[str, Any] = field(default_factory=dict)
    """What later steps need: the reservation's name, the check job's id, its results folder."""

    @property
    def ok(self) -> bool:
        return self.rc in (None, 0)

    def to_event(self) -> Event:
        return Event(
            kind=EventKind.ACT_ACTION,
            t=self.t,
            source=SOURCE,
            attrs={
                "id": self.id,
                "policy": self.policy,
                "step": self.step,
                "episode": self.episode,
                "target": self.target,
                "who": self.who,
                "why": self.why,
                "evidence": dict(self.evidence),
                "argv": list(self.argv),
                "rc": self.rc,
                "output": self.output,
                "undo": list(self.undo),
                "undo_note": self.undo_note,
                "details": dict(self.details),
            },
        )

    @classmethod
    def from_event(cls, e: Event) -> Action:
        a = e.attrs
        return cls(
            id=str(a["id"]),
            policy=str(a.get("policy", "")),
            step=str(a.get("step", "")),
            episode=str(a.get("episode", "")),
            target=str(a.get("target", "")),
            t=e.t,
            who=str(a.get("who", "")),
            why=str(a.get("why", "")),
            evidence=a.get("evidence") or {},
            argv=tuple(a.get("argv") or ()),
            rc=a.get("rc"),
            output=str(a.get("output", "")),
            undo=tuple(a.get("undo") or ()),
            undo_note=str(a.get("undo_note", "")),
            details=a.get("details") or {},
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Undo:
    of: str
    t: float
    who: str
    argv: tuple[str, ...]
    rc: int
    output: str = ""

    def to_event(self) -> Event:
        return Event(
            kind=EventKind.ACT_UNDO,
            t=self.t,
            source=SOURCE,
            attrs={"of": self.of, "who": self.who, "argv": list(self.argv), "rc": self.rc, "output": self.output},
        )

    @classmethod
    def from_event(cls, e: Event) -> Undo:
        a = e.attrs
        return cls(
            of=str(a["of"]),
            t=e.t,
            who=str(a.get("who", "")),
            argv=tuple(a.get("argv") or ()),
            rc=int(a.get("rc", 0)),
            output=str(a.get("output", "")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Recorded:
    """An action and its successful undo, if any."""

    action: Action
    undone: Undo | None = None

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {**self.action.to_event().attrs, "t": self.action.t}
        doc["undone"] = None if self.undone is None else {**self.undone.to_event().attrs, "t": self.undone.t}
        return doc


def recorded(store: Store, *, policy: str | None = None, episode: str | None = None) -> list[Recorded]:
    """Every action of the store, oldest first, with its undo (the first that succeeded)."""
    undos: dict[str, Undo] = {}
    for e in store.events(EventKind.ACT_UNDO):
        u = Undo.from_event(e)
        if u.rc == 0:
            undos.setdefault(u.of, u)
    out = []
    for e in store.events(EventKind.ACT_ACTION):
        a = Action.from_event(e)
        if (policy is None or a.policy == policy) and (episode is None or a.episode == episode):
            out.append(Recorded(action=a, undone=undos.get(a.id)))
    return out


def find(found: Sequence[Recorded], action_id: str) -> Recorded:
    """The action of that id, or a ``ConfigError`` (``hpcwatch act undo``: exit 2)."""
    match = next((r for r in found if r.action.id == action_id), None)
    if match is None:
        raise ConfigError(f"no action {action_id!r} in the store (hpcwatch act list shows them)")
    return match
