"""Readers of a training image's Python packages: ``pip list --format=json``, ``pip freeze``, site-packages.

The supply-chain detector needs three facts per image: which distributions are
installed (name, version), where each came from when it was not an index (a VCS
or a local file), and which ``*.pth`` files run code at interpreter start-up
(``site`` executes every ``.pth`` line that starts with ``import``,
https://docs.python.org/3/library/site.html). Each becomes an ``Event``:

- ``pip_package``: attrs ``name`` (as written), ``version`` (None for a URL
  install), ``url`` (a ``name @ URL`` or ``-e`` requirement), ``editable``, ``image``.
- ``pth_file``: attrs ``path``, ``line`` (1-based), ``code``, ``image``.

Lenient on purpose: pip freeze options lines (``--index-url``...) and comments are
skipped, not checked.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import orjson

from hpcwatch.errors import ParseError
from hpcwatch.records import Event
from hpcwatch.sources.lines import file_time, read_text
from hpcwatch.vocab import EventKind

__all__ = ["is_pip_list", "parse_pip_list", "read_pip_list", "parse_pip_freeze", "read_site_packages", "normalize_name"]

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_PINNED = re.compile(rf"^(?P<name>{_NAME})(?:\[[^\]]*\])?\s*===?\s*(?P<version>[^\s;#]+)")
_URL = re.compile(rf"^(?P<name>{_NAME})(?:\[[^\]]*\])?\s*@\s*(?P<url>\S+)")
_EDITABLE = re.compile(r"^(?:-e|--editable)\s+(?P<url>\S+)")
_GENERIC_STEMS = frozenset(
    {"pip-list", "pip-freeze", "freeze", "requirements", "requirements-frozen", "packages", "constraints"}
)
_EGG = re.compile(r"[#&]egg=(?P<name>[A-Za-z0-9._-]+)")


def normalize_name(name: str) -> str:
    """PEP 503 name: lower case, runs of ``-_.`` become one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pip_list(
    text: str, *, path: str | os.PathLike[str] = "<pip list>", image: str | None = None, t: float = 0.0
) -> Iterator[Event]:
    """Events of ``pip list --format=json`` output, or of ``pip freeze`` when the text is not JSON."""
    if not text.lstrip().startswith("["):
        yield from parse_pip_freeze(text.splitlines(), path=path, image=image, t=t)
        return
    try:
        rows = orjson.loads(text)
    except orjson.JSONDecodeError as err:
        raise ParseError(f"not JSON: {err}", path=path, line=getattr(err, "lineno", None)) from err
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("name"), str) or "version" not in row:
            raise ParseError(f"item {i} is not a {{name, version}} object", path=path, line=1, text=str(row))
        editable = row.get("editable_project_location")
        yield _package(
            row["name"],
            str(row["version"]),
            url=f"file://{editable}" if editable else None,
            editable=bool(editable),
            image=image,
            path=path,
            t=t,
        )


def parse_pip_freeze(
    lines: Iterable[str], *, path: str | os.PathLike[str] = "<pip freeze>", image: str | None = None, t: float = 0.0
) -> Iterator[Event]:
    """Events of ``pip freeze`` lines (``name==version``, ``name @ url``, ``-e url#egg=name``)."""
    for lineno, raw in enumerate(lines, 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#") or (line.startswith("-") and not _EDITABLE.match(line)):
            continue
        if m := _EDITABLE.match(line):
            egg = _EGG.search(m["url"])
            name = egg["name"] if egg else m["url"].rstrip("/").rsplit("/", 1)[-1]
            yield _package(name, None, url=m["url"], editable=True, image=image, path=path, t=t, line=lineno)
        elif m := _URL.match(line):
            yield _package(m["name"], None, url=m["url"], editable=False, image=image, path=path, t=t, line=lineno)
        elif m := _PINNED.match(line):
            yield _package(m["name"], m["version"], url=None, editable=False, image=image, path=path, t=t, line=lineno)
        else:
            raise ParseError("not a pip freeze requirement", path=path, line=lineno, text=raw)


def read_pip_list(path: str | os.PathLike[str], *, image: str | None = None) -> Iterator[Event]:
    """Events of a saved ``pip list --format=json`` or ``pip freeze`` file.

    The image defaults to the file stem (``pytorch-24.05.json``), or to the folder's name when the
    stem only says what the file is (``pip-list.json``, ``requirements.txt``).
    """
    p = Path(path)
    generic = p.stem.lower().replace("_", "-") in _GENERIC_STEMS
    yield from parse_pip_list(
        read_text(p), path=p, image=image or (p.parent.name if generic else p.stem), t=file_time(p)
    )


def read_site_packages(root: str | os.PathLike[str], *, image: str | None = None) -> Iterator[Event]:
    """``pth_file`` events for every ``.pth`` line under ``root`` that ``site`` would execute."""
    root = Path(root)
    if not root.is_dir():
        raise ParseError("not a site-packages folder", path=root)
    for pth in sorted(root.glob("*.pth")):
        for lineno, line in enumerate(read_text(pth).splitlines(), 1):
            # site.addpackage(): "Lines starting with import (followed by space or tab) are executed."
            if line.startswith(("import ", "import\t")):
                yield Event(
                    kind=EventKind.PTH_FILE,
                    t=file_time(pth),
                    source=str(pth),
                    attrs={"path": str(pth), "line": lineno, "code": line.strip(), "image": image or root.name},
                )


def _package(
    name: str,
    version: str | None,
    *,
    url: str | None,
    editable: bool,
    image: str | None,
    path: str | os.PathLike[str],
    t: float,
    line: int | None = None,
) -> Event:
    attrs: dict[str, str | bool | int | None] = {
        "name": name,
        "version": version,
        "url": url,
        "editable": editable,
        "image": image,
    }
    if line is not None:
        attrs["line"] = line
    return Event(kind=EventKind.PIP_PACKAGE, t=t, source=str(path), attrs=attrs)


_FREEZE_LINE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[^\]]*\])?\s*(===?\s*[^\s;#]+|@\s*\S+)\s*$")


def is_pip_list(head: str, name: str = "") -> bool:
    """Sniff: ``pip list --format=json`` ([{"name", "version"}...]) or a file of pip freeze lines."""
    text = head.lstrip()
    if text.startswith("["):
        return '"name"' in text[:500] and '"version"' in text[:500]
    lines = [ln.strip() for ln in text.splitlines()[:50] if ln.strip() and not ln.lstrip().startswith(("#", "-"))]
    return bool(lines) and all(_FREEZE_LINE.match(ln) for ln in lines)
