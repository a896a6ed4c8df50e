"""`lower` converts once: one FX -> IR conversion of the program it is given (the partitioners'
`ops_to_not_decompose` and the decomposition reuse key share it; the partitioners' hooks get the
ExportedProgram it came from), and one IR -> ExportedProgram conversion per program, one edge
ExportedProgram per (program, ExecuTorch partitioner), in a cold lowering with three partitioners."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from torch import nn

import texir.backends  # noqa: F401  (registers the demo and reference backends)
from texir.adapters import fx_export, fx_import
from texir.executorch import edge_program, executorch_partitioner
from texir.lowering import OpSupportPartitioner, PreprocessCache
from texir.orchestrate import lower

DEMO = "BackendWithDelegateMappingDemo"


class _Model(nn.Module):
    """Two linears XNNPACK takes, one whose weight is a user input (its node filter turns it down:
    decomposed after all), a tan for the demo backend and a sin for the reference backend."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = self.b(torch.relu(self.a(x)))
        return torch.sin(torch.tan(nn.functional.linear(y, w)))


class _Calls:
    """Each conversion function's calls, by the identity of what it converted."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self.inputs: dict[str, list[int]] = {}
        self._held: list[object] = []  # keeps every converted object alive, so ids stay unique

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            kind = f"{name}(decompose)" if kwargs.get("decompose") else name
            self.count[kind] += 1
            self._held.append(args[0])
            self.inputs.setdefault(kind, []).append(id(args[0]))
            return fn(*args, **kwargs)

        return counted


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Calls]:
    found = _Calls()
    originals = {
        "from_exported_program": fx_import.from_exported_program,
        "to_exported_program": fx_export.to_exported_program,
        "to_edge_exported_program": edge_program.to_edge_exported_program,
    }
    for module in list(sys.modules.values()):
        if not getattr(module, "__name__", "").startswith("texir"):
            continue
        for name, fn in originals.items():
            if getattr(module, name, None) is fn:  # every module that imported it by name
                monkeypatch.setattr(module, name, found.wrap(name, fn))
    yield found


@pytest.mark.parametrize("cache", [False, True], ids=["no-cache", "cold-cache"])
def test_three_partitioner_lowering_converts_each_program_once(calls: _Calls, cache: bool) -> None:
    torch.manual_seed(0)
    ep = torch.export.export(_Model().eval(), (torch.randn(2, 8), torch.randn(8, 8)))
    partitioners = [
        OpSupportPartitioner(DEMO, {"aten::tan.default"}),
        OpSupportPartitioner("texir-reference", {"aten::sin.default"}),
        executorch_partitioner(XnnpackPartitioner()),
    ]
    done = lower(ep, partitioners, cache=PreprocessCache() if cache else None)

    backends = sorted(d.backend for d in done.report.delegates)
    assert backends == ["BackendWithDelegateMappingDemo", "XnnpackBackend", "texir-reference"]
    assert [t.node for t in done.report.turned_down] == ["linear_2"]
    for kind, ids in calls.inputs.items():
        assert len(ids) == len(set(ids)), f"{kind} converted the same object twice"
    assert dict(calls.count) == {
        # the exported program once (its decomposition is made on that IR: texir.adapters.ir_decompose,
        # no conversion), then the retrace of the linear XNNPACK's node filter turned down
        "from_exported_program": 2,
        # the decomposed program (XNNPACK's node filter; decompose_nodes reuses it), the edge
        # program XNNPACK partitions and its one partition for preprocess (edge programs build on
        # to_exported_program), and ExecuTorch's verifier reading the two earlier delegates'
        # original programs
        "to_exported_program": 5,
        # the two edge programs (the one XNNPACK partitions, its partition for preprocess), and in
        # the first the two earlier delegates as ExecuTorch's LoweredBackendModules, whose edge
        # programs are made from the conversions counted above (not converted again)
        "to_edge_exported_program": 4,
    }
