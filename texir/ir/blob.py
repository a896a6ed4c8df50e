"""Immutable byte payloads that may alias another object's memory without copying it."""

from __future__ import annotations

import hashlib
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
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


# --- deferred digests -----------------------------------------------------------------------------
# A weight larger than the machine's memory (a memory-mapped checkpoint) costs a disk read per pass
# over it. Its digest is then deferred: the IR carries a stand-in, a 64-hex-digit string that is no
# payload's digest, until the file writer hashes the payload as it copies it (`HashingCopy`) and the
# written bytes get the real digest in place of the stand-in (`resolve_digests`). Stand-ins are
# given only to payloads whose bytes are known to differ from every other payload's (see
# texir.adapters.tensors), so deduplication by digest gives the same layout either way; the writers
# check this again once the real digests are known.

_DEFERRED: "weakref.WeakValueDictionary[str, Blob]" = weakref.WeakValueDictionary()
"""Stand-in -> a live payload carrying it (payloads carrying one stand-in hold the same bytes)."""


def deferred_blob(data: bytes | bytearray | memoryview, stand_in: str, *,
                  read_ahead: Callable[[int, int], None] | None = None) -> "Blob":
    """A Blob whose `digest()` is `stand_in` until its bytes are hashed (by a writer or by
    `content_digest()`); the writers put the real digest wherever the stand-in was written.
    `read_ahead(start, nbytes)`, when given, asks the system to start loading those bytes of the
    payload (a memory-mapped checkpoint read from disk) ahead of the writer's copy of them; a hint,
    it changes no byte."""
    blob = Blob(data, digest=stand_in)
    object.__setattr__(blob, "_deferred", True)
    object.__setattr__(blob, "_read_ahead", read_ahead)
    _DEFERRED[stand_in] = blob
    return blob


def is_deferred(digest: str) -> bool:
    """Whether `digest` is the stand-in of a payload still in use."""
    return digest in _DEFERRED


def resolve_digests(data: bytes | memoryview) -> bytes | memoryview:
    """`data` with every live stand-in it contains replaced by its payload's real digest (hashed
    now if no writer has yet); `data` itself when it holds none."""
    if not _DEFERRED:
        return data
    raw = bytes(data)
    found = False
    for stand_in, blob in list(_DEFERRED.items()):
        needle = stand_in.encode()
        if needle in raw:
            raw = raw.replace(needle, blob.content_digest().encode())
            found = True
    return raw if found else data


def real_digest(digest: str) -> str:
    """The real digest behind `digest` when it is a live stand-in (hashing the payload if needed),
    else `digest`."""
    blob = _DEFERRED.get(digest) if _DEFERRED else None
    return digest if blob is None else blob.content_digest()


class HashingCopy:
    """The chunks of payloads to write, hashed as they are handed out (hashlib releases the GIL,
    so the hash of one slice overlaps the write of the one before): one pass over a payload that
    is read from disk. A deferred payload learns its real digest when the last slice is out.

    Given the payloads in the order they will be copied and a second pool, the slices of payloads
    that can be read ahead (`deferred_blob(..., read_ahead=...)`) are asked for `_AHEAD` slices
    before the copy reaches them, across payload boundaries: the disk then serves many requests
    at once instead of one page fault at a time. Memory stays bounded: what is read ahead is the
    page cache's, at most `_AHEAD` slices of it ahead of the copy."""

    _SLICE = 16 << 20
    _AHEAD = 16

    def __init__(self, pool: ThreadPoolExecutor, payloads: Sequence["Blob"] = (),
                 ahead: ThreadPoolExecutor | None = None) -> None:
        self._pool = pool
        self._ahead = ahead
        self._slices: list[tuple[Callable[[int, int], None], int, int]] = []
        """(read_ahead, start, nbytes) of every slice that can be read ahead, in copy order."""
        self._first: dict[int, int] = {}
        """id(payload) -> the index in `_slices` of its first slice."""
        self._asked = 0
        for blob in payloads if ahead is not None else ():
            read_ahead = blob._read_ahead
            if read_ahead is None or not self._hashed(blob) or id(blob) in self._first:
                continue
            self._first[id(blob)] = len(self._slices)
            n = blob._view.nbytes
            self._slices.extend((read_ahead, start, min(self._SLICE, n - start)) for start in range(0, n, self._SLICE))

    @staticmethod
    def _hashed(blob: "Blob") -> bool:
        return blob._deferred and blob._content is None

    def _ask_until(self, end: int) -> None:
        """Ask for read-ahead of every slice before index `end` not asked for yet."""
        end = min(end, len(self._slices))
        while self._asked < end and self._ahead is not None:
            read_ahead, start, nbytes = self._slices[self._asked]
            self._ahead.submit(_hint, read_ahead, start, nbytes)
            self._asked += 1

    def chunks(self, blob: "Blob") -> Iterator[memoryview]:
        view = blob._view
        if not self._hashed(blob):
            yield view
            return
        first = self._first.get(id(blob))
        h = hashlib.sha256()
        pending = None
        for k, start in enumerate(range(0, view.nbytes, self._SLICE)):
            if first is not None:
                self._ask_until(first + k + 1 + self._AHEAD)
            piece = view[start : start + self._SLICE]
            if pending is not None:
                pending.result()
            pending = self._pool.submit(h.update, piece)
            yield piece
        if pending is not None:
            pending.result()
        object.__setattr__(blob, "_content", h.hexdigest())


def _hint(read_ahead: Callable[[int, int], None], start: int, nbytes: int) -> None:
    """Run a read-ahead hint; its failure costs only speed (the copy then reads by page faults)."""
    try:
        read_ahead(start, nbytes)
    except Exception:  # noqa: BLE001 - a hint: the bytes are read by the copy regardless
        pass


@final
class Blob:
    """A read-only run of bytes: tensor payloads and delegate blobs.

    A Blob may be a zero-copy view of memory owned elsewhere (a torch parameter's storage),
    exactly as `ExportedProgram.state_dict` aliases the module's tensors; texir never writes
    through it. Equality compares content; the hash is the length (consistent with equality,
    cheap); use `digest()` for a content hash.
    """

    __slots__ = ("_view", "_digest", "_deferred", "_content", "_read_ahead", "__weakref__")

    _view: memoryview
    _digest: str | None
    _deferred: bool
    """Whether `_digest` is a stand-in (`deferred_blob`): `_content` is then the real digest, once known."""
    _content: str | None
    _read_ahead: Callable[[int, int], None] | None
    """For a deferred payload: asks the system to load bytes [start, start + n) ahead of a copy."""

    def __init__(self, data: bytes | bytearray | memoryview, *, digest: str | None = None) -> None:
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        object.__setattr__(self, "_view", view.toreadonly())
        object.__setattr__(self, "_digest", digest)
        object.__setattr__(self, "_deferred", False)
        object.__setattr__(self, "_content", None)
        object.__setattr__(self, "_read_ahead", None)

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

    @property
    def deferred(self) -> bool:
        """Whether `digest()` is a stand-in for a digest not computed yet (`deferred_blob`)."""
        return self._deferred

    def content_digest(self) -> str:
        """SHA-256 of the content as lowercase hex: `digest()`, or for a deferred payload the real
        digest behind its stand-in (hashed now unless a writer already did)."""
        if not self._deferred:
            return self.digest()
        content = self._content
        if content is None:
            content = hashlib.sha256(self._view).hexdigest()
            object.__setattr__(self, "_content", content)
        return content

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

    def __reduce__(self) -> tuple[object, tuple[bytes] | tuple[bytes, str]]:
        if self._deferred and self._digest is not None:
            return (deferred_blob, (self.tobytes(), self._digest))  # the stand-in is in the IR it travels with
        return (Blob, (self.tobytes(),))
