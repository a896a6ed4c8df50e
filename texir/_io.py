"""Shared low-level helpers: atomic file output and pausing the cyclic GC. No torch, no flatbuffers."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import gc
import mmap
import os
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import FrameType

from texir.errors import TexirError

_CHUNK = 16 << 20
"""Largest single write: bounds the copy a non-contiguous view may need."""


def _default_file_mode() -> int:
    # mkstemp creates 0600 files; give the result the mode a plain open() would.
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


_TMP_SUFFIX = ".tmp"
_STALE_AFTER_S = 60.0
"""A temporary file of ours older than this, beside the destination, was left by a killed writer."""

_live: set[str] = set()
# Reentrant: the SIGTERM handler takes it on the main thread, which may hold it when the signal lands.
_live_lock = threading.RLock()


def _temp_prefix(target: Path) -> str:
    return f".{target.name}."


def _remove_stale(directory: Path, target: Path) -> None:
    """Delete temporary files of our naming pattern for `target` left behind by a writer that was
    killed (SIGKILL cannot be caught); recent ones may belong to a writer still running."""
    prefix = _temp_prefix(target)
    now = time.time()
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            name = entry.name
            if not (name.startswith(prefix) and name.endswith(_TMP_SUFFIX)) or entry.path in _live:
                continue
            middle = name[len(prefix):-len(_TMP_SUFFIX)]
            if not middle or "." in middle:  # mkstemp's random part has no dots
                continue
            with contextlib.suppress(OSError):
                if now - entry.stat(follow_symlinks=False).st_mtime > _STALE_AFTER_S:
                    os.unlink(entry.path)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Remove every temporary file being written, then die of the signal as we would have.
    with _live_lock:
        for tmp in list(_live):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


@contextlib.contextmanager
def _sigterm_cleanup(tmp: str) -> Iterator[None]:
    installed = False
    if threading.current_thread() is threading.main_thread():
        previous = signal.getsignal(signal.SIGTERM)
        if previous in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _on_sigterm)
            installed = True
    with _live_lock:
        _live.add(tmp)
    try:
        yield
    finally:
        with _live_lock:
            _live.discard(tmp)
        if installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def removed_on_sigterm(path: str) -> Iterator[None]:
    """Inside, SIGTERM removes the temporary file `path` (with any other being written) before the
    process dies of it; it is also a "live" file that stale-file cleanup leaves alone."""
    with _sigterm_cleanup(path):
        yield


def writable_mode(target: Path, error: type[TexirError] = TexirError) -> int:
    """The permission bits a file written to `target` gets: an existing file's own, else what a
    plain open() would give; a read-only destination is `error`."""
    mode = _default_file_mode()
    with contextlib.suppress(FileNotFoundError):
        existing = target.stat()
        if stat.S_ISREG(existing.st_mode):
            if not existing.st_mode & stat.S_IWUSR or not os.access(target, os.W_OK):
                raise error(f"cannot write {target}: the file is read-only; make it writable or choose another output")
            mode = stat.S_IMODE(existing.st_mode)
    return mode


def temp_beside(target: Path, error: type[TexirError] = TexirError) -> tuple[int, str]:
    """A new temporary file (descriptor, path) in `target`'s directory, named so that a killed
    writer's leftovers are found and removed (which this does first for `target`)."""
    directory = target.parent if str(target.parent) else Path(".")
    _remove_stale(directory, target)
    try:
        return tempfile.mkstemp(prefix=_temp_prefix(target), suffix=_TMP_SUFFIX, dir=directory)
    except OSError as exc:
        raise error(f"cannot write {target}: {exc.strerror or exc}") from None


def atomic_write(
    path: str | os.PathLike[str],
    chunks: Iterable[bytes | memoryview],
    *,
    error: type[TexirError] = TexirError,
    head: Callable[[], bytes | memoryview] | None = None,
    size_hint: int = 0,
) -> None:
    """Write `chunks` to `path` through a temporary file in the same directory and `os.replace`.
    `head`, when given, is called once every chunk is written, and its bytes are written over the
    file's first bytes (a header that depends on what writing the chunks learnt, of the same length).

    Payloads are streamed chunk by chunk (never joined into one bytes object). On any failure, and
    on SIGTERM, the temporary file is removed and `path` is left as it was; temporary files a
    killed writer left for the same destination are removed first. An existing destination keeps
    its permission bits; a read-only one is refused. An OSError becomes `error`, naming the file.
    No fsync: `os.replace` is atomic for readers; power-loss durability is left to the OS.
    `size_hint`: the bytes the chunks will hold; from `_DIRECT_BYTES` up they are written past the
    page cache where the file system allows it (`_write_direct`).
    """
    target = Path(path)
    mode = writable_mode(target, error)
    fd, tmp = temp_beside(target, error)
    try:
        with _sigterm_cleanup(tmp), os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            if size_hint >= _DIRECT_BYTES and _set_direct(fh.fileno(), True):
                _write_direct(fh.fileno(), chunks)
            else:
                for chunk in chunks:
                    view = memoryview(chunk)
                    for start in range(0, view.nbytes, _CHUNK):
                        fh.write(view[start : start + _CHUNK])
            if head is not None:
                size = fh.tell()
                fh.seek(0)
                fh.write(head())
                if fh.tell() > size:
                    raise error(f"cannot write {target}: its header grew past the data written after it")
            os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise error(f"cannot write {target}: {exc.strerror or exc}") from None
        raise


_DIRECT_BYTES = 64 << 20
"""Files from this size up are written with O_DIRECT (`_write_direct`)."""
_DIRECT_BLOCK = 16 << 20
"""The bounce buffer of a direct write: page-aligned, a multiple of any device's logical block."""


def _releasing_copy(into: memoryview) -> Callable[[int, memoryview], None]:
    """`copy(at, view)` puts `view`'s bytes into `into[at:]` with the GIL released (numpy's copy
    releases it; a memoryview slice assignment holds it for the whole copy, stalling every other
    thread: a `.ptd` drafted beside `torch.export` would slow the export)."""
    # numpy loads in ~0.1 s: only large files, which need the copy, pay for it
    import numpy as np

    target = np.frombuffer(into, dtype=np.uint8)

    def copy(at: int, view: memoryview) -> None:
        np.copyto(target[at : at + view.nbytes], np.frombuffer(view, dtype=np.uint8))

    return copy


def _set_direct(fd: int, on: bool) -> bool:
    """Turn O_DIRECT on or off for `fd`; whether it is now as asked (False where the system or
    the file system has no O_DIRECT: tmpfs, other platforms)."""
    direct = getattr(os, "O_DIRECT", 0)
    if not direct:
        return not on
    try:
        # fcntl exists on POSIX only, and only large writes need it: imported here, where its absence is handled
        import fcntl
    except ImportError:  # not POSIX
        return not on
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | direct if on else flags & ~direct)
    except OSError:
        return not on
    return True


def _write_all(fd: int, view: memoryview) -> None:
    while view.nbytes:
        view = view[os.write(fd, view):]


def _write_direct(fd: int, chunks: Iterable[bytes | memoryview], *, overlap: bool = True) -> None:
    """Write `chunks` from the start of `fd` (O_DIRECT set), through two page-aligned bounce
    buffers in whole `_DIRECT_BLOCK`s (with `overlap`, one filled while the other is written, on a
    thread of its own; else filled and written in turn, half the pace of memory traffic: what a
    write beside other work wants), then the tail with O_DIRECT off (it need not be a whole block); O_DIRECT is off when
    this returns. Why: a write through the page cache first has the kernel find fresh pages for
    the file (on this project's VMs 350-700 MiB/s), while a direct write goes from the buffer to
    the device (1.5-2 GB/s there); a file of many GB passes through the page cache at the disk's
    speed anyway once dirty pages are throttled. The file system may refuse a direct write
    (EINVAL): the rest is then written through the page cache."""
    buffers = [mmap.mmap(-1, _DIRECT_BLOCK) for _ in range(2)]
    views = [memoryview(b) for b in buffers]
    copies = [_releasing_copy(v) for v in views]
    direct = [True]

    def write(whole: memoryview) -> None:
        if direct[0]:
            try:
                _write_all(fd, whole)
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL or os.lseek(fd, 0, os.SEEK_CUR) % _DIRECT_BLOCK:
                    raise
                direct[0] = not _set_direct(fd, False)  # refused: the page cache then
        _write_all(fd, whole)

    k = fill = 0
    pending: Future[None] | None = None
    try:
        # a writer thread only to overlap: filled and written in turn, the buffers simply alternate
        overlapping = ThreadPoolExecutor(max_workers=1, thread_name_prefix="texir-write") if overlap else None
        with overlapping or contextlib.nullcontext():
            try:
                for chunk in chunks:
                    view = memoryview(chunk)
                    if view.ndim != 1 or view.format != "B":
                        view = view.cast("B")
                    pos = 0
                    while pos < view.nbytes:
                        take = min(view.nbytes - pos, _DIRECT_BLOCK - fill)
                        copies[k](fill, view[pos : pos + take])
                        fill += take
                        pos += take
                        if fill == _DIRECT_BLOCK:
                            if pending is not None:
                                pending.result()  # the other buffer is free again
                            if overlapping is not None:
                                pending = overlapping.submit(write, views[k])
                            else:
                                write(views[k])
                            k, fill = 1 - k, 0
                if pending is not None:
                    pending.result()
                    pending = None
            finally:
                if pending is not None:  # a failed copy: the write in flight ends before the buffers go
                    pending.cancel()
                    with contextlib.suppress(BaseException):
                        pending.result()
        if direct[0]:
            _set_direct(fd, False)
        _write_all(fd, views[k][:fill])
    finally:
        # A failed write's traceback may still hold a slice of a buffer: then the collector frees
        # it, and the failure, not a BufferError, is what the caller sees.
        del copies  # their arrays view the buffers
        for whole, buffer in zip(views, buffers):
            with contextlib.suppress(BufferError):
                whole.release()
                buffer.close()


_PAGE = mmap.PAGESIZE
_MADV_WILLNEED: int | None = getattr(mmap, "MADV_WILLNEED", None)
_madvise: Callable[[int, int, int], int] | None = None
"""libc's madvise, bound on first use (None until then, and where there is none)."""
_madvise_tried = False


def _libc_madvise() -> Callable[[int, int, int], int] | None:
    global _madvise, _madvise_tried
    if not _madvise_tried:
        _madvise_tried = True
        try:
            fn = ctypes.CDLL(None, use_errno=True).madvise
        except (OSError, AttributeError):
            return None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        fn.restype = ctypes.c_int
        _madvise = fn
    return _madvise


def advise_willneed(address: int, nbytes: int) -> None:
    """Ask the kernel to start reading the pages of `[address, address + nbytes)` (a file mapping:
    a memory-mapped checkpoint) into memory now, asynchronously, so that reading them later finds
    them cached instead of faulting them in one by one. Only a hint: does nothing where the system
    has no `madvise`, and ignores its failures (the bytes are read by page faults then)."""
    fn = _libc_madvise() if _MADV_WILLNEED is not None and nbytes > 0 else None
    if fn is None or _MADV_WILLNEED is None:
        return
    start = address - address % _PAGE  # madvise wants a page-aligned start
    fn(start, address + nbytes - start, _MADV_WILLNEED)  # ctypes releases the GIL around the call


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building many small acyclic objects (conversion,
    decoding): otherwise it rescans the growing heap again and again, for nothing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
