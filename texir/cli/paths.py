"""The files a command reads and writes: checked before it does any work, and (`Outputs`) written
to temporary files renamed into place together at the end, so that an error or an interrupt leaves
none of them."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from texir._io import removed_on_sigterm
from texir.cli import interrupts
from texir.errors import TexirError, UsageError

__all__ = ["Outputs", "OutputError", "check_output", "input_file", "is_model_spec", "refuse_clobbering"]


class OutputError(TexirError):
    """An output file could not be written or put in place."""


def input_file(spec: str) -> Path | None:
    """The file an input argument reads, if any: ``model.py:build`` reads ``model.py``; a
    snapshot, ``.pte`` or ``.pt2`` argument is the file itself; ``package.module:fn`` reads none."""
    head, sep, _ = spec.rpartition(":")
    if sep and head.endswith(".py"):
        return Path(head)
    candidate = Path(spec)
    return candidate if candidate.exists() else None


def is_model_spec(spec: str) -> bool:
    """True when the argument names a model to export (``file.py:fn``, ``package.module:fn``,
    ``.pt2``), not a snapshot or ``.pte`` file."""
    head, sep, _ = spec.rpartition(":")
    if sep and (head.endswith(".py") or not Path(spec).exists()):
        return True
    return spec.endswith(".pt2")


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def refuse_clobbering(command: str, inputs: Sequence[str], outputs: Sequence[tuple[str, Path | None]]) -> None:
    """Raise UsageError when an output names an input file, or two outputs name one file: the
    command would destroy its own input (or write one file twice)."""
    read = [(spec, path) for spec in inputs if (path := input_file(spec)) is not None]
    written: list[tuple[str, Path]] = []
    for flag, out in outputs:
        if out is None:
            continue
        for spec, path in read:
            if _same(out, path):
                raise UsageError(f"{flag} {out} is the input {spec!r}: {command} would overwrite it; write elsewhere")
        for other_flag, other in written:
            if _same(out, other):
                raise UsageError(f"{flag} and {other_flag} both name {out}; give each output its own file")
        written.append((flag, out))


def _mode_for(target: Path) -> int:
    """The permission bits the finished file gets: an existing file's, else what open() gives."""
    with contextlib.suppress(OSError):
        existing = target.stat()
        if stat.S_ISREG(existing.st_mode):
            return stat.S_IMODE(existing.st_mode)
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def check_output(flag: str, path: Path) -> None:
    """UsageError unless `path` can be written now: its directory exists and takes a new file (tried
    for real: a read-only file system or a directory without write permission fails here), and
    `path` is not a directory or a read-only file."""
    directory = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a directory; give a file name")
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        raise UsageError(f"{flag} {path}: the directory {directory} {what}; create it or write elsewhere")
    if path.exists() and (not os.access(path, os.W_OK) or not path.stat().st_mode & stat.S_IWUSR):
        raise UsageError(f"{flag} {path} is read-only; make it writable or write elsewhere")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot create a file in {directory}: {exc.strerror or exc}") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


class Outputs:
    """All the files one command writes, as one unit.

        with Outputs() as outputs:
            outputs.add("-o", args.output)             # checked now, before any work
            ...                                         # the work
            outputs.write(args.output, lambda tmp: pte.dump(program, tmp))
            outputs.commit()                            # every file renamed into place
        for path in outputs.written: ...

    Each `write` goes to a temporary file beside its destination (removed on SIGTERM too); `commit`
    renames them all, in the order they were added, and undoes the renames done if one fails or a
    SIGINT arrives meanwhile (a replaced file is restored). Leaving the block without a commit
    removes every temporary file; a failure of that cleanup never hides the error being raised.
    """

    def __init__(self) -> None:
        self._flags: dict[Path, str] = {}
        self._staged: dict[Path, str] = {}
        self._stack = contextlib.ExitStack()
        self.written: list[Path] = []

    def __enter__(self) -> Outputs:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.discard()

    def add(self, flag: str, path: Path | None) -> None:
        """Declare (and check) an output the command may write; None is no output."""
        if path is None:
            return
        check_output(flag, path)
        self._flags[path] = flag

    def write(self, target: Path, writer: Callable[[Path], None]) -> None:
        """`writer(tmp)` writes `target`'s content to the temporary path it is given."""
        if target not in self._flags:
            raise OutputError(f"internal error: {target} was not declared as an output; please report")
        interrupts.checkpoint(f"writing {target}")
        directory = target.parent if str(target.parent) else Path(".")
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
        except OSError as exc:
            raise OutputError(f"cannot write {target}: {exc.strerror or exc}") from None
        os.close(fd)
        self._stack.enter_context(removed_on_sigterm(tmp))
        self._staged[target] = tmp
        writer(Path(tmp))
        interrupts.checkpoint(f"wrote {target}")

    def size(self, target: Path) -> int:
        """The size of `target` as written (staged or in place)."""
        return Path(self._staged.get(target, target)).stat().st_size

    def commit(self) -> list[Path]:
        """Rename every written file into place, all or none; returns them in order."""
        done: list[tuple[Path, str | None]] = []
        with interrupts.deferred():
            try:
                if interrupts.interrupted():
                    raise KeyboardInterrupt
                for target in [t for t in self._flags if t in self._staged]:
                    interrupts.checkpoint(f"renaming {target}")
                    tmp = self._staged[target]
                    os.chmod(tmp, _mode_for(target))
                    backup = self._backup(target)
                    os.replace(tmp, target)
                    done.append((target, backup))
                    del self._staged[target]
                if interrupts.interrupted():
                    raise KeyboardInterrupt
            except BaseException as exc:
                self._undo(done)
                if isinstance(exc, OSError):
                    raise OutputError(f"cannot write {exc.filename or 'an output'}: {exc.strerror or exc}") from None
                raise
            for _, backup in done:
                if backup is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(backup)
            interrupts.finished()
        self.written = [t for t, _ in done]
        self._stack.close()
        interrupts.checkpoint("committed")  # a SIGINT from here on is ignored: the command exits 0
        return self.written

    @staticmethod
    def _backup(target: Path) -> str | None:
        """A hard link to the file `target` replaces, to restore it if the commit is undone."""
        if not target.is_file():
            return None
        name = tempfile.mktemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            os.link(target, name)
        except OSError:
            return None
        return name

    def _undo(self, done: list[tuple[Path, str | None]]) -> None:
        for target, backup in reversed(done):
            with contextlib.suppress(OSError):
                if backup is not None:
                    os.replace(backup, target)
                else:
                    os.unlink(target)

    def discard(self) -> None:
        """Remove every temporary file not yet renamed (cleanup errors are ignored)."""
        with interrupts.deferred():
            for tmp in self._staged.values():
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            self._staged.clear()
            with contextlib.suppress(Exception):
                self._stack.close()
