"""IR program -> the edge-dialect ExportedProgram ExecuTorch's partitioners and backends read."""

from __future__ import annotations

import json
from typing import Any

import torch
from torch.export import ExportedProgram

from texir.adapters.decompositions import graph_modules
from texir.executorch.deps import require_executorch
from texir.adapters.fx_export import rebuilt_exported, to_exported_program
from texir.adapters.targets import canonical_target
from texir.edge import DIM_ORDER_OPS
from texir.errors import UnsupportedError
from texir.ir import Program

__all__ = [
    "edge_target",
    "executorch_edge_target",
    "graph_modules",
    "to_edge_exported_program",
]

def edge_target(op: torch._ops.OpOverload) -> Any:
    """ExecuTorch's edge operator for an ATen (or other namespace) operator overload."""
    # executorch is an optional extra: imported on use
    from executorch.exir.dialects._ops import ops as exir_ops

    canonical = canonical_target(op)
    if canonical is None:
        raise UnsupportedError(f"{op!r} has no ExecuTorch edge operator")
    namespace, _, rest = canonical.partition("::")
    name, _, overload = rest.partition(".")
    return getattr(getattr(getattr(exir_ops.edge, namespace), name), overload or "default")


def executorch_edge_target(op: torch._ops.OpOverload) -> Any:
    """The target ExecuTorch's edge programs hold for `op`: its edge operator, or `op` itself for
    the operators to_edge leaves as ATen ones (symbolic sizes, scalar_tensor, asserts: ExecuTorch's
    own `should_lower_to_edge`; partitioners such as Vulkan's match them as ATen operators)."""
    # executorch is an optional extra: imported on use
    from executorch.exir.passes.replace_aten_with_edge_pass import should_lower_to_edge

    return edge_target(op) if should_lower_to_edge(op) else op


def to_edge_exported_program(program: Program) -> ExportedProgram:
    """`program` (in the to_edge form: texir.orchestrate.lower gives it) as the edge-dialect
    ExportedProgram ExecuTorch builds (dialect "EDGE", its edge verifier, the kept ops as
    `preserve_ops`), call_function targets ExecuTorch edge operators, with value metadata, module
    stacks, debug handles, `meta["custom"]` and the program's `backend_meta` notes in `node.meta`.
    A program holding the ATen ops ExecuTorch's dim-order pass replaces (`_to_copy`, `clone`,
    `empty.memory_format`: `lower(skip_dim_order=True)` keeps them) is verified as ExecuTorch's
    `EdgeCompileConfig(_skip_dim_order=True)` program is."""
    require_executorch("texir.executorch.to_edge_exported_program")
    ep = to_exported_program(program)
    notes: dict[str, dict[str, Any]] = {}
    for note in program.backend_meta:
        notes.setdefault(note.node, {})[note.key] = json.loads(note.value)
    kept: dict[str, torch._ops.OpOverload] = {}
    skip_dim_order = False
    for _, gm in graph_modules(ep.graph_module):
        for node in gm.graph.nodes:
            if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
                skip_dim_order = skip_dim_order or canonical_target(node.target) in DIM_ORDER_OPS
                if _kept_from_decomposition(node.target):
                    kept.setdefault(str(node.target), node.target)
                node.target = executorch_edge_target(node.target)
        gm.recompile()
    for node in ep.graph_module.graph.nodes:
        found = notes.get(node.name)
        if found:
            node.meta.update(found)
    return _as_edge_dialect(ep, [kept[k] for k in sorted(kept)], skip_dim_order=skip_dim_order)


def _kept_from_decomposition(op: torch._ops.OpOverload) -> bool:
    """An ATen op that the edge decomposition leaves only when a partitioner asks to keep it (not
    core ATen, not a view-copy); ExecuTorch's verifier then needs it in `preserve_ops`."""
    if op.namespace != "aten" or op.is_view:
        return False
    return torch.Tag.core not in op.tags and torch.Tag.view_copy not in op.tags


def _as_edge_dialect(
    ep: ExportedProgram, preserve_ops: list[torch._ops.OpOverload], *, skip_dim_order: bool = False
) -> ExportedProgram:
    """`ep` rebuilt as ExecuTorch's `_generate_edge_program` builds the edge program partitioners
    and backends are shown: with `EXIREdgeDialectVerifier(class_only=True, preserve_ops=...)`,
    so `ep.dialect == "EDGE"` and `ep.validate()` checks what ExecuTorch's checks (Arm's TOSA
    backend calls it). Building it validates it, as in ExecuTorch."""
    # executorch is an optional extra: imported on use
    from executorch.exir import EdgeCompileConfig
    from executorch.exir.verification.verifier import EXIREdgeDialectVerifier

    verifier = EXIREdgeDialectVerifier(
        edge_compile_config=EdgeCompileConfig(_skip_dim_order=skip_dim_order), class_only=True,
        preserve_ops=preserve_ops,
    )
    try:
        return rebuilt_exported(ep, verifiers=[verifier])
    except Exception as exc:  # ExecuTorch's SpecViolationError and friends: one typed error
        raise UnsupportedError(
            f"the program is not valid edge dialect for ExecuTorch's verifier ({type(exc).__name__}: {exc}); "
            "lower it with texir.orchestrate.lower, which decomposes it as ExecuTorch's to_edge does"
        ) from exc
