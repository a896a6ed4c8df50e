"""MODEL specs and a custom partitioner for the `texir lower` CLI tests."""

from __future__ import annotations

import torch
from torch import nn

from texir.ir import Program
from texir.lowering import DelegationSpec, PartitionPlan


class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.count.add_(1.0)
        return torch.sin(self.fc(x + y) * y) + self.count


def build() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return SmallNet(), (torch.randn(2, 4), torch.randn(2, 4))


class MulOnly:
    """A user partitioner class: built with the backend id, tags every mul."""

    def __init__(self, backend_id: str) -> None:
        self.backend_id = backend_id

    def __call__(self, program: Program) -> PartitionPlan:
        tags = {n.name: "muls" for n in program.graph.nodes if getattr(n, "target", "") == "aten::mul.Tensor"}
        return PartitionPlan.build(tags, {"muls": DelegationSpec(backend_id=self.backend_id)})
