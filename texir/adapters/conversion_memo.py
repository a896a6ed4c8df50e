"""The conversion memo: inside one `conversion_memo` block, each IR program is converted to an
ExportedProgram once, whoever asks (the partitioners' decomposition hooks, `lower`'s second
decomposition)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from torch.export import ExportedProgram

from texir.adapters.fx_export import to_exported_program
from texir.ir import Program

__all__ = ["conversion_memo", "exported_program_of", "forget_exported", "remember_exported"]

_EXPORTED: ContextVar[dict[int, tuple[Program, ExportedProgram]] | None] = ContextVar("texir_exported", default=None)


@contextlib.contextmanager
def conversion_memo() -> Iterator[None]:
    """Inside the block `exported_program_of` converts each program once: `lower` opens one per
    method, so the partitioners' decomposition hooks share one ExportedProgram of the program they
    are shown (the one it was converted from, when `remember_exported` recorded it)."""
    token = _EXPORTED.set({})
    try:
        yield
    finally:
        _EXPORTED.reset(token)


def remember_exported(program: Program, ep: ExportedProgram) -> None:
    """Record that `program` is `ep` converted (inside a `conversion_memo`; else nothing)."""
    memo = _EXPORTED.get()
    if memo is not None:
        memo[id(program)] = (program, ep)  # holds the program, so its id stays its own


def forget_exported(program: Program) -> None:
    """Drop what `remember_exported` recorded of `program` (when no hook will be shown it again)."""
    memo = _EXPORTED.get()
    if memo is not None:
        memo.pop(id(program), None)


def exported_program_of(program: Program) -> ExportedProgram:
    """`program` as an ATen ExportedProgram, converted once per `conversion_memo` block. The result
    is shared: read it, do not change it (`to_edge_exported_program` builds a fresh one to change)."""
    memo = _EXPORTED.get()
    found = memo.get(id(program)) if memo is not None else None
    if found is not None and found[0] is program:
        return found[1]
    ep = to_exported_program(program)
    remember_exported(program, ep)
    return ep
