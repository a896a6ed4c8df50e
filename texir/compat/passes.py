"""ExecuTorch graph passes (`transform_passes`, `EdgeProgramManager.transform`) on texir programs,
run as ExecuTorch runs them: on the edge-dialect ExportedProgram of the method, whose result is
imported back as texir IR (`texir.executorch.import_executorch_program`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from torch.export import ExportedProgram

from texir.errors import LoweringError, TexirError
from texir.executorch import import_executorch_program, require_executorch, to_edge_exported_program
from texir.ir import Program
from texir.lowering.lower import EdgeTransform

__all__ = ["TransformPassError", "edge_transform", "quant_fusion_and_const_prop", "transform_program"]


class TransformPassError(LoweringError):
    """An ExecuTorch pass given as `transform_passes` failed, or left a program texir cannot import."""


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
    return _on_edge_view(
        method, program, lambda view: _run(view, chosen), f"ExecuTorch pass ({names})",
        "fix the pass or drop it from transform_passes",
    )


def _on_edge_view(
    method: str, program: Program, run: Callable[[ExportedProgram], ExportedProgram], what: str, fix: str
) -> Program:
    """`run` on the method's edge ExportedProgram, the result imported back as texir IR; its failure,
    or a result texir cannot import, a `TransformPassError` naming the method, `what` ran and `fix`."""
    view = to_edge_exported_program(program)
    try:
        result = run(view)
    except TexirError:
        raise
    except Exception as exc:  # a pass's failure of any kind becomes one typed error
        raise TransformPassError(f"method {method!r}: {what} raised {type(exc).__name__}: {exc}; {fix}") from exc
    try:
        return import_executorch_program(result)
    except TexirError as exc:
        raise TransformPassError(f"method {method!r}: the program after {what} cannot be imported: {exc}") from exc


def edge_transform(passes: Any) -> EdgeTransform | None:
    """`transform_passes` as `texir.lower`'s `transform` hook (None for no passes)."""
    if not passes:
        return None
    _check_passes(passes)

    def run(method: str, program: Program) -> Program:
        return transform_program(method, program, passes)

    return run


def quant_fusion_and_const_prop(method: str, program: Program) -> Program:
    """`program` (lowered, to_edge form) after ExecuTorch's `quant_fusion_and_const_prop_pass`, which
    its `to_executorch` runs for `ExecutorchBackendConfig(do_quant_fusion_and_const_prop=True)`: the
    quantized patterns left outside delegates fused, and every node computed from constants alone
    folded into a new constant (`_prop_tensor_constant<N>`). Run on the method's edge ExportedProgram
    and imported back, as the transform passes are."""
    require_executorch("ExecutorchBackendConfig(do_quant_fusion_and_const_prop=True)")
    # executorch is this layer's dependency; its pass module imports the quantized patterns
    from executorch.exir.passes.quant_fusion_pass import quant_fusion_and_const_prop_pass

    return _on_edge_view(
        method, program, quant_fusion_and_const_prop_pass, "ExecuTorch's quant_fusion_and_const_prop_pass",
        "leave ExecutorchBackendConfig.do_quant_fusion_and_const_prop at False",
    )
