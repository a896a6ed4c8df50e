"""The edge form: ExecuTorch's to_edge / to_executorch rewrites as pure `Program -> Program` passes.

`to_edge_program` runs them in ExecuTorch's order and marks the result `dialect="EDGE"`; the
emitter (`texir.emit`) maps an edge program to the `.pte` schema and runs this first on anything
else. Two rewrites stay in the emitter because they depend on how values are laid out in memory,
which only emission knows: Python scalars in tensor positions become 0-dim constants at the point
of use (ScalarToTensorPass; the IR has no tensor literals, and lifting them to placeholders would
reorder the value table), and reshapes of planned or constant tensors become aliases of the same
memory (ReplaceViewCopyWithViewPass; it needs the base's storage and emitted layout).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from texir.edge._rewrite import EdgeError, rewrite_graph, rewrite_program
from texir.edge.debug_handles import compact_debug_handles
from texir.edge.dim_order import DIM_ORDER_OPS, to_dim_order_ops
from texir.edge.empty_tensors import prune_empty_tensors
from texir.edge.graph_asserts import ASSERT_TARGETS, remove_graph_asserts
from texir.edge.mixed_dtype import CAST_TARGET, MIXED_TYPE_OPS, cast_mixed_operands
from texir.edge.names import edge_name_base, edge_node_names
from texir.edge.noop import remove_noop_ops
from texir.edge.scalar_tensor import LIFTED_PREFIX, lift_scalar_operands
from texir.edge.sym_to_tensor import SCALAR_TENSOR_TARGET, sym_operands_to_tensors
from texir.edge.unused_state import remove_unused_state
from texir.edge.view_copy import replace_view_ops
from texir.edge.write_back import WRITE_BACK_TARGET, insert_write_back
from texir.ir.types import Program
from texir.ir.verify import verify

__all__ = [
    "ASSERT_TARGETS",
    "CAST_TARGET",
    "DEFAULT_PASSES",
    "DIM_ORDER_OPS",
    "EDGE_DIALECT",
    "EdgeError",
    "EdgePass",
    "LIFTED_PREFIX",
    "SCALAR_TENSOR_TARGET",
    "MIXED_TYPE_OPS",
    "TO_EDGE_PASSES",
    "WRITE_BACK_TARGET",
    "cast_mixed_operands",
    "compact_debug_handles",
    "edge_name_base",
    "edge_node_names",
    "insert_write_back",
    "lift_scalar_operands",
    "prune_empty_tensors",
    "sym_operands_to_tensors",
    "remove_graph_asserts",
    "remove_noop_ops",
    "remove_unused_state",
    "replace_view_ops",
    "rewrite_graph",
    "rewrite_program",
    "to_dim_order_ops",
    "to_edge_program",
]

EDGE_DIALECT = "EDGE"
EdgePass = Callable[[Program], Program]

DEFAULT_PASSES: tuple[EdgePass, ...] = (
    remove_graph_asserts,  # to_edge: RemoveGraphAssertsPass
    cast_mixed_operands,  # to_edge: RemoveMixedTypeOperators
    remove_noop_ops,  # to_edge: RemoveNoopPass
    prune_empty_tensors,  # to_edge: PruneEmptyTensorsPass
    replace_view_ops,  # to_edge: view ops -> *_copy
    to_dim_order_ops,  # to_edge: MemoryFormatOpsPass
    compact_debug_handles,  # to_edge: DebugHandleGeneratorPass (after the removals)
    sym_operands_to_tensors,  # to_executorch: SymToTensorPass
    insert_write_back,  # to_executorch: insert_write_back_for_buffers_pass
)
"""ExecuTorch's order. `remove_unused_state` is not among them: ExecuTorch keeps unused state
unless delegation consumed its users, so it is run by lowering, or added here by the caller."""


TO_EDGE_PASSES: tuple[EdgePass, ...] = (
    remove_graph_asserts,
    lift_scalar_operands,  # to_edge: ScalarToTensorPass + lift_constant_tensor_pass
    *DEFAULT_PASSES[1:-2],  # not SymToTensorPass nor write-back: ExecuTorch runs them after partitioning
    edge_node_names,  # to_edge: the ExportPass retrace names operator nodes after their targets
)
"""The rewrites ExecuTorch's to_edge makes before partitioning (`texir.lowering.lower` runs them):
partitioners see literals in Tensor positions as constants, and nodes named as in ExecuTorch
('aten_addmm_default'), so backends that print names into their blobs agree. Write-back comes at
emission. Each pass leaves a program it already rewrote unchanged, so the emitter can run
`DEFAULT_PASSES` after (plain `emit` keeps lifting literals itself, at their point of use)."""


def to_edge_program(
    program: Program, *, passes: Sequence[EdgePass] = DEFAULT_PASSES, check: bool = False
) -> Program:
    """`program` in the edge form: `passes` applied in order, the result marked `dialect="EDGE"`.
    With `check`, `texir.ir.verify` runs before and after every pass. Pure; an edge program is
    returned as it is."""
    if program.dialect == EDGE_DIALECT:
        return program
    if check:
        verify(program)
    for edge_pass in passes:
        program = edge_pass(program)
        if check:
            verify(program)
    return msgspec.structs.replace(program, dialect=EDGE_DIALECT)
