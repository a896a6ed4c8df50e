"""Cast the tensor operands of add/sub/mul/div/minimum to the result dtype first (exir's RemoveMixedTypeOperators)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from texir.edge._rewrite import Entry, Forward, MetaLookup, all_names, map_tensor_refs, program_ops, rewrite_program
from texir.ir.op_facts import OpTable
from texir.ir.names import NameAllocator
from texir.ir.types import (
    Argument,
    CallFunction,
    DTypeArg,
    Graph,
    Node,
    Program,
    Provenance,
    Ref,
    TensorMeta,
    ValueMeta,
)
from texir.serialize.pte.dtypes import DTYPE_TO_SCALAR_TYPE

__all__ = ["ATEN_CAST_TARGET", "CAST_TARGET", "MIXED_TYPE_OPS", "cast_mixed_operands", "cast_mixed_operands_aten"]

MIXED_TYPE_OPS = frozenset({
    "aten::add.Tensor", "aten::sub.Tensor", "aten::mul.Tensor", "aten::div.Tensor",
    "aten::div.Tensor_mode", "aten::minimum.default",
})
CAST_TARGET = "dim_order_ops::_to_dim_order_copy.default"
"""The cast: with no `dim_order` the copy keeps its input's layout (the emitter fills it in)."""
ATEN_CAST_TARGET = "aten::_to_copy.default"
"""The cast as ExecuTorch's pass writes it, before its MemoryFormatOpsPass (what stays with
`EdgeCompileConfig(_skip_dim_order=True)`, which leaves that pass out)."""


class _Rule:
    def __init__(self, names: NameAllocator, ops: OpTable, target: str) -> None:
        self.names = names
        self.ops = ops
        self.target = target
        self.base = target.split("::")[1].split(".")[0]  # the cast nodes' names: "_to_copy", "_to_dim_order_copy"
        self.meta_of = MetaLookup()

    def __call__(self, node: Node, meta: ValueMeta | None, prov: Provenance | None, graph: Graph) -> Forward | Sequence[Entry] | None:
        if not isinstance(node, CallFunction) or node.target not in MIXED_TYPE_OPS:
            return None
        if not isinstance(meta, TensorMeta) or meta.dtype not in DTYPE_TO_SCALAR_TYPE:
            return None
        casts: list[Entry] = []

        def cast(arg: Ref) -> Argument:
            source = self.meta_of(graph, arg.name)
            if not isinstance(source, TensorMeta) or source.dtype == meta.dtype:
                return arg  # (scalars are lifted, and cast, where the emitter meets them)
            out = self.names.fresh(self.base)
            cast_meta = msgspec.structs.replace(source, dtype=meta.dtype, requires_grad=False)
            casts.append((
                CallFunction(name=out, target=self.target, args=(arg,), kwargs=(("dtype", DTypeArg(value=meta.dtype)),)),
                cast_meta, prov,
            ))
            return Ref(name=out)

        new = map_tensor_refs(node, cast, self.ops)
        return None if new is None else (*casts, (new, meta, prov))


def cast_mixed_operands(program: Program) -> Program:
    """`program` with a cast node before each mixed-dtype operand of the ops in `MIXED_TYPE_OPS`."""
    return rewrite_program(program, _Rule(all_names(program), program_ops(program), CAST_TARGET))


def cast_mixed_operands_aten(program: Program) -> Program:
    """`cast_mixed_operands` with ATen's `_to_copy` as the cast (the to_edge form without dim-order ops)."""
    return rewrite_program(program, _Rule(all_names(program), program_ops(program), ATEN_CAST_TARGET))
