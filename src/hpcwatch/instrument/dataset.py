"""The shard verifier a data loader calls when it opens a training shard.

Poisoning a few shards of a pre-training set is enough to plant a backdoor
(Carlini et al., "Poisoning Web-Scale Training Datasets is Practical", 2023,
https://arxiv.org/abs/2302.10149); the cheap defence is to pin each shard's
hash in a (signed) manifest and check it at open time, on the node that reads it.

    verifier = ShardVerifier(read_manifest("/lustre/data/manifest.json"), key=key, job="4242", rank=3)
    for path in my_shards:
        verifier.check(path)          # before np.memmap / open
        ...
    store.add(verifier.events)        # or pass sink=... to stream them

Each check yields an ``Event(kind="shard_check")`` with attrs ``path``, ``ok``,
``reason`` (None | ``sha256`` | ``size`` | ``not_in_manifest`` | ``missing`` |
``bad_signature``), ``expected_sha256``, ``actual_sha256``, ``bytes``, ``dataset``,
``job``, ``rank``, ``host``; ``security.data_poisoning`` turns failed ones into findings.
With ``strict=True`` a failed check also raises ``PoisonedShard``.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from hpcwatch.errors import InputError
from hpcwatch.records import Event
from hpcwatch.sources.manifest import ShardManifest, signature_valid
from hpcwatch.vocab import EventKind

__all__ = ["ShardVerifier", "PoisonedShard", "sha256_file", "CHUNK_BYTES"]

#: Read shards in 8 MiB chunks: large enough for Lustre stripes, small enough for a loader's memory.
CHUNK_BYTES = 8 << 20


class PoisonedShard(InputError):
    """A shard that does not match its manifest (strict mode)."""


def sha256_file(path: str | os.PathLike[str]) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


class ShardVerifier:
    """Checks shards against one manifest; remembers every check as an event."""

    def __init__(
        self,
        manifest: ShardManifest,
        *,
        key: bytes | None = None,
        job: str | None = None,
        rank: int | None = None,
        host: str | None = None,
        strict: bool = False,
        sink: Callable[[Event], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.manifest = manifest
        self.job, self.rank, self.strict = job, rank, strict
        self.host = host or socket.gethostname()
        self._sink, self._clock = sink, clock
        self.events: list[Event] = []
        self.signature_ok = True if key is None else signature_valid(manifest, key)
        if not self.signature_ok:
            self._record(manifest.source, ok=False, reason="bad_signature", expected=None, actual=None, size=None)

    def check(self, path: str | os.PathLike[str]) -> bool:
        """True when the shard is listed and its size and SHA-256 match (and the manifest's signature held)."""
        entry = self.manifest.shard(path)
        if entry is None:
            return self._record(path, ok=False, reason="not_in_manifest", expected=None, actual=None, size=None)
        try:
            actual, size = sha256_file(path)
        except OSError:
            return self._record(path, ok=False, reason="missing", expected=entry.sha256, actual=None, size=None)
        reason = "size" if size != entry.bytes else "sha256" if actual != entry.sha256 else None
        if reason is None and not self.signature_ok:
            reason = "bad_signature"
        return self._record(path, ok=reason is None, reason=reason, expected=entry.sha256, actual=actual, size=size)

    def _record(
        self,
        path: str | os.PathLike[str],
        *,
        ok: bool,
        reason: str | None,
        expected: str | None,
        actual: str | None,
        size: int | None,
    ) -> bool:
        event = Event(
            kind=EventKind.SHARD_CHECK,
            t=self._clock(),
            source="hpcwatch.instrument.dataset",
            attrs={
                "path": str(Path(path)),
                "ok": ok,
                "reason": reason,
                "expected_sha256": expected,
                "actual_sha256": actual,
                "bytes": size,
                "dataset": self.manifest.dataset,
                "manifest": self.manifest.source,
                "job": self.job,
                "rank": self.rank,
                "host": self.host,
            },
        )
        self.events.append(event)
        if self._sink is not None:
            self._sink(event)
        if not ok and self.strict:
            raise PoisonedShard(f"{path}: shard does not match {self.manifest.source} ({reason})")
        return ok
