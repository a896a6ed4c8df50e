"""texir.adapters.op_args walks an op's arguments as pytree does."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.fx.immutable_collections import immutable_dict, immutable_list
from torch.utils import _pytree as pytree

from texir.adapters.op_args import leaves, map_leaves

_T = torch.zeros(2)
_U = torch.ones(3)

CASES: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((_T, 1, [2, _U, None], (3.0, [_T])), {"alpha": 2, "out": [_U]}),
    ((torch.Size([2, 3]), [_T, {"k": _U}]), {}),
    ((), {"x": (_T,), "y": None}),
    # an FX node's arguments: immutable lists and keyword dicts, given back as such
    ((immutable_list([_T, immutable_list([1, _U])]), immutable_dict({"b": _U, "a": [_T]})), {}),
]


@pytest.mark.parametrize("args, kwargs", CASES)
def test_walks_equal_pytrees(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    assert [id(x) for x in leaves(args, kwargs)] == [id(x) for x in pytree.tree_leaves((args, kwargs))]
    seen: list[int] = []

    def mark(t: torch.Tensor) -> str:
        seen.append(id(t))
        return f"node{len(seen)}"

    mine = map_leaves(torch.Tensor, mark, (args, kwargs))
    order, seen[:] = list(seen), []
    theirs = pytree.tree_map_only(torch.Tensor, mark, (args, kwargs))
    assert mine == theirs and order == seen
    assert _types(mine) == _types(theirs)
    assert type(mine[0]) is tuple and type(mine[1]) is dict


def _types(value: Any) -> Any:
    """`value`'s containers' types, nested as it is."""
    if isinstance(value, (list, tuple)):
        return (type(value), [_types(v) for v in value])
    if isinstance(value, dict):
        return (type(value), {k: _types(v) for k, v in value.items()})
    return type(value)
