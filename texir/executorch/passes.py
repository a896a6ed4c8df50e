"""ExecuTorch graph passes run on a texir program as ExecuTorch runs them: on the method's
edge-dialect ExportedProgram, whose result is imported back as texir IR. The bridge's part of
`texir.compat.passes` (which adds `transform_passes`), here so that `texir.recipes` and the CLI can
run ExecuTorch's `quant_fusion_and_const_prop_pass` without the compat facade."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from torch.export import ExportedProgram

from texir.errors import LoweringError, TexirError
from texir.executorch.deps import require_executorch
from texir.executorch.edge_program import to_edge_exported_program
from texir.executorch.reimport import import_executorch_program
from texir.ir import Program
from texir.lowering.report import Lowered

__all__ = ["TransformPassError", "fuse_quantized_embeddings", "on_edge_view", "quant_fusion_and_const_prop"]


class TransformPassError(LoweringError):
    """An ExecuTorch pass given as `transform_passes` failed, or left a program texir cannot import."""


def on_edge_view(
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


def quant_fusion_and_const_prop(method: str, program: Program) -> Program:
    """`program` (lowered, to_edge form) after ExecuTorch's `quant_fusion_and_const_prop_pass`, which
    its `to_executorch` runs for `ExecutorchBackendConfig(do_quant_fusion_and_const_prop=True)`: the
    quantized patterns left outside delegates fused, and every node computed from constants alone
    folded into a new constant (`_prop_tensor_constant<N>`). Run on the method's edge ExportedProgram
    and imported back, as the transform passes are."""
    require_executorch("ExecutorchBackendConfig(do_quant_fusion_and_const_prop=True)")
    # executorch is this layer's dependency; its pass module imports the quantized patterns
    from executorch.exir.passes.quant_fusion_pass import quant_fusion_and_const_prop_pass

    return on_edge_view(
        method, program, quant_fusion_and_const_prop_pass, "ExecuTorch's quant_fusion_and_const_prop_pass",
        "leave ExecutorchBackendConfig.do_quant_fusion_and_const_prop at False",
    )


def fuse_quantized_embeddings(lowered: Lowered, method: str = "forward") -> Lowered:
    """`lowered` with its program after ExecuTorch's `quant_fusion_and_const_prop_pass` (what
    `texir lower hf:DIR --qembedding` runs after lowering): the torchao `dequantize_affine` +
    `embedding` pairs that `qembedding` leaves outside XNNPACK become ExecuTorch's
    `quantized_decomposed::embedding_4bit`/`embedding_byte` (packed weights, folded as constants), which
    the runtime has kernels for. A program with nothing to fuse comes back with its constant subgraphs
    folded. Needs the `executorch` extra; a failure of the pass is a `TransformPassError`."""
    if not isinstance(lowered, Lowered):
        raise TransformPassError(f"fuse_quantized_embeddings takes what texir.lower returns (a Lowered), not a "
                                 f"{type(lowered).__name__}; pass texir.lower(...)'s result itself")
    program = quant_fusion_and_const_prop(method, lowered.program)
    return msgspec.structs.replace(lowered, program=program)
