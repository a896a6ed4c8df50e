"""Symbolic scalars in Tensor positions become 0-dim tensors first (exir's SymToTensorPass).

Tracing lets a SymInt stand where an op's schema wants a Tensor (`add.Tensor(t, sym_size)`); the
runtime reads that argument as a Tensor, so an `aten::scalar_tensor` node makes one: int32 for a
SymInt, float32 for a SymFloat, bool for a SymBool, as ExecuTorch does."""

from __future__ import annotations

from collections.abc import Sequence

from texir.edge._rewrite import Entry, Forward, MetaLookup, all_names, map_tensor_refs, program_ops, rewrite_program
from texir.ir.op_facts import OpTable
from texir.ir.names import NameAllocator
from texir.ir.types import (
    Argument,
    CallFunction,
    DType,
    DTypeArg,
    Graph,
    Node,
    Program,
    Provenance,
    Ref,
    SymBoolMeta,
    SymFloatMeta,
    SymIntMeta,
    TensorMeta,
    ValueMeta,
)

__all__ = ["SCALAR_TENSOR_TARGET", "sym_operands_to_tensors"]

SCALAR_TENSOR_TARGET = "aten::scalar_tensor.default"

_DTYPE_OF: dict[type, DType] = {SymIntMeta: DType.int32, SymFloatMeta: DType.float32, SymBoolMeta: DType.bool}


class _Rule:
    def __init__(self, names: NameAllocator, ops: OpTable) -> None:
        self.names = names
        self.ops = ops
        self.meta_of = MetaLookup()

    def __call__(self, node: Node, meta: ValueMeta | None, prov: Provenance | None, graph: Graph) -> Forward | Sequence[Entry] | None:
        if not isinstance(node, CallFunction) or node.target == SCALAR_TENSOR_TARGET:
            return None
        made: list[Entry] = []

        def coerce(arg: Ref) -> Argument:
            dtype = _DTYPE_OF.get(type(self.meta_of(graph, arg.name)))
            if dtype is None:
                return arg
            out = self.names.fresh("aten_scalar_tensor_default")
            made.append((
                CallFunction(name=out, target=SCALAR_TENSOR_TARGET, args=(arg,), kwargs=(("dtype", DTypeArg(value=dtype)),)),
                TensorMeta(dtype=dtype, shape=(), strides=()), prov,
            ))
            return Ref(name=out)

        new = map_tensor_refs(node, coerce, self.ops)
        return None if new is None else (*made, (new, meta, prov))


def sym_operands_to_tensors(program: Program) -> Program:
    """`program` with an `aten::scalar_tensor` node before each symbolic scalar used as a Tensor."""
    return rewrite_program(program, _Rule(all_names(program), program_ops(program)))
