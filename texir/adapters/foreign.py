"""Hooks through which a layer above the adapters teaches the importer objects of another
lowering stack (ExecuTorch's edge operators and lowered modules: `texir.executorch.reimport`
registers them), so the adapters never import that stack."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.export import ExportedProgram

from texir.ir import types as ir

__all__ = [
    "LoweredImporter",
    "TargetNamer",
    "foreign_lowered_module",
    "foreign_target",
    "register_lowered_importer",
    "register_target_namer",
]

TargetNamer = Callable[[Any], "str | None"]
"""An FX call target -> its canonical texir string (`aten::add.Tensor`), or None when not its kind."""

LoweredImporter = Callable[[Any, Callable[[ExportedProgram], ir.Program]], "ir.LoweredBackendModule | None"]
"""A `get_attr` value and the importer of nested programs -> a texir lowered module, or None when not
its kind."""

_TARGET_NAMERS: list[TargetNamer] = []
_LOWERED_IMPORTERS: list[LoweredImporter] = []


def register_target_namer(namer: TargetNamer) -> None:
    """Ask `namer` about call targets texir does not know (once per target: the answer is cached)."""
    if namer not in _TARGET_NAMERS:
        _TARGET_NAMERS.append(namer)


def register_lowered_importer(importer: LoweredImporter) -> None:
    """Ask `importer` about `get_attr` values that are neither graphs nor texir lowered modules."""
    if importer not in _LOWERED_IMPORTERS:
        _LOWERED_IMPORTERS.append(importer)


def foreign_target(target: Any) -> str | None:
    """The first registered namer's canonical string for `target`, or None."""
    for namer in _TARGET_NAMERS:
        name = namer(target)
        if name is not None:
            return name
    return None


def foreign_lowered_module(
    value: Any, import_program: Callable[[ExportedProgram], ir.Program]
) -> ir.LoweredBackendModule | None:
    """The first registered importer's texir lowered module for `value`, or None."""
    for importer in _LOWERED_IMPORTERS:
        module = importer(value, import_program)
        if module is not None:
            return module
    return None
