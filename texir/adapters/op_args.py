"""An ATen op's arguments walked as pytree walks them, faster: their containers are lists, tuples
and FX's immutable lists (a dict of keyword arguments at the top), gone over by a walk of their
own (FX's immutable dicts of keyword arguments too); any other container by pytree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.fx.immutable_collections import immutable_dict, immutable_list
from torch.utils import _pytree as pytree

__all__ = ["leaves", "map_leaves"]


def leaves(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """`pytree.tree_leaves((args, kwargs))`."""
    flat: list[Any] = []
    pending: list[Any] = [*args, *kwargs.values()]
    pending.reverse()
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind is list or kind is tuple or kind is immutable_list:  # (FX's lists: pytree's say the same)
            pending.extend(reversed(item))
        elif isinstance(item, (list, tuple, dict)):  # (torch.Size, a named tuple, a dict: pytree's say)
            flat.extend(pytree.tree_leaves(item))
        else:
            flat.append(item)
    return flat


def map_leaves(kind: type, fn: Callable[[Any], Any], value: Any) -> Any:
    """`pytree.tree_map_only(kind, fn, value)`: each leaf of `kind` replaced by `fn` of it, in order."""
    if isinstance(value, kind):
        return fn(value)
    if type(value) is tuple:
        return tuple([map_leaves(kind, fn, v) for v in value])
    if type(value) is list:
        return [map_leaves(kind, fn, v) for v in value]
    if type(value) is immutable_list:  # (an FX node's list: pytree gives one back)
        return immutable_list([map_leaves(kind, fn, v) for v in value])
    if type(value) is dict:
        return {k: map_leaves(kind, fn, v) for k, v in value.items()}
    if type(value) is immutable_dict:  # (an FX node's keyword arguments)
        return immutable_dict({k: map_leaves(kind, fn, v) for k, v in value.items()})
    if isinstance(value, (list, tuple, dict)):
        return pytree.tree_map_only(kind, fn, value)
    return value
