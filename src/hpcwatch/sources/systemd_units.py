"""Reader of ``systemctl --failed --output=json`` (and ``systemctl list-units --output=json``): which units failed.

systemd prints one JSON array of units, each ``{"unit", "load", "active", "sub", "description"}``
(systemctl(1), ``--output=json``; ``--failed`` keeps the units whose ``active`` is ``failed``). Samples
(labels ``node``, from ``--host``: the output does not name its host):

- ``systemd_units_failed``: how many listed units are failed (0 for ``[]``: looked, none failed);
- ``systemd_unit_failed`` per listed unit (labels ``unit``, ``load``, ``active``, ``sub``): 1 when failed, else 0.

Dated by the file's write time. Strict: a document that is not an array of objects naming a ``unit`` is a
``ParseError``; keys we do not read are skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import orjson

from hpcwatch import vocab
from hpcwatch.errors import ParseError
from hpcwatch.records import Sample
from hpcwatch.sources.lines import file_time, read_text

__all__ = ["parse_systemctl_json", "read_systemctl_json", "is_systemctl_json"]


def is_systemctl_json(head: str) -> bool:
    """A JSON array whose first object carries systemctl's unit keys."""
    text = head.lstrip()
    first = text[: text.find("}") + 1]
    return text.startswith("[") and all(f'"{key}"' in first for key in ("unit", "load", "active", "sub"))


def parse_systemctl_json(
    text: str, *, path: str | os.PathLike[str] = "<systemctl --output=json>", node: str | None = None, t: float = 0.0
) -> Iterator[Sample]:
    """The failed-unit samples (see the module docstring)."""
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as err:
        raise ParseError(f"not JSON: {err}", path=path, line=getattr(err, "lineno", 1) or 1) from err
    if not isinstance(doc, list) or not all(isinstance(u, dict) and isinstance(u.get("unit"), str) for u in doc):
        raise ParseError("not systemctl --output=json (want an array of units with a 'unit' name)", path=path, line=1)
    base = {"node": node} if node else {}
    failed = 0
    for unit in doc:
        is_failed = unit.get("active") == "failed"
        failed += is_failed
        labels = {**base, "unit": unit["unit"], **{k: str(unit.get(k) or "") for k in ("load", "active", "sub")}}
        yield Sample(metric=vocab.SYSTEMD_UNIT_FAILED, labels=labels, t=t, value=float(is_failed))
    yield Sample(metric=vocab.SYSTEMD_UNITS_FAILED, labels=base, t=t, value=float(failed))


def read_systemctl_json(
    path: str | os.PathLike[str], *, node: str | None = None, t: float | None = None
) -> Iterator[Sample]:
    text = read_text(path)
    yield from parse_systemctl_json(text, path=path, node=node, t=file_time(path) if t is None else t)
