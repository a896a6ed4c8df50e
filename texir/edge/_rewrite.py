"""The one graph-rewriting loop the edge passes share: per node keep, drop (forward its uses to
another value) or replace with new entries; nested graphs are rewritten too."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from texir.errors import PteError
from texir.ir.builder import GraphBuilder
from texir.ir.names import NameAllocator, rename_node, rename_output_spec
from texir.ir.op_facts import OpTable, op_table
from texir.ir.types import Argument, CallFunction, Graph, Node, Program, Provenance, Ref, Subgraph, ValueMeta

__all__ = ["EdgeError", "Entry", "Forward", "MetaLookup", "NodeRule", "all_names", "map_tensor_refs",
           "program_ops", "rewrite_graph", "rewrite_program"]

Entry = tuple[Node, ValueMeta | None, Provenance | None]


class EdgeError(PteError):
    """A program cannot be put into the edge form (the message names the node and the fix)."""


class Forward(msgspec.Struct, frozen=True):
    """Drop the node: every use of it reads `value` instead."""

    value: str


NodeRule = Callable[[Node, ValueMeta | None, Provenance | None, Graph], "Forward | Sequence[Entry] | None"]
"""Given a node (its references already renamed), its metadata and provenance and the graph being
rewritten: None keeps it, `Forward` drops it, a sequence of entries replaces it."""


def rewrite_graph(graph: Graph, rule: NodeRule, *, nested: bool = True) -> Graph:
    """`graph` with `rule` applied to every node (and, when `nested`, to nested graphs); the same
    object when nothing changed, so passes compose without rebuilding untouched graphs."""
    return _rewrite(graph, rule, nested)[0]


def _rewrite(graph: Graph, rule: NodeRule, nested: bool) -> tuple[Graph, dict[str, str]]:
    renames: dict[str, str] = {}
    entries = graph.entries()
    # Most passes change no node of most graphs: the builder starts at the first change, given the
    # entries before it as they were (an unchanged node is kept as the very same object).
    builder: GraphBuilder | None = None
    for index, (node, meta, prov) in enumerate(entries):
        # (nothing is renamed before the first `Forward`: the node is then its own renamed form)
        renamed = rename_node(node, renames, rename_self=False) if renames else node
        result = rule(renamed, meta, prov, graph)
        if builder is None:
            if result is None and renamed is node:
                continue
            builder = GraphBuilder()
            builder.extend(entries[:index])
        if result is None:
            builder.add(renamed, meta, prov)
        elif isinstance(result, Forward):
            renames[node.name] = renames.get(result.value, result.value)
        else:
            builder.extend(result)
    subgraphs = graph.subgraphs
    changed = builder is not None
    if nested and subgraphs:
        new_subs = tuple(Subgraph(name=s.name, graph=rewrite_graph(s.graph, rule)) for s in subgraphs)
        if any(a.graph is not b.graph for a, b in zip(new_subs, subgraphs)):
            subgraphs, changed = new_subs, True
    if not changed:
        return graph, renames
    if builder is None:  # only nested graphs changed
        builder = GraphBuilder()
        builder.extend(entries)
    return builder.build(subgraphs), renames


def rewrite_program(program: Program, rule: NodeRule, *, nested: bool = True) -> Program:
    """`program` with its graph rewritten by `rule`; output specs follow forwarded values."""
    graph, renames = _rewrite(program.graph, rule, nested)
    if graph is program.graph:
        return program
    signature = program.signature
    if renames:
        signature = msgspec.structs.replace(
            signature, outputs=tuple(rename_output_spec(s, renames) for s in signature.outputs)
        )
    return msgspec.structs.replace(program, graph=graph, signature=signature)


def all_names(program: Program) -> NameAllocator:
    """A name allocator over every node name of the program's graphs (nested ones included)."""
    used: set[str] = set()
    stack = [program.graph]
    while stack:
        graph = stack.pop()
        used.update(node.name for node in graph.nodes)
        stack.extend(s.graph for s in graph.subgraphs)
    return NameAllocator(used)


def program_ops(program: Program) -> OpTable:
    """The operator schemas `program` can call: texir's packaged table plus its own `op_schemas`."""
    return op_table(program.op_schemas)


class MetaLookup:
    """Value metadata by name for the graphs a rule sees (built once per graph)."""

    def __init__(self) -> None:
        self._tables: dict[int, tuple[Graph, dict[str, ValueMeta | None]]] = {}

    def __call__(self, graph: Graph, name: str) -> ValueMeta | None:
        entry = self._tables.get(id(graph))
        if entry is None or entry[0] is not graph:
            entry = (graph, {node.name: graph.meta(node) for node in graph.nodes})
            self._tables[id(graph)] = entry
        return entry[1].get(name)


def map_tensor_refs(node: CallFunction, fn: Callable[[Ref], Argument], table: OpTable) -> CallFunction | None:
    """`node` with `fn` applied to each `Ref` argument its op's schema (in `table`, the program's
    `op_table`) types as a Tensor (positional and keyword); None when the op is unknown or `fn`
    changed nothing."""
    facts = table.op_facts(node.target)
    if facts is None:
        return None
    positional = [a for a in facts.schema.arguments if not a.kwarg_only]
    kinds = {a.name: a.kind for a in facts.schema.in_args}
    changed = False

    def one(name: str, arg: Argument) -> Argument:
        nonlocal changed
        if kinds.get(name) != "tensor" or not isinstance(arg, Ref):
            return arg
        new = fn(arg)
        changed = changed or new is not arg
        return new

    args = tuple(one(a.name, v) for a, v in zip(positional, node.args)) + node.args[len(positional):]
    kwargs = tuple((k, one(k, v)) for k, v in node.kwargs)
    return msgspec.structs.replace(node, args=args, kwargs=kwargs) if changed else None
