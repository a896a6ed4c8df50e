"""IR program -> the edge-dialect ExportedProgram ExecuTorch's partitioners and backends read."""

from __future__ import annotations

import json
from typing import Any

import torch
from torch.export import ExportedProgram

from texir.adapters.decompositions import graph_modules
from texir.adapters.executorch.deps import require_executorch
from texir.adapters.fx_export import to_exported_program
from texir.adapters.targets import canonical_target
from texir.errors import UnsupportedError
from texir.ir import Program

__all__ = ["edge_target", "executorch_edge_target", "graph_modules", "to_edge_exported_program"]


def edge_target(op: torch._ops.OpOverload) -> Any:
    """ExecuTorch's edge operator for an ATen (or other namespace) operator overload."""
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
    from executorch.exir.passes.replace_aten_with_edge_pass import should_lower_to_edge

    return edge_target(op) if should_lower_to_edge(op) else op


def to_edge_exported_program(program: Program) -> ExportedProgram:
    """`program` (in the to_edge form: texir.lowering.lower gives it) as an ExportedProgram whose
    call_function targets are ExecuTorch edge operators, with value metadata, module stacks, debug
    handles and the program's `backend_meta` notes in `node.meta`."""
    require_executorch("texir.adapters.executorch.to_edge_exported_program")
    ep = to_exported_program(program)
    notes: dict[str, dict[str, Any]] = {}
    for note in program.backend_meta:
        notes.setdefault(note.node, {})[note.key] = json.loads(note.value)
    for _, gm in graph_modules(ep.graph_module):
        for node in gm.graph.nodes:
            if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
                node.target = executorch_edge_target(node.target)
        gm.recompile()
    for node in ep.graph_module.graph.nodes:
        found = notes.get(node.name)
        if found:
            node.meta.update(found)
    return ep
