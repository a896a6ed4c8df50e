"""Operator nodes take the names ExecuTorch's edge programs give them (to_edge's ExportPass retrace)."""

from __future__ import annotations

import re

import msgspec

from texir.ir.builder import GraphBuilder
from texir.ir.names import NameAllocator, rename_node, rename_output_spec
from texir.ir.types import CallFunction, Graph, Program, Subgraph

__all__ = ["NON_EDGE_OPS", "edge_name_base", "edge_node_names"]

_UPPER_AFTER_LOWER = re.compile(r"(?<=[a-z])([A-Z])")
_ILLEGAL = re.compile(r"[^0-9a-zA-Z_]+")
_BARE_NAMESPACES = frozenset({"_operator", "higher_order", "builtins", "math"})
"""Namespaces whose callables FX names by their bare name (getitem, cond, ...)."""

NON_EDGE_OPS: frozenset[str] = frozenset({
    "aten::sym_size.int", "aten::sym_stride.int", "aten::sym_numel.default", "aten::_local_scalar_dense.default",
    "aten::sym_constrain_range.default", "aten::sym_constrain_range_for_size.default",
    "aten::scalar_tensor.default", "aten::_assert_scalar.default", "aten::_assert_async.msg",
})
"""ATen operators ExecuTorch's to_edge leaves as ATen operators (its symbolic-size operators and the
ones it refuses to make edge operators; ExecuTorch 1.5.1's `should_lower_to_edge`): FX names them by
their bare name ('sym_size'), and partitioners see them as `torch.ops.aten.*`."""


def edge_name_base(target: str) -> str:
    """The name FX derives from an edge operator: 'aten::add.Tensor' -> 'aten_add_tensor',
    '_operator::getitem' -> 'getitem', 'aten::sym_size.int' -> 'sym_size' (`NON_EDGE_OPS`; snake
    case, illegal characters to '_')."""
    namespace, sep, rest = target.partition("::")
    bare = sep and (namespace in _BARE_NAMESPACES or target in NON_EDGE_OPS)
    text = rest.partition(".")[0] if bare else f"{namespace}.{rest}" if sep else target
    text = _ILLEGAL.sub("_", _UPPER_AFTER_LOWER.sub(r"_\1", text).lower())
    return text if text and not text[0].isdigit() else f"_{text}"


def _graph(graph: Graph) -> tuple[Graph, dict[str, str]]:
    # The retrace makes a new graph: placeholders and attributes keep their names, and every
    # operator node is named afresh from its target, in graph order, with FX's counters.
    allocator = NameAllocator({n.name for n in graph.nodes if not isinstance(n, CallFunction)})
    renames: dict[str, str] = {}
    for node in graph.nodes:
        if isinstance(node, CallFunction):
            renames[node.name] = allocator.fresh(edge_name_base(node.target))
    subgraphs = tuple(Subgraph(name=s.name, graph=_graph(s.graph)[0]) for s in graph.subgraphs)
    if all(old == new for old, new in renames.items()) and all(a.graph is b.graph for a, b in zip(subgraphs, graph.subgraphs)):
        return graph, {}
    builder = GraphBuilder()
    for node, meta, prov in graph.entries():
        builder.add(rename_node(node, renames), meta, prov)
    return builder.build(subgraphs), renames


def edge_node_names(program: Program) -> Program:
    """`program` with every operator node named as ExecuTorch's to_edge names it ('aten_addmm_default',
    'aten_addmm_default_1', 'getitem'), nested graphs too. Backends that print node names into their
    blobs (ExecuTorch's example backend) then see the names they see under ExecuTorch."""
    graph, renames = _graph(program.graph)
    if graph is program.graph:
        return program
    signature = msgspec.structs.replace(
        program.signature, outputs=tuple(rename_output_spec(s, renames) for s in program.signature.outputs)
    )
    meta = tuple(msgspec.structs.replace(m, node=renames.get(m.node, m.node)) for m in program.backend_meta)
    return msgspec.structs.replace(program, graph=graph, signature=signature, backend_meta=meta)
