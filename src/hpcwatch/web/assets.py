"""The page's scripts and styles (``static/``): served as files, and under a versioned address cached for good.

    /static/app.js              as before: the browser asks again each load (ETag, 304 when unchanged)
    /static/<version>/app.js    the page's own links: kept a year without asking (``immutable``)

``<version>`` is a hash of the files themselves, so a release that changes one is a new address and no
browser keeps an old script. A module's relative imports (``./tiles.js``) resolve under the same version.
The page also lists every module of its import graph as ``<link rel="modulepreload">``: the browser fetches
them beside ``app.js`` instead of after parsing it. At 1,024 nodes the busy demo took up to 0.65 s to serve
the second round of module fetches of a first page load, every load.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import MutableMapping
from functools import cache
from pathlib import Path
from typing import Any

from starlette.responses import Response
from starlette.staticfiles import StaticFiles

__all__ = ["STATIC_DIR", "CACHED_FOR_S", "AssetFiles", "asset_version", "module_graph"]

STATIC_DIR = Path(__file__).parent / "static"
#: How long a browser keeps a file of a versioned address: a year, the longest RFC 9111 readers honour.
CACHED_FOR_S = 365 * 86400
_IMPORT = re.compile(r"""^\s*import\s[^;]*?\sfrom\s+["']\./([\w.-]+\.js)["']""", re.M)


@cache
def asset_version(directory: Path = STATIC_DIR) -> str:
    """A short hash of every file's name and bytes: what the versioned address carries."""
    digest = hashlib.blake2b(digest_size=6)
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(path.relative_to(directory).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@cache
def module_graph(entry: str = "app.js", directory: Path = STATIC_DIR) -> tuple[str, ...]:
    """The modules ``entry`` imports, directly or not (its static ``import ... from "./x.js"`` lines), sorted."""
    seen: set[str] = set()
    todo = [entry]
    while todo:
        name = todo.pop()
        for imported in _IMPORT.findall((directory / name).read_text(encoding="utf-8")):
            if imported not in seen and imported != entry:
                seen.add(imported)
                todo.append(imported)
    return tuple(sorted(seen))


class AssetFiles(StaticFiles):
    """``StaticFiles`` that also answers under ``/<version>/``, with a year's caching there."""

    def __init__(self, *, directory: Path = STATIC_DIR) -> None:
        super().__init__(directory=directory)
        self.version = asset_version(directory)

    async def get_response(self, path: str, scope: MutableMapping[str, Any]) -> Response:
        head, _, rest = path.partition("/")
        if head != self.version or not rest:
            return await super().get_response(path, scope)
        response = await super().get_response(rest, scope)
        if response.status_code == 200:
            response.headers["Cache-Control"] = f"public, max-age={CACHED_FOR_S}, immutable"
        return response
