"""A partitioner that keeps an op whole but turns some of its nodes down (ExecuTorch's node filter,
`check_op_support`; texir's `nodes_to_decompose`): those nodes are decomposed after all, as
ExecuTorch does, instead of being left kept and undelegated."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests.xnnpack_oracle import executorch_xnnpack, pte_view, run_pte, texir_xnnpack
from texir.adapters import to_exported_program
from texir.executorch import executorch_partitioner
from texir.ir import CallFunction, Placeholder, Program, Ref, UserInput
from texir.lowering import OpSupportPartitioner, PartitionerError
from texir.orchestrate import lower
from texir.lowering.plan import PartitionPlan

LINEAR = "aten::linear.default"


class _ParamAndInputWeight(nn.Module):
    """A linear with a parameter weight (XNNPACK takes it) and one whose weight is a user input
    (XNNPACK's node filter turns it down)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(self.proj(x), w)


def _args() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(2, 8), torch.randn(8, 8)


def _export() -> torch.export.ExportedProgram:
    torch.manual_seed(1)
    return torch.export.export(_ParamAndInputWeight().eval(), _args(), strict=False)


def test_xnnpack_turns_a_linear_down_and_both_lowerings_agree() -> None:
    ours, theirs = texir_xnnpack(_export()), executorch_xnnpack(_export())
    assert theirs.error is None and ours.error is None, ours.error  # texir used to refuse: kept, undelegated
    assert ours.pte is not None and theirs.pte is not None
    mine, reference = pte_view(ours.pte), pte_view(theirs.pte)
    assert mine.delegates == reference.delegates  # same partitions, byte-equal blobs
    assert mine.named == reference.named
    assert mine.kernels == reference.kernels  # the turned-down linear runs as the same portable ops
    assert ours.partitions == theirs.partitions
    torch.manual_seed(1)
    model = _ParamAndInputWeight().eval()
    args = _args()
    (got,), (expected,) = run_pte(ours.pte, args), run_pte(theirs.pte, args)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[0], model(*args), rtol=1e-4, atol=1e-5)


class _KeepsLinearButNotDynamicWeights:
    """texir's own protocol: keeps linear whole, takes it, but turns down the linears whose weight
    is a user input."""

    def ops_to_not_decompose(self, program: Program) -> tuple[str, ...]:
        return (LINEAR,)

    def nodes_to_decompose(self, program: Program) -> list[str]:
        placeholders = [n.name for n in program.graph.nodes if isinstance(n, Placeholder)]
        users = {name for name, spec in zip(placeholders, program.signature.inputs) if isinstance(spec, UserInput)}
        return [
            n.name for n in program.graph.nodes
            if isinstance(n, CallFunction) and n.target == LINEAR
            and isinstance(n.args[1], Ref) and n.args[1].name in users
        ]

    def __call__(self, program: Program) -> PartitionPlan:
        return OpSupportPartitioner("texir-test", {LINEAR})(program)


def test_texir_partitioner_turning_a_node_down_gets_it_decomposed() -> None:
    import tests.lowering_helpers  # noqa: F401  # registers texir-test

    lowered = lower(_export(), [_KeepsLinearButNotDynamicWeights()], cache=None).program
    (module,) = lowered.lowered_modules
    inside = [n.target for n in module.module.original_program.graph.nodes if isinstance(n, CallFunction)]
    assert inside == [LINEAR]
    outside = [n.target for n in lowered.graph.nodes if isinstance(n, CallFunction)]
    assert LINEAR not in outside and any(t.startswith("aten::mm") for t in outside), outside
    torch.manual_seed(1)
    model = _ParamAndInputWeight().eval()
    args = _args()
    torch.testing.assert_close(to_exported_program(lowered).module()(*args), model(*args))


def test_the_report_says_what_was_turned_down_and_what_stayed_undelegated() -> None:
    import tests.lowering_helpers  # noqa: F401  # registers texir-test
    from texir.ir.names import CALL_DELEGATE, GETITEM
    from texir.orchestrate import lower

    done = lower(_export(), [_KeepsLinearButNotDynamicWeights()], cache=None)
    report = done.report
    assert report.not_decomposed == (LINEAR,)
    (turned,) = report.turned_down
    assert turned.target == LINEAR and "_KeepsLinearButNotDynamicWeights" in turned.partitioner
    (delegate,) = report.delegates
    assert delegate.backend == "texir-test" and delegate.module == "lowered_module_0" and not delegate.cache_hit
    outside = [n for n in done.program.graph.nodes if isinstance(n, CallFunction)
               and n.target not in (CALL_DELEGATE, GETITEM)]
    assert [u.node for u in report.undelegated] == [n.name for n in outside] and outside
    assert all(u.reason == "no_partitioner" and "not tagged by the partitioner" in u.detail for u in report.undelegated)
    edge_targets = {n.name: n.target for n in done.edge.graph.nodes if isinstance(n, CallFunction)}
    assert delegate.targets == tuple(edge_targets[n] for n in delegate.nodes) and delegate.targets
    assert done.program == lower(_export(), [_KeepsLinearButNotDynamicWeights()], cache=None).program


class _Bad(_KeepsLinearButNotDynamicWeights):
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def nodes_to_decompose(self, program: Program) -> list[str]:
        if isinstance(self.answer, BaseException):
            raise self.answer
        return list(self.answer)

    def __repr__(self) -> str:
        return "_Bad()"


def test_nodes_to_decompose_that_raises_or_names_no_node_is_a_partitioner_error() -> None:
    import tests.lowering_helpers  # noqa: F401  # registers texir-test

    with pytest.raises(PartitionerError, match=r"_Bad\(\)\.nodes_to_decompose raised KeyError"):
        lower(_export(), [_Bad(KeyError("w"))], cache=None)
    with pytest.raises(PartitionerError, match=r"named \['no_such_node'\], which are not nodes of the program"):
        lower(_export(), [_Bad(["no_such_node"])], cache=None)


def test_executorch_node_filter_that_raises_names_the_node() -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    class Raising(XnnpackPartitioner):  # type: ignore[misc]  # ExecuTorch ships no type information
        def ops_to_not_decompose(self, ep: Any) -> Any:
            ops, _ = super().ops_to_not_decompose(ep)

            def refuse(node: torch.fx.Node) -> bool:
                raise ValueError("cannot judge")

            return ops, refuse

    with pytest.raises(PartitionerError, match=r"Raising: its ops_to_not_decompose node filter raised ValueError on node 'linear\w*'"):
        lower(_export(), [executorch_partitioner(Raising())], cache=None)
