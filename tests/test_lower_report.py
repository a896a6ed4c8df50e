"""`lower`'s report: the seconds of each phase of the call, and why each undelegated node is so."""

from __future__ import annotations

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from torch import nn

import texir.backends  # noqa: F401  (registers the reference backend)
from texir.adapters import from_exported_program
from texir.backends import xnnpack
from texir.executorch import executorch_partitioner
from texir.lowering import PHASES, LowerReport, OpSupportPartitioner, lower_decomposed
from texir.lowering.errors import PartitionerError
from texir.orchestrate import lower

REFERENCE = "texir-reference"
LINEAR = "aten::linear.default"


class _LinearTan(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tan(torch.relu(self.proj(x)))


@pytest.fixture(scope="module")
def exported() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    return torch.export.export(_LinearTan().eval(), (torch.randn(2, 4),), strict=False)


def _check_phases(report: LowerReport) -> dict[str, float]:
    names = [p.name for p in report.phases]
    assert names == list(PHASES)
    seconds = {p.name: p.seconds for p in report.phases}
    assert all(s >= 0.0 for s in seconds.values()), seconds
    assert sum(s for n, s in seconds.items() if n != "total") <= seconds["total"], seconds
    return seconds


def test_lower_reports_each_phase_in_order(exported: torch.export.ExportedProgram) -> None:
    partitioner = OpSupportPartitioner(REFERENCE, {"aten::relu.default"})
    done = lower(exported, [partitioner], cache=None)
    assert [d.backend for d in done.report.delegates] == [REFERENCE]
    _check_phases(done.report)


def test_lower_decomposed_neither_imports_nor_decomposes(exported: torch.export.ExportedProgram) -> None:
    program = from_exported_program(exported, decompose=True)
    done = lower_decomposed(program, [OpSupportPartitioner(REFERENCE, {"aten::relu.default"})], cache=None)
    seconds = _check_phases(done.report)
    assert seconds["import"] == 0.0 and seconds["decompose"] == 0.0


class _StaticAndDynamicWeight(nn.Module):
    """A linear XNNPACK takes, one whose weight is a user input (its check turns the linear down:
    decomposed, its mm turned down too) and a tan no partitioner supports."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.tan(nn.functional.linear(self.proj(x), w))


@pytest.fixture(scope="module")
def dynamic_weight() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    args = (torch.randn(2, 8), torch.randn(8, 8))
    return torch.export.export(_StaticAndDynamicWeight().eval(), args, strict=False)


def _reasons(report: LowerReport) -> dict[str, tuple[str, str]]:
    return {u.target: (u.reason, u.detail) for u in report.undelegated}


def test_native_xnnpack_tells_turned_down_from_unsupported(dynamic_weight: torch.export.ExportedProgram) -> None:
    with xnnpack.registered():
        done = lower(dynamic_weight, [xnnpack.partitioner()], cache=None)
    assert [t.target for t in done.report.turned_down] == [LINEAR]  # its check refused it: decomposed
    reasons = _reasons(done.report)
    assert reasons["aten::mm.default"] == ("turned_down", "weight is not static")
    assert reasons["aten::tan.default"] == (
        "no_partitioner", "op aten::tan.default has no XNNPACK config in the native backend")


def test_executorch_xnnpack_tells_turned_down_from_unsupported(dynamic_weight: torch.export.ExportedProgram) -> None:
    done = lower(dynamic_weight, [executorch_partitioner(XnnpackPartitioner())], cache=None)
    assert [t.target for t in done.report.turned_down] == [LINEAR]  # its node filter turned it down
    reasons = _reasons(done.report)
    # the reason its config logged (WhyNoPartition); tan has no config: nothing to say
    assert reasons["aten::mm.default"] == ("turned_down", "XnnpackPartitioner: Expected weight to be a static param")
    assert reasons["aten::tan.default"] == (
        "no_partitioner", "not tagged by the partitioner executorch_partitioner(XnnpackPartitioner)")
    _check_phases(done.report)


def test_a_node_filter_turning_a_linear_down(exported: torch.export.ExportedProgram) -> None:
    program = from_exported_program(exported)  # not decomposed: the linear stays whole
    filtered = OpSupportPartitioner(
        REFERENCE, {LINEAR, "aten::relu.default"}, node_filter=lambda ctx: ctx.node.target != LINEAR
    )
    done = lower_decomposed(program, [filtered, OpSupportPartitioner(REFERENCE, {"aten::sin.default"})], cache=None)
    assert [len(d.nodes) for d in done.report.delegates] == [1]  # the relu
    reasons = _reasons(done.report)
    assert reasons[LINEAR] == ("turned_down", f"op '{LINEAR}' is supported but the node filter turned the node down")
    reason, detail = reasons["aten::tan.default"]
    assert reason == "no_partitioner" and detail.count("is not among the supported ops") == 2, detail


def test_a_kept_op_the_node_filter_refuses_is_decomposed_by_lower(exported: torch.export.ExportedProgram) -> None:
    """An op-set partitioner keeps linear whole; its filter refuses the one linear node, so `lower`
    decomposes that node (as ExecuTorch's check_op_support does) and the pieces run undelegated."""
    filtered = OpSupportPartitioner(
        REFERENCE, {LINEAR, "aten::relu.default"}, node_filter=lambda ctx: ctx.node.target != LINEAR
    )
    assert filtered.nodes_to_decompose(from_exported_program(exported)) == ("linear",)
    done = lower(exported, [filtered], cache=None)
    assert [t.target for t in done.report.turned_down] == [LINEAR]
    assert [len(d.nodes) for d in done.report.delegates] == [1]  # the relu
    left = {n.target for n in done.report.undelegated}
    assert LINEAR not in left and {"aten::addmm.default", "aten::mm.default"} & left, left


def test_a_node_filter_that_raises_is_a_partitioner_error(exported: torch.export.ExportedProgram) -> None:
    def broken(ctx: object) -> bool:
        raise KeyError("meta")

    with pytest.raises(PartitionerError, match=r"node filter raised KeyError on node 'linear'"):
        OpSupportPartitioner(REFERENCE, {LINEAR}, node_filter=broken).nodes_to_decompose(from_exported_program(exported))
