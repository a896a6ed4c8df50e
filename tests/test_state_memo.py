"""`lower` converts each weight to a state entry once (`texir.adapters.fx_import.state_memo`): the
decomposed program reuses the entries of the program it came from, buffers stay copies, another
tensor under the same name is converted anew, and the files are those written without the memo."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

from texir import orchestrate
from texir.adapters.fx_import import from_exported_program, state_memo
from texir.adapters.tensors import digest_memo
from texir.backends import xnnpack
from texir.emit import emit
from texir.serialize.pte.codec import dumps


class _Model(nn.Module):
    """A conv with batch norm (running statistics: buffers) and a linear (parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.lin = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


@pytest.fixture(scope="module")
def exported() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    model = _Model().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    return torch.export.export(model, (torch.randn(1, 3, 8, 8),), strict=False)


def _pte(ep: torch.export.ExportedProgram) -> bytes:
    with xnnpack.registered():
        return dumps(emit(orchestrate.lower(ep, [xnnpack.partitioner()], cache=None).program))


def test_lower_writes_the_same_bytes_without_the_memo(
    exported: torch.export.ExportedProgram, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_memo = _pte(exported)
    monkeypatch.setattr(orchestrate, "state_memo", contextlib.nullcontext)
    assert _pte(exported) == with_memo


def test_entries_are_reused_only_for_the_very_same_tensor(exported: torch.export.ExportedProgram) -> None:
    buffers = {s.target for s in exported.graph_signature.input_specs if s.kind.name == "BUFFER"}
    assert buffers
    with digest_memo(), state_memo():
        first = from_exported_program(exported)
        second = from_exported_program(exported)
        assert all(a is b for a, b in zip(first.state, second.state, strict=True))
    # A buffer's payload is still a copy of the program's tensor: writing the tensor leaves it be.
    entry = next(e for e in first.state if e.target == "bn.running_mean")
    assert entry.value.data is not None
    before = entry.value.data.tobytes()
    source = exported.state_dict["bn.running_mean"]
    kept = source.clone()
    try:
        source.add_(1.0)
        assert entry.value.data.tobytes() == before
    finally:
        source.copy_(kept)
    with digest_memo(), state_memo():
        first = from_exported_program(exported)
        # Another tensor under a weight's name: converted anew, with its own bytes.
        changed = nn.Parameter(exported.state_dict["lin.weight"].detach() + 1)
        swapped = dict(exported.state_dict, **{"lin.weight": changed})
        other = torch.export.ExportedProgram(
            root=exported.graph_module, graph=exported.graph, graph_signature=exported.graph_signature,
            state_dict=swapped, range_constraints=exported.range_constraints,
            module_call_graph=exported.module_call_graph, constants=exported.constants,
            verifiers=[exported.verifier],
        )
        third = from_exported_program(other)
    by_name = {e.target: e for e in third.state}
    old = {e.target: e for e in first.state}
    assert by_name["lin.weight"] is not old["lin.weight"]
    assert by_name["lin.weight"].value.sha256 != old["lin.weight"].value.sha256
    assert all(by_name[t] is old[t] for t in old if t != "lin.weight")
    # Outside the memo every conversion makes its own entries, equal to the memo's.
    fresh = from_exported_program(exported)
    assert fresh.state == first.state
    assert all(a is not b for a, b in zip(fresh.state, first.state, strict=True))
