"""Common mistakes with the Python API raise a typed texir error (also the Python type a caller
might catch) whose message names the fix; texir's native XNNPACK partitioner lowers without a
registration step."""

from __future__ import annotations

import pytest
import torch

import texir
from texir.adapters.core_aten import NonCoreOperatorError, TrainingModeError
from texir.backends import xnnpack
from texir.emit import EmitArgumentError, emit
from texir.errors import TexirError
from texir.lowering import backend as backend_module
from texir.lowering import (
    DelegationSpec,
    PartitionerArgumentError,
    PartitionPlan,
    PlanArgumentError,
    UnknownBackendError,
    get_backend,
    registered_backends,
    to_backend,
)
from texir.serialize import pte
from texir.serialize.pte import PteArgumentError


class _Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


@pytest.fixture(scope="module")
def exported() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    return torch.export.export(_Small().eval(), (torch.randn(2, 4),))


def test_native_xnnpack_partitioner_needs_no_registration(
    exported: torch.export.ExportedProgram, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as in a fresh process: nothing under XnnpackBackend (an earlier test may have registered one)
    monkeypatch.delitem(backend_module._REGISTRY, xnnpack.BACKEND_ID, raising=False)
    lowered = texir.lower(exported, [xnnpack.partitioner()], cache=None)
    assert [d.backend for d in lowered.report.delegates] == ["XnnpackBackend"]
    assert xnnpack.BACKEND_ID not in registered_backends()  # registered for that lowering only
    with xnnpack.registered() as backend:  # the explicit block keeps working, with its backend
        again = texir.lower(exported, [xnnpack.partitioner()], cache=None)
        assert get_backend(xnnpack.BACKEND_ID) is backend
    assert pte.dumps(emit(again.program)) == pte.dumps(emit(lowered.program))
    # to_backend (no orchestration) still needs the registration, and the error says how
    program = lowered.edge
    with pytest.raises(UnknownBackendError, match=r"with texir\.backends\.xnnpack\.registered\(\)"):
        to_backend(program, xnnpack.partitioner())


def test_native_partitioner_stays_native_after_the_bridge_registered_executorchs_backend(
    exported: torch.export.ExportedProgram, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ExecuTorch's bridge registers ExecuTorch's XnnpackBackend by itself for ExecuTorch's
    partitioner; texir's own partitioner in the same process still gets texir's backend (it did not:
    the bridged preprocess ran, and a large model's weights were hashed at import, not while written).
    A backend the user registers there stays theirs."""
    pytest.importorskip("executorch")
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from texir.executorch import executorch_partitioner
    from texir.executorch.backend import ExecutorchBackend

    monkeypatch.setattr(backend_module, "_REGISTRY", {})
    monkeypatch.setattr(backend_module, "_IMPLICIT", set())
    bridged = texir.lower(exported, [executorch_partitioner(XnnpackPartitioner())], cache=None)
    assert isinstance(get_backend(xnnpack.BACKEND_ID), ExecutorchBackend)
    assert backend_module.registered_implicitly(xnnpack.BACKEND_ID)
    used: list[object] = []
    native_preprocess = xnnpack.XnnpackNativeBackend.preprocess

    def counted(self: xnnpack.XnnpackNativeBackend, *args: object) -> object:
        used.append(self)
        return native_preprocess(self, *args)  # type: ignore[arg-type]  # forwarding the caller's arguments

    monkeypatch.setattr(xnnpack.XnnpackNativeBackend, "preprocess", counted)
    native = texir.lower(exported, [xnnpack.partitioner()], cache=None)
    assert len(used) == 1  # texir's backend preprocessed the native partitioner's delegate
    assert isinstance(get_backend(xnnpack.BACKEND_ID), ExecutorchBackend)  # the registry as it was
    assert pte.dumps(emit(native.program)) == pte.dumps(emit(bridged.program))
    mine = xnnpack.XnnpackNativeBackend()
    backend_module.register_backend(xnnpack.BACKEND_ID, mine, replace=True)  # the user's choice
    assert not backend_module.registered_implicitly(xnnpack.BACKEND_ID)
    texir.lower(exported, [xnnpack.partitioner()], cache=None)
    assert used[-1] is mine


def test_emit_of_the_lowered_result_says_emit_lowered_program(exported: torch.export.ExportedProgram) -> None:
    lowered = texir.lower(exported, [], cache=None)
    with pytest.raises(EmitArgumentError, match=r"write emit\(lowered\.program\)") as info:
        emit(lowered)  # type: ignore[arg-type]  # the mistake under test
    assert isinstance(info.value, TexirError) and isinstance(info.value, TypeError)
    with pytest.raises(EmitArgumentError, match="not int"):
        emit(3)  # type: ignore[arg-type]  # the mistake under test


def test_pte_dumps_of_an_ir_program_says_emit_first(exported: torch.export.ExportedProgram, tmp_path: object) -> None:
    program = texir.lower(exported, [], cache=None).program
    with pytest.raises(PteArgumentError, match=r"emit it first: pte\.dumps\(texir\.emit\.emit\(program\)\)") as info:
        pte.dumps(program)  # type: ignore[arg-type]  # the mistake under test
    assert isinstance(info.value, TexirError) and isinstance(info.value, TypeError)
    with pytest.raises(PteArgumentError, match=r"pte\.dump\(texir\.emit\.emit\(program\), path\)"):
        pte.dump(program, "never-written.pte")  # type: ignore[arg-type]  # the mistake under test


def test_one_partitioner_where_a_list_goes_and_back(exported: torch.export.ExportedProgram) -> None:
    part = xnnpack.partitioner()
    with pytest.raises(PartitionerArgumentError, match=r"write lower\(program, \[partitioner\]\)") as info:
        texir.lower(exported, part)  # type: ignore[call-overload]  # the mistake under test
    assert isinstance(info.value, TexirError) and isinstance(info.value, TypeError)
    with pytest.raises(PartitionerArgumentError, match=r"write lower\(program, \[partitioner\]\)"):
        texir.lower({"forward": exported}, part)  # type: ignore[call-overload]  # the mistake under test
    edge = texir.lower(exported, [], cache=None).edge
    with xnnpack.registered(), pytest.raises(PartitionerArgumentError, match="takes one partitioner, not a list"):
        to_backend(edge, [part])  # type: ignore[call-overload]  # the mistake under test


def test_partition_plan_with_dicts_says_build() -> None:
    spec = DelegationSpec(backend_id="texir-reference")
    with pytest.raises(PlanArgumentError, match=r"PartitionPlan\.build\(tags=") as info:
        PartitionPlan(tags={"add": "tag0"}, specs=(("tag0", spec),))  # type: ignore[arg-type]  # the mistake
    assert isinstance(info.value, TexirError) and isinstance(info.value, TypeError)
    with pytest.raises(PlanArgumentError, match=r"PartitionPlan\(specs=\.\.\.\)"):
        PartitionPlan(tags=(("add", "tag0"),), specs={"tag0": spec})  # type: ignore[arg-type]  # the mistake
    built = PartitionPlan.build(tags={"add": "tag0"}, specs={"tag0": spec})
    assert built.tags == (("add", "tag0"),)


class _Trains(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)


def test_a_model_in_training_mode_says_call_eval() -> None:
    module, args = _Trains(), (torch.randn(2, 4),)
    with pytest.raises(TrainingModeError, match=r"call model\.eval\(\) before torch\.export\.export") as info:
        texir.lower(torch.export.export(module.train(), args), [], cache=None)
    assert isinstance(info.value, NonCoreOperatorError)  # callers catching the older error still do
    assert "allow_non_core" not in str(info.value)
    lowered = texir.lower(torch.export.export(module.eval(), args), [], cache=None)  # the fix works
    assert lowered.program.graph.nodes
