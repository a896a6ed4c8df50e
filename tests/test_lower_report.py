"""`lower`'s report: the seconds of each phase of the call, and why each undelegated node is so."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import texir.backends  # noqa: F401  (registers the reference backend)
from texir.adapters import from_exported_program
from texir.lowering import PHASES, LowerReport, OpSupportPartitioner, lower_decomposed
from texir.orchestrate import lower

REFERENCE = "texir-reference"


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
