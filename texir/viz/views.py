"""Canonical text views of Programs, lowered backend modules and `.pte` programs.

A view is the text a snapshot stores and a diff compares, plus the original node names by line
(canonical names are positions, so a report shows both)."""

from __future__ import annotations

from typing import Any

import msgspec

from texir.errors import TexirError
from texir.viz.diff import (
    canonical_module_text,
    canonical_text,
    module_original_names,
    original_names,
)
from texir.ir.types import LoweredBackendModule, Program
from texir.viz.pte_view import bundle_text, pte_text

__all__ = ["TextView", "text_view"]


class TextView(msgspec.Struct, frozen=True):
    text: str
    names: dict[int, str] = msgspec.field(default_factory=dict)
    """Line number -> original node name."""
    kind: str = "program"


def text_view(obj: Any) -> TextView:
    """The canonical text view of a Program, a LoweredBackendModule, a PteProgram or a
    BundledProgram (an ExportedProgram is converted first)."""
    if isinstance(obj, Program):
        text = canonical_text(obj)
        return TextView(text, original_names(obj, text), "program")
    if isinstance(obj, LoweredBackendModule):
        text = canonical_module_text(obj)
        return TextView(text, module_original_names(obj, text), "lowered_module")
    if type(obj).__name__ == "ExportedProgram":  # convenience for tests on torch.export output
        from texir.adapters import from_exported_program  # imports torch (~2 s): only this case pays

        return text_view(from_exported_program(obj))
    if type(obj).__name__ == "PteProgram":
        return TextView(pte_text(obj), {}, "pte")
    if type(obj).__name__ == "BundledProgram":
        return TextView(bundle_text(obj), {}, "bpte")
    raise TexirError(
        f"cannot snapshot or diff a {type(obj).__name__}: pass a texir Program, a "
        "LoweredBackendModule or a PteProgram (texir.adapters.from_exported_program converts "
        "an ExportedProgram)"
    )
