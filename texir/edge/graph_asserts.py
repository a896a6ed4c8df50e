"""Drop runtime checks that have no ExecuTorch kernel (exir's RemoveGraphAssertsPass)."""

from __future__ import annotations

from collections.abc import Sequence

from texir.edge._rewrite import Entry, Forward, rewrite_program
from texir.ir.types import CallFunction, Graph, Node, Program, Provenance, ValueMeta

__all__ = ["ASSERT_TARGETS", "remove_graph_asserts"]

ASSERT_TARGETS = frozenset({
    "aten::_assert_tensor_metadata.default", "aten::_assert_async.default", "aten::_assert_async.msg",
    "aten::_assert_scalar.default", "aten::sym_constrain_range.default",
    "aten::sym_constrain_range_for_size.default", "aten::_functional_assert_async.msg",
    "aten::_functional_sym_constrain_range.default",
    "aten::_functional_sym_constrain_range_for_size.default",
})


def _rule(node: Node, meta: ValueMeta | None, prov: Provenance | None, graph: Graph) -> Forward | Sequence[Entry] | None:
    if isinstance(node, CallFunction) and node.target in ASSERT_TARGETS:
        return ()  # nothing reads an assert's result
    return None


def remove_graph_asserts(program: Program) -> Program:
    """`program` without assert and range-constraint nodes (in nested graphs too)."""
    return rewrite_program(program, _rule)
