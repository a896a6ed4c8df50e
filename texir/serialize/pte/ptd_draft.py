"""A `.ptd` file written before its program exists: `PtdDraft` lays out a predicted `.ptd` (the
payloads a lowering is expected to name, in the expected order) and writes it in a background
thread, hashing each payload as it goes, while the caller does other work (`torch.export`, which
keeps one core busy in Python, while the disk writes). `dump_ptd(ptd, path, draft=draft)` then
finishes the file from the real `.ptd`: every payload the draft put where the real layout puts it
stays (same bytes in memory: the draft keeps them referenced, and a digest known both ways must
agree), the rest is written in place, the header is written last, and the file is renamed into
place. The bytes are those `dump_ptd` writes without a draft, whatever the prediction was: a draft
whose header length differs (other keys or entries) is dropped and the file written afresh.

    with PtdDraft(out / "model.ptd", predicted) as draft:
        ...                                       # export, lower, emit
        dump_ptd(emitted.external[0], out / "model.ptd", draft=draft)
    print(draft.outcome)                          # what the prediction saved

Only the predicted entries' payloads, alignments, layouts and key lengths matter (keys that are
digests, unknown before hashing, may be any string of 64 characters)."""

from __future__ import annotations

import bisect
import contextlib
import errno
import hashlib
import mmap
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Final

import msgspec
import numpy as np

from texir._io import (
    _DIRECT_BYTES, _set_direct, _write_all, _write_direct, removed_on_sigterm, temp_beside, writable_mode,
)
from texir.errors import PteError
from texir.ir.blob import Blob
from texir.serialize.pte.ptd import _KeptApart, _layout, _resolved_head
from texir.serialize.pte.schema import PtdFile

__all__ = ["DraftOutcome", "PtdDraft"]

_HASH_AHEAD: Final = 512 << 20
"""Bytes of payloads hashed ahead of the one being copied (bounded memory for mapped payloads)."""
_SLICE: Final = 16 << 20
_OVERLAP = False
"""Whether the draft copies while it writes (`_write_direct(overlap=)`): no, the work it runs
beside (an export, in Python) loses more to the memory traffic than the draft gains."""
_NICER: Final = 10
"""How much nicer than the caller the draft's threads run."""
_BLOCK: Final = 4096
"""Ranges finished after lowering are written in whole blocks of this size (O_DIRECT's unit)."""
_BY_CONTENT: Final = 1 << 20
"""Predicted payloads below this size share a segment when their bytes are equal (`_by_memory`)."""

Identity = tuple[int, int]
"""A payload's memory: (address, size). The draft holds its payloads, so an address it wrote
cannot be reused for other bytes while the draft lives."""


def identity(blob: Blob) -> Identity:
    """Where `blob`'s bytes are in this process's memory."""
    view = blob.view()
    if not view.nbytes:
        return (0, 0)
    return (int(np.frombuffer(view, dtype=np.uint8).ctypes.data), view.nbytes)


class DraftOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What a draft saved: `kept` payload bytes were where the real file wants them, `rewritten`
    were not (or not drafted) and were written after the lowering; `used` is False when the draft
    was dropped (`why`) and the file written as without one."""

    used: bool
    kept: int = 0
    rewritten: int = 0
    why: str = ""
    waited: float = 0.0
    """Seconds `dump_ptd` waited for the draft to finish writing."""


class _Stopped(Exception):
    """The draft was cancelled while writing."""


class PtdDraft:
    """Writes the predicted `.ptd` for `path` into a temporary file beside it, in a background
    thread, from construction on. Use it as a context manager (leaving the block removes a draft
    `dump_ptd` did not use) or call `close()`, on the thread that made it. The predicted payloads'
    memory must hold the same bytes until `dump_ptd` (a model's weights while it is exported and
    lowered): a payload whose real digest is deferred takes the draft's hash of it unchecked."""

    def __init__(self, path: str | os.PathLike[str], predicted: PtdFile) -> None:
        self.path = Path(path)
        self.outcome = DraftOutcome(used=False, why="not used")
        # Stand-in digests that name the memory (a small payload's: its bytes), so the layout shares a
        # segment among uses of one memory (a tied weight) without hashing the large payloads now.
        entries = tuple(msgspec.structs.replace(e, data=_by_memory(e.data)) for e in predicted.entries)
        head, pieces, end = _layout(msgspec.structs.replace(predicted, entries=entries))
        self._head_size = len(head)
        self._size = len(head) + end
        self._placed: dict[int, tuple[Identity, Blob]] = {}
        at = len(head)
        for pad, blob in pieces:
            at += pad
            self._placed[at] = (identity(blob), blob)
            at += blob.nbytes
        self._pieces = pieces
        self._submitted = 0
        self._digests: dict[Identity, str] = {}
        self._stop = threading.Event()
        self._waited = 0.0
        self._error: BaseException | None = None
        self._stack = contextlib.ExitStack()
        self._mode = writable_mode(self.path, PteError)
        fd, self._tmp = temp_beside(self.path, PteError)
        self._stack.enter_context(removed_on_sigterm(self._tmp))
        self._stack.callback(self._remove)
        self._fd = fd
        self._thread = threading.Thread(target=self._run, name=f"texir-ptd-draft:{self.path.name}", daemon=True)
        self._thread.start()

    # --- the background write ---------------------------------------------------------------------

    def _run(self) -> None:
        _yield_cpu()
        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="texir-ptd-draft-hash",
                                    initializer=_yield_cpu) as pool:
                futures: dict[int, Future[str]] = {}
                try:
                    chunks = self._chunks(pool, futures)
                    if self._size >= _DIRECT_BYTES and _set_direct(self._fd, True):
                        _write_direct(self._fd, chunks, overlap=_OVERLAP)
                    else:
                        for chunk in chunks:
                            _write_all(self._fd, chunk)
                finally:
                    for future in futures.values():
                        future.cancel()
        except BaseException as exc:  # noqa: BLE001 - kept for dump_ptd, which then writes without the draft
            self._error = exc

    def _submit(self, pool: ThreadPoolExecutor, futures: dict[int, Future[str]], current: int) -> None:
        """Hash the payloads up to `current` and those within `_HASH_AHEAD` bytes past it."""
        ahead = 0
        while self._submitted < len(self._pieces) and (self._submitted <= current or ahead < _HASH_AHEAD):
            blob = self._pieces[self._submitted][1]
            futures[self._submitted] = pool.submit(_sha256, blob.view(), self._stop)
            if self._submitted > current:
                ahead += blob.nbytes
            self._submitted += 1

    def _chunks(self, pool: ThreadPoolExecutor, futures: dict[int, Future[str]]) -> Iterator[memoryview]:
        yield memoryview(bytes(self._head_size))  # the header's place: written last, from the real file
        for index, (pad, blob) in enumerate(self._pieces):
            self._submit(pool, futures, index)
            if pad:
                yield memoryview(bytes(pad))
            view = blob.view()
            for start in range(0, view.nbytes, _SLICE):
                if self._stop.is_set():
                    raise _Stopped
                yield view[start : start + _SLICE]
            self._digests[identity(blob)] = futures.pop(index).result()

    # --- finishing --------------------------------------------------------------------------------

    def finish(self, ptd: PtdFile, path: str | os.PathLike[str]) -> bool:
        """Complete the file as `ptd` at `path` (what `dump_ptd(ptd, path, draft=self)` does);
        False, with the draft removed, when it cannot be used (the caller then writes afresh)."""
        start = time.perf_counter()
        self._thread.join()
        self._waited = time.perf_counter() - start
        if self._fd < 0:
            return False  # used or closed already: written afresh
        try:
            if self._error is not None:
                return self._drop(f"drafting failed: {type(self._error).__name__}: {self._error}")
            return self._finish(ptd, Path(path))
        except _KeptApart:
            return self._drop("two payloads turned out equal: laid out by content")
        except OSError as exc:
            self.close()
            raise PteError(f"cannot write {os.fspath(path)}: {exc.strerror or exc}") from None
        except BaseException:
            self.close()
            raise

    def _finish(self, ptd: PtdFile, path: Path) -> bool:
        valid = dict(self._digests)
        for e in ptd.entries:  # what the draft hashed, the real payloads need not hash again
            known = valid.get(identity(e.data))
            if known is None:
                continue
            if not e.data.deferred:
                if e.data.digest() != known:  # these bytes changed since they were drafted
                    del valid[identity(e.data)]
            elif e.data._content is None:
                object.__setattr__(e.data, "_content", known)  # as HashingCopy records a hash
        head, pieces, end = _layout(ptd)
        if len(head) != self._head_size:
            return self._drop(f"the header is {len(head)} bytes, the draft's {self._head_size}: other entries")
        resolved = _resolved_head(head, pieces)
        kept = rewritten = 0
        at = len(head)
        spans: list[tuple[int, memoryview]] = [(0, memoryview(resolved))]  # the final file: (start, bytes)
        dirty: list[tuple[int, int]] = [(0, len(head))]
        claimed: set[int] = set()
        for pad, blob in pieces:
            at += pad
            spans.append((at, blob.view()))
            drafted = self._placed.get(at)
            if drafted is not None and drafted[0] == identity(blob) and drafted[0] in valid:
                kept += blob.nbytes
                claimed.add(at)
            else:
                dirty.append((at, at + blob.nbytes))
                rewritten += blob.nbytes
            at += blob.nbytes
        # drafted bytes nothing kept lie where the file wants other payloads or padding
        dirty += [(where, where + b.nbytes) for where, (_, b) in self._placed.items() if where not in claimed]
        os.ftruncate(self._fd, at)
        _write_ranges(self._fd, spans, _aligned(dirty, at), at)
        os.fchmod(self._fd, self._mode)
        os.close(self._fd)
        self._fd = -1
        try:
            os.replace(self._tmp, path)
        except OSError as exc:
            raise PteError(f"cannot write {path}: {exc.strerror or exc}") from None
        self._tmp = ""
        self.outcome = DraftOutcome(used=True, kept=kept, rewritten=rewritten, waited=self._waited)
        self.close()
        return True

    def _drop(self, why: str) -> bool:
        self.outcome = DraftOutcome(used=False, why=why, waited=self._waited)
        self.close()
        return False

    def close(self) -> None:
        """Stop drafting and remove the draft's file (nothing once `dump_ptd` used it)."""
        self._stop.set()
        self._thread.join()
        self._stack.close()

    def _remove(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        if self._tmp:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)
            self._tmp = ""

    def __enter__(self) -> PtdDraft:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _yield_cpu() -> None:
    """Lower the calling thread's priority (Linux schedules threads apart): the draft takes the
    cores the work it runs beside leaves idle, not its share of the busy one."""
    with contextlib.suppress(AttributeError, OSError):  # no per-thread priority here: the draft competes
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + _NICER)


def _by_memory(blob: Blob) -> Blob:
    """`blob` with a digest naming its memory, or for a small one its bytes: the real layout shares
    a segment among equal payloads, and small ones are cheap to compare (a model's norm weights,
    all ones before training); large ones equal to another are not predicted."""
    if blob.nbytes < _BY_CONTENT:
        return Blob(blob.view(), digest=hashlib.sha256(blob.view()).hexdigest())
    address, size = identity(blob)
    return Blob(blob.view(), digest=f"{address:032x}{size:032x}")


def _sha256(view: memoryview, stop: threading.Event) -> str:
    h = hashlib.sha256()
    for start in range(0, view.nbytes, _SLICE):
        if stop.is_set():
            raise _Stopped
        h.update(view[start : start + _SLICE])
    return h.hexdigest()


def _aligned(ranges: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """`ranges` widened to whole `_BLOCK`s (within `size`), merged, in order."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted((lo - lo % _BLOCK, min(size, -(-hi // _BLOCK) * _BLOCK)) for lo, hi in ranges if hi > lo):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _write_ranges(fd: int, spans: list[tuple[int, memoryview]], ranges: list[tuple[int, int]], size: int) -> None:
    """Write the file's bytes over `ranges` (block-aligned), each made in a page-aligned buffer from
    `spans` (the file: sorted, disjoint (start, bytes), zeros between them), past the page cache
    where the file system allows (the whole blocks; the file's last, partial one through it)."""
    buffer = mmap.mmap(-1, _SLICE)
    whole = np.frombuffer(buffer, dtype=np.uint8)
    starts = [start for start, _ in spans]
    direct = size >= _DIRECT_BYTES and _set_direct(fd, True)
    try:
        for lo, hi in ranges:
            for a in range(lo, hi, _SLICE):
                b = min(hi, a + _SLICE)
                out = whole[: b - a]
                out[:] = 0
                k = max(0, bisect.bisect_right(starts, a) - 1)
                while k < len(spans) and spans[k][0] < b:
                    start, view = spans[k]
                    x, y = max(a, start), min(b, start + view.nbytes)
                    if x < y:
                        np.copyto(out[x - a : y - a], np.frombuffer(view[x - start : y - start], dtype=np.uint8))
                    k += 1
                if direct and (b - a) % _BLOCK:
                    direct = not _set_direct(fd, False)  # the file's last block: through the page cache
                try:
                    _pwrite_all(fd, memoryview(buffer)[: b - a], a)
                except OSError as exc:
                    if not direct or exc.errno != errno.EINVAL:
                        raise
                    direct = not _set_direct(fd, False)  # the file system refuses direct writes
                    _pwrite_all(fd, memoryview(buffer)[: b - a], a)
    finally:
        _set_direct(fd, False)
        del whole
        with contextlib.suppress(BufferError):
            buffer.close()


def _pwrite_all(fd: int, view: memoryview, at: int) -> None:
    while view.nbytes:
        n = os.pwrite(fd, view, at)
        view, at = view[n:], at + n

