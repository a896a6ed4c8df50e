"""Memory-format ops become ExecuTorch's dim-order ops (exir's MemoryFormatOpsPass)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from texir.edge._rewrite import EdgeError, Entry, Forward, MetaLookup, rewrite_program
from texir.ir.types import (
    Argument,
    CallFunction,
    Graph,
    IntArg,
    ListArg,
    MemoryFormat,
    MemoryFormatArg,
    Node,
    NoneArg,
    Program,
    Provenance,
    Ref,
    TensorMeta,
    ValueMeta,
)

__all__ = ["DIM_ORDER_OPS", "to_dim_order_ops"]

DIM_ORDER_OPS: dict[str, str] = {
    "aten::_to_copy.default": "dim_order_ops::_to_dim_order_copy.default",
    "aten::clone.default": "dim_order_ops::_clone_dim_order.default",
    "aten::empty.memory_format": "dim_order_ops::_empty_dim_order.default",
}


def _explicit_order(fmt: MemoryFormat, rank: int, where: str) -> tuple[int, ...]:
    if fmt == MemoryFormat.contiguous_format:
        return tuple(range(rank))
    if fmt == MemoryFormat.channels_last and rank == 4:
        return (0, 2, 3, 1)
    if fmt == MemoryFormat.channels_last_3d and rank == 5:
        return (0, 2, 3, 4, 1)
    raise EdgeError(f"{where}: memory format {fmt} does not fit a rank-{rank} tensor; use contiguous_format")


def _preserved_order(
    node: CallFunction, meta: ValueMeta | None, graph: Graph, meta_of: MetaLookup
) -> tuple[int, ...] | None:
    """The dim order of the node's input (largest stride first, ties in dim order, as torch's
    `Tensor.dim_order()`); contiguous for a list input; None when a stride is symbolic (the
    emitter then takes the input's layout as it emits it)."""
    rank = len(meta.shape) if isinstance(meta, TensorMeta) else 0
    first = node.args[0] if node.args else None
    if not isinstance(first, Ref):
        return tuple(range(rank))
    source = meta_of(graph, first.name)
    if not isinstance(source, TensorMeta) or len(source.strides) != rank:
        return None
    strides = source.strides
    if not all(isinstance(s, int) for s in strides):
        return None
    return tuple(sorted(range(rank), key=lambda d: -int(strides[d])))


def _with_order(
    kwargs: tuple[tuple[str, Argument], ...], order: tuple[int, ...] | None
) -> tuple[tuple[str, Argument], ...]:
    if order is None:
        return kwargs
    return (*kwargs, ("dim_order", ListArg(items=tuple(IntArg(value=d) for d in order))))


def _rule(
    node: Node, meta: ValueMeta | None, prov: Provenance | None, graph: Graph, meta_of: MetaLookup
) -> Forward | Sequence[Entry] | None:
    if not isinstance(node, CallFunction):
        return None
    if node.target in _FILLED and all(k != "dim_order" for k, _ in node.kwargs):
        # A cast an earlier pass inserted as a dim-order op: it keeps its input's order.
        filled = _with_order(node.kwargs, _preserved_order(node, meta, graph, meta_of))
        if filled is node.kwargs:
            return None
        return ((msgspec.structs.replace(node, kwargs=filled), meta, prov),)
    target = DIM_ORDER_OPS.get(node.target)
    if target is None:
        return None
    kwargs = dict(node.kwargs)
    fmt: Argument = kwargs.pop("memory_format", NoneArg())
    fmt_value = fmt.value if isinstance(fmt, MemoryFormatArg) else None
    new_kwargs = tuple((k, v) for k, v in node.kwargs if k != "memory_format")
    # As ExecuTorch's pass: preserve_format (or none) takes the input's dim order, an explicit
    # memory format its own order.
    if fmt_value in (None, MemoryFormat.preserve_format):
        order = _preserved_order(node, meta, graph, meta_of)
    else:
        rank = len(meta.shape) if isinstance(meta, TensorMeta) else 0
        order = _explicit_order(fmt_value, rank, f"node {node.name!r} ({node.target})")
    new_kwargs = _with_order(new_kwargs, order)
    return ((msgspec.structs.replace(node, target=target, kwargs=new_kwargs), meta, prov),)


_FILLED = frozenset({"dim_order_ops::_to_dim_order_copy.default", "dim_order_ops::_clone_dim_order.default"})


def to_dim_order_ops(program: Program) -> Program:
    """`program` with `_to_copy`/`clone`/`empty.memory_format` as dim-order ops (nested graphs too)."""
    meta_of = MetaLookup()
    return rewrite_program(program, lambda node, meta, prov, graph: _rule(node, meta, prov, graph, meta_of))
