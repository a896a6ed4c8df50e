"""`lower(..., order=)`: where the lowered graph's nodes go.

"executorch" (the default) replays ExecuTorch's to_backend edits on names (`texir.lowering.fx_order`),
so XNNPACK blobs and debug maps are byte-equal to ExecuTorch's (checked against ExecuTorch itself in
tests/test_executorch_backends.py and tests/test_debug_maps.py); "program" keeps the program's own
order. Both must give a valid program that computes what eager does."""

from __future__ import annotations

import pytest
import torch

import tests.lowering_helpers as h
from texir.adapters import to_exported_program
from texir.ir import CallFunction, Program, verify
from texir.lowering import OpSupportPartitioner, PartitionerError, get_lowered_submodules
from texir.orchestrate import lower
from texir.lowering.fx_order import FusedPart, executorch_node_order


class TwoBranches(torch.nn.Module):
    """Two independent chains joined at the end, with a value used twice by one node (cat([y, y]))."""

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)
        w = torch.cat([y, y])  # the same input twice: torch.fx counts it once
        v = torch.sin(z) * 2.0
        return torch.cat([w, torch.cat([v, v])]) + 1.0


ARGS = (torch.randn(2, 3), torch.randn(2, 3))


def _program() -> Program:
    return h.export_program(TwoBranches(), ARGS)


def _partitioner() -> OpSupportPartitioner:
    return OpSupportPartitioner(h.TEST_BACKEND, {"aten::relu.default", "aten::cat.default", "aten::sin.default"})


def _calls(program: Program) -> list[str]:
    return [n.name for n in program.graph.nodes if isinstance(n, CallFunction)]


@pytest.mark.parametrize("order", ["executorch", "program"])
def test_both_orders_give_valid_programs_that_compute_like_eager(order: str) -> None:
    lowered = lower(_program(), [_partitioner()], cache=None, order=order).program  # type: ignore[arg-type]
    verify(lowered)
    assert len(get_lowered_submodules(lowered)) >= 1
    expected = TwoBranches()(*ARGS)
    torch.testing.assert_close(to_exported_program(lowered).module()(*ARGS), expected)


def test_orders_hold_the_same_nodes() -> None:
    a = lower(_program(), [_partitioner()], cache=None, order="executorch").program
    b = lower(_program(), [_partitioner()], cache=None, order="program").program
    assert sorted(_calls(a)) == sorted(_calls(b))


def test_a_node_reading_one_value_twice_is_ordered() -> None:
    # Regression: cat([y, y]) made the in-degree count y twice and the replay report a cycle.
    program = _program()
    cats = [n.name for n in program.graph.nodes if isinstance(n, CallFunction) and n.target == "aten::cat.default"]
    relu = next(n.name for n in program.graph.nodes if isinstance(n, CallFunction) and n.target == "aten::relu.default")
    result = executorch_node_order(program.graph, [FusedPart(tag="tag0", members=frozenset({relu, cats[0]}))])
    assert result.member_order["tag0"] == (relu, cats[0])
    kinds = [kind for kind, _, _ in result.final]
    assert kinds.count("call") == 1 and kinds.count("attr") == 1 and kinds.count("getitem") == 1
    names = [name for kind, name, _ in result.final if kind == "node"]
    assert relu not in names and cats[0] not in names and all(c in names for c in cats[1:])


def test_an_unknown_order_is_refused() -> None:
    with pytest.raises(PartitionerError, match=r"order='sideways' is not a node order; use 'program' or 'executorch'"):
        lower(_program(), [_partitioner()], cache=None, order="sideways")  # type: ignore[arg-type]
