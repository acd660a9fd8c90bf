"""Reader of a training-data shard manifest: what each shard must hash to, optionally signed.

The format is ours (no standard exists for this); a JSON object::

    {"dataset": "fineweb-edu-10B",
     "shards": [{"path": "train-00000.bin", "sha256": "<64 hex>", "bytes": 1048576, "samples": 4096}, ...],
     "signature": {"alg": "HMAC-SHA256", "value": "<64 hex>"}}            # optional

``path`` is relative to the manifest's folder (or absolute). The signature is the
HMAC-SHA256 (RFC 2104) of ``signed_payload(manifest)``: the ``dataset`` and
``shards`` as JSON with sorted keys and no spaces, so the same manifest signs the
same whatever the writer's key order or indentation.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from hpcwatch.errors import ParseError
from hpcwatch.sources.lines import read_text, shown

__all__ = [
    "Shard",
    "ShardManifest",
    "parse_manifest",
    "read_manifest",
    "signed_payload",
    "sign_manifest",
    "signature_valid",
    "SIGNATURE_ALG",
]

SIGNATURE_ALG = "HMAC-SHA256"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Shard:
    path: str
    sha256: str
    bytes: int
    samples: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardManifest:
    dataset: str
    shards: tuple[Shard, ...]
    signature: str | None
    """Hex HMAC-SHA256, or None when unsigned."""
    root: str
    """Folder relative shard paths are resolved against."""
    source: str

    def shard(self, path: str | os.PathLike[str]) -> Shard | None:
        """The entry of a shard, by its path as written or as resolved against ``root``."""
        p = Path(path)
        for shard in self.shards:
            if shard.path == str(path) or self.resolve(shard) == p or Path(shard.path).name == p.name:
                return shard
        return None

    def resolve(self, shard: Shard) -> Path:
        return Path(shard.path) if os.path.isabs(shard.path) else Path(self.root) / shard.path


def signed_payload(dataset: str, shards: tuple[Shard, ...] | list[dict[str, Any]]) -> bytes:
    rows = [
        s if isinstance(s, dict) else {"path": s.path, "sha256": s.sha256, "bytes": s.bytes, "samples": s.samples}
        for s in shards
    ]
    rows = [{k: v for k, v in r.items() if v is not None} for r in rows]
    return orjson.dumps({"dataset": dataset, "shards": rows}, option=orjson.OPT_SORT_KEYS)


def sign_manifest(dataset: str, shards: list[dict[str, Any]], key: bytes) -> dict[str, Any]:
    """A manifest document with its signature, as a writer of datasets would produce it."""
    value = hmac.new(key, signed_payload(dataset, shards), hashlib.sha256).hexdigest()
    return {"dataset": dataset, "shards": shards, "signature": {"alg": SIGNATURE_ALG, "value": value}}


def signature_valid(manifest: ShardManifest, key: bytes) -> bool:
    if manifest.signature is None:
        return False
    expected = hmac.new(key, signed_payload(manifest.dataset, manifest.shards), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, manifest.signature)


def parse_manifest(text: str, *, path: str | os.PathLike[str] = "<manifest>", root: str | None = None) -> ShardManifest:
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as err:
        raise ParseError(f"not JSON: {err}", path=path) from err
    if not isinstance(doc, dict) or not isinstance(doc.get("shards"), list):
        raise ParseError("a shard manifest is an object with a 'shards' list", path=path, line=1)
    shards = tuple(_shard(row, i, path) for i, row in enumerate(doc["shards"]))
    sig = doc.get("signature")
    if sig is not None and (
        not isinstance(sig, dict) or sig.get("alg") != SIGNATURE_ALG or not _HEX64.match(str(sig.get("value", "")))
    ):
        raise ParseError(f"signature must be {{alg: {SIGNATURE_ALG}, value: 64 hex}}", path=path, text=str(sig))
    return ShardManifest(
        dataset=str(doc.get("dataset", "")),
        shards=shards,
        signature=sig["value"] if sig else None,
        root=root if root is not None else str(Path(path).parent),
        source=str(path),
    )


def _shard(row: object, i: int, path: str | os.PathLike[str]) -> Shard:
    if not isinstance(row, dict) or not isinstance(row.get("path"), str):
        raise ParseError(f"shard {i} has no path", path=path, text=str(row))
    digest = str(row.get("sha256", "")).lower()
    if not _HEX64.match(digest):
        raise ParseError(f"shard {i} ({shown(row['path'])}): sha256 is not 64 hex digits", path=path, text=digest)
    size = row.get("bytes")
    if not isinstance(size, int) or size < 0:
        raise ParseError(f"shard {i} ({shown(row['path'])}): bytes is not a count", path=path, text=str(size))
    samples = row.get("samples")
    return Shard(path=row["path"], sha256=digest, bytes=size, samples=samples if isinstance(samples, int) else None)


def read_manifest(path: str | os.PathLike[str]) -> ShardManifest:
    return parse_manifest(read_text(path), path=path)
