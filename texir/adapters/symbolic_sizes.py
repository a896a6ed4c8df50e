"""The nodes giving a program's symbolic sizes, made where torch's retrace makes them (for
`texir.adapters.local_decompose`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

__all__ = ["SYM_SIZE", "SizeNodes", "SizeOf", "unbacked_sizes"]

SYM_SIZE = torch.ops.aten.sym_size.int
_SYM_STRIDE = torch.ops.aten.sym_stride.int
_SYM_NUMEL = torch.ops.aten.sym_numel.default
_SYM_STORAGE_OFFSET = torch.ops.aten.sym_storage_offset.default


def _name(op: OpOverload) -> str:
    """The name torch's tracer gives a node of `op` (FX's, from the overload: `sym_size_int`)."""
    overload = op._overloadname
    return op.overloadpacket.__name__ if overload == "default" else f"{op.overloadpacket.__name__}_{overload}"


class SizeOf:
    """A symbolic size a node of the program reads (its `sym_size`), standing for that node."""

    def __init__(self, value: torch.SymInt) -> None:
        self.value = value


class SizeNodes:
    """Which node of `graph` gives each symbolic size, keyed by the size's expression (first wins,
    as in torch's tracer); `annotate(node, value)` gives a new node its metadata."""

    def __init__(self, graph: torch.fx.Graph, annotate: Callable[[torch.fx.Node, Any], None]) -> None:
        self.graph = graph
        self.annotate = annotate
        self.nodes: dict[Any, torch.fx.Node] = {}  # a size's expression -> the node giving it
        self.sources: dict[Any, tuple[OpOverload, torch.fx.Node, tuple[int, ...]]] = {}  # ... -> an input's

    def track(self, value: torch.Tensor, node: torch.fx.Node) -> None:
        """Where each symbolic size of the input `value` can be read, unless an earlier input gives
        it: torch's tracer notes the same of each input (sizes, strides, numel, storage offset) and
        makes the node reading one where it is first used."""
        def note(size: Any, op: OpOverload, *index: int) -> None:
            if isinstance(size, torch.SymInt) and size.node.maybe_as_int() is None:
                self.sources.setdefault(size.node.expr, (op, node, index))

        for i, size in enumerate(value.shape):
            note(size, SYM_SIZE, i)
        for i, stride in enumerate(value.stride()):
            note(stride, _SYM_STRIDE, i)
        note(value.numel(), _SYM_NUMEL)
        note(value.storage_offset(), _SYM_STORAGE_OFFSET)

    def record(self, op: OpOverload, args: tuple[Any, ...], value: torch.SymInt) -> None:
        """A size node of the program itself, where it stands; it gives every later use of its
        expression that no earlier node gives."""
        node = self.graph.create_node("call_function", op, args, {}, name=self.graph._target_to_str(_name(op)))
        self.annotate(node, value)
        self.nodes.setdefault(value.node.expr, node)

    def node_of(self, size: torch.SymInt) -> torch.fx.Node | int | None:
        """The node giving the symbolic `size` (a constant one is its int); a size of an input that
        no node gives yet gets its node here, where it is first used. None for a size computed
        from others (SymInt arithmetic, which torch's tracer records as nodes)."""
        constant = size.node.maybe_as_int()
        if constant is not None:
            return int(constant)
        expr = size.node.expr
        found = self.nodes.get(expr)
        if found is not None:
            return found
        source = self.sources.get(expr)
        if source is None:
            return None
        op, tensor, index = source
        self.record(op, (tensor, *index), size)
        return self.nodes[expr]


def unbacked_sizes(value: torch.Tensor) -> bool:
    """Whether a size, stride or the storage offset of `value` is only known at run time (an
    unbacked symbol): `free_unbacked_symbols`, answered at once for a tensor of plain int sizes,
    strides and offset (a static program's every value: no symbol to walk for)."""
    if not value._has_symbolic_sizes_strides:
        return False
    return bool(free_unbacked_symbols(value))
