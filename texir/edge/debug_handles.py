"""Debug handles renumbered over the nodes that survive the edge rewrites (exir numbers them in
to_edge after RemoveGraphAssertsPass, RemoveNoopPass and dead-code elimination)."""

from __future__ import annotations

from collections import deque

import msgspec

from texir.ir.types import CallFunction, GetAttr, Graph, Program, Ref, Subgraph, SubgraphMeta

__all__ = ["compact_debug_handles"]


def compact_debug_handles(program: Program) -> Program:
    """`program` with its debug handles renumbered 1, 2, ... in order of first appearance, nodes
    that shared a handle still sharing one, so that removed nodes leave no gaps. Graphs are visited
    breadth first, nested graphs in the order their higher-order calls name them. A program with
    lowered modules is returned as it is: its delegates' debug maps already refer to its handles."""
    if program.lowered_modules:
        return program
    order = _graphs_in_order(program.graph)
    renumber: dict[int, int] = {}
    for graph in order:
        for handle in graph.debug_handles():
            if handle is not None and handle not in renumber:
                renumber[handle] = len(renumber) + 1
    if all(old == new for old, new in renumber.items()):
        return program
    return msgspec.structs.replace(program, graph=_apply(program.graph, renumber))


def _graphs_in_order(root: Graph) -> list[Graph]:
    out: list[Graph] = []
    queue: deque[Graph] = deque([root])
    while queue:
        graph = queue.popleft()
        out.append(graph)
        by_name = {s.name: s.graph for s in graph.subgraphs}
        attrs = {n.name: graph.meta(n) for n in graph.nodes if isinstance(n, GetAttr)}
        for node in graph.nodes:
            if isinstance(node, CallFunction) and node.target.startswith("higher_order::"):
                for arg in node.args:
                    meta = attrs.get(arg.name) if isinstance(arg, Ref) else None
                    if isinstance(meta, SubgraphMeta) and meta.graph in by_name:
                        queue.append(by_name[meta.graph])
    return out


def _apply(graph: Graph, renumber: dict[int, int]) -> Graph:
    table = graph.provenance
    if table is not None:
        handles = tuple(None if h is None else renumber.get(h, h) for h in table.debug_handle)
        table = msgspec.structs.replace(table, debug_handle=handles)
    subgraphs = tuple(Subgraph(name=s.name, graph=_apply(s.graph, renumber)) for s in graph.subgraphs)
    return msgspec.structs.replace(graph, provenance=table, subgraphs=subgraphs)
