"""Reductions over the one dim of a 0-dim tensor, spelled as ExecuTorch 1.5.1's portable kernels take
them. torch lets a 0-dim tensor be reduced over dim 0 (or -1); the runtime's `sum.IntList_out`
aborts the process on it (tensor_impl.h: "Dimension out of range"), which a `.pte` must never do.
Summing a 0-dim tensor over all its dims (`dim=None`) is the same value, and the kernel takes it.
texir's own rewrite (ExecuTorch's `.pte` of such a program aborts), run at emission."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from texir.edge._rewrite import Entry, Forward, MetaLookup, rewrite_program
from texir.ir.types import CallFunction, Graph, IntArg, ListArg, Node, NoneArg, Program, Provenance, Ref, TensorMeta, ValueMeta

__all__ = ["ZERO_DIM_SUMS", "reduce_zero_dim_sums"]

ZERO_DIM_SUMS = frozenset({"aten::sum.dim_IntList"})


class _Rule:
    def __init__(self) -> None:
        self.meta_of = MetaLookup()

    def __call__(self, node: Node, meta: ValueMeta | None, prov: Provenance | None, graph: Graph) -> Forward | Sequence[Entry] | None:
        if not isinstance(node, CallFunction) or node.target not in ZERO_DIM_SUMS or len(node.args) < 2:
            return None
        base, dims = node.args[0], node.args[1]
        if not isinstance(base, Ref) or not isinstance(dims, ListArg) or not dims.items:
            return None
        base_meta = self.meta_of(graph, base.name)
        if not isinstance(base_meta, TensorMeta) or base_meta.shape != ():
            return None
        if not all(isinstance(d, IntArg) and d.value in (0, -1) for d in dims.items):
            return None  # (any other dim is out of range in torch too)
        return [(msgspec.structs.replace(node, args=(base, NoneArg(), *node.args[2:])), meta, prov)]


def reduce_zero_dim_sums(program: Program) -> Program:
    """`program` with every sum over dim 0 or -1 of a 0-dim tensor written as a sum over all dims."""
    return rewrite_program(program, _Rule())
