"""Drop empty tensors from `cat` operands, and what computed only them (exir's PruneEmptyTensorsPass)."""

from __future__ import annotations

import msgspec

from texir.edge._dead import dead_producers
from texir.ir.builder import GraphBuilder
from texir.ir.types import (
    CallFunction,
    DTypeArg,
    Graph,
    IntArg,
    ListArg,
    Program,
    Ref,
    Subgraph,
    TensorMeta,
)

__all__ = ["CAT", "prune_empty_tensors"]

CAT = "aten::cat.default"
_FULL = "aten::full.default"


def _is_empty(meta: object) -> bool:
    """Statically empty: some dimension is the integer 0 (a symbolic one is assumed not to be)."""
    return isinstance(meta, TensorMeta) and any(d == 0 for d in meta.shape if isinstance(d, int))


def _prune(graph: Graph) -> Graph:
    metas = {node.name: graph.meta(node) for node in graph.nodes}
    replaced: dict[str, CallFunction] = {}
    dropped: list[str] = []
    for node in graph.nodes:
        if not isinstance(node, CallFunction) or node.target != CAT or not node.args:
            continue
        operands = node.args[0]
        if not isinstance(operands, ListArg):
            continue
        kept = tuple(a for a in operands.items if not (isinstance(a, Ref) and _is_empty(metas.get(a.name))))
        if len(kept) == len(operands.items):
            continue
        meta = metas.get(node.name)
        if kept:
            replaced[node.name] = msgspec.structs.replace(node, args=(ListArg(items=kept), *node.args[1:]))
        elif isinstance(meta, TensorMeta) and all(isinstance(d, int) for d in meta.shape):
            # every operand empty: a zero-filled tensor of the result's shape (exir writes full)
            shape = ListArg(items=tuple(IntArg(value=int(d)) for d in meta.shape))
            replaced[node.name] = CallFunction(
                name=node.name, target=_FULL, args=(shape, IntArg(value=0)),
                kwargs=(("dtype", DTypeArg(value=meta.dtype)),), meta_id=node.meta_id,
            )
        else:
            continue
        dropped.extend(a.name for a in operands.items if a not in kept and isinstance(a, Ref))
    subgraphs = tuple(Subgraph(name=s.name, graph=_prune(s.graph)) for s in graph.subgraphs)
    if not replaced and all(a.graph is b.graph for a, b in zip(subgraphs, graph.subgraphs)):
        return graph
    # What computed only the dropped operands goes too (exir eliminates dead code after).
    dead = dead_producers({node.name: replaced.get(node.name, node) for node in graph.nodes}, dropped)
    builder = GraphBuilder()
    for node, meta, prov in graph.entries():
        if node.name not in dead:
            builder.add(replaced.get(node.name, node), meta, prov)
    return builder.build(subgraphs)


def prune_empty_tensors(program: Program) -> Program:
    """`program` with statically empty operands left out of every `cat` (in nested graphs too); a
    `cat` of empty operands only becomes `full` of its shape with zeros. Nodes that computed only
    the dropped operands are removed."""
    graph = _prune(program.graph)
    return program if graph is program.graph else msgspec.structs.replace(program, graph=graph)
