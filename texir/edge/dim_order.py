"""Memory-format ops become ExecuTorch's dim-order ops (exir's MemoryFormatOpsPass)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from texir.edge._rewrite import EdgeError, Entry, Forward, rewrite_program
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


def _rule(node: Node, meta: ValueMeta | None, prov: Provenance | None, graph: Graph) -> Forward | Sequence[Entry] | None:
    if not isinstance(node, CallFunction):
        return None
    target = DIM_ORDER_OPS.get(node.target)
    if target is None:
        return None
    kwargs = dict(node.kwargs)
    fmt: Argument = kwargs.pop("memory_format", NoneArg())
    fmt_value = fmt.value if isinstance(fmt, MemoryFormatArg) else None
    new_kwargs = tuple((k, v) for k, v in node.kwargs if k != "memory_format")
    # preserve_format (or none) keeps the input's layout as the emitter lays it out, so the
    # dim_order argument is left for the emitter to fill from the emitted input.
    if fmt_value not in (None, MemoryFormat.preserve_format):
        rank = len(meta.shape) if isinstance(meta, TensorMeta) else 0
        order = _explicit_order(fmt_value, rank, f"node {node.name!r} ({node.target})")
        new_kwargs = (*new_kwargs, ("dim_order", ListArg(items=tuple(IntArg(value=d) for d in order))))
    return ((msgspec.structs.replace(node, target=target, kwargs=new_kwargs), meta, prov),)


def to_dim_order_ops(program: Program) -> Program:
    """`program` with `_to_copy`/`clone`/`empty.memory_format` as dim-order ops (nested graphs too)."""
    return rewrite_program(program, _rule)
