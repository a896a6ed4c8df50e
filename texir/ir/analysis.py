"""Read-only analyses over the IR: uses, value tables, argument walks. Nothing here builds IR."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from texir.errors import IRError
from texir.ir.printer import contiguous_strides
from texir.ir.types import (
    Argument,
    CallFunction,
    Graph,
    ListArg,
    Node,
    Output,
    Ref,
    TensorMeta,
    TupleArg,
    ValueMeta,
)


def iter_refs(arg: Argument) -> Iterator[str]:
    """Names referenced by an argument, in order (lists and tuples walked depth first)."""
    if isinstance(arg, Ref):
        yield arg.name
    elif isinstance(arg, (ListArg, TupleArg)):
        for item in arg.items:
            yield from iter_refs(item)


def node_args(node: Node) -> Iterator[Argument]:
    """Positional then keyword arguments of a node."""
    if isinstance(node, CallFunction):
        yield from node.args
        for _, value in node.kwargs:
            yield value
    elif isinstance(node, Output):
        yield from node.args


def node_inputs(node: Node) -> Iterator[str]:
    """Names of the values a node reads, in argument order (with repeats)."""
    # (collected in one loop, not through nested generators: every lowering pass asks this of
    # every node, often more than once)
    if isinstance(node, CallFunction):
        args: Iterable[Argument] = (*node.args, *(value for _, value in node.kwargs))
    elif isinstance(node, Output):
        args = node.args
    else:
        return iter(())
    names: list[str] = []
    for arg in args:
        if isinstance(arg, Ref):
            names.append(arg.name)
        elif isinstance(arg, (ListArg, TupleArg)):
            names.extend(iter_refs(arg))
    return iter(names)


def users(graph: Graph) -> dict[str, tuple[str, ...]]:
    """For each node name, the names of nodes that read it, in graph order, without repeats."""
    result: dict[str, list[str]] = {node.name: [] for node in graph.nodes}
    for node in graph.nodes:
        seen: set[str] = set()
        for name in node_inputs(node):
            if name not in seen and name in result:
                seen.add(name)
                result[name].append(node.name)
    return {name: tuple(us) for name, us in result.items()}


def value_metas(graph: Graph) -> dict[str, ValueMeta]:
    """Name-keyed table of the metadata of every node that has one."""
    metas = graph.metas
    table: dict[str, ValueMeta] = {}
    for node in graph.nodes:
        if not isinstance(node, Output) and node.meta_id is not None:
            table[node.name] = metas[node.meta_id]
    return table


def output_node(graph: Graph) -> Output:
    last = graph.nodes[-1] if graph.nodes else None
    if not isinstance(last, Output):
        raise IRError("graph has no output node; end every graph with one Output node")
    return last


def walk_keyed_graphs(graph: Graph, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Graph]]:
    """The graph and its nested graphs depth first, each with its subgraph-name path."""
    yield path, graph
    for sub in graph.subgraphs:
        yield from walk_keyed_graphs(sub.graph, (*path, sub.name))


def walk_graphs(graph: Graph, path: str = "") -> Iterator[tuple[str, Graph]]:
    """`walk_keyed_graphs` with each path dotted ('' for the top)."""
    for keyed, sub in walk_keyed_graphs(graph, tuple(path.split(".")) if path else ()):
        yield ".".join(keyed), sub


def node_key(path: tuple[str, ...], name: str) -> str:
    """A node's key across nested graphs: 'name', or 'subgraph/name' (what plans and reports use)."""
    return "/".join((*path, name))


def call_nodes(graph: Graph) -> tuple[CallFunction, ...]:
    return tuple(n for n in graph.nodes if isinstance(n, CallFunction))


def same_dim_order(a: TensorMeta, b: TensorMeta) -> bool:
    """Whether two tensors have the same dim order (torch's `dim_order()`: dims by decreasing
    stride, ties in dim order). With concrete strides the orders are compared; when either has a
    symbolic stride the order is not known for every shape, and only identical strides (the same
    expressions) answer yes."""
    if len(a.strides) != len(b.strides):
        return False
    left = [s for s in a.strides if isinstance(s, int)]
    right = [s for s in b.strides if isinstance(s, int)]
    if len(left) == len(right) == len(a.strides):
        return _dim_order(left) == _dim_order(right)
    return a.strides == b.strides


_FORMAT_DIMS: dict[tuple[str, int], tuple[int, ...]] = {
    ("channels_last", 4): (1, 3, 2, 0),
    ("channels_last_3d", 5): (1, 4, 3, 2, 0),
}
"""The dims torch's `is_contiguous(memory_format=...)` walks, innermost first (contiguous: last to first)."""


def contiguous_in(meta: TensorMeta, memory_format: str) -> bool:
    """Whether the tensor is laid out as `memory_format` ("contiguous_format", "channels_last",
    "channels_last_3d") asks, as torch's `Tensor.is_contiguous(memory_format=...)` answers: dims of
    size 1 may have any stride; an empty tensor is contiguous. False when a size or stride is
    symbolic and the strides are not exactly a contiguous tensor's (`contiguous_strides`), or the
    format does not fit the rank."""
    shape, strides = meta.shape, meta.strides
    if len(shape) != len(strides):
        return False
    if not all(isinstance(d, int) for d in (*shape, *strides)):
        return memory_format == "contiguous_format" and tuple(strides) == contiguous_strides(tuple(shape))
    if memory_format == "contiguous_format":
        dims: tuple[int, ...] = tuple(reversed(range(len(shape))))
    elif (memory_format, len(shape)) in _FORMAT_DIMS:
        dims = _FORMAT_DIMS[(memory_format, len(shape))]
    else:
        return False
    if any(shape[d] == 0 for d in dims):
        return True
    expected = 1
    for d in dims:
        size, stride = int(shape[d]), int(strides[d])
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _dim_order(strides: list[int]) -> list[int]:
    return sorted(range(len(strides)), key=lambda d: -strides[d])
