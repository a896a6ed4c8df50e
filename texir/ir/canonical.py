"""`canonicalize(program)`: a naming- and order-independent form for comparing programs.

Steps: (1) keep the (topological) node order; (2) rename every node to %0, %1, ... in order, per
graph, and rewrite every reference, signature entry and module-call argument to match; (3) sort the
state and range-constraint tables; (4) drop unstable provenance (stack traces, which hold file paths
and line numbers). Two programs that differ only in names compare equal once canonicalized.
"""

from __future__ import annotations

import msgspec

from texir.ir.builder import GraphBuilder
from texir.ir.names import rename_arg, rename_input_spec, rename_node, rename_output_spec
from texir.ir.types import (
    Argument,
    CallFunction,
    GetAttr,
    Graph,
    InputSpec,
    ListArg,
    ModuleCallEntry,
    NamedLoweredModule,
    Node,
    Output,
    OutputSpec,
    Placeholder,
    Program,
    Provenance,
    Ref,
    Subgraph,
    TupleArg,
    UserInput,
    UserOutput,
)


def _stable_prov(prov: Provenance | None) -> Provenance | None:
    if prov is None:
        return None
    return msgspec.structs.replace(prov, stack_trace=None)


def canonicalize_graph(graph: Graph) -> tuple[Graph, dict[str, str]]:
    """The graph with nodes renamed %0.. in order (metadata and locations re-interned in order of
    first use); also returns the old -> new name map of this graph (nested graphs: see
    `canonicalize_with_names`)."""
    graph, names, _ = _canonical_graph(graph, "")
    return graph, names


def _canonical_graph(graph: Graph, path: str) -> tuple[Graph, dict[str, str], dict[str, dict[str, str]]]:
    names: dict[str, str] = {}
    counter = 0
    for node in graph.nodes:
        if isinstance(node, Output):
            names[node.name] = "output"
        else:
            names[node.name] = str(counter)
            counter += 1
    builder = GraphBuilder()
    for node, meta, prov in graph.entries():
        builder.add(rename_node(node, names), meta, _stable_prov(prov))
    nested: dict[str, dict[str, str]] = {path: names}
    subs = []
    for s in sorted(graph.subgraphs, key=lambda s: s.name):
        sub_graph, _, sub_names = _canonical_graph(s.graph, f"{path}/{s.name}" if path else s.name)
        nested.update(sub_names)
        subs.append(Subgraph(name=s.name, graph=sub_graph))
    return builder.build(tuple(subs)), names, nested


def canonicalize(program: Program) -> Program:
    """The canonical form of `program` (see the module docstring). Pure; idempotent."""
    return canonicalize_with_names(program)[0]


def canonicalize_with_names(program: Program) -> tuple[Program, dict[str, dict[str, str]]]:
    """`canonicalize`, also returning each graph's old -> canonical name map, keyed by the graph's
    path: '' for the program graph, 'true_graph_0' (or 'a/b') for nested graphs, and
    '<module>:<path>' for the graphs of lowered module '<module>'."""
    graph, names, maps = _canonical_graph(program.graph, "")
    signature = msgspec.structs.replace(
        program.signature,
        inputs=tuple(rename_input_spec(s, names) for s in program.signature.inputs),
        outputs=tuple(rename_output_spec(s, names) for s in program.signature.outputs),
    )
    calls = []
    for entry in program.module_call_graph:
        sig = entry.signature
        if sig is not None:
            sig = msgspec.structs.replace(
                sig,
                inputs=tuple(rename_arg(a, names) for a in sig.inputs),
                outputs=tuple(rename_arg(a, names) for a in sig.outputs),
            )
        calls.append(ModuleCallEntry(fqn=entry.fqn, signature=sig))
    lowered = []
    for m in sorted(program.lowered_modules, key=lambda m: m.name):
        inner, inner_maps = canonicalize_with_names(m.module.original_program)
        maps.update({f"{m.name}:{k}": v for k, v in inner_maps.items()})
        lowered.append(NamedLoweredModule(name=m.name, module=msgspec.structs.replace(m.module, original_program=inner)))
    canonical = msgspec.structs.replace(
        program,
        graph=graph,
        signature=signature,
        state=tuple(sorted(program.state, key=lambda e: e.target)),
        range_constraints=tuple(sorted(program.range_constraints, key=lambda r: r.symbol)),
        module_call_graph=tuple(calls),
        lowered_modules=tuple(lowered),
        backend_meta=tuple(sorted(
            (msgspec.structs.replace(m, node=names.get(m.node, m.node)) for m in program.backend_meta),
            key=lambda m: (m.node, m.key),
        )),
        op_schemas=tuple(sorted(set(program.op_schemas))),
    )
    return canonical, maps




def _graph_without_stack_traces(graph: Graph) -> Graph:
    table = graph.provenance
    subs = tuple(Subgraph(name=s.name, graph=_graph_without_stack_traces(s.graph)) for s in graph.subgraphs)
    if (table is None or all(loc.stack_trace is None for loc in table.locations)) and all(
        a.graph is b.graph for a, b in zip(subs, graph.subgraphs)
    ):
        return graph
    builder = GraphBuilder()
    for node, meta, prov in graph.entries():
        builder.add(node, meta, _stable_prov(prov))
    return builder.build(subs)


def drop_stack_traces(program: Program) -> Program:
    """`program` without stack traces (they hold machine paths and line numbers), in nested graphs
    and lowered modules too; everything else, debug handles included, is kept. Pure."""
    lowered = tuple(
        NamedLoweredModule(
            name=m.name,
            module=msgspec.structs.replace(m.module, original_program=drop_stack_traces(m.module.original_program)),
        )
        for m in program.lowered_modules
    )
    return msgspec.structs.replace(program, graph=_graph_without_stack_traces(program.graph), lowered_modules=lowered)
