"""Shared low-level helpers: atomic file output and pausing the cyclic GC. No torch, no flatbuffers."""

from __future__ import annotations

import contextlib
import gc
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from texir.errors import TexirError

_CHUNK = 16 << 20
"""Largest single write: bounds the copy a non-contiguous view may need."""


def _default_file_mode() -> int:
    # mkstemp creates 0600 files; give the result the mode a plain open() would.
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write(
    path: str | os.PathLike[str],
    chunks: Iterable[bytes | memoryview],
    *,
    error: type[TexirError] = TexirError,
) -> None:
    """Write `chunks` to `path` through a temporary file in the same directory and `os.replace`.

    Payloads are streamed chunk by chunk (never joined into one bytes object). On any failure the
    temporary file is removed and `path` is left as it was; an OSError becomes `error`, naming the
    file. No fsync: `os.replace` is atomic for readers; power-loss durability is left to the OS.
    """
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise error(f"cannot write {target}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), _default_file_mode())
            for chunk in chunks:
                view = memoryview(chunk)
                for start in range(0, view.nbytes, _CHUNK):
                    fh.write(view[start : start + _CHUNK])
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise error(f"cannot write {target}: {exc.strerror or exc}") from None
        raise


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
