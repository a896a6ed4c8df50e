"""The edge form: ExecuTorch's to_edge / to_executorch rewrites as pure `Program -> Program` passes.

`texir.edge.pipeline` names them in stages (`TO_EDGE` before partitioning, `TO_EXECUTORCH` after) and
runs them (`run_stage`: a failing pass is named; TEXIR_VERIFY=1 verifies after each pass). A program's
`dialect` records the stage it reached, so `to_edge_program` / the emitter (`texir.emit`) run only the
stages still missing before mapping the `EDGE` program to the `.pte` schema.

Two rewrites stay in the emitter because they depend on how values are laid out in memory, which
only emission knows: in plain `emit` (not after `lower`, whose `TO_EDGE` lifts them) Python scalars
in tensor positions become 0-dim constants at their point of use, cast for the mixed-dtype ops
(ScalarToTensorPass and RemoveMixedTypeOperators on scalars; the IR has no tensor literals, and
lifting them to placeholders would reorder the value table, changing the bytes), and reshapes of
planned or constant tensors become aliases of the same memory (ReplaceViewCopyWithViewPass; it needs
the base's storage and emitted layout).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from texir.edge._rewrite import EdgeError, rewrite_graph, rewrite_program
from texir.edge.debug_handles import compact_debug_handles
from texir.edge.dim_order import DIM_ORDER_OPS, to_dim_order_ops
from texir.edge.empty_tensors import prune_empty_tensors
from texir.edge.graph_asserts import ASSERT_TARGETS, remove_graph_asserts
from texir.edge.mixed_dtype import CAST_TARGET, MIXED_TYPE_OPS, cast_mixed_operands, inline_mixed_scalars
from texir.edge.names import edge_name_base, edge_node_names
from texir.edge.noop import remove_noop_ops
from texir.edge.pipeline import (
    EDGE_DIALECT,
    EMIT_TO_EDGE,
    PARTITIONABLE_DIALECT,
    TO_EDGE,
    TO_EDGE_SKIP_DIM_ORDER,
    TO_EXECUTORCH,
    TO_EXECUTORCH_KEEP_VIEW_COPY,
    DialectError,
    NamedPass,
    PassError,
    run_stage,
    to_edge_stage,
    to_emittable,
    to_partitionable,
)
from texir.edge.scalar_tensor import LIFTED_PREFIX, lift_scalar_operands
from texir.edge.sym_to_tensor import SCALAR_TENSOR_TARGET, sym_operands_to_tensors
from texir.edge.unused_state import remove_unused_state
from texir.edge.view_copy import replace_view_copies_with_views, replace_view_ops
from texir.edge.write_back import WRITE_BACK_TARGET, insert_write_back
from texir.edge.zero_dim import ZERO_DIM_SUMS, reduce_zero_dim_sums
from texir.ir.types import Program

__all__ = [
    "ZERO_DIM_SUMS",
    "ASSERT_TARGETS",
    "CAST_TARGET",
    "DIM_ORDER_OPS",
    "EDGE_DIALECT",
    "EdgeError",
    "EdgePass",
    "DialectError",
    "EMIT_TO_EDGE",
    "NamedPass",
    "PARTITIONABLE_DIALECT",
    "PassError",
    "TO_EDGE",
    "TO_EDGE_SKIP_DIM_ORDER",
    "TO_EXECUTORCH",
    "TO_EXECUTORCH_KEEP_VIEW_COPY",
    "run_stage",
    "to_edge_stage",
    "to_emittable",
    "to_partitionable",
    "LIFTED_PREFIX",
    "SCALAR_TENSOR_TARGET",
    "MIXED_TYPE_OPS",
    "WRITE_BACK_TARGET",
    "cast_mixed_operands",
    "compact_debug_handles",
    "edge_name_base",
    "edge_node_names",
    "inline_mixed_scalars",
    "insert_write_back",
    "lift_scalar_operands",
    "prune_empty_tensors",
    "sym_operands_to_tensors",
    "remove_graph_asserts",
    "reduce_zero_dim_sums",
    "remove_noop_ops",
    "remove_unused_state",
    "replace_view_copies_with_views",
    "replace_view_ops",
    "rewrite_graph",
    "rewrite_program",
    "to_dim_order_ops",
    "to_edge_program",
]

EdgePass = Callable[[Program], Program]


def to_edge_program(
    program: Program, *, passes: Sequence[EdgePass] | None = None, check: bool | None = None
) -> Program:
    """`program` in the edge form the emitter maps, marked `dialect="EDGE"`. By default only the
    stages it still misses run (`texir.edge.pipeline.to_emittable`); explicit `passes` run in order on
    a program not yet `EDGE`. `check` (default: TEXIR_VERIFY=1) runs `texir.ir.verify` after every
    pass; a failing pass is a `PassError` naming it. Pure; an edge program is returned as it is."""
    if passes is None:
        return to_emittable(program, check=check)
    if program.dialect == EDGE_DIALECT:
        return program
    stage = tuple(NamedPass(getattr(f, "__name__", repr(f)), f, "(caller's pass)") for f in passes)
    return msgspec.structs.replace(run_stage(program, stage, check=check), dialect=EDGE_DIALECT)
