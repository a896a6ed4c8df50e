"""Lowered-module numbering as ExecuTorch's: its multi-method `to_backend` (behind
`to_edge_transform_and_lower` and `EdgeProgramManager.to_backend`) fuses every tag first and names
lowered modules, delegate calls and their debug handles in the order of the calls in the graph,
while its one-program `to_backend(ep, partitioner)` names them in the partitioner's tag order.
ExecuTorch's `AddMulPartitionerDemo` lists its tags out of graph order (`['tag1', 'tag3']`, tag1
the later partition); test_backends_lifted.py's `test_add_mul_partitioner` asserts the numbering."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from texir.ir import CallFunction, GetAttr, Program


class AddMul(torch.nn.Module):
    """ExecuTorch's test_add_mul_partitioner model: two mm+add partitions around one sub."""

    def forward(self, a: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = torch.mm(a, x)
        z = y + b
        a = z - a
        y = torch.mm(a, x)
        return y + b


ARGS = (torch.randn(2, 2), torch.randn(2, 2), torch.randn(2, 2))


def _texir_names(program: Program) -> list[tuple[str, str, int | None]]:
    """Each call in graph order: (name, its lowered module or '', debug handle)."""
    g = program.graph
    attrs = {n.name: n.target for n in g.nodes if isinstance(n, GetAttr)}
    return [
        (n.name, attrs.get(getattr(n.args[0], "name", ""), "") if n.args else "", h)
        for n, h in zip(g.nodes, g.debug_handles())
        if isinstance(n, CallFunction)
    ]


def _executorch_names(ep: Any) -> list[tuple[str, str, int | None]]:
    def module_of(n: Any) -> str:
        first = n.args[0] if n.args else None
        return str(first.target) if getattr(first, "op", None) == "get_attr" else ""

    return [(n.name, module_of(n), n.meta.get("debug_handle")) for n in ep.graph.nodes if n.op == "call_function"]


@pytest.fixture(scope="module")
def exported() -> torch.export.ExportedProgram:
    return torch.export.export(AddMul(), ARGS, strict=True)


def test_tags_out_of_graph_order_are_numbered_as_to_edge_transform_and_lower_numbers_them(
    exported: torch.export.ExportedProgram,
) -> None:
    pytest.importorskip("executorch")
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.backend.test.op_partitioner_demo import AddMulPartitionerDemo

    import texir
    from texir.executorch import executorch_partitioner

    ours = texir.lower(exported, [executorch_partitioner(AddMulPartitionerDemo())], cache=None).program
    theirs = to_edge_transform_and_lower(copy.deepcopy(exported), partitioner=[AddMulPartitionerDemo()])
    expected = _executorch_names(theirs.exported_program())
    assert _texir_names(ours) == expected
    # the first call in the graph is lowered_module_0 although its tag is listed second
    assert [m for _, m, _ in expected if m] == ["lowered_module_0", "lowered_module_1"]


def test_tags_out_of_graph_order_are_numbered_in_tag_order_by_one_program_to_backend(
    exported: torch.export.ExportedProgram,
) -> None:
    pytest.importorskip("executorch")
    from executorch.exir import to_edge
    from executorch.exir.backend.backend_api import to_backend as et_to_backend
    from executorch.exir.backend.test.op_partitioner_demo import AddMulPartitionerDemo

    import texir
    from texir.executorch import executorch_partitioner
    from texir.lowering import to_backend

    edge = texir.lower(exported, [], cache=None).program
    ours = to_backend(edge, executorch_partitioner(AddMulPartitionerDemo()))
    theirs = et_to_backend(to_edge(copy.deepcopy(exported)).exported_program(), AddMulPartitionerDemo())
    expected = _executorch_names(theirs)
    assert _texir_names(ours) == expected
    # tag1 (the later partition) is lowered first, as the partitioner lists it
    assert [m for _, m, _ in expected if m] == ["lowered_module_1", "lowered_module_0"]


def test_an_unknown_numbering_is_refused() -> None:
    from texir.lowering.delegate import apply_plan
    from texir.lowering.errors import PartitionerError
    from texir.lowering.plan import PartitionPlan

    import tests.lowering_helpers as h

    program = h.export_program(AddMul(), ARGS)
    with pytest.raises(PartitionerError, match="numbering='sideways'"):
        apply_plan(program, PartitionPlan(tags=(), specs=()), numbering="sideways")  # type: ignore[arg-type]  # the refused value
