"""The edge decomposition table looked up one op at a time gives the entries of the whole table."""

from __future__ import annotations

import functools
from typing import Any

import torch

from texir.adapters.decompositions import edge_decomposition_table, lazy_edge_decomposition_table


def _same(a: Any, b: Any) -> bool:
    # A composite op's entry is a fresh partial (of a fresh closure) over its kernel each time
    # torch's table is built.
    if isinstance(a, functools.partial) and isinstance(b, functools.partial):
        return a.func.__code__ is b.func.__code__ and a.args == b.args and a.keywords == b.keywords
    return a is b


def test_every_entry_of_the_table_is_looked_up_the_same() -> None:
    eager = edge_decomposition_table(("aten::linear.default",))
    lazy = lazy_edge_decomposition_table(("aten::linear.default",))
    assert torch.ops.aten.linear.default not in lazy and torch.ops.aten.linear.default not in eager
    different = [op for op, entry in eager.items() if not _same(lazy.get(op), entry)]
    assert different == []
    assert set(lazy) == set(eager) and len(lazy) == len(eager)


def test_ops_outside_the_table_are_not_in_it() -> None:
    eager = edge_decomposition_table()
    lazy = lazy_edge_decomposition_table()
    outside = []
    for name in torch.ops.aten:
        packet = getattr(torch.ops.aten, name)
        for overload in packet.op_overloads():
            if (overload in lazy) != (overload in eager):
                outside.append(overload)
    assert outside == []
    # spot checks: kept whole, decomposed by the core table, by its composite kernel, quantization kept
    assert torch.ops.aten.convolution.default not in lazy
    assert torch.ops.aten.native_batch_norm.default not in lazy or torch.ops.aten.native_batch_norm.default in eager
    assert torch.ops.aten.hardswish.default in lazy
    assert torch.ops.aten.linear.default in lazy
    assert torch.ops.aten.upsample_nearest2d.vec not in lazy
    assert not any(getattr(op, "namespace", None) == "quantized_decomposed" for op in lazy)
