"""Cast the tensor operands of add/sub/mul/div/minimum to the result dtype first (exir's RemoveMixedTypeOperators)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from texir.adapters.op_schemas import op_facts
from texir.edge._rewrite import Entry, Forward, MetaLookup, all_names, rewrite_program
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

__all__ = ["CAST_TARGET", "MIXED_TYPE_OPS", "cast_mixed_operands"]

MIXED_TYPE_OPS = frozenset({
    "aten::add.Tensor", "aten::sub.Tensor", "aten::mul.Tensor", "aten::div.Tensor",
    "aten::div.Tensor_mode", "aten::minimum.default",
})
CAST_TARGET = "dim_order_ops::_to_dim_order_copy.default"
"""The cast: with no `dim_order` the copy keeps its input's layout (the emitter fills it in)."""


class _Rule:
    def __init__(self, names: NameAllocator) -> None:
        self.names = names
        self.meta_of = MetaLookup()

    def __call__(self, node: Node, meta: ValueMeta | None, prov: Provenance | None, graph: Graph) -> Forward | Sequence[Entry] | None:
        if not isinstance(node, CallFunction) or node.target not in MIXED_TYPE_OPS:
            return None
        if not isinstance(meta, TensorMeta) or meta.dtype not in DTYPE_TO_SCALAR_TYPE:
            return None
        facts = op_facts(node.target)
        if facts is None:
            return None
        positional = [a for a in facts.schema.arguments if not a.kwarg_only]
        kinds = {a.name: a.kind for a in facts.schema.in_args}
        casts: list[Entry] = []

        def cast(name: str, arg: Argument) -> Argument:
            if kinds.get(name) != "tensor" or not isinstance(arg, Ref):
                return arg  # scalars are lifted (and cast) where the emitter meets them
            source = self.meta_of(graph, arg.name)
            if not isinstance(source, TensorMeta) or source.dtype == meta.dtype:
                return arg
            out = self.names.fresh("_to_dim_order_copy")
            cast_meta = msgspec.structs.replace(source, dtype=meta.dtype, requires_grad=False)
            casts.append((
                CallFunction(name=out, target=CAST_TARGET, args=(arg,), kwargs=(("dtype", DTypeArg(value=meta.dtype)),)),
                cast_meta, prov,
            ))
            return Ref(name=out)

        args = tuple(cast(a.name, v) for a, v in zip(positional, node.args))
        kwargs = tuple((k, cast(k, v)) for k, v in node.kwargs)
        if not casts:
            return None
        return (*casts, (msgspec.structs.replace(node, args=args, kwargs=kwargs), meta, prov))


def cast_mixed_operands(program: Program) -> Program:
    """`program` with a cast node before each mixed-dtype operand of the ops in `MIXED_TYPE_OPS`."""
    return rewrite_program(program, _Rule(all_names(program)))
