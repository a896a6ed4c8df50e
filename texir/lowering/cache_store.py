"""Where the preprocess cache keeps its entries durably: a local directory or a directory at an
fsspec URL (`memory://`, `s3://bucket/texir`, ...), one file per key under `<root>/<key[:2]>/<key>`,
each written atomically (a reader sees a whole entry or none; writers racing on a key are safe)."""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Any, Protocol

from texir.lowering.errors import BackendPreprocessError

__all__ = ["Store", "open_store"]


class Store(Protocol):
    """Where durable cache entries live: one file per key, under `<root>/<key[:2]>/<key>`."""

    def read(self, key: str) -> bytes | None: ...

    def write(self, key: str, data: bytes) -> None: ...


class _LocalStore:
    """A local directory. Each entry is written to a temporary file beside it and renamed into
    place (`os.replace`, atomic): a reader sees a whole entry or none, and writers racing on one
    key (with equal bytes: the key is their content's) leave one whole file."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, key: str) -> bytes | None:
        try:
            return (self.root / key[:2] / key).read_bytes()
        except OSError:
            return None

    def write(self, key: str, data: bytes) -> None:
        folder = self.root / key[:2]
        tmp = None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}.")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, folder / key)
        except OSError:  # a cache that cannot be written is only slower
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass


# Object stores make an object visible only once its single upload is complete: written in place.
_ATOMIC_PUT = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "r2"})


class _FsspecStore:
    """A directory on an fsspec filesystem. On object stores (S3, GCS, Azure) an entry is one
    upload, visible whole or not at all; elsewhere (memory://, sftp, ...) it is written to a
    temporary name and moved into place. Any error of the filesystem counts as a miss on reading
    and is dropped on writing: a cache that cannot be read or written is only slower."""

    def __init__(self, fs: Any, root: str) -> None:
        self.fs, self.root = fs, root.rstrip("/")
        protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
        self.atomic_put = bool(protocols & _ATOMIC_PUT)

    def read(self, key: str) -> bytes | None:
        try:
            data = self.fs.cat_file(f"{self.root}/{key[:2]}/{key}")
        except Exception:  # fsspec backends raise their own errors (a missing key, no network)
            return None
        return data if isinstance(data, bytes) else None

    def write(self, key: str, data: bytes) -> None:
        folder = f"{self.root}/{key[:2]}"
        tmp = None
        try:
            if self.atomic_put:
                self.fs.pipe_file(f"{folder}/{key}", data)
                return
            self.fs.makedirs(folder, exist_ok=True)
            tmp = f"{folder}/.{key}.{uuid.uuid4().hex}"
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, f"{folder}/{key}")
        except Exception:  # see the class docstring
            if tmp is not None:
                try:
                    self.fs.rm_file(tmp)
                except Exception:  # already gone, or the filesystem is unreachable
                    pass


def _is_url(location: str) -> bool:
    return "://" in location or "::" in location


def open_store(location: str | os.PathLike[str]) -> tuple[Store, Path | None]:
    """The store at `location` (a local path, `~` and environment variables expanded, or an fsspec
    URL, environment variables expanded) and its local directory, if it is one."""
    text = os.path.expandvars(os.fspath(location))
    if not _is_url(text):
        root = Path(os.path.expanduser(text))
        return _LocalStore(root), root
    # fsspec only for a URL: a local cache needs nothing past the standard library
    import fsspec
    from fsspec.implementations.local import LocalFileSystem  # with fsspec, for the same reason

    try:
        fs, root_path = fsspec.core.url_to_fs(text)
    except (ImportError, ValueError) as exc:  # an unknown protocol or its package missing
        raise BackendPreprocessError(
            f"preprocess cache location {text!r}: fsspec cannot open it ({type(exc).__name__}: {exc}); "
            "install the filesystem's package (e.g. s3fs for s3://) or give a local directory"
        ) from exc
    if isinstance(fs, LocalFileSystem):
        root = Path(root_path)
        return _LocalStore(root), root
    return _FsspecStore(fs, root_path), None
