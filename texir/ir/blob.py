"""Immutable byte payloads that may alias another object's memory without copying it."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import final

_PARALLEL_BYTES = 1 << 20
"""Payloads from this size up are hashed in worker threads (hashlib releases the GIL on them)."""


def sha256_many(payloads: Sequence[bytes | memoryview]) -> list[str]:
    """The SHA-256 (lowercase hex) of each payload; large ones hashed in parallel threads."""
    digests: list[str | None] = [None] * len(payloads)
    large = [i for i, p in enumerate(payloads) if memoryview(p).nbytes >= _PARALLEL_BYTES]
    workers = min(len(large), os.cpu_count() or 1)
    if workers > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for i, digest in zip(large, pool.map(lambda i: hashlib.sha256(payloads[i]).hexdigest(), large)):
                digests[i] = digest
    return [d if d is not None else hashlib.sha256(p).hexdigest() for d, p in zip(digests, payloads)]


def digest_all(blobs: Sequence["Blob"]) -> None:
    """Compute (and cache) the digest of every blob that has none yet, large ones in parallel."""
    missing = [b for b in blobs if b._digest is None]
    for blob, digest in zip(missing, sha256_many([b._view for b in missing])):
        object.__setattr__(blob, "_digest", digest)


@final
class Blob:
    """A read-only run of bytes: tensor payloads and delegate blobs.

    A Blob may be a zero-copy view of memory owned elsewhere (a torch parameter's storage),
    exactly as `ExportedProgram.state_dict` aliases the module's tensors; texir never writes
    through it. Equality compares content; the hash is the length (consistent with equality,
    cheap); use `digest()` for a content hash.
    """

    __slots__ = ("_view", "_digest")

    _view: memoryview
    _digest: str | None

    def __init__(self, data: bytes | bytearray | memoryview, *, digest: str | None = None) -> None:
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        object.__setattr__(self, "_view", view.toreadonly())
        object.__setattr__(self, "_digest", digest)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Blob is immutable")

    @property
    def nbytes(self) -> int:
        return self._view.nbytes

    def view(self) -> memoryview:
        """A read-only, 1-D, unsigned-byte view of the payload (no copy)."""
        return self._view

    def tobytes(self) -> bytes:
        return self._view.tobytes()

    def digest(self) -> str:
        """SHA-256 of the content as lowercase hex (computed once, then cached)."""
        digest = self._digest
        if digest is None:
            digest = hashlib.sha256(self._view).hexdigest()
            object.__setattr__(self, "_digest", digest)
        return digest

    def __len__(self) -> int:
        return self._view.nbytes

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Blob):
            return NotImplemented
        if self is other:
            return True
        if self._view.nbytes != other._view.nbytes:
            return False
        if self._digest is not None and other._digest is not None:
            return self._digest == other._digest
        return self._view == other._view

    def __hash__(self) -> int:
        return hash(self._view.nbytes)

    def __repr__(self) -> str:
        return f"Blob(nbytes={self.nbytes})"

    def __reduce__(self) -> tuple[type[Blob], tuple[bytes]]:
        return (Blob, (self.tobytes(),))
