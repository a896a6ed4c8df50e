"""Nodes `texir.adapters.local_decompose` records without a fake-tensor dispatch: an op with nothing
to decompose, on inputs that hold the program's own values, gives the program's own value."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence, Set
from typing import Any

import torch
from torch._C import DispatchKey
from torch._ops import OpOverload

from texir.adapters.symbolic_sizes import SizeOf, unbacked_sizes

__all__ = ["known_value", "passes_again", "plain_op"]


_BELOW_THE_RECORDER = frozenset({DispatchKey.Meta})
"""Python kernels that never run before the recorder sees the op: a Meta kernel (most core ATen
ops have one, torch's shape function) only computes a fake tensor's result, below the mode."""


def plain_op(op: OpOverload, table: Mapping[Any, Any], special: Set[OpOverload]) -> bool:
    """Nothing to decompose: not in `special`, no entry in `table`, no composite kernel and no
    Python kernel the Python dispatcher would run first (one for Meta only computes a fake
    tensor's result), so the op reaches the recorder as it is."""
    return op not in table and op not in special and _kernel_free(op)


@functools.cache
def _kernel_free(op: OpOverload) -> bool:
    return _BELOW_THE_RECORDER.issuperset(op.py_kernels) and not torch._C._dispatch_has_kernel_for_dispatch_key(
        op.name(), "CompositeImplicitAutograd"  # type: ignore[no-untyped-call]  # OpOverload.name is untyped
    )


def known_value(
    node: torch.fx.Node, env: Mapping[torch.fx.Node, Any], bound: Mapping[int, Any]
) -> torch.Tensor | Sequence[torch.Tensor] | None:
    """`node`'s own value (a tensor, or the results of a multi-result op such as batch norm), when
    its op is recorded whole on inputs holding the program's own values (`env`: the new node of
    each; a weight's value detached) or its own symbolic sizes: the export computed it from the
    same metadata, and it has no autograd state. None otherwise, or when a value already stands
    for another node (`bound`, by id)."""
    known = node.meta.get("val")
    parts = known if isinstance(known, (tuple, list)) and known else (known,)
    if not all(_fresh(part, bound) for part in parts) or len({id(part) for part in parts}) != len(parts):
        return None
    return known if _own_inputs(node, env) else None


def _own_inputs(node: torch.fx.Node, env: Mapping[torch.fx.Node, Any]) -> bool:
    """Every input of `node` holds the program's own value (`env`: the new node of each, of the
    metadata the program's had) or its own symbolic size: what the export computed `node` on."""
    for arg in node.all_input_nodes:
        got, mine = env.get(arg), arg.meta.get("val")
        if isinstance(got, SizeOf):
            if not isinstance(mine, torch.SymInt) or _expr(mine) != _expr(got.value):
                return False
        elif not isinstance(got, torch.fx.Node) or not _same_meta(got.meta.get("val"), mine):
            return False
    return True


def passes_again(node: torch.fx.Node, env: Mapping[torch.fx.Node, Any]) -> bool:
    """`node`'s op returns nothing (an assertion: `_assert_tensor_metadata`) and its inputs hold the
    program's own values: the export ran it on the same metadata, so it passes again (recorded
    without a dispatch)."""
    target = node.target
    return isinstance(target, OpOverload) and not target._schema.returns and _own_inputs(node, env)


def _fresh(value: Any, bound: Mapping[int, Any]) -> bool:
    """A tensor without autograd state that no node stands for yet, of sizes known before it runs
    (for a size only known at run time the retrace names its own symbol)."""
    return (
        isinstance(value, torch.Tensor) and not value.requires_grad and id(value) not in bound
        and not unbacked_sizes(value)
    )


def _expr(size: Any) -> Any:
    return size.node.expr if isinstance(size, torch.SymInt) else size


def _same_meta(a: Any, b: Any) -> bool:
    """`a` and `b` are tensors of the same metadata (a value a decomposition handed through, such
    as `to` of the same dtype, is its input's), compared without guarding symbolic sizes."""
    if a is b:
        return True
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    if (a.dtype, a.device, a.layout, a.requires_grad, a.dim()) != (b.dtype, b.device, b.layout, b.requires_grad, b.dim()):
        return False
    pairs = [*zip(a.shape, b.shape), *zip(a.stride(), b.stride()), (a.storage_offset(), b.storage_offset())]
    return all(_expr(x) == _expr(y) for x, y in pairs)
