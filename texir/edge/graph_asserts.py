"""Drop runtime checks that have no ExecuTorch kernel, and what computed only their operands (exir's
RemoveGraphAssertsPass, which eliminates the dead code it leaves: the symbolic comparisons an
`_assert_scalar` read)."""

from __future__ import annotations

import msgspec

from texir.edge._dead import dead_producers
from texir.ir.analysis import node_inputs
from texir.ir.builder import GraphBuilder
from texir.ir.types import CallFunction, Graph, Program, Subgraph

__all__ = ["ASSERT_TARGETS", "remove_graph_asserts"]

ASSERT_TARGETS = frozenset({
    "aten::_assert_tensor_metadata.default", "aten::_assert_async.default", "aten::_assert_async.msg",
    "aten::_assert_scalar.default", "aten::sym_constrain_range.default",
    "aten::sym_constrain_range_for_size.default", "aten::_functional_assert_async.msg",
    "aten::_functional_sym_constrain_range.default",
    "aten::_functional_sym_constrain_range_for_size.default",
})


def _without_asserts(graph: Graph) -> Graph:
    subgraphs = tuple(Subgraph(name=s.name, graph=_without_asserts(s.graph)) for s in graph.subgraphs)
    asserts = [n for n in graph.nodes if isinstance(n, CallFunction) and n.target in ASSERT_TARGETS]
    if not asserts and all(a.graph is b.graph for a, b in zip(subgraphs, graph.subgraphs)):
        return graph
    gone = {n.name for n in asserts}  # nothing reads an assert's result
    kept = {n.name: n for n in graph.nodes if n.name not in gone}
    gone |= dead_producers(kept, [ref for n in asserts for ref in node_inputs(n)])
    builder = GraphBuilder()
    for node, meta, prov in graph.entries():
        if node.name not in gone:
            builder.add(node, meta, prov)
    return builder.build(subgraphs)


def remove_graph_asserts(program: Program) -> Program:
    """`program` without assert and range-constraint nodes (in nested graphs too), nor the nodes that
    computed only their operands."""
    graph = _without_asserts(program.graph)
    return program if graph is program.graph else msgspec.structs.replace(program, graph=graph)
