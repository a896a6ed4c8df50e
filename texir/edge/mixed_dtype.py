"""Cast the tensor operands of add/sub/mul/div/minimum to the result dtype first (exir's RemoveMixedTypeOperators)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from texir.edge._rewrite import Entry, Forward, MetaLookup, all_names, map_tensor_refs, program_ops, rewrite_program
from texir.ir.op_facts import OpTable
from texir.ir.names import INLINE_CONSTANT, NameAllocator
from texir.ir.types import (
    Argument,
    BoolArg,
    CallFunction,
    DTypeArg,
    FloatArg,
    Graph,
    IntArg,
    Node,
    Program,
    Provenance,
    Ref,
    TensorMeta,
    ValueMeta,
)
from texir.serialize.pte.dtypes import DTYPE_TO_SCALAR_TYPE

__all__ = [
    "ATEN_CAST_TARGET", "CAST_TARGET", "MIXED_TYPE_OPS", "cast_mixed_operands", "cast_mixed_operands_aten",
    "inline_mixed_scalars",
]

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


class _InlineRule:
    def __init__(self, names: NameAllocator, ops: OpTable) -> None:
        self.names = names
        self.ops = ops

    def __call__(self, node: Node, meta: ValueMeta | None, prov: Provenance | None, graph: Graph) -> Forward | Sequence[Entry] | None:
        if not isinstance(node, CallFunction) or node.target not in MIXED_TYPE_OPS:
            return None
        if not isinstance(meta, TensorMeta) or meta.dtype not in DTYPE_TO_SCALAR_TYPE:
            return None
        facts = self.ops.op_facts(node.target)
        if facts is None:
            return None
        kinds = {a.name: a.kind for a in facts.schema.in_args}
        positional = [a for a in facts.schema.arguments if not a.kwarg_only]
        constants: list[Entry] = []

        def inline(name: str, arg: Argument) -> Argument:
            if kinds.get(name) != "tensor" or not isinstance(arg, (BoolArg, IntArg, FloatArg)):
                return arg
            out = self.names.fresh("scalar_constant")
            constants.append((
                CallFunction(name=out, target=INLINE_CONSTANT, args=(arg,)),
                TensorMeta(dtype=meta.dtype, shape=(), strides=()), None,  # no debug handle: it emits no instruction
            ))
            return Ref(name=out)

        # schema order (positional, then keyword), the order the emitter meets the operands in
        args = tuple(inline(a.name, v) for a, v in zip(positional, node.args)) + node.args[len(positional):]
        kwargs = tuple((k, inline(k, v)) for k, v in node.kwargs)
        if not constants:
            return None
        return (*constants, (msgspec.structs.replace(node, args=args, kwargs=kwargs), meta, prov))


def inline_mixed_scalars(program: Program) -> Program:
    """`program` with each bool/int/float literal in a Tensor position of the ops in
    `MIXED_TYPE_OPS` replaced by a `texir::inline_constant` node just before its user, typed with the
    user's result dtype: ScalarToTensorPass and RemoveMixedTypeOperators for the literals `lower`'s
    `lift_scalar_operands` leaves (plain `emit` of an ATen program, nested graphs). Unlike a lifted
    placeholder, the constant is emitted where it is used, so the value table keeps its order."""
    return rewrite_program(program, _InlineRule(all_names(program), program_ops(program)))
