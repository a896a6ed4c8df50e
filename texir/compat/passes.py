"""ExecuTorch graph passes (`transform_passes`, `EdgeProgramManager.transform`) on texir programs,
run as ExecuTorch runs them: on the edge-dialect ExportedProgram of the method, whose result is
imported back as texir IR (`texir.executorch.import_executorch_program`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from torch.export import ExportedProgram

from texir.executorch import require_executorch
from texir.executorch.passes import TransformPassError, on_edge_view, quant_fusion_and_const_prop
from texir.ir import Program
from texir.lowering.lower import EdgeTransform

__all__ = ["TransformPassError", "edge_transform", "quant_fusion_and_const_prop", "transform_program"]


def _passes_for(passes: Any, method: str) -> Any:
    """The passes (a sequence, or a PassManager) ExecuTorch runs on `method`, or None for none."""
    if isinstance(passes, Mapping):
        return passes.get(method)
    return passes


def _run(ep: ExportedProgram, passes: Any) -> ExportedProgram:
    # executorch is this layer's dependency; its program module is slow to import
    from executorch.exir.program._program import _transform, _transform_with_pass_manager
    from torch.fx.passes.infra.pass_manager import PassManager

    if isinstance(passes, PassManager):  # ExecuTorch's ExportedProgramPassManager is one too
        result = _transform_with_pass_manager(ep, passes)
    else:
        result = _transform(ep, *passes)
    return cast(ExportedProgram, result)


def _check_passes(passes: Any) -> None:
    if isinstance(passes, Mapping):
        for method, chosen in passes.items():
            _check_passes_of(f"transform_passes[{method!r}]", chosen)
    else:
        _check_passes_of("transform_passes", passes)


def _check_passes_of(where: str, passes: Any) -> None:
    # executorch is this layer's dependency (torch's PassManager is what ExecuTorch's managers extend)
    from torch.fx.passes.infra.pass_manager import PassManager

    if isinstance(passes, PassManager) or passes is None:
        return
    if not isinstance(passes, Sequence) or isinstance(passes, str) or not all(callable(p) for p in passes):
        raise TransformPassError(
            f"{where} is a {type(passes).__name__}; pass a list of passes (callables), a dict of such lists by "
            "method name, or a PassManager"
        )


def transform_program(method: str, program: Program, passes: Any) -> Program:
    """`program` (to_edge form) after ExecuTorch's `passes` for `method` (as `transform_passes` takes
    them: a list, a dict by method name, or a PassManager); the same program when none apply."""
    _check_passes(passes)
    chosen = _passes_for(passes, method)
    if chosen is None or (isinstance(chosen, Sequence) and not chosen):
        return program
    require_executorch("transform_passes")
    names = ", ".join(getattr(p, "__name__", type(p).__name__)
                      for p in (chosen if isinstance(chosen, Sequence) else [chosen]))
    return on_edge_view(
        method, program, lambda view: _run(view, chosen), f"ExecuTorch pass ({names})",
        "fix the pass or drop it from transform_passes",
    )


def edge_transform(passes: Any) -> EdgeTransform | None:
    """`transform_passes` as `texir.lower`'s `transform` hook (None for no passes)."""
    if not passes:
        return None
    _check_passes(passes)

    def run(method: str, program: Program) -> Program:
        return transform_program(method, program, passes)

    return run
