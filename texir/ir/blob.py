"""Immutable byte payloads that may alias another object's memory without copying it."""

from __future__ import annotations

import hashlib
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
import itertools
from concurrent.futures import Future, ThreadPoolExecutor
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

_DEFERRED: "dict[str, weakref.WeakValueDictionary[int, Blob]]" = {}
"""Stand-in -> the live payloads carrying it (they hold the same bytes: a tied weight's two uses
may be two Blobs, and the stand-in must resolve while either lives). Entries whose payloads are
all gone are dropped as they are met (`_carrier`). By identity: Blobs of equal bytes compare equal,
so a WeakSet would keep only the first."""


def _carrier(stand_in: str) -> "Blob | None":
    """A live payload carrying `stand_in`, one whose real digest is known if any (no second hash
    of the same bytes); None, and the entry dropped, when none lives."""
    blobs = _DEFERRED.get(stand_in)
    if blobs is None:
        return None
    live = list(blobs.values())
    if not live:
        del _DEFERRED[stand_in]
        return None
    return next((b for b in live if b._content is not None), live[0])


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
    _DEFERRED.setdefault(stand_in, weakref.WeakValueDictionary())[id(blob)] = blob
    return blob


def is_deferred(digest: str) -> bool:
    """Whether `digest` is the stand-in of a payload still in use."""
    return _carrier(digest) is not None


def resolve_digests(data: bytes | memoryview) -> bytes | memoryview:
    """`data` with every live stand-in it contains replaced by its payload's real digest (hashed
    now if no writer has yet); `data` itself when it holds none."""
    if not _DEFERRED:
        return data
    raw = bytes(data)
    found = False
    for stand_in in list(_DEFERRED):
        blob = _carrier(stand_in)
        needle = stand_in.encode()
        if blob is not None and needle in raw:
            raw = raw.replace(needle, blob.content_digest().encode())
            found = True
    return raw if found else data


def real_digest(digest: str) -> str:
    """The real digest behind `digest` when it is a live stand-in (hashing the payload if needed),
    else `digest`."""
    blob = _carrier(digest) if _DEFERRED else None
    return digest if blob is None else blob.content_digest()


class HashingCopy:
    """The chunks of payloads to write; deferred payloads are hashed on the pool's threads ahead of
    the copy (hashlib releases the GIL: the hashes run beside the write, several payloads at once),
    so each payload is read once from disk for both when it is memory-mapped: the hash brings its
    pages in and the copy finds them cached. A deferred payload learns its real digest once it is
    hashed, at the latest when its last chunk is out.

    Given the payloads in copy order, at most `_WINDOW` bytes of payloads past the one being copied
    are hashed ahead (bounded memory: for mapped payloads what is read ahead is the page cache's).
    A hash of a payload that can be read ahead (`deferred_blob(..., read_ahead=...)`) first asks
    for the `_AHEAD` slices after the one it reads, so the disk serves many requests at once
    instead of one page fault at a time."""

    _SLICE = 16 << 20
    _AHEAD = 8
    _WINDOW = 512 << 20

    def __init__(self, pool: ThreadPoolExecutor, payloads: Sequence["Blob"] = ()) -> None:
        self._pool = pool
        self._queue: list[Blob] = []
        """The deferred payloads to hash, in copy order, each once."""
        self._index: dict[int, int] = {}
        """id(payload) -> its place in `_queue`."""
        for blob in payloads:
            if self._hashed(blob) and id(blob) not in self._index:
                self._index[id(blob)] = len(self._queue)
                self._queue.append(blob)
        self._ends = list(itertools.accumulate(b._view.nbytes for b in self._queue))
        self._futures: dict[int, Future[str]] = {}
        self._submitted = 0

    @staticmethod
    def _hashed(blob: "Blob") -> bool:
        return blob._deferred and blob._content is None

    def _submit_through(self, current: int) -> None:
        """Start hashing the payloads of `_queue` up to `current` and those ahead of it within `_WINDOW`."""
        copied = self._ends[current] - self._queue[current]._view.nbytes
        while self._submitted < len(self._queue) and (
                self._submitted <= current or self._ends[self._submitted - 1] - copied < self._WINDOW):
            blob = self._queue[self._submitted]
            self._futures[id(blob)] = self._pool.submit(self._digest, blob)
            self._submitted += 1

    def _digest(self, blob: "Blob") -> str:
        view, read_ahead = blob._view, blob._read_ahead
        h = hashlib.sha256()
        starts = range(0, view.nbytes, self._SLICE)
        if read_ahead is not None:
            for start in starts[: self._AHEAD]:
                _hint(read_ahead, start, min(self._SLICE, view.nbytes - start))
        for k, start in enumerate(starts):
            if read_ahead is not None and k + self._AHEAD < len(starts):
                ahead = starts[k + self._AHEAD]
                _hint(read_ahead, ahead, min(self._SLICE, view.nbytes - ahead))
            h.update(view[start : start + self._SLICE])
        return h.hexdigest()

    def chunks(self, blob: "Blob") -> Iterator[memoryview]:
        view = blob._view
        if not self._hashed(blob):
            yield view
            return
        index = self._index.get(id(blob))
        if index is None:  # not announced: hashed now, beside its own copy
            future = self._pool.submit(self._digest, blob)
        else:
            self._submit_through(index)
            future = self._futures.pop(id(blob))
        for start in range(0, view.nbytes, self._SLICE):
            yield view[start : start + self._SLICE]
        object.__setattr__(blob, "_content", future.result())

    def cancel(self) -> None:
        """Drop the hashes not started (the write failed)."""
        for future in self._futures.values():
            future.cancel()


def _hint(read_ahead: Callable[[int, int], None], start: int, nbytes: int) -> None:
    """Run a read-ahead hint; its failure costs only speed (the bytes are read by page faults then)."""
    try:
        read_ahead(start, nbytes)
    except Exception:  # noqa: BLE001 - a hint: the bytes are read by the hash and the copy regardless
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
            carrier = _carrier(self._digest) if self._digest is not None else None
            content = carrier._content if carrier is not None else None  # (hashed as another Blob of it)
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
