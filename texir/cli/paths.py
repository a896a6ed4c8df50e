"""Checks on the files a command reads and writes, before it does any work."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from texir.errors import UsageError

__all__ = ["input_file", "is_model_spec", "refuse_clobbering"]


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
