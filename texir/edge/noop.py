"""Drop ops that return their input unchanged: a static slice keeping the whole tensor (exir's RemoveNoopPass)."""

from __future__ import annotations

from collections.abc import Sequence

from texir.edge._rewrite import Entry, Forward, MetaLookup, rewrite_program
from texir.ir.types import (
    CallFunction,
    Graph,
    Node,
    Program,
    Provenance,
    Ref,
    TensorMeta,
    ValueMeta,
)

__all__ = ["NOOP_SLICES", "remove_noop_ops"]

NOOP_SLICES = frozenset({"aten::slice.Tensor", "aten::slice_copy.Tensor"})


class _Rule:
    def __init__(self) -> None:
        self.meta_of = MetaLookup()

    def __call__(self, node: Node, meta: ValueMeta | None, prov: Provenance | None, graph: Graph) -> Forward | Sequence[Entry] | None:
        if not isinstance(node, CallFunction) or node.target not in NOOP_SLICES:
            return None
        base = node.args[0] if node.args else None
        if not isinstance(meta, TensorMeta) or not isinstance(base, Ref):
            return None
        base_meta = self.meta_of(graph, base.name)
        if not isinstance(base_meta, TensorMeta):
            return None
        shapes = (*meta.shape, *base_meta.shape)
        if any(isinstance(d, str) for d in shapes) or tuple(meta.shape) != tuple(base_meta.shape):
            return None
        return Forward(base.name)


def remove_noop_ops(program: Program) -> Program:
    """`program` with whole-tensor static slices replaced by their input (in nested graphs too)."""
    return rewrite_program(program, _Rule())
